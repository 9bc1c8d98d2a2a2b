"""TVM Relax's TVMScript as a second text format: seed 000's two modules read straight from
the seed document, folded by rules, printed back and read again; located errors; the CLI."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from eqquant.core.nodes import Call, Constant, post_order
from eqquant.errors import EqquantError, NameError_, ParseError, TypeCheckError, UnknownOpError
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.ir.tvmscript import metadata_key, parse_tvmscript, print_tvmscript
from eqquant.optimizer import optimize
from eqquant.zoo import build

SEED = Path(__file__).parent / "data" / "seeds" / "000_80f8a6011235bce0.txt"


def seed_modules() -> list[str]:
    """The ``@I.ir_module`` listings of seed 000, as the document prints them."""
    text = SEED.read_text(encoding="utf-8")
    return re.findall(r"^@I\.ir_module\n.*?^        return \w+\n", text, re.S | re.M)


def seed_params():
    """Drawn as the seed draws them (np.random.rand), named as its params_np."""
    rng = np.random.RandomState(0)
    weight = rng.rand(32, 3, 3, 3).astype(np.float32)
    gamma, beta, mean, var = (rng.rand(32).astype(np.float32) for _ in range(4))
    data = rng.rand(1, 3, 224, 224).astype(np.float32)
    return weight, gamma, beta, mean, var, data


def decomposed_constants():
    """The first module's metadata: DecomposeOpsForInference's constants in the order the
    listing uses them (conv weight, mean, variance, gamma, beta)."""
    weight, gamma, beta, mean, var, _ = seed_params()
    return {0: weight, 1: mean, 2: var, 3: gamma, 4: beta}


def folded_constants():
    """The second module's metadata: the weight and bias FoldBatchnormToConv2D computes."""
    weight, gamma, beta, mean, var, _ = seed_params()
    k = gamma / np.sqrt(var + np.float32(1e-5))
    return {0: (weight * k[:, None, None, None]).astype(np.float32),
            1: (beta - mean * k).reshape(1, 32, 1, 1).astype(np.float32)}


def ops_of(mod) -> list[str]:
    return [n.op_name for n in post_order(mod.main.body) if isinstance(n, Call)]


def test_seed_has_two_modules():
    mods = seed_modules()
    assert len(mods) == 2
    assert "R.subtract" in mods[0] and "R.subtract" not in mods[1]


