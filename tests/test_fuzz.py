"""The fuzz suite: mutated programs, rule files, .npz files and ONNX models through the entry
points a user reaches. Every input must end in success or in eqquant's own error (with a
location where the input is text); never another exception, a hang, or a NaN written into a
program. CI runs a fixed, derandomized budget; `pytest -m fuzz --hypothesis-profile long`
runs a long one. pytest's summary says how many inputs each fuzzer ran."""
from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzzing import IR_TOKENS, RAN, RULE_TOKENS, mutated, mutated_bytes
from eqquant.errors import (ArityError, AttrError, EqquantError, NameError_, ParseError,
                            RuleError, TypeCheckError)
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.ir.typecheck import check_module

pytestmark = pytest.mark.fuzz

LOCATED = (ParseError, TypeCheckError, NameError_, AttrError, ArityError)


def _budget(n: int) -> int:
    """The CI budget, or the profile's own when a long profile is loaded."""
    return max(n, settings.default.max_examples) if settings.default.max_examples > 1000 else n


def _fuzz_settings(n: int):
    return settings(max_examples=_budget(n), deadline=60_000, derandomize=True,
                    suppress_health_check=list(HealthCheck), database=None)


def _ir_corpus() -> list[str]:
    from eqquant.zoo.models import build
    return [
        print_module(build("resnet18_stem", image_size=8).module),
        print_module(build("conv_bn").module),
        "def @main(%x: Tensor[(1, 4), float32], %w: Tensor[(3, 4), float32]) {\n"
        "  %0 = nn.dense(%x, %w);\n  %1 = nn.relu(%0);\n  (%1, nn.softmax(%1))\n}\n",
        "def @main(%x: Tensor[(1, 2, 4, 4), float32]) {\n"
        "  %0 = qnn.quantize(%x, 0.1f, 3, out_dtype=\"uint8\");\n"
        "  %1 = nn.max_pool2d(%0, pool_size=[2, 2], strides=[2, 2]);\n"
        "  qnn.dequantize(%1, 0.1f, 3) /* ty=Tensor[(1, 2, 2, 2), float32] */\n}\n",
        "def @main(%x: Tensor[(2, 3), float32]) {\n  %0 = fn (%p: Tensor[(2, 3), float32], "
        "Composite=\"c\") { nn.relu(%p) };\n  %1 = %0(%x);\n  reshape(%1, newshape=[3, 2])\n}\n",
    ]


IR_CORPUS = _ir_corpus()


def _small_inputs(mod):
    rng = np.random.default_rng(0)
    out = {}
    for p in mod.main.params:
        t = p.type
        if not hasattr(t, "shape") or t.size > 100_000:
            return None
        if t.dtype.startswith("float"):
            out[p.name] = rng.normal(size=t.shape).astype(t.dtype)
        elif t.dtype == "bool":
            out[p.name] = rng.integers(0, 2, t.shape).astype(bool)
        else:
            info = np.iinfo(t.dtype)
            out[p.name] = rng.integers(max(info.min, -100), min(info.max, 100),
                                       t.shape).astype(t.dtype)
    return out


@_fuzz_settings(1500)
@given(text=mutated(IR_CORPUS, IR_TOKENS))
def test_fuzz_ir_text(text):
    RAN["ir text (parse, type-check, print, run)"] += 1
    try:
        mod = parse(text, "fuzz.ir")
        check_module(mod)
        out = print_module(mod)
    except LOCATED as e:
        assert e.loc is not None, e.format()
        return
    except EqquantError:
        return
    again = parse(out, "printed.ir")            # what fmt prints reads back, the same
    assert print_module(again) == out
    inputs = _small_inputs(mod)
    if inputs is not None:
        from eqquant.ir.interp import run
        with np.errstate(all="ignore"):
            try:
                run(mod, inputs)
            except EqquantError:
                pass


def _rules_corpus() -> list[str]:
    from eqquant.resources import rules_dir
    return [p.read_text() for p in sorted(rules_dir().glob("*.rules"))]


RULES_CORPUS = _rules_corpus()


