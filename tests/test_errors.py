"""Malformed programs: each gives the right error class at the right line and column, and the
CLI shows it without a traceback, exit status 2."""
import subprocess
import sys

import pytest

from eqquant.errors import (ArityError, AttrError, NameError_, ParseError, TypeCheckError,
                            UnknownOpError)
from eqquant.ir.parser import parse
from eqquant.ir.typecheck import check_module

HEAD = "def @main(%x: Tensor[(1, 3, 8, 8), float32], %w: Tensor[(4, 3, 3, 3), float32]) {\n"

# (name, source, error class, line, column, a word the message must contain)
CASES = [
    ("unclosed bracket", HEAD + "  nn.relu(%x\n}\n", ParseError, 3, 1, "expected"),
    ("truncated file", HEAD + "  %0 = nn.relu(%x);\n  nn.relu(%0)", ParseError, 3, 14,
     "end of file"),
    ("unknown op", HEAD + "  nn.rellu(%x)\n}\n", UnknownOpError, 2, 3, "nn.relu"),
    ("wrong arity", HEAD + "  nn.relu(%x, %x)\n}\n", ArityError, 2, 3, "takes 1"),
    ("bad attribute type", HEAD + '  nn.conv2d(%x, %w, padding="same")\n}\n', AttrError, 2, 21,
     "padding"),
    ("unknown attribute", HEAD + "  nn.relu(%x, alpha=0.1)\n}\n", AttrError, 2, 15, "alpha"),
    ("missing attribute", HEAD + "  cast(%x)\n}\n", AttrError, 2, 3, "dtype"),
    ("duplicate attribute", HEAD + "  clip(%x, a_min=0f, a_min=1f)\n}\n", AttrError, 2, 22,
     "twice"),
    ("shape mismatch", HEAD + "  %0 = nn.conv2d(%x, %w);\n  add(%0, %x)\n}\n", TypeCheckError,
     3, 3, "broadcast"),
    ("conv weight rank", "def @main(%x: Tensor[(1, 3, 8, 8), float32], %w: Tensor[(3, 3), "
     "float32]) {\n  nn.conv2d(%x, %w)\n}\n", TypeCheckError, 2, 3, "weight"),
    ("dtype mismatch", "def @main(%x: Tensor[(4), float32], %y: Tensor[(4), int8]) {\n"
     "  add(%x, %y)\n}\n", TypeCheckError, 2, 3, "dtypes"),
    ("undefined value", HEAD + "  nn.relu(%y)\n}\n", NameError_, 2, 11, "%y"),
    ("redefined value", HEAD + "  %0 = nn.relu(%x);\n  %0 = nn.relu(%x);\n  %0\n}\n",
     NameError_, 3, 3, "already defined"),
    ("duplicate parameter", "def @main(%x: float32, %x: float32) {\n  %x\n}\n", NameError_,
     1, 24, "twice"),
    ("bad literal", HEAD + "  multiply(%x, 1.5i8)\n}\n", ParseError, 2, 16, "integer"),
    ("literal out of range", HEAD + "  multiply(%x, 300i8)\n}\n", ParseError, 2, 16, "fit"),
    ("unknown dtype", "def @main(%x: Tensor[(4), float33]) {\n  %x\n}\n", ParseError, 1, 27,
     "dtype"),
    ("unexpected character", HEAD + "  nn.relu($x)\n}\n", ParseError, 2, 11, "character"),
    ("unclosed comment", HEAD + "  /* note\n  nn.relu(%x)\n}\n", ParseError, 2, 3,
     "comment"),
    ("unterminated string", HEAD + '  cast(%x, dtype="int8)\n}\n', ParseError, 2, 18, "string"),
    ("annotation mismatch", HEAD + "  nn.relu(%x) /* ty=Tensor[(9), float32] */\n}\n",
     TypeCheckError, 2, 15, "annotation"),
    ("projection of a tensor", HEAD + "  %x.0\n}\n", TypeCheckError, 2, 6, "not a tuple"),
    ("untyped constant", HEAD + "  add(%x, meta[relay.Constant][0])\n}\n", TypeCheckError, 2,
     11, "no type"),
    ("positional after attribute", HEAD + '  cast(dtype="int8", %x)\n}\n', ParseError, 2, 22,
     "positional"),
    ("return type mismatch", "def @main(%x: Tensor[(4), float32]) -> Tensor[(5), float32] {\n"
     "  nn.relu(%x)\n}\n", TypeCheckError, 1, 1, "return"),
    ("no main", "def @f(%x: float32) {\n  %x\n}\n", NameError_, 1, 1, "main"),
]


