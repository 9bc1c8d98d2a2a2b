"""Residual sums fused into the convolution (``rules/residual.rules``, fused.qconv2d_add):
the rules fire in the layout phase on either operand order, the fused op computes the bits of
the qnn.add it stands for on every int8 path, and its type, export and fallbacks behave."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from eqquant.core.nodes import Call, post_order
from eqquant.errors import TypeCheckError
from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.ir.parser import parse
from eqquant.ir.typecheck import check_module
from eqquant.runtime.execution.executor import Executor
from kernel_paths import forced_int8_path, int8_paths


_NAMES = itertools.count()


def _p(b, value):
    """A constant parameter of a fresh name."""
    return b.param(f"p{next(_NAMES)}", value)


def _conv_args(b, rng, c, o, k, dtype, layout, z2=5):
    """fused.qconv2d's operands after the image: C -> O channels, to 8 bits at 0.1, z2."""
    last = layout == "NHWC"
    w = rng.integers(-128, 128, (o, c, k, k)).astype("i1")
    sw = rng.uniform(0.01, 0.02, o).astype(np.float32)
    return [_p(b, np.ascontiguousarray(w.transpose(2, 3, 1, 0)) if last else w),
            _p(b, rng.integers(-900, 900, (o,) if last else (o, 1, 1)).astype("i4")),
            _p(b, np.array(3 if dtype == "uint8" else 0, np.int32)),
            _p(b, np.array(0, np.int32)), _p(b, np.array(0.05, np.float32)), _p(b, sw),
            _p(b, np.float32(0.05) * sw),        # the accumulator's scale: sx * sw
            _p(b, np.array(0, np.int32)), _p(b, np.array(0.1, np.float32)),
            _p(b, np.array(z2 if dtype == "uint8" else 0, np.int32))]


def _block(b, x, rng, c, o, k, stride, pad, dtype, layout, act="none"):
    """A fused int8 convolution of ``x`` (C -> O channels) to 8 bits at scale 0.1 (its
    output's scale and zero point: the call's last two operands)."""
    last = layout == "NHWC"
    extra = dict(a_min=0.0, a_max=2.0) if act == "clip" else {}
    return b.call(
        "fused.qconv2d", x, *_conv_args(b, rng, c, o, k, dtype, layout),
        strides=[stride] * 2, padding=[pad] * 4, activation=act, out_dtype=dtype,
        axis=3 if last else 1, data_layout=layout,
        kernel_layout="HWIO" if last else "OIHW", **extra)


def _sum(b, lhs, rhs, params, method="once"):
    """qnn.add(lhs, rhs) with (sa, za, sb, zb, so, zo) = ``params``."""
    kinds = (np.float32, np.int32) * 3
    return b.call("qnn.add", lhs, rhs, *[_p(b, np.array(v, t)) for v, t in zip(params, kinds)],
                  method=method)


@settings(max_examples=15, deadline=None)
@given(c=st.integers(1, 9), o=st.integers(1, 150), k=st.sampled_from([1, 3]),
       stride=st.integers(1, 2), size=st.integers(3, 22), dtype=st.sampled_from(["int8",
                                                                                "uint8"]),
       act=st.sampled_from(["none", "relu", "clip"]), first=st.booleans(),
       layout=st.sampled_from(["NHWC", "NCHW"]), batch=st.integers(1, 2),
       ratio=st.sampled_from([0.7, 3.0, 100.0]), seed=st.integers(0, 999))
# a small image split by channel blocks and pixel shares; a last block of 96 of 128 lanes
@example(c=5, o=160, k=1, stride=1, size=7, dtype="uint8", act="none", first=True,
         layout="NHWC", batch=1, ratio=0.7, seed=1)
@example(c=4, o=96, k=3, stride=1, size=16, dtype="uint8", act="relu", first=False,
         layout="NHWC", batch=1, ratio=3.0, seed=2)
