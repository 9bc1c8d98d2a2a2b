"""Programs that take any batch (issue 52): sizes known only at run time (``?n``) in the text
IR, TVMScript and ONNX imports; type relations over them; rules that match such a size only
where they hold for every size; extraction priced at the sizes served (--batch); one program
run at every size (``SizedExecutor``); and one library for every batch, run sample by
sample with the batch-1 run's bits."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import eqquant
from conftest import cli_exit
from eqquant.core.types import Dim, SizeUnknown, TensorType, bind_type, dim_of_text
from eqquant.errors import EvalError, ParseError, TypeCheckError
from eqquant.ir.interp import run
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.ir.typecheck import check_module, infer_types
from eqquant.passes.sizes import batch_size, bind_sizes, per_sample_problem
from eqquant.runtime.execution.sized import SizedExecutor, executor_for

DATA = Path(__file__).parent / "data"
N, S = Dim.named("n"), Dim.named("s")


def program(body: str, params: str) -> str:
    return f"def @main({params}) {{\n{body}\n}}\n"


# -- sizes as values ----------------------------------------------------------------------------

def test_sizes_compute_as_polynomials_and_refuse_what_depends_on_them():
    assert N * S * 128 // 128 == N * S and (N * S * 128) // (N * 128) == S
    assert N + 1 - 1 == N and isinstance(N - N, int) and N - N == 0
    assert N >= 1 and N > 0 and N - 1 >= 0 and not (N < 1)
    assert str(128 * N * S) == "128*?n*?s" and str(N + 1) == "?n+1"
    assert N != 1 and N == Dim.named("n")         # never equal to a plain int
    for question in (lambda: N > 1, lambda: (N + 1) // 2, lambda: N % 4, lambda: int(N)):
        with pytest.raises(SizeUnknown):
            question()
    fresh = iter(range(1, 9))
    assert dim_of_text("2*?n-3", lambda: f"_{next(fresh)}") == 2 * N - 3
    assert str(dim_of_text("?", lambda: "_1")) == "?"
    with pytest.raises(ValueError, match="not a size"):
        dim_of_text("?n?", lambda: "_")
    assert bind_type(TensorType((N, 3, S * 2), "float32"), {"n": 4, "s": 5}) == \
        TensorType((4, 3, 10), "float32")


def test_text_ir_round_trips_sizes_in_types_and_shapes():
    text = program("  %0 = reshape(%x, newshape=[?n, 4, ?s, 8]);\n  nn.relu(%0)",
                   "%x: Tensor[(?n, ?s, 32), float32], %y: Tensor[(?, 10), float32]")
    mod = parse(text, "open.ir")
    assert mod.main.params[0].type.shape == (N, S, 32)
    anonymous = mod.main.params[1].type.shape[0]
    assert isinstance(anonymous, Dim) and str(anonymous) == "?"
    again = print_module(mod)
    assert "Tensor[(?n, ?s, 32), float32]" in again and "newshape=[?n, 4, ?s, 8]" in again
    assert "Tensor[(?, 10), float32]" in again and parse(again) == mod
    types = check_module(mod)
    assert types[id(mod.main.body)] == TensorType((N, 4, S, 8), "float32")
    # a ? in an attribute would be a size of its own: refused where it is written
    with pytest.raises(ParseError, match=r"open2.ir:2:\d+.*must be named"):
        parse(program("  reshape(%x, newshape=[?, 32])", "%x: Tensor[(?n, 32), float32]"),
              "open2.ir")
    with pytest.raises(ParseError, match=r"open3.ir:1:\d+"):
        parse("def @main(%x: Tensor[(?n?, 3), float32]) { %x }", "open3.ir")


def test_tvmscript_names_its_sizes():
    from eqquant.ir.tvmscript import parse_tvmscript, print_tvmscript
    src = '''
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("n", 3, 8, 8), dtype="float32"), w: R.Tensor((4, 3, 3, 3), dtype="float32")) -> R.Tensor(("n", 4, 8, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor(("n", 4, 8, 8), dtype="float32") = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            gv: R.Tensor(("n", 4, 8, 8), dtype="float32") = R.nn.relu(lv)
            R.output(gv)
        return gv
'''
    mod = parse_tvmscript(src)
    assert mod.main.params[0].type.shape == (N, 3, 8, 8)
    out = print_tvmscript(mod)
    assert 'R.Tensor(("n", 3, 8, 8), dtype="float32")' in out and parse_tvmscript(out) == mod


# -- type relations ----------------------------------------------------------------------------

@pytest.mark.parametrize("body, params, want", [
    ("nn.conv2d(%x, %w, strides=[2, 2], padding=[1, 1, 1, 1])",
     "%x: Tensor[(?n, 3, 8, 8), float32], %w: Tensor[(4, 3, 3, 3), float32]", (N, 4, 4, 4)),
    ("nn.max_pool2d(%x, pool_size=[2, 2], strides=[2, 2])",
     "%x: Tensor[(?n, 3, 8, 8), float32]", (N, 3, 4, 4)),
    ("nn.dense(%x, %w)", "%x: Tensor[(?n, 16), float32], %w: Tensor[(4, 16), float32]", (N, 4)),
    ("reshape(%x, newshape=[-1, 64])", "%x: Tensor[(?n, ?s, 4, 16), float32]", (N * S, 64)),
    ("reshape(%x, newshape=[0, -1])", "%x: Tensor[(?n, 4, 16), float32]", (N, 64)),
    ("concatenate((%x, %y), axis=0)",
     "%x: Tensor[(?n, 3), float32], %y: Tensor[(?s, 3), float32]", (N + S, 3)),
    ("nn.batch_matmul(%x, %y, transpose_b=False)",
     "%x: Tensor[(?n, ?s, 8), float32], %y: Tensor[(?n, 8, ?s), float32]", (N, S, S)),
    ("mean(%x, axis=[1], keepdims=True)", "%x: Tensor[(?n, ?s, 8), float32]", (N, 1, 8)),
    ("nn.softmax(%x, axis=-1)", "%x: Tensor[(?n, ?s), float32]", (N, S)),
    ("transpose(%x, axes=[1, 0, 2])", "%x: Tensor[(?n, ?s, 8), float32]", (S, N, 8)),
    ("add(%x, %y)", "%x: Tensor[(?n, 1, 8), float32], %y: Tensor[(?s, 8), float32]",
     (N, S, 8)),
    ("strided_slice(%x, begin=[0], end=[1], axes=[1])", "%x: Tensor[(?n, ?s), float32]",
     (N, 1)),
])
def test_type_relations_carry_sizes(body, params, want):
    mod = parse(program("  " + body, params))
    assert check_module(mod)[id(mod.main.body)].shape == want


@pytest.mark.parametrize("body, params, why", [
    ("add(%x, %y)", "%x: Tensor[(?n, 3), float32], %y: Tensor[(4, 3), float32]",
     r"add: it does not hold for every size of \?n .*name equal sizes alike"),
    ("add(%x, %y)", "%x: Tensor[(?, 3), float32], %y: Tensor[(?, 3), float32]",
     r"add: it does not hold for every size of \?"),
    ("reshape(%x, newshape=[3, -1])", "%x: Tensor[(?n, 4), float32]",
     r"reshape: it does not hold for every size of \?n"),
    ("nn.dense(%x, %w)", "%x: Tensor[(3, ?k), float32], %w: Tensor[(4, 16), float32]",
     r"nn.dense: data .* and weight .* disagree"),
])
def test_a_relation_that_holds_for_some_sizes_only_is_a_located_error(body, params, why):
    with pytest.raises(TypeCheckError, match=r"sized.ir:2:3: .*" + why):
        check_module(parse(program("  " + body, params), "sized.ir"))


# -- rules and extraction ---------------------------------------------------------------------

UNIT_BATCH = """
# A batch of one flattened is a reshape to one row.
rule unit_batch_flatten: nn.batch_flatten(?x) => reshape(?x, newshape=[1, -1])
    if shape(?x) == [1, _, _, _]