@pytest.mark.parametrize("name,src,cls,line,col,word", CASES, ids=[c[0] for c in CASES])
def test_error_class_and_location(name, src, cls, line, col, word):
    with pytest.raises(cls) as info:
        check_module(parse(src, "bad.ir"))
    err = info.value
    assert err.loc is not None, err.format()
    assert (err.loc.file, err.loc.line, err.loc.column) == ("bad.ir", line, col), err.format()
    assert word.lower() in err.message.lower(), err.format()
    text = err.format()
    assert text.startswith(f"bad.ir:{line}:{col}: ")
    assert text.rstrip().endswith("^")  # the line is quoted with a caret under the column


def test_at_least_fifteen_kinds():
    assert len({c[0] for c in CASES}) >= 15


def _cli(*args, cwd=None, env=None):
    import os
    return subprocess.run([sys.executable, "-m", "eqquant.cli.main", *args],
                          capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **env} if env else None)


@pytest.mark.parametrize("name,src,cls,line,col,word", CASES[::3], ids=[c[0] for c in CASES[::3]])
def test_cli_reports_without_traceback(tmp_path, name, src, cls, line, col, word):
    f = tmp_path / "bad.ir"
    f.write_text(src)
    r = _cli("check", str(f))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert f"bad.ir:{line}:{col}:" in r.stderr
    assert "^" in r.stderr


def test_cli_missing_file_and_bad_params(tmp_path):
    r = _cli("fmt", str(tmp_path / "nope.ir"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    prog = tmp_path / "m.ir"
    prog.write_text("def @main(%x: Tensor[(2), float32]) {\n  nn.relu(%x)\n}\n")
    bad = tmp_path / "p.npz"
    bad.write_bytes(b"not a zip")
    r = _cli("check", str(prog), "--params", str(bad))
    assert r.returncode == 2 and "p.npz" in r.stderr and "Traceback" not in r.stderr


def test_fmt_check_and_in_place(tmp_path):
    f = tmp_path / "m.ir"
    messy = "def @main(%x: Tensor[(2), float32]) { %a = nn.relu(%x); add(%a, %a) // twice\n}"
    f.write_text(messy)
    assert _cli("fmt", "--check", str(f)).returncode == 1
    assert _cli("fmt", "-i", str(f)).returncode == 0
    canonical = f.read_text()
    assert canonical == ("def @main(%x: Tensor[(2), float32]) {\n  %a = nn.relu(%x);\n"
                         "  add(%a, %a)\n}\n")
    assert _cli("fmt", "--check", str(f)).returncode == 0
    f.write_text(messy.replace("relu", "rellu"))
    before = f.read_text()
    r = _cli("fmt", "-i", str(f))
    assert r.returncode == 2 and f.read_text() == before  # nothing overwritten on failure


@pytest.mark.parametrize("variable, value, said", [
    ("EQQUANT_INT8_KERNEL", "avx1024", "not an int8 path"),
    ("EQQUANT_FP32_KERNEL", "avx1024", "not a float path"),
])
def test_a_forced_kernel_path_that_is_not_one_is_a_clear_error(tmp_path, variable, value,
                                                               said):
    """Forcing a kernel path that does not exist (or that this CPU lacks: test_runtime_int8,
    test_runtime) stops `eqquant run` with the reason, exit 2, never a silent fallback."""
    import numpy as np
    from eqquant.zoo import build, write
    paths = write(build("conv_bn", image_size=8), tmp_path)
    with np.load(paths["input"]) as f:
        np.save(tmp_path / "x.npy", f[f.files[0]])
    r = _cli("run", str(paths["ir"]), "-x", str(tmp_path / "x.npy"), "--engine", "executor",
             env={variable: value})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{variable}={value}: {said}" in r.stderr
