"""The README's first command runs `eqquant demo`: the main job on a bundled model, stage by
stage. Run here as the installed command runs it, in a process of its own."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def test_the_demo_runs_every_stage_and_checks_its_bits(tmp_path):
    eqquant = shutil.which("eqquant", path=str(Path(sys.executable).parent))
    assert eqquant is not None
    done = subprocess.run([eqquant, "demo", "--out", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for stage in ("type-check", "saturate + extract + fold", "quantize (minmax, 4 samples)",
                  "run int8 on the executor (first)"):
        assert stage in out, stage
    assert "equal the int8 reference bit for bit" in out
    assert "output: SQNR" in out
    made = tmp_path / "demo"
    assert (made / "resnet18_stem.int8.ir").exists() and (made / "resnet18_stem.opt.ir").exists()
