"""A non-editable install carries grammar/, rules/ and the deploy library's C source, and works
from another directory."""
import os
import subprocess
import sys

from conftest import REPO


def test_wheel_install_runs_fmt_elsewhere(tmp_path):
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--target", str(target), str(REPO)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (target / "eqquant" / "_data" / "grammar" / "ir.lark").is_file()
    assert (target / "eqquant" / "_data" / "rules").is_dir()
    assert (target / "eqquant" / "deploy" / "library.c").is_file()   # (eqquant compile's)
    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "m.ir").write_text("def @main(%x: Tensor[(2), float32]) { nn.relu(%x) }")
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run([sys.executable, "-c", "import eqquant.resources as r, eqquant; "
                            "print(eqquant.__file__); print(r.data_dir('grammar'))"],
                           capture_output=True, text=True, cwd=work, env=env)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(target)) for line in where.stdout.split())
    script = target / "bin" / "eqquant"
    out = subprocess.run([str(script), "fmt", "m.ir"], capture_output=True, text=True,
                         cwd=work, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "def @main(%x: Tensor[(2), float32]) {\n  nn.relu(%x)\n}\n"