@_fuzz_settings(150)
@given(text=mutated(RULES_CORPUS, RULE_TOKENS, max_edits=3))
def test_fuzz_rules_files(text):
    """Mutated rule files: load, compile to egglog, and load into an e-graph."""
    RAN["rules files (load, compile, egglog)"] += 1
    from eqquant.rules.loader import parse_rules
    try:
        rs = parse_rules(text, str(Path(tempfile.gettempdir()) / "fuzz.rules"))
    except RuleError as e:
        assert e.loc is not None, e.format()
        return
    except EqquantError:
        return
    from eqquant.egraph.engine import EGraphSession
    from eqquant.ir.parser import parse as parse_ir
    session = EGraphSession(parse_ir("def @main(%x: Tensor[(1, 2), float32]) { nn.relu(%x) }"))
    from eqquant.rules.compile import compile_ruleset
    try:
        session.add_ruleset(compile_ruleset(rs))
    except EqquantError as e:
        assert "egglog rejected" not in e.message, e.message   # a bug of ours if it does
        raise


def _npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


NPZ_CORPUS = [
    _npz_bytes(data=np.ones((2, 1, 4), np.float32), w=np.arange(6, dtype=np.int8)),
    _npz_bytes(**{"meta[relay.Constant][0]": np.zeros((3,), np.float64)}),
]


@_fuzz_settings(800)
@given(data=mutated_bytes(NPZ_CORPUS))
def test_fuzz_npz_and_calibration_files(data, tmp_path_factory):
    RAN[".npz and calibration files"] += 1
    from eqquant.api import calibration_samples, load
    from eqquant.ir.params import load_params
    path = tmp_path_factory.mktemp("npz") / "f.npz"
    path.write_bytes(data)
    try:
        values = load_params(path)
        for k in values:
            np.asarray(values[k])
    except EqquantError:
        return
    model = load(parse("def @main(%data: Tensor[(1, 4), float32]) { nn.relu(%data) }"))
    try:
        samples = calibration_samples(path, model)
        for s in samples:
            assert set(s) <= {"data"}
    except EqquantError:
        pass


def _onnx_corpus() -> list[bytes]:
    onnx_models = pytest.importorskip("onnx_models")
    return [onnx_models.resnet_block(4).SerializeToString(),
            onnx_models.mobilenet_block(4, 2).SerializeToString(),
            onnx_models.classifier_head(8, 3).SerializeToString(),
            onnx_models.many_ops().SerializeToString()]


@st.composite
def _onnx_model(draw):
    """A corpus model with bytes flipped, or with one node's op type, attribute or one
    initializer's dimensions changed (structure-aware: these get past protobuf)."""
    import onnx
    corpus = _onnx_corpus()
    if draw(st.booleans()):
        return draw(mutated_bytes(corpus))
    model = onnx.load_from_string(draw(st.sampled_from(corpus)))
    nodes = model.graph.node
    node = nodes[draw(st.integers(0, len(nodes) - 1))]
    kind = draw(st.sampled_from(["op", "attr", "dims", "input"]))
    if kind == "op":
        from eqquant.ops.registry import onnx_forms
        node.op_type = draw(st.sampled_from(sorted(onnx_forms()) + ["Loop", "ConstantOfShape"]))
    elif kind == "attr" and node.attribute:
        a = node.attribute[draw(st.integers(0, len(node.attribute) - 1))]
        value = draw(st.sampled_from([0, -1, 2 ** 31, 2 ** 62, 7]))
        if a.ints:
            a.ints[draw(st.integers(0, len(a.ints) - 1))] = value
        else:
            a.i = value
    elif kind == "dims" and model.graph.initializer:
        init = model.graph.initializer[draw(st.integers(0, len(model.graph.initializer) - 1))]
        if init.dims:
            init.dims[draw(st.integers(0, len(init.dims) - 1))] = draw(
                st.sampled_from([0, 1, 3, 2 ** 40]))
    elif node.input:
        node.input[draw(st.integers(0, len(node.input) - 1))] = draw(
            st.sampled_from(["", "nope", nodes[0].output[0]]))
    return model.SerializeToString()


