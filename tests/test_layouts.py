"""Layouts chosen by rules: the layout_transform op, the channel-last integer kernels, and
rules/layout.rules on a whole network (MobileNet-v2 int8 keeps every convolution channel-last
with no layout change between two of them, and computes the NCHW program's bits)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eqquant.core.nodes import Call, post_order
from eqquant.errors import TypeCheckError
from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.ir.typecheck import check_module
from eqquant.runtime.execution.executor import Executor

CHANGE = """def @main(%x: Tensor[(2, 3, 4, 5), uint8]) {
  layout_transform(%x, src_layout="NCHW", dst_layout="NHWC")
}
"""


def test_layout_transform_types_runs_and_prints_back():
    mod = parse(CHANGE)
    assert str(check_module(mod)[id(mod.main.body)]) == "Tensor[(2, 4, 5, 3), uint8]"
    assert print_module(parse(print_module(mod))) == print_module(mod)
    x = np.arange(120, dtype=np.uint8).reshape(2, 3, 4, 5)
    want = x.transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(run(mod, {"x": x}), want)
    ex = Executor(mod)
    assert [s.kind for s in ex.steps] == ["kernel"]
    np.testing.assert_array_equal(ex.run({"x": x}), want)


@pytest.mark.parametrize("shape, src, dst, dtype", [
    ((2, 3, 37, 41), "NCHW", "NHWC", "uint8"), ((1, 40, 33, 35), "NCHW", "NHWC", "float32"),
    ((2, 33, 35, 70), "NHWC", "NCHW", "int8"), ((1, 5, 6, 7), "NCHW", "HWCN", "float32"),
    ((2, 3, 40, 30), "NCHW", "NHWC", "float32")])
def test_the_layout_change_kernel_moves_every_value(shape, src, dst, dtype):
    """NCHW <-> NHWC run as tiled plane transposes (several 32 x 32 tiles, partial ones at
    the edges; three channels interleaved in runs of 1024 pixels, the last partial); any
    other permutation as numpy's copy."""
    from eqquant.ops.tensor import layout_perm
    text = CHANGE.replace("(2, 3, 4, 5), uint8", f"{shape}, {dtype}").replace(
        'src_layout="NCHW", dst_layout="NHWC"', f'src_layout="{src}", dst_layout="{dst}"')
    mod = parse(text)
    x = np.random.default_rng(0).integers(-128, 128, shape).astype(dtype)
    ex = Executor(mod)
    assert ex.steps[0].kind == "kernel"
    assert (ex.steps[0].fn.plane is not None) == (dst in ("NCHW", "NHWC"))
    np.testing.assert_array_equal(ex.run({"x": x}), x.transpose(layout_perm(src, dst)))


@pytest.mark.parametrize("src, dst, message", [
    ("NCHW", "NHWD", "name different axes"),
    ("NCHW8c", "NHWC", "blocked layouts"),
    ("NCH", "NHC", "has 3 axes, the data 4"),
])
def test_a_bad_layout_is_a_type_error(src, dst, message):
    with pytest.raises(TypeCheckError, match=message):
        check_module(parse(CHANGE.replace('src_layout="NCHW", dst_layout="NHWC"',
                                          f'src_layout="{src}", dst_layout="{dst}"')))


def test_layout_transform_exports_as_an_onnx_transpose():
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort
    from eqquant.interop.onnx_export import to_onnx
    mod = parse(CHANGE.replace("uint8", "float32"))
    model = to_onnx(mod)
    assert [n.op_type for n in model.graph.node] == ["Transpose"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.transpose(0, 2, 3, 1))


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(["uint8", "int8", "int32", "float32"]),
       c=st.sampled_from([1, 3, 8, 19, 31, 32, 33, 64, 72, 96, 130, 200]),
       k=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1),
       dil=st.integers(1, 2), size=st.integers(3, 9), seed=st.integers(0, 99))