def test_decomposed_module_folds_to_conv_and_add():
    mod = parse_tvmscript(seed_modules()[0], str(SEED), decomposed_constants())
    assert ops_of(mod).count("reshape") == 4 and "divide" in ops_of(mod)
    folded = optimize(mod, {}, rules=["simplify", "bn_fold"], cost="cpu").module
    assert sorted(ops_of(folded)) == ["add", "nn.conv2d"]
    data = seed_params()[-1]
    want = run(mod, {"data": data})
    got = run(folded, {"data": data})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_folded_module_is_recognised_as_folded():
    mod = parse_tvmscript(seed_modules()[1], str(SEED), folded_constants())
    assert sorted(ops_of(mod)) == ["add", "nn.conv2d"]
    again = optimize(mod, {}, rules=["simplify", "bn_fold"], cost="cpu").module
    assert sorted(ops_of(again)) == ["add", "nn.conv2d"]
    # and it computes what the decomposed module computes, with TVM's folded constants
    data = seed_params()[-1]
    first = parse_tvmscript(seed_modules()[0], str(SEED), decomposed_constants())
    np.testing.assert_allclose(run(mod, {"data": data}), run(first, {"data": data}),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", [0, 1])
def test_seed_round_trip_is_exact(which):
    consts = decomposed_constants() if which == 0 else folded_constants()
    mod = parse_tvmscript(seed_modules()[which], str(SEED), consts)
    text = print_tvmscript(mod)
    again = parse_tvmscript(text, "<printed>", consts)
    assert again == mod
    assert print_tvmscript(again) == text
    # the listing's own bindings and annotations come back as written
    for line in seed_modules()[which].splitlines():
        if re.match(r"\s+lv\w*: R\.Tensor\(", line) and "R.expand_dims" not in line:
            assert line.split(" = ")[0] in text


def test_annotations_are_checked():
    text = seed_modules()[1].replace("R.Tensor((1, 32, 224, 224), dtype=\"float32\") = R.add",
                                     "R.Tensor((1, 16, 224, 224), dtype=\"float32\") = R.add")
    mod = parse_tvmscript(text, "bad.py", folded_constants())
    from eqquant.ir.typecheck import check_module
    with pytest.raises(TypeCheckError) as e:
        check_module(mod)
    assert e.value.loc is not None and (e.value.loc.line, e.value.loc.column) == (7, 18)


@pytest.mark.parametrize("model", ["resnet18_stem", "mobilenet_v2"])
def test_zoo_programs_round_trip_through_tvmscript(model):
    """A program of the text IR printed as TVMScript reads back as the same program."""
    m = build(model, image_size=32)
    mod = bind_params(m.module, m.params)
    consts = {c.index: c.data for c in post_order(mod.main.body) if isinstance(c, Constant)}
    text = print_tvmscript(mod)
    again = parse_tvmscript(text, "<printed>", consts)
    assert print_module(again) == print_module(parse(print_module(again)))
    x = next(iter(m.inputs.values()))
    np.testing.assert_array_equal(run(again, {"data": x}), run(mod, {"data": x}))
    assert print_tvmscript(again) == text


def _module(body: str, params: str = 'x: R.Tensor((2, 3), dtype="float32")') -> str:
    return ("@I.ir_module\nclass Module:\n    @R.function\n"
            f"    def main({params}):\n        with R.dataflow():\n{body}"
            "            R.output(lv)\n        return lv\n")


ERRORS = [
    ("unknown op", _module("            lv = R.nn.frobnicate(x)\n"), UnknownOpError, 6, 18),
    ("undefined name", _module("            lv = R.nn.relu(y)\n"), NameError_, 6, 28),
    ("no metadata", _module('            lv = R.add(x, metadata["relax.expr.Constant"][3])\n'),
     TypeCheckError, 6, 27),
    ("syntax", _module("            lv = R.nn.relu(x,, )\n"), ParseError, 6, 30),
    ("bad size", _module("            lv = R.nn.relu(x)\n",
                         'x: R.Tensor(("n?", 3), dtype="float32")'), ParseError, 4, 27),
    ("bad attribute", _module("            lv = R.nn.softmax(x, axes=1)\n"), EqquantError, 6, 18),
    ("training batch norm", _module(
        "            lv = R.nn.batch_norm(x, x, x, x, x, training=True)\n"), EqquantError, 6, 18),
]


@pytest.mark.parametrize("name,src,cls,line,col", ERRORS, ids=[e[0] for e in ERRORS])
def test_located_errors(name, src, cls, line, col):
    with pytest.raises(cls) as e:
        parse_tvmscript(src, "m.py")
    assert e.value.loc is not None, e.value
    assert (e.value.loc.line, e.value.loc.column) == (line, col), e.value.format()


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "eqquant.cli.main", *args],
                          capture_output=True, text=True, cwd=cwd)


def test_cli_import_and_fmt(tmp_path):
    src = tmp_path / "module.py"
    src.write_text(seed_modules()[0])
    npz = tmp_path / "consts.npz"
    np.savez(npz, **{metadata_key(i): v for i, v in decomposed_constants().items()})
    r = _cli("import", str(src), "-p", str(npz), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    ir = tmp_path / "out" / "module.ir"
    assert "nn.conv2d" in ir.read_text()
    r = _cli("fmt", "--to", "relax", str(ir))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# from tvm.script import ir as I") and "R.nn.conv2d(" in r.stdout
    # the .ir's weights (keyed meta[relay.Constant][i]) serve the printed module too
    back = tmp_path / "back.py"
    back.write_text(r.stdout)
    r2 = _cli("fmt", "--check", str(back), "-p", str(tmp_path / "out" / "module.npz"))
    assert r2.returncode == 0, r2.stderr
    # the whole flow runs on the TVMScript file
    r3 = _cli("opt", str(src), "-p", str(npz), "-o", str(tmp_path / "folded.ir"))
    assert r3.returncode == 0, r3.stderr
    assert sorted(re.findall(r"= (nn\.conv2d|add)\(", (tmp_path / "folded.ir").read_text())) \
        == ["add", "nn.conv2d"]


def test_cli_errors_are_located(tmp_path):
    src = tmp_path / "module.py"
    src.write_text(seed_modules()[0])
    r = _cli("fmt", str(src))          # TVMScript omits constants: they must be given
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "module.py:6:82:" in r.stderr and "relax.expr.Constant" in r.stderr
    r = _cli("fmt", "-i", "--to", "relax", str(tmp_path / "x.ir"))
    assert r.returncode == 2 and "own format" in r.stderr
