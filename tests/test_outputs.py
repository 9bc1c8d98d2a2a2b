"""Outputs are whole or absent, and a program's .ir and .npz always belong together: a
writer killed at any instant never leaves a pair that loads mismatched."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from conftest import REPO, cli_exit
from eqquant.errors import EqquantError
from eqquant.ir.loader import load_program, save_program
from eqquant.ir.parser import parse

N = 1 << 20    # weights big enough that a save takes a while (a kill lands inside one)


def _version(k: int):
    mod = parse("def @main(%x: Tensor[(4), float32], %w: Tensor[(1048576), float32]) {\n"
                f"  multiply(%x, {float(k)}f)\n}}\n")
    return mod, {"w": np.full(N, k, np.float32)}


def _consistent(path) -> int:
    mod, params = load_program(path)
    k = float(mod.main.body.args[1].value)
    assert np.all(params["w"] == k), "the weights belong to another save"
    return int(k)


WRITER = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, {tests!r})
    from test_outputs import _version
    from eqquant.ir.loader import save_program
    k = 1
    while True:
        k += 1
        mod, params = _version(k)
        save_program({path!r}, mod, params)
""")


def test_a_killed_writer_never_leaves_a_mismatched_pair(tmp_path):
    path = tmp_path / "m.ir"
    save_program(path, *_version(1))
    rng = np.random.default_rng(0)
    seen = set()
    for trial in range(12):
        proc = subprocess.Popen([sys.executable, "-c", WRITER.format(
            tests=str(REPO / "tests"), path=str(path))])
        time.sleep(float(rng.uniform(0.5, 2.0)))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        seen.add(_consistent(path))
        assert (tmp_path / "m.npz").exists()
    assert len(seen) >= 3, seen          # the writer did get through several saves


def test_a_pair_from_two_different_saves_is_refused(tmp_path):
    a, b = tmp_path / "a" / "m.ir", tmp_path / "b" / "m.ir"
    save_program(a, *_version(1))
    save_program(b, *_version(2))
    (a.parent / "m.npz").write_bytes((b.parent / "m.npz").read_bytes())
    with pytest.raises(EqquantError, match="does not belong"):
        load_program(a)


def test_the_stamp_is_read_from_the_zip_directory_and_old_stamps_still_load(tmp_path):
    """A saved program's stamp digests its .npz's member list (names, CRC-32s, sizes: read
    from the zip's central directory, not the whole file); one saved with a digest of the
    whole file (before) still loads, and is still refused beside other weights; a truncated
    .npz (its central directory lost) is refused."""
    from eqquant.ir.outputs import STAMP_PREFIX, WHOLE, ZIP, digest_file
    path = tmp_path / "m.ir"
    save_program(path, *_version(3))
    text = path.read_text()
    assert text.startswith(f"{STAMP_PREFIX}{ZIP}=")
    npz = tmp_path / "m.npz"
    body = text.split("\n", 1)[1]
    path.write_text(f"{STAMP_PREFIX}{WHOLE}={digest_file(npz, WHOLE)}\n{body}")
    assert _consistent(path) == 3
    other = tmp_path / "o" / "m.ir"
    save_program(other, *_version(4))
    saved = npz.read_bytes()
    npz.write_bytes((other.parent / "m.npz").read_bytes())
    with pytest.raises(EqquantError, match="does not belong"):
        load_program(path)
    path.write_text(text)
    npz.write_bytes(saved[:len(saved) // 2])
    assert digest_file(npz) is None
    with pytest.raises(EqquantError, match="does not belong"):
        load_program(path)


def _model(tmp_path):
    from eqquant.zoo.models import build
    m = build("resnet18_stem", image_size=16)
    path = tmp_path / "model.ir"
    save_program(path, m.module, m.params)
    calib = tmp_path / "calib.npz"
    rng = np.random.default_rng(0)
    np.savez(calib, data=rng.normal(size=(2, 1, 3, 16, 16)).astype(np.float32))
    return path, calib


def test_a_failing_quantize_writes_nothing(tmp_path, monkeypatch, capsys):
    path, calib = _model(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    import eqquant.quant.calibrate as cal

    def boom(self, path):       # the last file of the four fails to write
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(cal.CalibrationTable, "write", boom)
    out = tmp_path / "q" / "model.ir"
    assert cli_exit(["quantize", str(path), "--calib", str(calib), "--mode", "minmax",
                     "-o", str(out)]) == 2
    assert "No space left" in capsys.readouterr().err
    assert not out.parent.exists() or not any(out.parent.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "q") == before


@pytest.mark.parametrize("command", ["opt", "quantize"])
def test_an_output_equal_to_the_input_is_refused(tmp_path, command, capsys):
    path, calib = _model(tmp_path)
    text = path.read_text()
    argv = ([command, str(path), "-r", "simplify", "-o", str(path)] if command == "opt" else
            [command, str(path), "--calib", str(calib), "-o", str(path)])
    assert cli_exit(argv) == 2
    assert "overwrite the input" in capsys.readouterr().err
    assert path.read_text() == text


def test_outputs_follow_the_umask_and_write_through_symlinks(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "m.ir"
        save_program(path, *_version(1))
        assert (path.stat().st_mode & 0o777) == 0o644
        assert ((tmp_path / "m.npz").stat().st_mode & 0o777) == 0o644
    finally:
        os.umask(old)
    real = tmp_path / "real.ir"
    real.write_text("def @main(%x: Tensor[(2), float32]) {  nn.relu(%x)  }\n")
    link = tmp_path / "link.ir"
    link.symlink_to(real)
    assert cli_exit(["fmt", "-i", str(link)]) == 0
    assert link.is_symlink() and real.read_text().startswith("def @main(%x: Tensor[(2), ")
    assert "  nn.relu(%x)\n" in real.read_text()


def test_write_errors_are_reported_not_raised(tmp_path, capsys):
    path, _ = _model(tmp_path)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder should be")
    assert cli_exit(["opt", str(path), "-r", "simplify", "-o", str(blocked / "o.ir")]) == 2
    assert "cannot write" in capsys.readouterr().err
    if os.geteuid() != 0:        # root writes anywhere: only a non-root run can check this
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert cli_exit(["opt", str(path), "-r", "simplify", "-o", str(ro / "o.ir")]) == 2


def test_a_saved_program_stays_canonical_under_fmt(tmp_path):
    path = tmp_path / "m.ir"
    save_program(path, *_version(3))
    assert cli_exit(["fmt", "--check", str(path)]) == 0
    assert cli_exit(["fmt", "-i", str(path)]) == 0
    assert _consistent(path) == 3


def test_a_writer_dying_between_the_two_renames_leaves_the_old_pair_readable(tmp_path,
                                                                             monkeypatch):
    """The one instant two renames cannot cover: the new .npz is in place, the .ir is not
    yet. The loader then reads the weights the save kept, which are the old program's."""
    import eqquant.ir.outputs as outputs
    path = tmp_path / "m.ir"
    save_program(path, *_version(1))
    real = os.replace
    calls = []

    def die_on_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")       # as a signal would, mid-commit
        real(src, dst)
    monkeypatch.setattr(outputs.os, "replace", die_on_second)
    with pytest.raises(KeyboardInterrupt):
        save_program(path, *_version(2))
    monkeypatch.setattr(outputs.os, "replace", real)
    assert np.all(np.load(tmp_path / "m.npz")["w"] == 2)     # the new weights are in place
    assert _consistent(path) == 1                           # yet the pair read is the old one
    save_program(path, *_version(3))
    assert _consistent(path) == 3