def test_channel_last_max_pool_equals_the_reference(dtype, c, k, stride, pad, dil, size, seed):
    """nn.max_pool2d with layout NHWC on its channel-last kernel (not the NCHW one between
    transposes), every dtype it takes, against the reference, bit for bit: channel counts
    that fill 4, 2 or 1 vectors of ``pool_simd`` and a scalar tail; floats with NaN, -0.0
    beside 0.0, and infinities."""
    if size + 2 * pad < dil * (k - 1) + 1 or pad >= k:
        return
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.input("x", (2, size, size, c), dtype)
    y = b.call("nn.max_pool2d", x, pool_size=[k, k], strides=[stride] * 2, padding=[pad] * 4,
               dilation=[dil] * 2, layout="NHWC")
    mod = b.finish(y)[0]
    if dtype == "float32":
        xv = rng.normal(size=(2, size, size, c)).astype(dtype)
        flat = xv.reshape(-1)
        at = rng.choice(flat.size, min(flat.size, 40), replace=False)
        flat[at] = rng.choice([np.nan, -0.0, 0.0, np.inf, -np.inf], at.size)
    else:
        info = np.iinfo(dtype)
        xv = rng.integers(info.min, int(info.max) + 1, (2, size, size, c)).astype(dtype)
    got, want = Executor(mod).run({"x": xv}), run(mod, {"x": xv})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{got.itemsize}"))


@pytest.fixture(scope="module")
def mobilenet_int8():
    from eqquant.quant.flow import quantize
    from eqquant.zoo import build
    m = build("mobilenet_v2")
    rng = np.random.default_rng(0)
    shape = m.module.main.params[0].type.shape
    samples = [{"data": rng.normal(size=shape).astype("float32")} for _ in range(2)]
    return quantize(m.module, m.params, samples, "minmax", per_channel=True), shape


def test_mobilenet_int8_keeps_every_convolution_channel_last(mobilenet_int8):
    """The acceptance count: no layout change between two convolutions; one at the input."""
    q, _ = mobilenet_int8
    calls = [n for n in post_order(q.compiled.main.body) if isinstance(n, Call)]
    convs = [c for c in calls if c.op_name in ("fused.qconv2d", "fused.qconv2d_add")]
    # the classifier's dense layer runs as a 1x1 convolution over its rows, channel-last
    # (layout.rules: qdense_requantize_as_pointwise_qconv2d): its rows viewed as an image
    rows = [c for c in convs if c.args[0].op_name == "expand_dims"]
    assert len(rows) == 1 and rows[0].attrs["data_layout"] == "NHWC"
    convs = [c for c in convs if c is not rows[0]]
    assert len(convs) == 52 and all(c.attrs["data_layout"] == "NHWC" for c in convs)
    changes = [c for c in calls if c.op_name == "layout_transform"]
    assert len(changes) == 1 and changes[0].args[0].op_name == "qnn.quantize"
    # nothing between two convolutions: every convolution reads a convolution (the ten
    # inverted residuals' sums taken in their projections' epilogues: rules/residual.rules),
    # or the one change at the input
    assert sum(c.op_name == "fused.qconv2d_add" for c in convs) == 10
    assert not [c for c in calls if c.op_name == "qnn.add"]
    for conv in convs:
        assert conv.args[0].op_name in ("fused.qconv2d", "fused.qconv2d_add",
                                        "layout_transform")
    assert "channel-last, 1 layout changes" in q.report()
    assert "53 of 53 convolutions" in q.report()        # (the classifier's among them)


def test_mobilenet_int8_layouts_change_no_bit(mobilenet_int8):
    """The layout phase is exact: the NHWC program computes the NCHW program's bits, on an
    input in the calibrated range and on one far outside it."""
    q, shape = mobilenet_int8
    rng = np.random.default_rng(5)
    nchw, nhwc = Executor(q.module), Executor(q.compiled)
    for scale in (1.0, 40.0):
        x = {"data": (scale * rng.normal(size=shape)).astype("float32")}
        np.testing.assert_array_equal(nhwc.run(x), nchw.run(x))