# Flattening keeps the leading axis, whatever its size.
rule flatten_keeps_the_batch: nn.batch_flatten(?x) => reshape(?x, newshape=[0, -1])
    if shape(?x) == [?b, _, _, _]
"""


@pytest.mark.parametrize("lead, unit, kept", [("1", 1, 1), ("?n", 0, 1), ("2", 0, 1)])
def test_a_guard_matches_an_open_size_only_where_the_rule_holds_for_every_size(
        tmp_path, lead, unit, kept):
    from eqquant.optimizer import optimize
    from eqquant.rules.loader import load_rules
    path = tmp_path / "unit.rules"
    path.write_text(UNIT_BATCH)
    mod = parse(program("  nn.batch_flatten(%x)", f"%x: Tensor[({lead}, 3, 2, 2), float32]"))
    result = optimize(mod, None, [load_rules(path)], cost="nodes", fold=False, why=False)
    matches = result.report.phases[0].matches
    assert (matches["unit_batch_flatten"], matches["flatten_keeps_the_batch"]) == (unit, kept)
    x = np.random.default_rng(0).standard_normal((3 if lead == "?n" else int(lead), 3, 2, 2))
    out = run(result.module, {"x": x.astype(np.float32)})
    np.testing.assert_array_equal(out, x.astype(np.float32).reshape(len(x), -1))


def test_extraction_prices_open_sizes_at_the_batch_served():
    from eqquant.extract.cost import AtSizes, CpuLatency
    from eqquant.ops.registry import get_op
    op = get_op("nn.dense")
    attrs = op.canonical_attrs({})
    ins = [TensorType((N, 512), "float32"), TensorType((1000, 512), "float32")]
    out = TensorType((N, 1000), "float32")
    one = AtSizes(CpuLatency(), {}).op_cost(op, attrs, ins, out)
    many = AtSizes(CpuLatency(), {"n": 32}).op_cost(op, attrs, ins, out)
    assert many > 2 * one      # (at batch 1 the weight's bytes weigh most)
    assert "priced at ?n=32" in AtSizes(CpuLatency(), {"n": 32}).summary()


# -- running at every size --------------------------------------------------------------------

CONV = program("""  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1]);
  %1 = nn.relu(%0);
  %2 = nn.global_avg_pool2d(%1);
  nn.batch_flatten(%2)""", "%x: Tensor[(?n, 3, 8, 8), float32], %w: Tensor[(4, 3, 3, 3), float32]")


def conv_model():
    w = np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32)
    return eqquant.load(parse(CONV), {"w": w})


def test_one_program_runs_at_every_batch():
    m = conv_model()
    assert m.inputs == {"x": ((N, 3, 8, 8), "float32")}
    x = np.random.default_rng(2).standard_normal((5, 3, 8, 8)).astype(np.float32)
    ex = m.executor()
    assert isinstance(ex, SizedExecutor)
    for b in (1, 3, 5):
        got = m.run(x[:b])
        want = run(m.module, {"x": x[:b]}, m.params)
        assert got.shape == (b, 4) and np.max(np.abs(got - want)) <= 1e-5
    assert "?n=5" in ex.describe_sizes()
    with pytest.raises(EvalError, match="%x expects shape"):
        m.run(np.zeros((2, 3, 9, 8), np.float32))


def test_calibration_takes_a_batch_as_its_samples():
    m = conv_model()
    batch = np.random.default_rng(3).standard_normal((6, 3, 8, 8)).astype(np.float32)
    assert eqquant.api.calibration_samples(batch, m).total == 6
    q = eqquant.quantize(m, batch, mode="minmax", per_channel=True, cost="cpu")
    assert q.module.main.params[0].type.shape[0] == N
    x = batch[:3]
    y = q.run(x)
    for i in range(3):      # int8: the batch's rows are the single runs' bits
        np.testing.assert_array_equal(y[i:i + 1], q.run(x[i:i + 1]))


def test_a_program_knows_whether_it_runs_sample_by_sample():
    def problem(body, params="%x: Tensor[(?n, 8), float32]"):
        mod = parse(program("  " + body, params))
        name = batch_size(mod, infer_types(mod)[id(mod.main.body)])
        return name, per_sample_problem(mod, name) if name else None

    assert problem("nn.softmax(%x, axis=1)") == ("n", None)
    assert "along the batch axis" in problem("nn.softmax(%x, axis=0)")[1]
    assert problem("mean(%x, axis=[0], keepdims=True)")[0] is None  # no batch comes out
    assert "over the whole batch" in problem(
        "add(%x, mean(%x, axis=[0], keepdims=True))")[1]
    assert problem("transpose(%x, axes=[1, 0])")[0] is None      # the output's batch moved
    name, why = problem("nn.batch_flatten(%x)", "%x: Tensor[(?n, ?s, 4), float32]")
    assert name is None         # ?s is open too: not a batch alone


def _library_or_skip(ex, folder):
    from eqquant.deploy.build import NotDeployable, build
    from eqquant.deploy.check import Checker
    with Checker() as checker:
        try:
            build(ex, folder)
        except NotDeployable as e:
            if "known only at run time" in e.message or "sample by sample" in e.message:
                raise
            pytest.skip(f"this CPU saves no library of this program ({e.message}); "
                        "test_deploy covers which")
        return checker.check(ex, folder)


def test_one_library_serves_every_batch_with_the_batch_one_bits(tmp_path):
    from eqquant.deploy.build import BATCHED
    from eqquant.deploy.loader import Library
    m = eqquant.load(DATA / "tiny_resnet.onnx")
    rng = np.random.default_rng(4)
    q = eqquant.quantize(m, rng.standard_normal((4, 3, 16, 16)).astype(np.float32),
                         mode="minmax", per_channel=True, cost="cpu")
    assert _library_or_skip(q.executor(), tmp_path / "lib") is None
    lib = Library(tmp_path / "lib")
    assert lib.batch == "N" and lib.inputs["input_1"].shape[0] == Dim.named("N")
    # two tables of launches: batch 1 and BATCHED (a batch of 11: one run of 8, three of 1)
    assert lib.batched is not None and lib.batched[0] == BATCHED == 8
    x = rng.standard_normal((19, 3, 16, 16)).astype(np.float32)
    ones = np.concatenate([lib.run(x[i:i + 1]) for i in range(19)])
    for b in (1, 3, 8, 11, 19):
        got = lib.run(x[:b])
        np.testing.assert_array_equal(got, ones[:b])
        np.testing.assert_array_equal(got, q.run(x[:b]))      # the executor at batch b
    # the weights both tables read are stored once
    plan = lib.plan
    stored = [(r["at"], r["bytes"]) for r in plan["roots"] if r["at"] is not None]
    assert len(set(stored)) < len(stored)
    assert (tmp_path / "lib" / "data.bin").stat().st_size <= sum(
        n for _, n in set(stored)) + 64 * len(stored)
    with pytest.raises(EvalError, match="expects shape"):
        lib.run(np.zeros((2, 3, 15, 16), np.float32))


def test_a_program_that_mixes_its_batch_gets_no_library_and_says_why(tmp_path):
    from eqquant.deploy.build import NotDeployable, build
    mod = parse(program("  nn.softmax(%x, axis=0)", "%x: Tensor[(?n, 8), float32]"))
    with pytest.raises(NotDeployable, match=r"sample by sample .*along the batch axis"):
        build(executor_for(mod), tmp_path / "a")
    mod = parse(program("  nn.relu(%x)", "%x: Tensor[(?n, ?s), float32]"))
    with pytest.raises(NotDeployable, match=r"\?n, \?s are known only at run time"):
        build(executor_for(mod), tmp_path / "b")


# -- ONNX: a batch and a sequence length left open ----------------------------------------------

def test_an_encoder_with_open_batch_and_length_runs_every_length():
    ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    path = DATA / "tiny_encoder.onnx"
    m = eqquant.load(path)
    assert m.inputs == {"input": ((Dim.named("batch"), Dim.named("seq"), 32), "float32")}
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for b, s in ((1, 16), (2, 64), (1, 128)):
        x = rng.standard_normal((b, s, 32)).astype(np.float32)
        np.testing.assert_allclose(m.run(x), sess.run(None, {"input": x})[0], rtol=1e-4,
                                   atol=1e-4)
    # quantized once, from samples of several lengths: the int8 program keeps both open
    q = eqquant.quantize(m, [rng.standard_normal((1, s, 32)).astype(np.float32)
                             for s in (16, 32, 16)], mode="minmax", cost="cpu")
    assert "Tensor[(?batch, ?seq, 32), float32]" in q.text()
    for s in (16, 48):
        x = rng.standard_normal((2, s, 32)).astype(np.float32)
        ref = m.run(x)
        sqnr = 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - q.run(x)) ** 2))
        assert sqnr > 15
    # mixed precision: each mark's noise measured at the calibration samples' sizes (one
    # shape), the program chosen keeping both sizes open
    mixed = eqquant.quantize(m, [rng.standard_normal((1, 8, 32)).astype(np.float32)
                                 for _ in range(2)], mode="minmax", cost="cpu", min_sqnr=20)
    assert "Tensor[(?batch, ?seq, 32), float32]" in mixed.text()
    x = rng.standard_normal((2, 24, 32)).astype(np.float32)
    ref = m.run(x)
    assert 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - mixed.run(x)) ** 2)) > 15


def test_the_command_line_runs_an_open_length_on_the_executor_and_says_why(tmp_path, capsys):
    pytest.importorskip("onnx", reason="the onnx extra is not installed")
    x = np.random.default_rng(8).standard_normal((1, 12, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert cli_exit(["run", str(DATA / "tiny_encoder.onnx"), "-x", str(tmp_path / "x.npy"),
                     "-o", str(tmp_path / "y.npy"), "-v"]) == 0
    err = capsys.readouterr().err
    assert "?batch, ?seq are known only at run time" in err and "?batch=1, ?seq=12" in err
    assert "nn.dense" in err or "qnn.dense" in err or "fused.dense" in err   # the plan
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"),
                               eqquant.load(DATA / "tiny_encoder.onnx").run(x), atol=1e-5)


def test_the_command_line_prices_and_serves_an_open_batch(tmp_path, capsys):
    pytest.importorskip("onnx", reason="the onnx extra is not installed")
    rng = np.random.default_rng(6)
    np.save(tmp_path / "calib.npy", rng.standard_normal((3, 3, 16, 16)).astype(np.float32))
    np.save(tmp_path / "x.npy", rng.standard_normal((5, 3, 16, 16)).astype(np.float32))
    out = tmp_path / "q.ir"
    assert cli_exit(["quantize", str(DATA / "tiny_resnet.onnx"), "--calib",
                     str(tmp_path / "calib.npy"), "--mode", "minmax", "--cost", "cpu",
                     "--batch", "8", "-o", str(out)]) == 0
    assert "Tensor[(?N, 3, 16, 16), float32]" in out.read_text()
    capsys.readouterr()
    assert cli_exit(["run", str(out), "-x", str(tmp_path / "x.npy"), "-o",
                     str(tmp_path / "y.npy")]) == 0
    y = np.load(tmp_path / "y.npy")
    single = eqquant.load(out).run(np.load(tmp_path / "x.npy")[2:3])
    assert y.shape[0] == 5 and np.array_equal(y[2:3], single)
    capsys.readouterr()
    code = cli_exit(["compile", str(out), "-o", str(tmp_path / "lib")])
    said = capsys.readouterr()
    # (a CPU kind whose kernels for this program are not all launches refuses it, and says
    # why: never for its open batch)
    assert code == 0 or "known only at run time" not in said.err
    def runs_as_the_executor(lib: str) -> None:
        assert cli_exit(["run", str(tmp_path / lib), "-x", str(tmp_path / "x.npy"), "-o",
                         str(tmp_path / f"{lib}.npy")]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / f"{lib}.npy"), y)
    if code == 0:
        assert "its batch ?N open: any batch runs, in runs of 8 samples" in said.out
        runs_as_the_executor("lib")
        # a batched table of 2: the batch of 5 runs as two runs of 2 and one of 1; of 1: none
        for n, says in (("2", "in runs of 2 samples"), ("1", "one sample at a time")):
            assert cli_exit(["compile", str(out), "-o", str(tmp_path / f"lib{n}"),
                             "--batched", n]) == 0
            assert says in capsys.readouterr().out
            runs_as_the_executor(f"lib{n}")
    assert cli_exit(["quantize", str(DATA / "tiny_resnet.onnx"), "--calib",
                     str(tmp_path / "calib.npy"), "--size", "seq=4", "-o",
                     str(tmp_path / "r.ir")]) == 2
    assert "no open size ?seq" in capsys.readouterr().err


def test_the_sizes_served_choose_the_kernels_named_in_the_program():
    from eqquant.runtime.lowering.plan import choose, site_of
    from eqquant.runtime.target import current
    from eqquant.core.nodes import Call, Constant, Scalar, post_order
    m = eqquant.load(DATA / "tiny_resnet.onnx")
    calib = np.random.default_rng(7).standard_normal((3, 3, 16, 16)).astype(np.float32)
    named = {}
    def classifier(c) -> bool:
        """the dense layer: as it is, or as a 1x1 convolution over its rows (layout.rules)"""
        return isinstance(c, Call) and (c.op_name == "qnn.dense" or (
            c.op_name == "fused.qconv2d" and c.args[0].op_name == "expand_dims"))
    for n in (1, 8):
        q = eqquant.quantize(m, calib, mode="minmax", cost="cpu", sizes={"N": n})
        dense = next(c for c in post_order(q.module.main.body) if classifier(c))
        at_n = bind_sizes(q.module, {"N": n})
        types = infer_types(at_n)
        bound = next(c for c in post_order(at_n.main.body) if classifier(c))
        consts = {i: (a.data if isinstance(a, Constant) else a.value)
                  for i, a in enumerate(bound.args) if isinstance(a, (Constant, Scalar))}
        site = site_of(bound.op, bound.attrs, [types[id(a)] for a in bound.args],
                       types[id(bound)], consts)
        # (a dense site's kernel is chosen by its rows; a convolution's by its shape)
        assert site.rows == (n if bound.op_name == "qnn.dense" else None)
        # the kernel the program names is the target's choice for the site at n rows
        assert dense.attrs["kernel"] == choose(site, current()).kernel
        named[n] = dense.attrs["kernel"]
        x = np.random.default_rng(n).standard_normal((2, 3, 16, 16)).astype(np.float32)
        y = q.run(x)        # every batch runs, whatever kernel the program names
        np.testing.assert_array_equal(y[1:], q.run(x[1:]))


def test_onnx_export_keeps_an_open_batch(tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    from eqquant.interop.onnx_export import to_onnx
    import onnx
    m = eqquant.load(DATA / "tiny_resnet.onnx")
    from eqquant.ir.params import bind_params
    model = to_onnx(bind_params(m.module, m.params))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N" and [d.dim_value for d in dims[1:]] == [3, 16, 16]
    onnx.save(model, str(tmp_path / "out.onnx"))
    sess = ort.InferenceSession(str(tmp_path / "out.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(9).standard_normal((3, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x})[0], m.run(x),
                               rtol=1e-4, atol=1e-5)