def test_a_fused_residual_sum_gives_the_bits_of_the_sum_on_every_path(
        c, o, k, stride, size, dtype, act, first, layout, batch, ratio, seed):
    """fused.qconv2d_add (made by the layout phase from a convolution and a qnn.add, the
    convolution either operand) computes the unfused program's bits on every int8 path the
    CPU has: the residual summed in each work item's tile on the SIMD ones, after the
    convolution elsewhere (NCHW, the portable path, a residual scale 77 times the sum's:
    multipliers past the int32 split)."""
    from eqquant.quant.flow import compile_layouts
    rng = np.random.default_rng(seed)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    shape = (batch, size, size, c) if layout == "NHWC" else (batch, c, size, size)
    b = Builder()
    x = b.input("x", shape, dtype)
    y = _block(b, x, rng, c, o, k, stride, 1 if k == 3 else 0, dtype, layout, act)
    out_hw = (size + 2 * (1 if k == 3 else 0) - k) // stride + 1
    rshape = (batch, out_hw, out_hw, o) if layout == "NHWC" else (batch, o, out_hw, out_hw)
    r = b.input("r", rshape, dtype)
    zr, zo = (7, 2) if dtype == "uint8" else (0, 0)
    z2 = 5 if dtype == "uint8" else 0
    s = _sum(b, y, r, (0.1, z2, 0.1 * ratio, zr, 0.1 * 1.3, zo)) if first else \
        _sum(b, r, y, (0.1 * ratio, zr, 0.1, z2, 0.1 * 1.3, zo))
    unfused = bind_params(*b.finish(s))
    from eqquant.runtime.lowering.plan import unplanned
    fused = unplanned(compile_layouts(unfused).module)     # (planned for each path below)
    ops = [n.op_name for n in post_order(fused.main.body) if isinstance(n, Call)]
    assert "fused.qconv2d_add" in ops and "qnn.add" not in ops
    xs = {"x": rng.integers(lo, hi, shape).astype(dtype),
          "r": rng.integers(lo, hi, rshape).astype(dtype)}
    want = run(unfused, xs)
    np.testing.assert_array_equal(run(fused, xs), want)
    for path in int8_paths():
        with forced_int8_path(path):
            ex = Executor(fused)
            step = next(st_ for st_ in ex.steps if st_.label == "fused.qconv2d_add")
            # in the tile on a SIMD path where the layout phase left the sum channel-last
            # and the multipliers split; otherwise the convolution, then the sum
            assert step.fn.in_tile == (step.fn.conv.simd is not None and
                                       step.fn.channels_last and ratio / 1.3 < 64)
            np.testing.assert_array_equal(ex.run(xs), want)


def _residual_block(method):
    """x -> conv -> conv, summed with x (a ResNet basic block's shape), uint8 or int8."""
    dtype = "uint8" if method == "once" else "int8"
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (1, 8, 8, 16), dtype)
    y = _block(b, x, rng, 16, 16, 3, 1, 1, dtype, "NHWC", "relu")
    y = _block(b, y, rng, 16, 16, 3, 1, 1, dtype, "NHWC")
    z = 5 if dtype == "uint8" else 0
    out = _sum(b, y, x, (0.1, z, 0.1, z, 0.12, 0), method)
    return bind_params(*b.finish(out)), dtype


def test_only_the_sum_rounding_once_is_fused():
    """TVM's realize sum (two roundings) has no fused form: it stays a qnn.add."""
    from eqquant.quant.flow import compile_layouts
    for method, fused in (("once", True), ("realize", False)):
        mod, dtype = _residual_block(method)
        out = compile_layouts(mod).module
        ops = [n.op_name for n in post_order(out.main.body) if isinstance(n, Call)]
        assert ("fused.qconv2d_add" in ops) == fused and ("qnn.add" in ops) != fused
        xs = {"x": np.random.default_rng(1).integers(0 if dtype == "uint8" else -128, 128,
                                                     (1, 8, 8, 16)).astype(dtype)}
        np.testing.assert_array_equal(Executor(out).run(xs), run(mod, xs))


def test_the_fused_sum_prints_back_and_explains_its_rule():
    """The fused program prints and parses back to the same program, and the layout phase's
    report names the residual rule with its file and line."""
    from eqquant.ir.printer import print_module
    from eqquant.quant.flow import compile_layouts
    mod, _ = _residual_block("once")
    result = compile_layouts(mod)
    text = print_module(result.module)
    assert "fused.qconv2d_add(" in text
    assert print_module(parse(text)) == text
    located = result.rule_locations
    assert any("residual.rules" in str(where) for name, where in located.items()
               if name.startswith("fuse_qconv2d_add"))