def test_mobilenet_int8_small_steps_are_bound_to_their_kernels(mobilenet_int8):
    """The steps that make one kernel call (``Binding.kernel_call``): the average and the
    dequantize are bound to their kernels' entry points, not run through their bindings'
    Python (the classifier's bias of 1000 units took 18 us so, 2 bound; its bias and
    requantize now run in its GEMM's epilogue, as a 1x1 convolution's)."""
    import functools
    from eqquant.runtime.lowering.fp32 import Binding
    from eqquant.runtime.codegen.launch import _BoundLaunch
    q, _ = mobilenet_int8
    ex = Executor(q.compiled)
    small = ("qnn.global_avg_pool2d", "qnn.dequantize")
    sites = [(step.label, p) for step, p in zip(ex.steps, ex._prepared) if step.label in small]
    assert sorted({label for label, _ in sites}) == sorted(small)
    for label, p in sites:
        call = p[0]
        assert isinstance(call, _BoundLaunch) or (isinstance(call, functools.partial) and
                                                  not isinstance(call.func, Binding)), label


@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_mobilenet_prepared_steps_give_the_bits_of_gathered_ones(mobilenet_int8, precision):
    """A plain run calls each step bound once to its arrays (``Executor._prepare``: every
    convolution straight to its kernel's compiled entry point, int8 and float alike, where
    the float ones run on the FMA kernels); a profiled run gathers each step's operands and
    goes through the binding. Same bits, and again after the thread pool's size changed (the
    convolutions' work split is bound with them)."""
    import numba
    from eqquant.quant.flow import compile_layouts
    from eqquant.runtime.kernels import amx
    from eqquant.runtime.kernels import avx2
    from eqquant.runtime.kernels import fma
    from eqquant.runtime.kernels import fp32 as kernels_fp32
    from eqquant.runtime.kernels import int8 as kernels_int8
    from eqquant.runtime.kernels import vnni
    vnni16, avxvnni = vnni.PATHS["vnni16"], vnni.PATHS["avxvnni"]
    from eqquant.runtime.lowering.fp32 import fp32_path
    from eqquant.runtime.codegen.launch import Driver, Parallel, _BoundLaunch, _Calls
    q, shape = mobilenet_int8
    if precision == "int8":
        ex, label = Executor(q.compiled), ("fused.qconv2d", "fused.qconv2d_add")
        kernels = (kernels_int8.depthwise_channels_last, amx.conv_requantize,
                   vnni.conv_requantize, vnni16.conv_requantize, avxvnni.conv_requantize,
                   avx2.conv_requantize, avx2.conv_requantize_bytes,
                   # the portable path's launches: windows, products, requantization, the
                   # moves between layouts
                   kernels_int8.im2col_i8, kernels_int8.gemm_i8,
                   kernels_int8.bias_clamp_requantize, kernels_fp32.copy_rows,
                   kernels_fp32._transpose_tiles, kernels_fp32._interleave_rows,
                   # a residual added after the convolution (where not in its tiles)
                   kernels_int8.qadd, kernels_int8.qadd_once, kernels_int8.qadd_once_split)
    else:
        ex, label = Executor(compile_layouts(q.fp32).module), ("fused.conv2d",
                                                                "fused.conv2d_add")
        kernels = (kernels_fp32.depthwise_channels_last,) + \
            ((fma.conv,) if fp32_path() != "blas" else ())
    convs = [(step, p) for step, p in zip(ex.steps, ex._prepared) if step.label in label]
    # (bound to the compiled entry points themselves, not their dispatchers)
    # (a ``launch.parallel`` kernel: to its C entry, through the launcher; a
    # ``launch.Driver``: to its parts', in order)
    parts = [p for k in kernels for p in (k.parts if isinstance(k, Driver) else (k,))]
    entries = {c.entry_point for k in parts if not isinstance(k, Parallel)
               for c in k.overloads.values()}
    entries |= {e.address for k in parts if isinstance(k, Parallel)
                for e in k._entries.values()}

    def to_entries(call):
        if isinstance(call, _Calls):
            return all(map(to_entries, call.calls))
        if isinstance(call, _BoundLaunch):
            return call.address in entries
        return getattr(call, "func", None) in entries
    bound = [p is not None and to_entries(p[0]) for _, p in convs]
    depthwise = [step.fn.depthwise if precision == "fp32" else step.fn.conv.depthwise
                 for step, _ in convs]
    # (int8: the classifier's dense layer too, as a 1x1 convolution over its rows)
    assert len(convs) == (53 if precision == "int8" else 52) and sum(depthwise) == 17
    assert bound == [True] * len(convs) if len(kernels) > 1 else bound == depthwise
    rng = np.random.default_rng(6)
    x = {"data": rng.normal(size=shape).astype("float32")}
    want = ex.run(x, profile=True)
    np.testing.assert_array_equal(ex.run(x), want)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        np.testing.assert_array_equal(ex.run(x), want)
        assert ex._threads == 1
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(ex.run(x), want)
    assert ex._threads == before


