"""Dynamic quantization (``quantize --mode dynamic``, as ONNX Runtime's quantize_dynamic): the
operands of the compute ops marked with parameters computed from each input as it runs
(``qnn.dynamic_scale`` and ``qnn.dynamic_zero_point`` of one ``qnn.dynamic_range``), the same
rules moving the work into integers, the kernels giving the reference's bits."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from eqquant.core.nodes import Call, post_order
from eqquant.ir.interp import run
from eqquant.ir.parser import parse
from eqquant.ops.numerics import MIN_SCALE
from eqquant.ops.qnn import dynamic_params
from eqquant.quant.annotate import annotate
from eqquant.quant.calibrate import CalibrationTable
from eqquant.quant.flow import quantize
from eqquant.runtime.execution.executor import Executor

from conftest import bert_sample, cli_exit
from soundness_programs import dense_program

PARAMS = """def @main(%x: Tensor[(4, 6), float32]) {
  %r = qnn.dynamic_range(%x);
  %0 = qnn.dynamic_scale(%r, dtype="DT");
  %1 = qnn.dynamic_zero_point(%r, dtype="DT");
  %2 = qnn.quantize(%x, %0, %1, out_dtype="DT");
  qnn.dequantize(%2, %0, %1)
}
"""

FLOATS = hnp.arrays(np.float32, (4, 6), elements=st.floats(
    -1e6, 1e6, allow_nan=False, allow_infinity=False, width=32))


def _special(kind: str, rng, shape=(4, 6)) -> np.ndarray:
    x = rng.normal(0, 2, shape).astype(np.float32)
    if kind == "nonfinite":
        x[0, :3] = [np.inf, -np.inf, np.nan]
    elif kind == "zeros":
        x[:] = 0
    elif kind == "one value":
        x[:] = 3.5
    elif kind == "denormal":
        x = (x * 1e-40).astype(np.float32)
    elif kind == "all nan":
        x[:] = np.nan
    elif kind == "positive":
        x = np.abs(x) + 1
    return x


@pytest.mark.parametrize("shape", [(4, 6), (300, 257)])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("kind", ["normal", "nonfinite", "zeros", "one value", "denormal",
                                  "all nan", "positive", "extremes late"])
def test_the_dynamic_parameters_run_as_kernels_with_the_references_bits(dtype, kind, shape):
    """qnn.dynamic_scale and qnn.dynamic_zero_point, and the quantize and dequantize that read
    them at run time, are kernels (launches) on this CPU, and give the reference's bits on
    ordinary tensors and on the awkward ones: infinities and NaN (they take no part in the
    range), all zeros, one value, denormals, no finite value at all; on few values (one
    thread) and on many (the range in shares, a thread each, the extremes in the last
    share's remainder too)."""
    mod = parse(PARAMS.replace("DT", dtype).replace("(4, 6)", str(shape)))
    ex = Executor(mod)
    kinds = {st.node.op_name: st.kind for st in ex.steps if st.node is not None}
    assert kinds == {"qnn.dynamic_range": "kernel", "qnn.dynamic_scale": "kernel",
                     "qnn.dynamic_zero_point": "kernel", "qnn.quantize": "kernel",
                     "qnn.dequantize": "kernel"}, kinds
    x = _special(kind, np.random.default_rng(7), shape)
    if kind == "extremes late":
        x.reshape(-1)[-1], x.reshape(-1)[-2] = 40.0, -30.0
    got, want = ex.run({"x": x}), run(mod, {"x": x})
    np.testing.assert_array_equal(got, want)
    scale, zero = dynamic_params(x, dtype)
    assert scale >= MIN_SCALE and (zero == 0 if dtype == "int8" else 0 <= zero <= 255)
    if kind == "zeros" or kind == "all nan":
        assert (scale, zero) == (1.0, 0)
    if kind == "positive" and dtype == "uint8":
        assert zero == 0          # the range covers 0: [0, max]
    finite = np.isfinite(x)
    if kind not in ("denormal", "all nan"):
        # every finite value comes back within half a step of itself
        assert np.all(np.abs(got[finite] - x[finite]) <= scale / 2 * (1 + 1e-5) + 1e-30)


@settings(max_examples=60, deadline=None)
@given(x=FLOATS)
@example(x=np.full((4, 6), 1e-45, np.float32))     # (a range whose scale underflows float32)
@example(x=np.zeros((4, 6), np.float32))            # (no range: the scale 1.0 for both)
def test_uint8_parameters_agree_with_onnx_runtimes_dynamic_quantize_linear(x):
    """ONNX's DynamicQuantizeLinear (ONNX Runtime): the same scale within one float32 step
    (it divides in float32, eqquant in float64 rounded once; a range so narrow that its
    scale would be below 1e-12 gets 1e-12, as calibration's) and the same 8-bit values within
    one step."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [4, 6]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("z", TensorProto.UINT8, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y, s, z = sess.run(None, {"x": x})
    scale, zero = dynamic_params(x, "uint8")
    if float(s) < MIN_SCALE:             # a range below 255 * 1e-12: eqquant's least scale
        #                                  (ONNX Runtime's float32 division gives 0 on denormals)
        assert scale == MIN_SCALE
        return
    assert abs(scale - float(s)) <= float(np.spacing(np.float32(s))), (scale, s)
    assert abs(zero - int(z)) <= 1
    q = run(parse(PARAMS.replace("DT", "uint8").replace(
        "qnn.dequantize(%2, %0, %1)", "%2")), {"x": x})
    assert np.max(np.abs(q.astype(np.int64) - y)) <= 1


def test_a_bert_encoder_quantizes_dynamically_in_integers(tmp_path):
    """The zoo's BERT-style encoder, dynamic: every dense layer and attention product in
    integers, their inputs quantized at run time and nothing else (no calibration: the
    table is empty, the report says so); more accurate than static calibration on the same
    data; the executor computes the reference's values on inputs it never saw."""
    import eqquant
    from eqquant.zoo import build
    m = build("bert_tiny", seq=8)
    rng = np.random.default_rng(3)

    def sample():
        return bert_sample(rng)
    data = [sample() for _ in range(6)]
    model = eqquant.load(m.module, m.params)
    q = eqquant.quantize(model, data, mode="dynamic", per_channel=True)
    static = eqquant.quantize(model, data, mode="minmax", per_channel=True)
    module = q.quantized.module
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.batch_matmul") == 4 and "nn.batch_matmul" not in names
    assert names.count("qnn.dense") == 13 and "nn.dense" not in names
    # each quantized operand's range and parameters computed once, however many layers
    # read it
    assert names.count("qnn.dynamic_range") == names.count("qnn.dynamic_scale") == \
        names.count("qnn.dynamic_zero_point") == names.count("qnn.quantize") == 17
    assert q.quantized.table.mode == "dynamic" and not q.quantized.table.ranges
    assert "calibration dynamic" in q.report().text
    assert q.report().output["sqnr"] >= static.report().output["sqnr"]
    ex = Executor(q.quantized.runnable)
    kinds = {st.node.op_name: st.kind for st in ex.steps if st.node is not None}
    for op in ("qnn.dynamic_range", "qnn.dynamic_scale", "qnn.dynamic_zero_point",
               "qnn.quantize", "qnn.dequantize", "qnn.dense", "qnn.batch_matmul"):
        assert kinds[op] == "kernel", (op, kinds[op])
    for _ in range(3):
        s = sample()
        # (the pooler's tanh stays float, and its kernel rounds once from float64: an ulp
        # from numpy's float32 tanh; everything before it is the reference's bits)
        np.testing.assert_allclose(ex.run(s), run(q.quantized.runnable, s), rtol=1e-6,
                                   atol=1e-7)
    # its parameters have no QDQ form: the export says so, and writes nothing
    from eqquant.errors import EqquantError
    with pytest.raises(EqquantError, match="computed at run time"):
        q.export_onnx(tmp_path / "dynamic.onnx")
    assert not (tmp_path / "dynamic.onnx").exists()


LAYER = """def @main(%x: Tensor[(3, 256), float32], %w: Tensor[(256, 256), float32],
          %b: Tensor[(256), float32]) {
  ACT(add(nn.dense(%x, %w), %b))
}
"""


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("act", ["nn.relu", "clip", ""])
def test_a_dynamic_layer_computes_the_marked_layer_on_any_input(dtype, act):
    """Soundness: the dynamic program extraction picks computes what the marked program
    computes (the dense layer an exact identity of integer arithmetic, the bias added in
    float), on inputs of any scale and sign: tiny ones too, whose scale computed at run time
    would put an integer bias past int32; the kernels give the integer reference's bits.
    (One layer: in a chain, a float rounding apart moves the next layer's range, computed
    from its input, and with it every value's step.)"""
    rng = np.random.default_rng(11)
    text = LAYER.replace("ACT", act) if act != "clip" else \
        LAYER.replace("ACT(add(nn.dense(%x, %w), %b))",
                      "clip(add(nn.dense(%x, %w), %b), a_min=-1f, a_max=2f)")
    params = {"w": rng.normal(0, 0.5, (256, 256)).astype(np.float32),
              "b": rng.normal(0, 0.3, (256,)).astype(np.float32)}
    samples = [rng.uniform(0, 1, (3, 256)).astype(np.float32) for _ in range(3)]
    r = quantize(parse(text), params, samples, "dynamic", dtype=dtype, per_channel=True)
    names = [n.op_name for n in post_order(r.module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.dense") == 1 and "fused.dense" not in names, names
    marked = annotate(r.fp32, CalibrationTable("dynamic", {}), dtype, "max", True,
                      dynamic=True)
    ex = Executor(r.module)
    for scale in (1.0, -3.0, 1e4, 1e-7):
        x = {"x": (rng.uniform(-1, 1, (3, 256)) * scale).astype(np.float32)}
        want, got = run(marked, x), run(r.module, x)
        np.testing.assert_array_equal(ex.run(x), got)
        # the same integers, scaled and summed in another order: float32 rounding apart
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_the_command_line_quantizes_dynamically(tmp_path):
    """``eqquant quantize --mode dynamic`` writes a program that loads and runs as written,
    its calibration table empty of ranges."""
    import json
    rng = np.random.default_rng(2)
    text, params = dense_program(rng, 8, ["relu", "none"])
    (tmp_path / "m.ir").write_text(text)
    np.savez(tmp_path / "m.npz", **params)
    np.savez(tmp_path / "calib.npz", x=rng.uniform(0, 1, (4, 1, 8)).astype(np.float32))
    out = tmp_path / "m.int8.ir"
    assert cli_exit(["quantize", str(tmp_path / "m.ir"), "--calib", str(tmp_path / "calib.npz"),
                     "--mode", "dynamic", "-o", str(out)]) == 0
    # its library: the parameters computed at run time by launches too, the executor's bits
    np.save(tmp_path / "x.npy", rng.uniform(-2, 2, (1, 8)).astype(np.float32))
    assert cli_exit(["compile", str(out), "-o", str(tmp_path / "lib")]) == 0
    assert cli_exit(["run", str(tmp_path / "lib"), "-x", str(tmp_path / "x.npy"),
                     "-o", str(tmp_path / "lib.npy")]) == 0
    assert cli_exit(["run", str(out), "-x", str(tmp_path / "x.npy"), "--engine", "executor",
                     "-o", str(tmp_path / "ex.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "lib.npy"), np.load(tmp_path / "ex.npy"))
    table = json.loads(out.with_suffix(".calib.json").read_text())
    assert table["mode"] == "dynamic" and table["ranges"] == {}
    assert "qnn.dynamic_scale" in out.read_text()
    import eqquant
    again = eqquant.load(out)
    x = rng.uniform(-2, 2, (1, 8)).astype(np.float32)
    # (a float layer's kernel sums in its own order: float32 rounding apart)
    np.testing.assert_allclose(again.run(x), run(again.module, {"x": x}, again.params),
                               rtol=1e-5, atol=1e-6)
