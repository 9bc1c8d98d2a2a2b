"""``eqquant run`` of a program as it was given (an ONNX import, a float text IR with its batch
norms) runs it optimized for the CPU: batch norms folded, epilogues fused, layouts and kernels
chosen, once per program, the result cached (a damaged cache made again, never trusted);
``--no-opt`` runs it as it is."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import cli_exit, own_cache
from eqquant.zoo import build, write


@pytest.fixture()
def stem(tmp_path, monkeypatch):
    """resnet18's stem as text IR (batch norms unfolded) with an input, and a cache of its
    own; libraries off, so that each run goes through the executor."""
    own_cache(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("EQQUANT_DEPLOY", "0")
    paths = write(build("resnet18_stem", image_size=32), tmp_path)
    return paths["ir"], paths["input"], tmp_path


def _run(capsys, *argv) -> tuple[str, np.ndarray | None]:
    """(stderr, the output written) of ``eqquant run ... -v -o out.npy``."""
    ir, x, folder = argv[:3]
    out = folder / "out.npy"
    out.unlink(missing_ok=True)
    assert cli_exit(["run", str(ir), "-x", str(x), "-o", str(out), "-v", *argv[3:]]) == 0
    return capsys.readouterr().err, np.load(out)


def _ops(err: str) -> list[str]:
    """The ops of the kernel plan ``run -v`` printed."""
    lines = err.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["step", "op"])
    return [line.split()[1] for line in lines[head + 1:] if line.strip()]


def test_a_float_program_runs_optimized_once_and_from_the_cache_after(stem, capsys):
    ir, x, folder = stem
    err, got = _run(capsys, ir, x, folder)
    assert "optimized:" in err and "(cached)" not in err
    assert "nn.batch_norm" not in _ops(err) and "fused.conv2d" in _ops(err)
    _, want = _run(capsys, ir, x, folder, "--engine", "reference")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # the second run takes the optimized program from the cache: the same bits
    err, again = _run(capsys, ir, x, folder)
    assert "(cached)" in err
    np.testing.assert_array_equal(again, got)
    # as it is: its batch norms run, unfolded
    err, plain = _run(capsys, ir, x, folder, "--no-opt")
    assert "optimized" not in err and "nn.batch_norm" in _ops(err)
    np.testing.assert_allclose(plain, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("damage", ["program", "weights", "digests"])
def test_a_damaged_optimized_program_is_made_again(stem, capsys, damage):
    ir, x, folder = stem
    _, first = _run(capsys, ir, x, folder)
    cached = folder / "cache" / "optimized"
    kept = {f.suffix: f for f in cached.iterdir()}
    assert set(kept) == {".ir", ".npz", ".sha256"}
    if damage == "program":           # still a valid program, but not the one optimized
        text = kept[".ir"].read_text()
        kept[".ir"].write_text(text.replace('activation="relu"', 'activation="none"', 1))
    elif damage == "weights":
        data = bytearray(kept[".npz"].read_bytes())
        data[len(data) // 2] ^= 0xFF
        kept[".npz"].write_bytes(bytes(data))
    else:
        kept[".sha256"].write_text("not digests\n")
    err, again = _run(capsys, ir, x, folder)
    assert "optimized:" in err and "(cached)" not in err      # made again, not trusted
    np.testing.assert_array_equal(again, first)
    err, _ = _run(capsys, ir, x, folder)
    assert "(cached)" in err                                  # and kept again


def test_compile_saves_the_optimized_program_and_runs_it_as_saved(stem, capsys):
    """As it is, the stem's batch norms would run on their reference semantics, which no
    library holds; optimized, they are folded away and the library is saved."""
    ir, x, folder = stem
    _, want = _run(capsys, ir, x, folder)
    lib = folder / "lib"
    assert cli_exit(["compile", str(ir), "-o", str(lib), "--no-opt"]) == 2
    assert "nn.batch_norm" in capsys.readouterr().err and not lib.exists()
    assert cli_exit(["compile", str(ir), "-o", str(lib)]) == 0
    assert "optimized:" in capsys.readouterr().out
    err, got = _run(capsys, lib, x, folder)
    assert "runs on the library" in err
    np.testing.assert_array_equal(got, want)
    assert cli_exit(["run", str(lib), "-x", str(x), "--no-opt"]) == 2     # (as it was saved)