def test_a_residual_of_another_shape_is_a_type_error():
    """The residual must have the convolution's output type: the error says which."""
    text = """def @main(%x: Tensor[(1, 4, 4, 3), uint8], %r: Tensor[(1, 4, 4, 5), uint8],
                    %w: Tensor[(1, 1, 3, 4), int8]) {
      fused.qconv2d_add(%x, %w, 0, 0, 0, 0.1f, 0.1f, 0.01f, 0, 0.1f, 0, %r, 0.1f, 0, 0.1f, 0,
                        0.2f, 0,
                        data_layout="NHWC", kernel_layout="HWIO", axis=3, out_dtype="uint8")
    }"""
    with pytest.raises(TypeCheckError, match="residual must be"):
        check_module(parse(text))


def test_the_fused_sum_exports_to_onnx_and_onnx_runtime_agrees():
    """Its QDQ form is the convolution's (quantized to the sum's lhs parameters) and the
    sum's: ONNX Runtime's result lies within two output steps of ours (its float rounding)."""
    ort = pytest.importorskip("onnxruntime")
    from eqquant.interop.onnx_export import to_onnx
    rng = np.random.default_rng(2)
    b = Builder()
    x, r = (b.call("qnn.quantize", b.input(n, (1, 16, 8, 8)), _p(b, np.array(s, np.float32)),
                   _p(b, np.array(z, np.int32)), out_dtype="uint8")
            for n, s, z in (("x", 0.05, 3), ("r", 0.2, 7)))
    y = b.call("fused.qconv2d_add", x, *_conv_args(b, rng, 16, 16, 3, "uint8", "NCHW"), r,
               *[_p(b, np.array(v, t)) for v, t in ((0.1, np.float32), (5, np.int32),
                                                     (0.2, np.float32), (7, np.int32),
                                                     (0.25, np.float32), (4, np.int32))],
               padding=[1, 1, 1, 1], activation="relu", out_dtype="uint8")
    y = b.call("qnn.dequantize", y, _p(b, np.array(0.25, np.float32)),
               _p(b, np.array(4, np.int32)))
    mod = bind_params(*b.finish(y))
    model = to_onnx(mod)
    assert [n.op_type for n in model.graph.node].count("Add") == 1
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = {k: rng.normal(scale=4.0, size=(1, 16, 8, 8)).astype(np.float32) for k in "xr"}
    got = sess.run(None, xs)[0]
    want = Executor(mod).run(xs)
    np.testing.assert_array_equal(want, run(mod, xs))
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 2 * 0.25 + 1e-6


def _float_block(rng, c, size, first, act):
    """x -> conv (relu) -> conv, then the first conv's output added (either operand; a
    ResNet basic block), then act."""
    b = Builder()
    x = b.input("x", (2, c, size, size))

    def conv(v, activation):
        return b.call("fused.conv2d", v, _p(b, rng.normal(size=(c, c, 3, 3)).astype("f4")),
                      _p(b, rng.normal(size=(c, 1, 1)).astype("f4")), padding=[1, 1, 1, 1],
                      activation=activation)
    r = conv(x, "relu")
    y = conv(r, "none")
    y = b.call("add", y, r) if first else b.call("add", r, y)
    if act == "relu":
        y = b.call("nn.relu", y)
    elif act == "clip":     # (a float clip commutes with a layout change: rules/layout.rules)
        y = b.call("clip", y, a_min=-0.5, a_max=1.5)
    return b.finish(y)


@pytest.mark.parametrize("path", ["fma", "avx512", "blas"])
@pytest.mark.parametrize("c, first, act, size", [
    (64, True, "relu", 9), (40, False, "none", 9), (24, False, "relu", 9),
    (24, True, "clip", 9), (24, False, "relu", 16), (40, True, "none", 20)])
