"""Channels-last programs (data_layout="NHWC", kernel_layout="HWIO", pools with layout="NHWC"),
as Relay prints TensorFlow and TFLite models: they parse, type-check, print back, compute
what the NCHW program computes (reference and executor), and fold batch norms over axis 3."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eqquant.core.nodes import Call, post_order
from eqquant.errors import EqquantError, TypeCheckError
from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.ir.typecheck import check_module
from eqquant.optimizer import optimize
from eqquant.runtime.execution.executor import Executor

PROGRAM = """def @main(%x: Tensor[(1, 12, 10, 6), float32], %w: Tensor[(3, 3, 6, 8), float32],
          %b: Tensor[(8), float32]) {
  %0 = nn.conv2d(%x, %w, strides=[2, 2], padding=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="HWIO");
  %1 = nn.bias_add(%0, %b, axis=3);
  %2 = nn.relu(%1);
  %3 = nn.max_pool2d(%2, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], layout="NHWC");
  nn.global_avg_pool2d(%3, layout="NHWC")
}
"""


def test_parse_typecheck_and_print():
    mod = parse(PROGRAM)
    types = check_module(mod)
    assert str(types[id(mod.main.body)]) == "Tensor[(1, 1, 1, 8), float32]"
    assert print_module(parse(print_module(mod))) == print_module(mod)
    assert 'data_layout="NHWC", kernel_layout="HWIO"' in print_module(mod)


def test_layouts_must_agree():
    bad = PROGRAM.replace('kernel_layout="HWIO"', 'kernel_layout="OIHW"')
    with pytest.raises(TypeCheckError, match="NHWC takes kernel_layout=HWIO"):
        check_module(parse(bad))
    bad = PROGRAM.replace('layout="NHWC");\n  nn.global', 'layout="NHWC", out_layout="NCHW");'
                          '\n  nn.global')
    with pytest.raises(TypeCheckError, match="out_layout"):
        check_module(parse(bad))


def _nchw_twin(x, w, b):
    """The same network written in NCHW/OIHW, for comparison."""
    src = PROGRAM.replace('data_layout="NHWC", kernel_layout="HWIO"', "") \
        .replace(', layout="NHWC"', "").replace("axis=3", "axis=1") \
        .replace("(1, 12, 10, 6)", "(1, 6, 12, 10)").replace("(3, 3, 6, 8)", "(8, 6, 3, 3)")
    src = src.replace("%0 = nn.conv2d(%x, %w, strides=[2, 2], padding=[1, 1, 1, 1], );",
                      "%0 = nn.conv2d(%x, %w, strides=[2, 2], padding=[1, 1, 1, 1]);")
    return run(parse(src), {"x": x.transpose(0, 3, 1, 2), "w": w.transpose(3, 2, 0, 1), "b": b})


def test_reference_and_executor_match_the_nchw_program():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 12, 10, 6)).astype(np.float32)
    w = rng.normal(size=(3, 3, 6, 8)).astype(np.float32)
    b = rng.normal(size=8).astype(np.float32)
    mod = parse(PROGRAM)
    want = _nchw_twin(x, w, b).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(run(mod, {"x": x, "w": w, "b": b}), want, rtol=1e-5, atol=1e-5)
    bound = bind_params(mod, {"w": w, "b": b})
    ex = Executor(bound)
    kinds = {s.label: s.kind for s in ex.steps}     # kernels, not the reference
    assert all(kinds[k] == "kernel" for k in ("nn.conv2d", "nn.max_pool2d",
                                              "nn.global_avg_pool2d")), kinds
    np.testing.assert_allclose(ex.run({"x": x}), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(c=st.sampled_from([3, 4, 8]), o_per_group=st.sampled_from([1, 2, 5]),
       depthwise=st.booleans(), k=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]),
       pad=st.sampled_from([0, 1]), dil=st.sampled_from([1, 2]), bias=st.booleans(),
       act=st.sampled_from(["none", "relu", "clip"]), seed=st.integers(0, 99))
def test_fused_conv_executor_equals_reference(c, o_per_group, depthwise, k, stride, pad, dil,
                                              bias, act, seed):
    """fused.conv2d in NHWC on the executor (its NCHW kernels between transposes) equals the
    reference, for grouped, depthwise and dense convolutions."""
    rng = np.random.default_rng(seed)
    groups = c if depthwise else 1
    o = o_per_group * groups if depthwise else o_per_group * 2
    b = Builder()
    x = b.input("x", (2, 9, 7, c))
    w = b.param("w", rng.normal(size=(k, k, c // groups, o)).astype(np.float32))
    bv = b.param("b", rng.normal(size=(o,)).astype(np.float32)) if bias else b.scalar(0.0)
    extra = {"a_min": -0.5, "a_max": 0.7} if act == "clip" else {}
    y = b.call("fused.conv2d", x, w, bv, strides=[stride, stride], padding=[pad] * 4,
               dilation=[dil, dil], groups=groups, data_layout="NHWC", kernel_layout="HWIO",
               activation=act, **extra)
    mod = bind_params(*b.finish(y))
    xv = rng.normal(size=(2, 9, 7, c)).astype(np.float32)
    ex = Executor(mod)
    assert [s.kind for s in ex.steps] == ["kernel"]
    np.testing.assert_allclose(ex.run({"x": xv}), run(mod, {"x": xv}), rtol=1e-4, atol=1e-5)


def test_batch_norm_over_axis_3_folds():
    rng = np.random.default_rng(1)
    b = Builder()
    x = b.input("x", (1, 8, 8, 4))
    w = b.param("w", rng.normal(size=(3, 3, 4, 6)).astype(np.float32))
    y = b.call("nn.conv2d", x, w, padding=[1, 1], data_layout="NHWC", kernel_layout="HWIO")
    stats = [b.param(name, v.astype(np.float32)) for name, v in (
        ("gamma", rng.uniform(0.5, 1.5, 6)), ("beta", rng.normal(size=6)),
        ("mean", rng.normal(size=6)), ("var", rng.uniform(0.5, 2, 6)))]
    y = b.get(b.call("nn.batch_norm", y, *stats, axis=3), 0)
    y = b.call("nn.relu", y)
    mod = bind_params(*b.finish(y))
    result = optimize(mod, {}, rules=["simplify", "bn_fold", "fusion"], cost="cpu")
    ops = [n.op_name for n in post_order(result.module.main.body) if isinstance(n, Call)]
    assert "nn.batch_norm" not in ops and ops == ["fused.conv2d"], ops
    xv = rng.normal(size=(1, 8, 8, 4)).astype(np.float32)
    np.testing.assert_allclose(Executor(result.module).run({"x": xv}), run(mod, {"x": xv}),
                               rtol=1e-5, atol=1e-5)


def test_onnx_export_refuses_channels_last():
    pytest.importorskip("onnx")
    from eqquant.interop.onnx_export import to_onnx
    rng = np.random.default_rng(0)
    mod = bind_params(parse(PROGRAM), {"w": rng.normal(size=(3, 3, 6, 8)).astype(np.float32),
                                      "b": np.zeros(8, np.float32)})
    with pytest.raises(EqquantError, match="NHWC"):
        to_onnx(mod)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 70), h=st.integers(1, 9), w=st.integers(1, 9),
       seed=st.integers(0, 2 ** 16))
def test_the_channel_last_global_average_sums_as_the_nchw_one(n, c, h, w, seed):
    """nn.global_avg_pool2d read channel-last (each pixel's channels a row) adds each
    channel's values in the order the NCHW kernel does: the same bits, on values spread over
    many orders of magnitude (where the order of a float sum shows)."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, c, h, w)) * 10.0 ** rng.integers(-6, 7, (n, c, h, w))
         ).astype("f4")
    outs = []
    for layout in ("NCHW", "NHWC"):
        b = Builder()
        v = b.input("x", x.shape if layout == "NCHW" else (n, h, w, c))
        mod, params = b.finish(b.call("nn.global_avg_pool2d", v, layout=layout))
        xv = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        outs.append(Executor(mod).run({"x": xv}).reshape(n, c))
    np.testing.assert_array_equal(outs[1], outs[0])