@_fuzz_settings(700)
@given(data=_onnx_model())
def test_fuzz_onnx_import(data, tmp_path_factory):
    pytest.importorskip("onnx")
    RAN["ONNX models (import, type-check, run)"] += 1
    from eqquant.interop.onnx_import import import_onnx
    path = tmp_path_factory.mktemp("onnx") / "fuzz.onnx"
    path.write_bytes(data)
    try:
        mod, params, _ = import_onnx(path)
    except EqquantError:
        return
    check_module(mod)
    inputs = _small_inputs(mod)
    if inputs is not None:
        from eqquant.ir.interp import run
        with np.errstate(all="ignore"):
            try:
                run(mod, {**inputs, **params})
            except EqquantError:
                pass


# -- shapes and quantization parameters past the ordinary: every engine agrees or refuses --

_SHAPED = [
    "sum(%x, axis=[{a}])", "mean(%x, axis=[{a}], keepdims=True)", "max(%x, axis=[{a}])",
    "min(%x)", "reshape(%x, newshape=[-1])", "expand_dims(%x, axis=0, num_newaxis={n})",
    "transpose(%x)", "nn.relu(%x)", "add(%x, %x)", "nn.softmax(%x, axis={a})",
    "squeeze(%x)", "strided_slice(%x, begin=[0], end=[{n}], axes=[{a}])",
]
_SCALES = ["0f", "-1f", "1e-30f", "1e30f", "0.5f", "3.4e38f", "1e-45f"]


@st.composite
def _shaped_program(draw):
    rank = draw(st.sampled_from([0, 1, 2, 3, 4, 7, 33, 40]))
    dims = draw(st.lists(st.sampled_from([0, 1, 2, 3]), min_size=rank, max_size=rank))
    kind = draw(st.sampled_from(["shape", "quantize", "requantize"]))
    shape = ", ".join(map(str, dims)) + ("," if rank == 1 else "")
    if kind == "shape":
        body = draw(st.sampled_from(_SHAPED)).format(
            a=draw(st.integers(-2, max(rank, 1))), n=draw(st.sampled_from([1, 2, 40, 100000])))
        return f"def @main(%x: Tensor[({shape}), float32]) {{ {body} }}"
    s1, s2 = draw(st.sampled_from(_SCALES)), draw(st.sampled_from(_SCALES))
    z = draw(st.sampled_from([0, 128, -129, 300]))
    if kind == "quantize":
        return (f"def @main(%x: Tensor[({shape}), float32]) {{ "
                f"qnn.quantize(%x, {s1}, {z}, out_dtype=\"uint8\") }}")
    return (f"def @main(%x: Tensor[({shape}), int32]) {{ "
            f"qnn.requantize(%x, {s1}, 0, {s2}, {z}, out_dtype=\"int8\") }}")


@_fuzz_settings(250)
@given(text=_shaped_program())
def test_fuzz_zero_sizes_extreme_ranks_and_quantization_parameters(text):
    """Zero-size tensors, ranks up to 40, scales of 0, negative, denormal or huge, zero
    points out of range: the reference and the executor give the same result, or both
    refuse with eqquant's own error; nothing else is raised, nothing crashes."""
    RAN["zero sizes, extreme ranks, quantization parameters (both engines)"] += 1
    from eqquant.ir.interp import run
    from eqquant.runtime.execution.executor import Executor
    try:
        mod = parse(text, "fuzz.ir")
        check_module(mod)
    except LOCATED as e:
        assert e.loc is not None, e.format()
        return
    inputs = _small_inputs(mod)
    outcomes = []
    for engine in (lambda: run(mod, inputs), lambda: Executor(mod).run(inputs)):
        with np.errstate(all="ignore"):
            try:
                outcomes.append(("value", engine()))
            except EqquantError as e:
                outcomes.append(("refused", e.message))
    (kind_a, a), (kind_b, b) = outcomes
    assert kind_a == kind_b, (text, outcomes)
    if kind_a == "value":
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert x.shape == y.shape and x.dtype == y.dtype, text
            np.testing.assert_array_equal(x, y, err_msg=text)