def test_a_float_residual_sum_joins_the_convolution(monkeypatch, path, c, first, act, size):
    """add(conv, r) then relu (a ResNet block's end) is one fused.conv2d_add in the layout
    phase, the convolution either operand; it computes the unfused program's numbers (the
    same float additions in the same order) on each float path the CPU has: on the FMA
    kernels the residual summed into each finished tile (of some channel blocks on 9 x 9
    images, of whole rows from 16 x 16), on the BLAS path after the convolution."""
    from eqquant.quant.flow import compile_layouts
    from eqquant.runtime.target import fp32_paths
    if path not in fp32_paths():
        pytest.skip(f"this CPU has no {path} path")   # (blas: always there)
    monkeypatch.setenv("EQQUANT_FP32_KERNEL", path)
    rng = np.random.default_rng(c)
    plain = bind_params(*_float_block(rng, c, size, first, act))
    fused = compile_layouts(plain).module
    calls = [n for n in post_order(fused.main.body) if isinstance(n, Call)]
    ops = [n.op_name for n in calls]
    assert ops.count("fused.conv2d_add") == 1 and not {"add", "nn.relu", "clip"} & set(ops)
    (conv,) = [n for n in calls if n.op_name == "fused.conv2d_add"]
    assert conv.attrs["activation"] == act and conv.attrs["data_layout"] == "NHWC"
    xs = {"x": rng.normal(size=(2, c, size, size)).astype(np.float32)}
    ex = Executor(fused)
    step = next(s for s in ex.steps if s.label == "fused.conv2d_add")
    assert step.fn.in_gemm == (path != "blas")
    got = ex.run(xs)
    np.testing.assert_array_equal(got, Executor(plain).run(xs))
    # (the reference sums in another order: float32 rounding of sums in the hundreds)
    want = run(plain, xs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=max(2e-3, 1e-5 * np.abs(want).max()))


def test_a_float_residual_that_broadcasts_is_summed_after_the_convolution():
    """A residual of another shape that broadcasts (one value per channel) is added after the
    convolution, then the activation: the reference's numbers."""
    rng = np.random.default_rng(4)
    b = Builder()
    x = b.input("x", (1, 9, 9, 16))
    r = b.input("r", (1, 1, 1, 16))
    y = b.call("fused.conv2d_add", x, _p(b, rng.normal(size=(3, 3, 16, 16)).astype("f4")),
               _p(b, rng.normal(size=(16,)).astype("f4")), r, padding=[1, 1, 1, 1],
               data_layout="NHWC", kernel_layout="HWIO", activation="relu")
    mod = bind_params(*b.finish(y))
    ex = Executor(mod)
    assert not ex.steps[0].fn.in_gemm
    xs = {"x": rng.normal(size=(1, 9, 9, 16)).astype("f4"),
          "r": rng.normal(size=(1, 1, 1, 16)).astype("f4")}
    got = ex.run(xs)
    assert (got == 0).any() and (got > 0).any()
    np.testing.assert_allclose(got, run(mod, xs), rtol=1e-4, atol=1e-4)


def test_the_float_fused_sum_exports_to_onnx_and_onnx_runtime_agrees():
    """fused.conv2d_add exports as Conv (its bias inside), Add of the residual, Relu: ONNX
    Runtime computes the same numbers to float32 rounding."""
    ort = pytest.importorskip("onnxruntime")
    from eqquant.interop.onnx_export import to_onnx
    rng = np.random.default_rng(5)
    b = Builder()
    x, r = b.input("x", (1, 8, 6, 6)), b.input("r", (1, 8, 6, 6))
    y = b.call("fused.conv2d_add", x, _p(b, rng.normal(size=(8, 8, 3, 3)).astype("f4")),
               _p(b, rng.normal(size=(8, 1, 1)).astype("f4")), r, padding=[1, 1, 1, 1],
               activation="relu")
    mod = bind_params(*b.finish(y))
    model = to_onnx(mod)
    assert [n.op_type for n in model.graph.node] == ["Conv", "Add", "Relu"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = {k: rng.normal(size=(1, 8, 6, 6)).astype(np.float32) for k in "xr"}
    got = sess.run(None, xs)[0]
    want = Executor(mod).run(xs)
    assert (want == 0).any() and (want > 0).any()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
