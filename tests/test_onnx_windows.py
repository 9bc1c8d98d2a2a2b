"""Convolutions and pools over one and three spatial axes, drawn by hypothesis and checked
against ONNX Runtime: a 1-d Conv, MaxPool, AveragePool or ConvTranspose is read as the 2-d op
on a row one pixel high (so the 2-d kernels run it), a 3-d one as nn.conv3d, nn.max_pool3d or
nn.avg_pool3d; each runs on the reference interpreter and the executor, and exports back to a
model ONNX Runtime runs the same way."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from hypothesis import assume, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import helper  # noqa: E402

from eqquant import parse  # noqa: E402
from eqquant.errors import TypeCheckError  # noqa: E402
from eqquant.interop.onnx_import import import_onnx  # noqa: E402
from eqquant.ir.printer import print_module  # noqa: E402
from eqquant.ir.typecheck import infer_types  # noqa: E402
from eqquant.ops.numerics import padding_only_window  # noqa: E402
from eqquant.runtime.execution.executor import Executor  # noqa: E402
from test_onnx_ops import SETTINGS, _agree, _data, _model  # noqa: E402


def _window(data, dims, k_max=3):
    """Window attributes over ``dims`` axes: kernel, strides, dilations, pads (each pad
    smaller than the window: wider than half of it too, as PyTorch's opset-9 export
    pads a ceil-mode pool)."""
    kernel = [data.draw(st.integers(1, k_max)) for _ in range(dims)]
    strides = [data.draw(st.integers(1, 2)) for _ in range(dims)]
    dil = [data.draw(st.integers(1, 2)) for _ in range(dims)]
    pads = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]   # (ORT: a pad < kernel)
    return kernel, strides, dil, pads


def _fits(size, kernel, strides, dil, pads):
    n = len(kernel)
    return all(sz + pads[i] + pads[i + n] >= d * (k - 1) + 1
               for i, (sz, k, d) in enumerate(zip(size, kernel, dil)))


@SETTINGS
@given(dims=st.sampled_from([1, 3]), n=st.integers(1, 2), groups=st.integers(1, 2),
       cin=st.integers(1, 3), cout=st.integers(1, 3), bias=st.booleans(),
       seed=st.integers(0, 2 ** 16), data=st.data())
def test_conv_over_one_and_three_axes(dims, n, groups, cin, cout, bias, seed, data):
    size = [data.draw(st.integers(1, 6)) for _ in range(dims)]
    kernel, strides, dil, pads = _window(data, dims)
    assume(_fits(size, kernel, strides, dil, pads))
    rng = np.random.default_rng(seed)
    weight = rng.normal(size=(cout * groups, cin, *kernel)).astype(np.float32)
    inits = [("w", weight)] + ([("b", rng.normal(size=cout * groups).astype(np.float32))]
                               if bias else [])
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"],
                            kernel_shape=kernel, strides=strides, dilations=dil, pads=pads,
                            group=groups)
    shape = (n, cin * groups, *size)
    mod = _agree(_model([node], shape, inits=inits), _data(shape, seed=seed), tol=1e-4)
    assert ("nn.conv3d(" if dims == 3 else "nn.conv2d(") in str(mod)


@SETTINGS
@given(dims=st.sampled_from([1, 3]), op=st.sampled_from(["MaxPool", "AveragePool"]),
       ceil=st.booleans(), include_pad=st.booleans(), seed=st.integers(0, 2 ** 16),
       data=st.data())
def test_pools_over_one_and_three_axes(dims, op, ceil, include_pad, seed, data):
    size = [data.draw(st.integers(1, 6)) for _ in range(dims)]
    kernel, strides, dil, pads = _window(data, dims)
    if op == "AveragePool":
        dil = [1] * dims          # (AveragePool has dilations from opset 19 only)
        pads = [min(p, k - 1) for p, k in zip(pads, kernel * 2)]
    assume(_fits(size, kernel, strides, dil, pads))
    assume(not any(padding_only_window(sz, k, s, d, pads[i], pads[i + dims], ceil) is not None
                   for i, (sz, k, s, d) in enumerate(zip(size, kernel, strides, dil))))
    attrs = dict(kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=int(ceil))
    if op == "MaxPool":
        attrs["dilations"] = dil
    else:
        attrs["count_include_pad"] = int(include_pad)
    shape = (2, 3, *size)
    mod = _agree(_model([helper.make_node(op, ["x"], ["y"], **attrs)], shape),
                 _data(shape, seed=seed))
    pool = {"MaxPool": "max_pool", "AveragePool": "avg_pool"}[op]
    assert f"nn.{pool}{3 if dims == 3 else 2}d(" in str(mod)


@SETTINGS
@given(n=st.integers(1, 2), cin=st.integers(1, 3), cout=st.integers(1, 3),
       length=st.integers(1, 6), k=st.integers(1, 3), stride=st.integers(1, 3),
       seed=st.integers(0, 2 ** 16), data=st.data())
def test_conv_transpose_over_one_axis(n, cin, cout, length, k, stride, seed, data):
    pads = [data.draw(st.integers(0, k - 1)) for _ in range(2)]
    out_pad = [data.draw(st.integers(0, stride - 1))]
    assume((length - 1) * stride + k + out_pad[0] - sum(pads) >= 1)
    weight = np.random.default_rng(seed).normal(size=(cin, cout, k)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[stride], pads=pads,
                            output_padding=out_pad)
    shape = (n, cin, length)
    mod = _agree(_model([node], shape, inits=[("w", weight)]), _data(shape, seed=seed),
                 tol=1e-4)
    assert "nn.conv2d_transpose(" in str(mod)


def test_a_one_d_convolution_and_pool_run_on_the_two_d_kernels():
    """The row a 1-d op is read as runs on the 2-d ops' kernels, not on reference code."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3], pads=[1, 1]),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2], strides=[2])]
    model = _model(nodes, (1, 4, 16), inits=[("w", rng.normal(size=(8, 4, 3)).astype(
        np.float32))])
    x = _data((1, 4, 16))
    _agree(model, x, tol=1e-4)
    mod, params, _ = import_onnx(model)
    from eqquant.ir.params import bind_params
    ex = Executor(bind_params(mod, params))
    ex.run({mod.main.params[0].name: x})
    kinds = {s.label.split(" ")[0]: s.kind for s in ex.steps}
    assert kinds["nn.conv2d"] == "kernel" and kinds["nn.max_pool2d"] == "kernel", kinds