@pytest.mark.parametrize("groups", [1, 16, 32])
def test_convolutions_go_channel_last_where_their_kernels_read_it(groups):
    """Extraction under the CPU cost model moves a chain of dense (groups 1), grouped (16
    groups of 2: the VNNI GEMMs run them in sets of groups, channel-last) or depthwise (32
    groups of one channel) int8 convolutions channel-last; the program computes the same
    bits on whatever kernels this CPU gives them (the portable loops move a grouped one's
    image NCHW and back)."""
    from eqquant.optimizer import optimize
    rng = np.random.default_rng(groups)
    c = 32
    b = Builder()
    y = b.input("x", (1, c, 28, 28), "uint8")
    for i in range(3):
        w = rng.integers(-127, 128, (c, c // groups, 3, 3)).astype("i1")
        y = b.call("fused.qconv2d", y, b.param(f"w{i}", w),
                   b.param(f"b{i}", rng.integers(-900, 900, (c, 1, 1)).astype("i4")),
                   b.param(f"zx{i}", np.array(7, np.int32)),
                   b.param(f"zw{i}", np.array(0, np.int32)),
                   b.param(f"sx{i}", np.array(0.05, np.float32)),
                   b.param(f"sw{i}", rng.uniform(0.01, 0.02, c).astype(np.float32)),
                   b.param(f"s1{i}", (0.05 * rng.uniform(0.01, 0.02, c)).astype(np.float32)),
                   b.param(f"z1{i}", np.array(0, np.int32)),
                   b.param(f"s2{i}", np.array(0.1, np.float32)),
                   b.param(f"z2{i}", np.array(7, np.int32)), padding=[1, 1, 1, 1],
                   groups=groups, activation="relu", out_dtype="uint8")
    mod = bind_params(*b.finish(y))
    result = optimize(mod, None, ["layout"], cost="cpu")
    convs = [n for n in post_order(result.module.main.body)
             if isinstance(n, Call) and n.op_name == "fused.qconv2d"]
    assert [n.attrs["data_layout"] for n in convs] == ["NHWC"] * 3
    xv = {"x": rng.integers(0, 256, (1, c, 28, 28)).astype("uint8")}
    np.testing.assert_array_equal(Executor(result.module).run(xv), run(mod, xv))


def test_float_resnet_runs_channel_last_with_one_change_at_the_input():
    """The float program's layouts: every convolution channel-last (the FMA kernels' layout)
    under the CPU cost model, one layout change (at the input; the global pool's one-pixel
    output is flattened as it is), and the same numbers as the NCHW program (exact rules;
    the kernels sum in the same order either way) on an input far outside any range seen."""
    from eqquant.quant.flow import FP32_RULES, FP32_SCHEDULE, compile_layouts
    from eqquant.optimizer import optimize
    from eqquant.zoo import build
    m = build("resnet18", image_size=64)
    fp = optimize(bind_params(m.module, m.params), None, FP32_RULES, FP32_SCHEDULE).module
    result = compile_layouts(fp, "cpu")
    calls = [n for n in post_order(result.module.main.body) if isinstance(n, Call)]
    convs = [c for c in calls if c.op_name in ("fused.conv2d", "fused.conv2d_add")]
    assert len(convs) == 20 and all(c.attrs["data_layout"] == "NHWC" for c in convs)
    # each block's shortcut and last relu in its last convolution (rules/residual.rules)
    assert sum(c.op_name == "fused.conv2d_add" for c in convs) == 8
    changes = [c for c in calls if c.op_name == "layout_transform"]
    assert len(changes) == 1 and changes[0].args[0] is result.module.main.params[0]
    x = {"data": (30 * np.random.default_rng(2).normal(size=(1, 3, 64, 64))).astype("f4")}
    np.testing.assert_allclose(Executor(result.module).run(x), Executor(fp).run(x),
                               rtol=1e-5, atol=1e-4 * 30)
    np.testing.assert_allclose(Executor(result.module).run(x), run(fp, x), rtol=1e-3,
                               atol=1e-2 * 30)


def test_a_float_squeeze_excitation_block_runs_channel_last():
    """MobileNet-v3's block in float: a depthwise convolution, its squeeze-excitation (a
    global pool, two convolutions, a sigmoid gate times the map) and a hardswish, between two
    dense convolutions: every convolution channel-last, the gate's product and the
    activations with them (rules elementwise_map_* and elementwise_pair_*): the only layout
    changes are the input's, the output's and the one-pixel gate's; the NCHW program's
    numbers."""
    from eqquant.ir.builder import Builder
    from eqquant.quant.flow import FP32_RULES, FP32_SCHEDULE, compile_layouts
    from eqquant.optimizer import optimize
    rng = np.random.default_rng(6)
    c = 16
    b = Builder()
    x = b.input("x", (1, c, 14, 14))

    def conv(v, name, o, i, k, groups=1):
        w = b.param(name, (rng.normal(size=(o, i // groups, k, k)) / np.sqrt(i * k * k))
                    .astype("float32"))
        return b.call("nn.conv2d", v, w, padding=[k // 2] * 4, groups=groups)
    y = conv(x, "w0", c, c, 1)
    y = conv(y, "dw", c, c, 3, groups=c)
    g = b.call("nn.global_avg_pool2d", y)
    g = b.call("nn.relu", conv(g, "se1", 4, c, 1))
    g = b.call("sigmoid", conv(g, "se2", c, 4, 1))
    y = b.call("nn.hardswish", b.call("multiply", y, g))
    mod, params = b.finish(conv(y, "w1", c, c, 1))
    fp = optimize(bind_params(mod, params), None, FP32_RULES, FP32_SCHEDULE).module
    result = compile_layouts(fp, "cpu")
    calls = [n for n in post_order(result.module.main.body) if isinstance(n, Call)]
    from eqquant.ir.typecheck import infer_types
    types = infer_types(result.module)
    main = result.module.main
    # every change but the input's and the output's moves a one-pixel value (the gate's)
    inner = [n for n in calls if n.op_name == "layout_transform" and n is not main.body and
             n.args[0] is not main.params[0]]
    assert all(int(np.prod(types[id(n)].shape)) <= c for n in inner)      # (batch 1)
    for name in ("sigmoid", "multiply", "nn.hardswish"):
        (op,) = [n for n in calls if n.op_name == name]
        assert types[id(op)].shape[-1] == c, name        # channel-last
    convs = [n for n in calls if n.op_name in ("nn.conv2d", "fused.conv2d")]
    assert sum(n.attrs["data_layout"] == "NHWC" for n in convs) >= 4
    xv = {"x": (20 * rng.normal(size=(1, c, 14, 14))).astype("f4")}
    np.testing.assert_allclose(Executor(result.module).run(xv), run(fp, xv), rtol=1e-4,
                               atol=1e-4 * 20)


def test_a_convolution_left_apart_from_its_bias_is_fused_again_and_laid_out():
    """An earlier extraction may leave a convolution and its bias apart (their timings within
    each other's noise): the layout phase finds the fusion again (exact rules) and runs the
    whole chain channel-last, with a layout change at the input only; a convolution with no
    bias to fuse (nn.conv2d, then a pool) goes channel-last too."""
    from eqquant.quant.flow import compile_layouts
    rng = np.random.default_rng(0)
    b = Builder()
    y = b.input("x", (1, 16, 20, 20))
    for i in range(2):
        w = rng.normal(size=(16, 16, 3, 3)).astype("f4")
        y = b.call("add", b.call("nn.conv2d", y, b.param(f"w{i}", w), padding=[1, 1]),
                   b.param(f"b{i}", rng.normal(size=(16, 1, 1)).astype("f4")))
        y = b.call("nn.relu", y)
    y = b.call("nn.conv2d", y, b.param("w2", rng.normal(size=(16, 16, 3, 3)).astype("f4")),
               padding=[1, 1])
    y = b.call("nn.global_avg_pool2d", y)
    mod = bind_params(*b.finish(y))
    result = compile_layouts(mod, "cpu").module
    calls = [n for n in post_order(result.main.body) if isinstance(n, Call)]
    convs = [c for c in calls if c.op_name in ("fused.conv2d", "nn.conv2d")]
    assert [c.op_name for c in convs] == ["fused.conv2d"] * 2 + ["nn.conv2d"]
    assert all(c.attrs["data_layout"] == "NHWC" for c in convs)
    changes = [c for c in calls if c.op_name == "layout_transform" and
               c.attrs["dst_layout"] == "NHWC"]
    assert len(changes) == 1 and changes[0].args[0] is result.main.params[0]
    x = {"x": (30 * rng.normal(size=(1, 16, 20, 20))).astype("f4")}
    np.testing.assert_allclose(Executor(result).run(x), run(mod, x), rtol=1e-3, atol=1e-1)


def test_an_integer_layer_inside_a_float_chain_stays_channel_last():
    """A mixed program's integer island (quantize, an integer convolution summing in int32,
    its bias, a dequantize by the product of the scales) between float convolutions: the
    quantize, the integer convolution, its bias and the dequantize commute with the layout
    change (exact rules), so the whole chain runs channel-last with one change at the input,
    and computes what the NCHW program computes."""
    from eqquant.quant.flow import compile_layouts
    rng = np.random.default_rng(1)
    b = Builder()
    x = b.input("x", (1, 16, 20, 20))

    def float_conv(y, i):
        return b.call("fused.conv2d", y, b.param(f"w{i}", rng.normal(
            size=(16, 16, 3, 3)).astype("f4")), b.param(f"b{i}", rng.normal(
                size=(16, 1, 1)).astype("f4")), padding=[1, 1], activation="relu")
    y = float_conv(x, 0)
    q = b.call("qnn.quantize", y, b.param("s", np.array(0.05, "f4")),
               b.param("z", np.array(0, "i4")), out_dtype="uint8")
    acc = b.call("qnn.conv2d", q, b.param("wq", rng.integers(-127, 128, (16, 16, 3, 3))
                                          .astype("i1")),
                 b.param("zx", np.array(0, "i4")), b.param("zw", np.array(0, "i4")),
                 b.param("sx", np.array(0.05, "f4")), b.param("sw", np.array(0.01, "f4")),
                 padding=[1, 1], out_dtype="int32")
    acc = b.call("add", acc, b.param("bq", rng.integers(-500, 500, (16, 1, 1)).astype("i4")))
    y = b.call("qnn.dequantize", acc, b.param("s2", np.array(0.0005, "f4")),
               b.param("z2", np.array(0, "i4")), axis=1)
    mod = bind_params(*b.finish(float_conv(y, 1)))
    result = compile_layouts(mod, "cpu").module
    calls = [n for n in post_order(result.main.body) if isinstance(n, Call)]
    assert [c.attrs["data_layout"] for c in calls if "conv2d" in c.op_name] == ["NHWC"] * 3
    to_nhwc = [c for c in calls if c.op_name == "layout_transform" and
               c.attrs["dst_layout"] == "NHWC"]
    assert len(to_nhwc) == 1 and to_nhwc[0].args[0] is result.main.params[0]
    xv = {"x": rng.normal(size=(1, 16, 20, 20)).astype("f4")}
    np.testing.assert_allclose(Executor(result).run(xv), Executor(mod).run(xv), rtol=1e-5,
                               atol=1e-4)


def test_a_channel_last_block_written_with_transposes_runs_its_convolution_channel_last():
    """ConvNeXt's block as exported: a channel-last value transposed to NCHW for a depthwise
    int8 convolution and back. The transposes are the layout changes (layout.rules), so the
    convolution runs channel-last with neither of them left, and the same bits."""
    from eqquant.quant.flow import compile_layouts
    rng = np.random.default_rng(3)
    c = 32
    b = Builder()
    x = b.input("x", (1, 9, 9, c), "uint8")
    y = b.call("transpose", x, axes=[0, 3, 1, 2])
    p = {name: b.param(name, v) for name, v in [
        ("w", rng.integers(-128, 128, (c, 1, 7, 7)).astype("i1")),
        ("bias", rng.integers(-900, 900, (c, 1, 1)).astype("i4")),
        ("zx", np.array(7, "i4")), ("zw", np.array(0, "i4")), ("sx", np.array(0.05, "f4")),
        ("sw", rng.uniform(0.01, 0.02, c).astype("f4")),
        ("s1", (0.05 * rng.uniform(0.01, 0.02, c)).astype("f4")), ("z1", np.array(0, "i4")),
        ("s2", np.array(0.1, "f4")), ("z2", np.array(5, "i4"))]}
    y = b.call("fused.qconv2d", y, *p.values(), padding=[3, 3, 3, 3], groups=c,
               activation="none", out_dtype="uint8", axis=1)
    mod = bind_params(*b.finish(b.call("transpose", y, axes=[0, 2, 3, 1])))
    result = compile_layouts(mod, "cpu").module
    calls = [n for n in post_order(result.main.body) if isinstance(n, Call)]
    assert [n.op_name for n in calls] == ["fused.qconv2d"], [n.op_name for n in calls]
    assert calls[0].attrs["data_layout"] == "NHWC"
    xv = {"x": rng.integers(0, 256, (1, 9, 9, c)).astype(np.uint8)}
    np.testing.assert_array_equal(Executor(result).run(xv), run(mod, xv))


def test_an_average_pool_of_a_join_runs_channel_last_with_its_convolutions():
    """Inception's block: two convolutions joined along the channels, the join average-pooled
    and convolved. The pool takes the channel-last moves up to the join (layout.rules), so
    everything runs channel-last with one change in and one out, computing what the NCHW
    program computes."""
    from eqquant.quant.flow import compile_layouts
    rng = np.random.default_rng(4)
    b = Builder()
    x = b.input("x", (1, 8, 12, 12))

    def conv(y, i, cin, cout):
        return b.call("fused.conv2d", y, b.param(f"w{i}", rng.normal(
            size=(cout, cin, 3, 3)).astype("f4")), b.param(f"b{i}", rng.normal(
                size=(cout, 1, 1)).astype("f4")), padding=[1, 1], activation="relu")
    join = b.call("concatenate", b.tuple(conv(x, 0, 8, 16), conv(x, 1, 8, 8)), axis=1)
    pool = b.call("nn.avg_pool2d", join, pool_size=[3, 3], padding=[1, 1, 1, 1],
                  count_include_pad=True)
    mod = bind_params(*b.finish(conv(pool, 2, 24, 8)))
    result = compile_layouts(mod, "cpu").module
    calls = [n for n in post_order(result.main.body) if isinstance(n, Call)]
    assert [c.attrs["layout"] for c in calls if c.op_name == "nn.avg_pool2d"] == ["NHWC"]
    assert [c.attrs["data_layout"] for c in calls if "conv2d" in c.op_name] == ["NHWC"] * 3
    assert sum(c.op_name == "layout_transform" for c in calls) == 2
    xv = {"x": rng.normal(size=(1, 8, 12, 12)).astype("f4")}
    np.testing.assert_allclose(Executor(result).run(xv), Executor(mod).run(xv), rtol=1e-5,
                               atol=1e-4)


def test_a_cost_model_as_laid_out_takes_off_the_transposes_the_layout_phase_removes():
    """LaidOut (extraction's view before the layout phase): an NCHW call site of an op whose
    kernels read channel-last data costs the model's price of the channel-last call the
    layout rules make of it (image and result NHWC, weight HWIO, bias (C)), which leaves out
    the two layout changes its kernels make; a site already in the kernels' layout, and an
    op whose kernels do not care, cost what the model says."""
    from eqquant.core.types import TensorType
    from eqquant.extract.cost import CpuLatency, LaidOut
    from eqquant.ops.registry import get_op
    cpu = CpuLatency()
    laid = LaidOut(cpu)
    conv = get_op("fused.conv2d")
    x, y = TensorType((1, 64, 56, 56), "float32"), TensorType((1, 64, 56, 56), "float32")
    nchw = conv.canonical_attrs({"padding": [1, 1, 1, 1]})
    types = [x, TensorType((64, 64, 3, 3), "float32"), TensorType((64, 1, 1), "float32")]
    change = get_op("layout_transform")
    to_nhwc = change.canonical_attrs({"src_layout": "NCHW", "dst_layout": "NHWC"})
    moved = TensorType((1, 56, 56, 64), "float32")
    changes = 2 * cpu.instance_cost(change, to_nhwc, [x], moved)
    nhwc = conv.canonical_attrs({"padding": [1, 1, 1, 1], "data_layout": "NHWC",
                                 "kernel_layout": "HWIO"})
    nhwc_types = [moved, TensorType((3, 3, 64, 64), "float32"), TensorType((64,), "float32")]
    assert laid.instance_cost(conv, nchw, types, y) == \
        cpu.instance_cost(conv, nhwc, nhwc_types, moved)
    # (the roofline's NCHW site: the same call and its two moves, about)
    assert laid.instance_cost(conv, nchw, types, y) == pytest.approx(
        cpu.instance_cost(conv, nchw, types, y) - changes, rel=0.01)
    assert laid.instance_cost(conv, nhwc, nhwc_types, moved) == \
        cpu.instance_cost(conv, nhwc, nhwc_types, moved)
    relu = get_op("nn.relu")
    assert laid.instance_cost(relu, {}, [x], y) == cpu.instance_cost(relu, {}, [x], y)
    # the max pool's channel-last kernel is its fast one: an NCHW site pays the transposes
    pool = get_op("nn.max_pool2d")
    p_nchw = pool.canonical_attrs({"pool_size": [3, 3], "strides": [2, 2],
                                   "padding": [1, 1, 1, 1]})
    p_nhwc = pool.canonical_attrs({"pool_size": [3, 3], "strides": [2, 2],
                                   "padding": [1, 1, 1, 1], "layout": "NHWC"})
    half, half_nhwc = TensorType((1, 64, 28, 28), "float32"), TensorType((1, 28, 28, 64),
                                                                         "float32")
    assert cpu.instance_cost(pool, p_nchw, [x], half) > \
        cpu.instance_cost(pool, p_nhwc, [moved], half_nhwc)
    assert laid.instance_cost(pool, p_nchw, [x], half) == \
        cpu.instance_cost(pool, p_nhwc, [moved], half_nhwc)
