"""Adding an op is one registry entry plus its kernel function: this file registers a unary op
(ONNX's ThresholdedRelu at its default alpha: x where x > 1, else 0) with an fp32 Numba kernel and its ONNX form, and nothing else;
an ONNX model that uses it then imports, runs on the executor's kernel (not the reference)
and exports back, each step checked against ONNX Runtime."""
from __future__ import annotations

import numba
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from eqquant.interop.onnx_export import to_onnx
from eqquant.interop.onnx_import import import_onnx
from eqquant.ir.interp import run
from eqquant.ops.registry import ELEMWISE, UNARY, OnnxForm, OpDef, get_op, has_op, register
from eqquant.ops.typerel import float_input
from eqquant.runtime.execution.executor import Executor


@numba.njit(cache=False)
def _thresholded_kernel(x, out):
    for i in range(x.size):
        out[i] = x[i] if x[i] > np.float32(1) else np.float32(0)


def _thresholded(x):
    return np.where(x > 1, x, 0).astype(x.dtype)


# -- the one entry ---------------------------------------------------------------------------
if not has_op("test.thresholded_relu"):
    register(OpDef("test.thresholded_relu", inputs=("data",),
                   props=frozenset({ELEMWISE, UNARY}), type_rel=float_input,
                   semantics=_thresholded, doc="x where x > 1, else 0",
                   kernel="Elementwise",
                   kernel_params={"fn": _thresholded_kernel},
                   onnx=(OnnxForm("ThresholdedRelu"),)))


def _model() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ThresholdedRelu", ["r"], ["s"]),
             helper.make_node("Add", ["s", "x"], ["y"])]
    graph = helper.make_graph(
        nodes, "thresholded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def test_an_op_registered_here_imports_runs_on_its_kernel_and_exports():
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32) * 3
    model = _model()
    expected = _ort(model, x)
    mod, params, _ = import_onnx(model)
    assert not params
    assert "test.thresholded_relu" in str(mod)
    ex = Executor(mod)
    got = ex.run({mod.main.params[0].name: x})
    step = next(s for s in ex.steps if s.label.startswith("test.thresholded_relu"))
    assert step.kind == "kernel"                       # its own kernel, not the reference
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    ref = run(mod, {mod.main.params[0].name: x})
    np.testing.assert_allclose(ref, expected, rtol=1e-6, atol=1e-6)
    back = to_onnx(mod)
    assert any(n.op_type == "ThresholdedRelu" for n in back.graph.node)
    np.testing.assert_allclose(_ort(back, x), expected, rtol=1e-6, atol=1e-6)
    assert get_op("test.thresholded_relu").onnx[0].op_type == "ThresholdedRelu"