def test_three_d_ops_in_the_text_ir_round_trip_and_type_check():
    text = """
def @main(%x: Tensor[(1, 2, 4, 6, 6), float32], %w: Tensor[(3, 2, 3, 3, 3), float32]) {
  %0 = nn.conv3d(%x, %w, padding=[1, 1, 1, 1, 1, 1], strides=[1, 2, 2]);
  %1 = nn.max_pool3d(%0, pool_size=[2, 2, 2], strides=[2, 2, 2]);
  nn.avg_pool3d(%1, pool_size=[1, 3, 3], padding=[0, 1, 1, 0, 1, 1], count_include_pad=True)
}
"""
    mod = parse(text)
    printed = print_module(mod)
    assert print_module(parse(printed)) == printed
    types = infer_types(mod)
    assert types[id(mod.main.body)].shape == (1, 3, 2, 1, 1)
    x = _data((1, 2, 4, 6, 6))
    w = _data((3, 2, 3, 3, 3), seed=1)
    got = Executor(mod).run({"x": x, "w": w})
    assert got.shape == (1, 3, 2, 1, 1) and np.isfinite(got).all()
    # a window that does not fit is a located type error
    with pytest.raises(TypeCheckError, match="does not fit"):
        infer_types(parse(text.replace("(1, 2, 4, 6, 6)", "(1, 2, 1, 6, 6)").replace(
            "padding=[1, 1, 1, 1, 1, 1], ", "")))


def test_a_pool_window_that_reads_only_padding_is_refused():
    """A dilated window may straddle the input and read only padding (ONNX Runtime then
    gives -FLT_MAX for a maximum): a located error, in 2-d as in 3-d."""
    from eqquant.interop.onnx_import import OnnxImportError
    for shape, attrs in (((1, 1, 1, 4), dict(kernel_shape=[2, 1], dilations=[2, 1],
                                             pads=[1, 0, 1, 0])),
                         ((1, 1, 1, 4, 4), dict(kernel_shape=[2, 1, 1], dilations=[2, 1, 1],
                                                pads=[1, 0, 0, 1, 0, 0]))):
        with pytest.raises(OnnxImportError, match="reads only padding"):
            import_onnx(_model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], shape))


@pytest.mark.parametrize("dtype", ["float32", "uint8", "int8"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_pool_padded_wider_than_half_its_window_runs_on_the_kernels(dtype, layout):
    """PyTorch's opset-9 export writes a ceil-mode pool (GoogLeNet's) as explicit padding at
    the far end, 2 on a 3x3 window: every window still holds a value, and the kernels give
    the reference's bits."""
    from eqquant.ir.interp import run
    shape = (1, 3, 9, 9) if layout == "NCHW" else (1, 9, 9, 3)
    text = (f"def @main(%x: Tensor[{shape}, {dtype}]) {{ nn.max_pool2d(%x, pool_size=[3, 3], "
            f"strides=[2, 2], padding=[0, 0, 2, 2], layout=\"{layout}\") }}")
    mod = parse(text)
    rng = np.random.default_rng(0)
    x = (rng.normal(size=shape) * 50).astype(dtype) if dtype == "float32" else \
        rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, shape).astype(dtype)
    ex = Executor(mod)
    got = ex.run({"x": x})
    assert [s.kind for s in ex.steps] == ["kernel"]
    np.testing.assert_array_equal(got, run(mod, {"x": x}))
    assert got.shape[2 if layout == "NCHW" else 1] == 5
