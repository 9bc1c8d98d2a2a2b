"""The Numba kernels against the reference interpreter, and the executor on whole models."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.optimizer import optimize
from eqquant.runtime.execution.executor import Executor
from eqquant.zoo import build

RTOL, ATOL = 1e-4, 1e-5


def _check(mod, params, inputs, kernel_ops):
    bound = bind_params(mod, params)
    ex = Executor(bound)
    labels = [s.label for s in ex.steps]
    for op in kernel_ops:  # the op ran on its kernel, not on the reference fallback
        assert op in labels, labels
    np.testing.assert_allclose(ex.run(inputs), run(bound, inputs), rtol=RTOL, atol=ATOL)


conv_cases = st.fixed_dictionaries({
    "kind": st.sampled_from(["dense", "grouped", "depthwise", "pointwise", "wide"]),
    "c": st.integers(1, 6), "o": st.integers(1, 6), "hw": st.integers(5, 12),
    "k": st.integers(1, 5), "stride": st.integers(1, 3), "pad": st.integers(0, 2),
    "dil": st.integers(1, 2), "act": st.sampled_from(["none", "relu", "clip"]),
    "fused": st.booleans(), "nhwc": st.booleans(), "seed": st.integers(0, 999)})


def _on_every_fp32_path(check):
    """``check()`` on each float convolution path this CPU runs (EQQUANT_FP32_KERNEL)."""
    import os
    from eqquant.runtime.target import fp32_paths
    for path in fp32_paths():
        os.environ["EQQUANT_FP32_KERNEL"] = path
        try:
            check()
        finally:
            del os.environ["EQQUANT_FP32_KERNEL"]


@settings(max_examples=40, deadline=None)
@given(conv_cases)
def test_conv2d_kernel(case):
    """Every fp32 convolution path against the reference: dense, grouped, depthwise, 1x1,
    and wide ones (33-80 output channels: several GEMM blocks, the last one partial, split
    between work items), NCHW or channel-last (NHWC data, HWIO weight, a bias per channel:
    the dense and depthwise kernels read it as it is, a grouped one between transposes)."""
    rng = np.random.default_rng(case["seed"])
    c, o, k = case["c"], case["o"], case["k"]
    groups = 1
    if case["kind"] == "grouped":
        c, o, groups = 2 * c, 2 * o, 2
    elif case["kind"] == "depthwise":
        o, groups = c, c
    elif case["kind"] == "pointwise":
        k, case["stride"], case["pad"] = 1, 1, 0
    elif case["kind"] == "wide":
        o = 33 + 8 * o
    nhwc = case["nhwc"]
    hw = max(case["hw"], case["dil"] * (k - 1) + 1)
    b = Builder()
    x = b.input("x", (2, hw, hw, c) if nhwc else (2, c, hw, hw))
    weight = rng.normal(size=(o, c // groups, k, k)).astype("float32")
    w = b.param("w", np.ascontiguousarray(weight.transpose(2, 3, 1, 0)) if nhwc else weight)
    attrs = dict(strides=[case["stride"]] * 2, padding=[case["pad"]] * 2,
                 dilation=[case["dil"]] * 2, groups=groups)
    if nhwc:
        attrs.update(data_layout="NHWC", kernel_layout="HWIO")
    if case["fused"]:
        bias = b.param("b", rng.normal(size=(o,) if nhwc else (o, 1, 1)).astype("float32"))
        y = b.call("fused.conv2d", x, w, bias, activation=case["act"], a_min=-0.5, a_max=0.7,
                   **attrs)
    else:
        y = b.call("nn.conv2d", x, w, **attrs)
    mod, params = b.finish(y)
    xs = {"x": rng.normal(size=x.type.shape).astype("float32")}
    _on_every_fp32_path(lambda: _check(mod, params, xs, ["fused.conv2d" if case["fused"]
                                                         else "nn.conv2d"]))


# (groups, input channels a group, outputs a group): RegNet's groups of 8, ResNeXt's of 4
# (sets of 4 groups) and 16, groups that no set size but 1 divides (13), a group of 32, and
# sets whose outputs end inside a vector (groups of 6: the direct kernel's)
FLOAT_GROUPED = [(6, 8, 8), (32, 4, 4), (4, 16, 16), (13, 8, 8), (3, 32, 32), (8, 6, 6)]


@settings(max_examples=15, deadline=None)
@given(shape=st.sampled_from(FLOAT_GROUPED), k=st.sampled_from([1, 3]),
       stride=st.integers(1, 2), size=st.integers(3, 15), nhwc=st.booleans(),
       residual=st.booleans(), act=st.sampled_from(["none", "relu"]), batch=st.integers(1, 2),
       seed=st.integers(0, 999))
@example(shape=(6, 8, 8), k=3, stride=1, size=14, nhwc=True, residual=False, act="relu",
         batch=1, seed=1)
@example(shape=(32, 4, 4), k=3, stride=2, size=15, nhwc=True, residual=True, act="relu",
         batch=2, seed=2)
@example(shape=(13, 8, 8), k=3, stride=1, size=7, nhwc=False, residual=False, act="none",
         batch=1, seed=3)
def test_grouped_float_convolutions_run_on_the_fma_gemm_in_sets(shape, k, stride, size, nhwc,
                                                                residual, act, batch, seed):
    """A grouped float convolution (fused.conv2d, and fused.conv2d_add) runs on the FMA GEMMs
    as sets of groups, each set a GEMM of block-diagonal weights finished in registers at its
    channels (``fma.grouped``), where the sets' outputs fill whole vectors; else on the
    direct kernel. The reference's numbers to float32 rounding, on every float path."""
    from eqquant.runtime.kernels.gather import group_span
    groups, cg, og = shape
    c, o = groups * cg, groups * og
    rng = np.random.default_rng(seed)
    oh = (size + 2 - k) // stride + 1 if k == 3 else (size - 1) // stride + 1
    pad = 1 if k == 3 else 0
    b = Builder()
    x = b.input("x", (batch, size, size, c) if nhwc else (batch, c, size, size))
    weight = rng.normal(size=(o, cg, k, k)).astype("float32")
    w = b.param("w", np.ascontiguousarray(weight.transpose(2, 3, 1, 0)) if nhwc else weight)
    bias = b.param("b", rng.normal(size=(o,) if nhwc else (o, 1, 1)).astype("float32"))
    attrs = dict(strides=[stride] * 2, padding=[pad] * 4, groups=groups, activation=act)
    if nhwc:
        attrs.update(data_layout="NHWC", kernel_layout="HWIO")
    out_shape = (batch, oh, oh, o) if nhwc else (batch, o, oh, oh)
    args = [x, w, bias]
    if residual:
        args.append(b.input("r", out_shape))
    op = "fused.conv2d_add" if residual else "fused.conv2d"
    mod, params = b.finish(b.call(op, *args, **attrs))
    xs = {"x": rng.normal(size=x.type.shape).astype("float32")}
    if residual:
        xs["r"] = rng.normal(size=out_shape).astype("float32")

    def check():
        from eqquant.runtime.lowering.fp32 import fp32_path
        bound = bind_params(mod, params)
        ex = Executor(bound)
        np.testing.assert_allclose(ex.run(xs), run(bound, xs), rtol=RTOL, atol=1e-4)
        (step,) = [s for s in ex.steps if s.label == op]
        path = fp32_path()
        vector = {"fma": 8, "avx512": 16}.get(path)
        block = 2 * vector if vector else 0
        on_gemm = vector is not None and group_span(groups, og, block) * og % vector == 0
        assert (step.fn.sets is not None) == on_gemm, (path, step.fn.kernel)
        assert step.fn.kernel == (f"x86.{path}" if on_gemm else "direct")
    _on_every_fp32_path(check)


@settings(max_examples=10, deadline=None)
@given(c=st.integers(2, 20), o=st.integers(1, 100), k=st.sampled_from([1, 3]),
       act=st.sampled_from(["none", "relu", "clip"]), seed=st.integers(0, 999))
# a last block of whole vectors on both widths (48), on the 256-bit one only (40), none (20)
@example(c=3, o=48, k=3, act="relu", seed=1)
@example(c=5, o=40, k=1, act="clip", seed=2)
@example(c=4, o=20, k=3, act="none", seed=3)
def test_float_sums_finished_in_registers_give_the_bits_finished_in_memory(c, o, k, act, seed):
    """A channel-last convolution finishes its whole blocks of channels in the GEMM's
    registers (bias, clamp, store); an NCHW one stores the sums and finishes them after
    (``fma._finish``). Same sums, same bias, same clamp: the same bits, on each FMA path."""
    from eqquant.runtime.lowering.fp32 import fp32_path
    if fp32_path() == "blas":
        pytest.skip("this CPU has no AVX2/FMA: the float GEMM is BLAS's")
    rng = np.random.default_rng(seed)
    weight = rng.normal(size=(o, c, k, k)).astype("float32")
    bias = rng.normal(size=o).astype("float32")
    image = rng.normal(size=(2, c, 9, 9)).astype("float32")
    _on_every_fp32_path(lambda: _same_bits_either_layout(weight, bias, image, act))


def _same_bits_either_layout(weight, bias, image, act):
    from eqquant.runtime.lowering.fp32 import fp32_path
    if fp32_path() == "blas":       # (no FMA GEMM on this path: nothing finishes in registers)
        return
    o, c, k, _ = weight.shape
    outs = []
    for nhwc in (False, True):
        b = Builder()
        x = b.input("x", (2, 9, 9, c) if nhwc else (2, c, 9, 9))
        w = b.param("w", np.ascontiguousarray(weight.transpose(2, 3, 1, 0)) if nhwc else weight)
        attrs = dict(padding=[k // 2] * 2)
        if nhwc:
            attrs.update(data_layout="NHWC", kernel_layout="HWIO")
        y = b.call("fused.conv2d", x, w, b.param("b", bias if nhwc else bias.reshape(o, 1, 1)),
                   activation=act, a_min=-0.5, a_max=0.7, **attrs)
        ex = Executor(bind_params(*b.finish(y)))
        assert ex.steps[-1].fn.fma is not None
        got = ex.run({"x": np.ascontiguousarray(image.transpose(0, 2, 3, 1)) if nhwc
                      else image})
        outs.append(got.transpose(0, 3, 1, 2) if nhwc else got)
    assert np.ascontiguousarray(outs[0]).tobytes() == np.ascontiguousarray(outs[1]).tobytes()


@settings(max_examples=30, deadline=None)
@given(c=st.integers(1, 40), k=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2),
       pad=st.integers(0, 2), dil=st.integers(1, 2), hw=st.integers(3, 12),
       n=st.integers(1, 3), seed=st.integers(0, 999))
def test_channel_last_depthwise_sums_its_taps_in_order(c, k, stride, pad, dil, hw, n, seed):
    """The channel-last depthwise kernel (the SIMD sweep inside the image, 16 channels at a
    time and a tail, and the border loop around it), on a batch of ``n`` images in one
    launch, gives the bits of the bias plus each inside tap's product in turn, kernel row by
    row, each product and sum rounded to float32, then the clamp: what NumPy computes below
    image by image, bit for bit."""
    from eqquant.runtime.kernels.depthwise import entry
    from eqquant.runtime.kernels.fp32 import depthwise_channels_last
    rng = np.random.default_rng(seed)
    if hw + 2 * pad < dil * (k - 1) + 1:
        return
    x = rng.normal(size=(n, hw, hw, c)).astype(np.float32)
    w = rng.normal(size=(k, k, c)).astype(np.float32)
    bias = rng.normal(size=c).astype(np.float32)
    oh = (hw + 2 * pad - dil * (k - 1) - 1) // stride + 1
    out = np.empty((n, oh, oh, c), np.float32)
    depthwise_channels_last(x, w, bias, stride, stride, pad, pad, dil, dil, -0.5, 0.7, out,
                            entry("float"))
    want = np.empty_like(out)
    for b in range(n):
        for y in range(oh):
            for xo in range(oh):
                acc = bias.copy()
                for i in range(k):
                    for j in range(k):
                        iy, ix = y * stride - pad + i * dil, xo * stride - pad + j * dil
                        if 0 <= iy < hw and 0 <= ix < hw:
                            acc = acc + x[b, iy, ix] * w[i, j]
                want[b, y, xo] = np.minimum(np.maximum(acc, np.float32(-0.5)),
                                            np.float32(0.7))
    assert out.tobytes() == want.tobytes()


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 5), st.integers(1, 100), st.integers(1, 80),
       st.sampled_from(["none", "relu", "clip"]), st.integers(0, 999),
       st.sampled_from(["vector", "row", "one"]))
@example(1, 512, 10, "none", 0, "row")     # an ONNX Gemm's bias, imported as (1, units)
def test_dense_kernel(batch, k, units, act, seed, bias):
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.input("x", (batch, k))
    shape = {"vector": (units,), "row": (1, units), "one": (1,)}[bias]
    y = b.call("fused.dense", x, b.param("w", rng.normal(size=(units, k)).astype("float32")),
               b.param("b", rng.normal(size=shape).astype("float32")), activation=act,
               a_min=-0.5, a_max=0.7)
    mod, params = b.finish(y)
    xs = {"x": rng.normal(size=(batch, k)).astype("float32")}
    _on_every_fp32_path(lambda: _check(mod, params, xs, ["fused.dense"]))


def test_the_fastest_fp32_path_is_chosen_and_a_missing_one_refused(monkeypatch):
    from eqquant.errors import EqquantError
    from eqquant.runtime.kernels import fma
    from eqquant.runtime.lowering.fp32 import fp32_path
    from eqquant.runtime.target import FP32_PATHS, fp32_paths
    b = Builder()
    x = b.input("x", (1, 3, 8, 8))
    y = b.call("fused.conv2d", x, b.param("w", np.ones((20, 3, 3, 3), np.float32)),
               b.param("b", np.ones((20, 1, 1), np.float32)), padding=[1, 1])
    bound = bind_params(*b.finish(y))
    expected = tuple(p for p in FP32_PATHS if p == "blas" or fma.available(p))
    assert fp32_paths() == expected and fp32_path() == expected[0]
    step = Executor(bound).steps[0].fn
    assert (step.fma is not None) == fma.available("fma")
    if step.fma is not None:     # packed for the chosen GEMM's block of channels
        assert step.packed.shape[2] == fma.block_of(fp32_path())
    monkeypatch.setenv("EQQUANT_FP32_KERNEL", "blas")
    assert Executor(bound).steps[0].fn.fma is None
    missing = [p for p in FP32_PATHS if p not in expected]    # (a list: one more is added)
    for path in missing + ["avx1024"]:
        monkeypatch.setenv("EQQUANT_FP32_KERNEL", path)
        with pytest.raises(EqquantError, match="EQQUANT_FP32_KERNEL"):
            Executor(bound)


def test_float_programs_keep_blas_threads_out(monkeypatch):
    """On the FMA paths no float op calls numpy's BLAS: OpenBLAS's own threads spin for a
    tenth of a second after each call and took half the cores from the next convolutions
    (resnet18 fp32 ran 37 ms instead of 21)."""
    from eqquant.runtime.lowering import fp32 as bindings
    if bindings.fp32_path() == "blas":
        pytest.skip("this CPU has no AVX2/FMA: the float GEMM is BLAS's")
    m = build("resnet18", image_size=64)
    bound = bind_params(m.module, m.params)
    x = {"data": np.random.default_rng(0).normal(size=(1, 3, 64, 64)).astype("float32")}
    fused = optimize(bound, None, ["simplify", "bn_fold", "fusion"],
                     "simplify; bn_fold; simplify; fusion").module
    ex = Executor(fused)

    def no_blas(*args, **kwargs):
        raise AssertionError("numpy's matmul (BLAS) was called")
    monkeypatch.setattr(bindings.np, "matmul", no_blas)
    monkeypatch.setattr(np, "dot", no_blas)
    out = ex.run(x)
    monkeypatch.undo()
    np.testing.assert_allclose(out, run(bound, x), rtol=1e-3, atol=1e-3)


pool_cases = st.fixed_dictionaries({
    "op": st.sampled_from(["nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d"]),
    "k": st.integers(1, 3), "stride": st.integers(1, 3), "pad": st.integers(0, 1),
    "dil": st.integers(1, 2), "include": st.booleans(), "hw": st.integers(5, 9),
    "seed": st.integers(0, 999), "nhwc": st.booleans(), "n": st.integers(1, 3)})


@settings(max_examples=40, deadline=None)
@given(pool_cases)
def test_pool_kernels(case):
    """The pools' kernels on a batch of 1-3 images (channel-last: the batch in one launch)
    against the reference."""
    rng = np.random.default_rng(case["seed"])
    k = case["k"]
    b = Builder()
    attrs = dict(pool_size=[k, k], strides=[case["stride"]] * 2,
                 padding=[min(case["pad"], k - 1)] * 4, dilation=[case["dil"]] * 2)
    if case["op"] == "nn.avg_pool2d":
        attrs["count_include_pad"] = case["include"]
    if case["op"] == "nn.global_avg_pool2d":
        attrs = {}
    hw = max(case["hw"], case["dil"] * (k - 1) + 1)
    shape = (case["n"], 3, hw, hw)
    if case["nhwc"]:                        # (the channel-last kernels')
        attrs["layout"], shape = "NHWC", (case["n"], hw, hw, 3)
    y = b.call(case["op"], b.input("x", shape), **attrs)
    mod, params = b.finish(y)
    _check(mod, params, {"x": rng.normal(size=shape).astype("float32")}, [case["op"]])


@pytest.mark.parametrize("name", ["max_pool", "max_pool_channels_last"])
def test_float_max_pools_store_no_choice(name):
    """The float max pools compile without masked stores (``vmaskmovps``, microcoded on an
    AMD EPYC: the channel-last pool of a 112 x 112 x 64 image took 3.7x as long, and this
    test failed on it): the NCHW pool writes its running maxima from one buffer into another
    (``kernels_fp32._max``), never stored back where the larger is already; the channel-last
    one keeps them in registers (``pool_simd``). Compiled afresh here (a cached kernel shows
    no code)."""
    from numba import njit
    from eqquant.runtime.kernels import fp32 as kernels_fp32
    from eqquant.runtime.codegen.llvm_loops import cpu_has
    if not cpu_has("avx"):
        pytest.skip("this CPU has no AVX: no vmaskmovps to look for")
    kernel = getattr(kernels_fp32, name)
    fresh = njit((kernel if name == "max_pool" else kernel["f32"]).py_func)   # thread 0 of 1
    shape = (8, 9, 9) if name == "max_pool" else (2, 9, 9, 8)     # (channel-last: a batch)
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    out = np.empty((8, 5, 5) if name == "max_pool" else (2, 5, 5, 8), np.float32)
    fresh(0, 1, (x, 3, 3, 2, 2, 1, 1, 1, 1, *[np.float32(-np.inf)] * (name == "max_pool"), out))
    asm = fresh.inspect_asm(fresh.signatures[0])
    assert "ymm" in asm                                   # the maxima vectorised
    assert "vmaskmovps" not in asm


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_max_pools_keep_nan_and_infinities_as_the_reference_does(layout):
    """A NaN in a window makes its maximum NaN (numpy's max, the reference's), also after
    finite taps and before others; -inf never wins against a finite tap, +inf always does.
    (The kernels once kept their running maximum past a NaN: Python's ``max``.)"""
    shape = (1, 4, 9, 9) if layout == "NCHW" else (1, 9, 9, 4)
    b = Builder()
    y = b.call("nn.max_pool2d", b.input("x", shape), pool_size=[3, 3], strides=[2, 2],
               padding=[1, 1, 1, 1], layout=layout)
    mod, _ = b.finish(y)
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    for at, v in ((7, np.nan), (50, np.inf), (90, -np.inf), (200, np.nan), (201, -np.inf)):
        x.flat[at] = v
    got, want = Executor(mod).run({"x": x}), run(mod, {"x": x})
    assert np.isnan(want).sum() >= 3 and np.isposinf(want).any()
    np.testing.assert_array_equal(got, want)     # (NaNs in the same places)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_max_pools_keep_the_first_of_equal_zeros_as_the_reference_does(layout):
    """Of -0.0 and 0.0 in one window, the one met first (kernel row, then column) is the
    maximum, in the reference (``numerics.max_pool2d``) and in both kernels, bit for bit:
    numpy's ``max`` over the window axes had picked by its own order of reduction, and the
    channel-last kernel's bits differed from it on 3 of 8 outputs of a 3 x 3 image."""
    shape = (2, 3, 5, 5) if layout == "NCHW" else (2, 5, 5, 3)
    b = Builder()
    y = b.call("nn.max_pool2d", b.input("x", shape), pool_size=[2, 2], strides=[1, 1],
               layout=layout)
    mod, _ = b.finish(y)
    x = np.random.default_rng(5).choice(np.array([-0.0, 0.0, -1.0], np.float32), shape)
    got, want = Executor(mod).run({"x": x}), run(mod, {"x": x})
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.signbit(want[want == 0]).any() and (~np.signbit(want[want == 0])).any()
    # by hand: one window, -0.0 first, then 0.0; and the other way round
    one = Builder()
    z = one.call("nn.max_pool2d", one.input("x", (1, 1, 1, 2)), pool_size=[1, 2])
    m, _ = one.finish(z)
    for first, then in ((-0.0, 0.0), (0.0, -0.0)):
        v = {"x": np.array([[[[first, then]]]], np.float32)}
        assert np.signbit(run(m, v).flat[0]) == np.signbit(first)
        assert np.signbit(Executor(m).run(v).flat[0]) == np.signbit(first)


def test_relu_keeps_infinities_and_nan_as_the_reference_does():
    """relu(-inf) is 0, relu(inf) inf, relu(NaN) NaN, relu(-0.0) -0.0 (``tensor._relu``);
    the kernel once made -inf NaN (v - v), and -0.0 +0 (as numpy's maximum did)."""
    b = Builder()
    mod, _ = b.finish(b.call("nn.relu", b.input("x", (1, 2, 3, 4))))
    x = np.random.default_rng(4).normal(size=(1, 2, 3, 4)).astype(np.float32)
    x.flat[:4] = [-np.inf, np.inf, np.nan, -0.0]
    got, want = Executor(mod).run({"x": x}), run(mod, {"x": x})
    assert want.flat[0] == 0 and np.isnan(want.flat[2])
    np.testing.assert_array_equal(got, want)
    assert np.signbit(want.flat[3]) and np.signbit(got.flat[3])


def test_relu_clip_and_a_fused_relu_agree_bit_for_bit_on_every_float():
    """nn.relu, clip to [0, inf] and a fused op's relu (the clamp ``fused.epilogue_bounds``
    gives) are one function, so that fusing a relu (``rules/fusion.rules``) is an exact
    identity, also on -0.0, NaN and the infinities (relu was numpy's maximum(x, 0), which
    made -0.0 +0 where the fused form kept it); and the kernels of the first two agree."""
    from eqquant.ops import fused
    from eqquant.ops.registry import get_op
    x = np.array([-np.inf, -3.5, -1e-45, -0.0, 0.0, 1e-45, 2.0, np.inf, np.nan], np.float32)
    relu = get_op("nn.relu").semantics(x)
    clip = get_op("clip").semantics(x, a_min=0.0, a_max=np.inf)
    lo, hi = fused.epilogue_bounds({"activation": "relu"})
    fused_relu = fused._activate(x, "relu", lo, hi)
    for other in (clip, fused_relu):
        assert relu.tobytes() == other.tobytes()
    assert np.signbit(relu[3]) and np.isnan(relu[-1]) and relu[0] == 0
    for op, attrs in (("nn.relu", {}), ("clip", {"a_min": 0.0, "a_max": np.inf})):
        b = Builder()
        mod, _ = b.finish(b.call(op, b.input("x", x.shape), **attrs))
        assert Executor(mod).run({"x": x}).tobytes() == relu.tobytes()


@pytest.mark.parametrize("size", [16, 20000])       # the one-thread twin, the parallel kernel
@pytest.mark.parametrize("per_channel", [False, True])
def test_float_division_by_zero_gives_infinities_and_nan_as_the_reference_does(size,
                                                                                per_channel):
    """x / 0 is +-inf, 0 / 0 and NaN / 0 NaN (numpy's divide); the kernels once raised
    ZeroDivisionError (Numba's Python error model)."""
    shape = (1, 4, size // 4)
    b = Builder()
    z_shape = (1, 4, 1) if per_channel else shape
    mod, _ = b.finish(b.call("divide", b.input("x", shape), b.input("z", z_shape)))
    x = np.random.default_rng(5).normal(size=shape).astype(np.float32)
    x[0, :, :3] = [[1, -1, 0]] * 4
    x[0, 1, 3] = np.nan
    z = np.ones(z_shape, np.float32)
    z[0, :2] = 0
    with np.errstate(divide="ignore", invalid="ignore"):
        want = run(mod, {"x": x, "z": z})
    got = Executor(mod).run({"x": x, "z": z})
    assert np.isposinf(want).any() and np.isneginf(want).any() and np.isnan(want).any()
    np.testing.assert_array_equal(got, want)


def test_elementwise_dense_softmax_and_global_pool_kernels():
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (2, 4, 5, 5))
    y = b.input("y", (2, 4, 5, 5))
    s = b.call("add", x, y)
    s = b.call("multiply", s, b.param("k", rng.normal(size=(4, 1, 1)).astype("float32")))
    s = b.call("subtract", s, y)
    s = b.call("divide", s, b.param("d", rng.uniform(1, 2, (1, 4, 1, 1)).astype("float32")))
    s = b.call("nn.relu", s)
    s = b.call("clip", s, a_min=0.1, a_max=0.9)
    g = b.call("nn.batch_flatten", b.call("nn.global_avg_pool2d", s))
    d = b.call("fused.dense", g, b.param("w", rng.normal(size=(3, 4)).astype("float32")),
               b.param("bias", rng.normal(size=(3,)).astype("float32")), activation="relu")
    d = b.call("nn.dense", d, b.param("w2", rng.normal(size=(5, 3)).astype("float32")))
    out = b.call("nn.softmax", d)
    mod, params = b.finish(out)
    inputs = {"x": rng.normal(size=(2, 4, 5, 5)).astype("float32"),
              "y": rng.normal(size=(2, 4, 5, 5)).astype("float32")}
    _check(mod, params, inputs, ["add", "multiply", "subtract", "divide", "nn.relu", "clip",
                                 "nn.global_avg_pool2d", "fused.dense", "nn.dense",
                                 "nn.softmax", "nn.batch_flatten"])


def test_concatenate_and_pad_kernels():
    rng = np.random.default_rng(1)
    b = Builder()
    x = b.input("x", (1, 3, 4, 5))
    y = b.input("y", (1, 2, 4, 5))
    c = b.call("concatenate", b.tuple(x, y), axis=1)
    p = b.call("nn.pad", c, b.scalar(-1.5), pad_width=[[0, 0], [0, 0], [1, 2], [0, 3]])
    mod, params = b.finish(p)
    inputs = {"x": rng.normal(size=(1, 3, 4, 5)).astype("float32"),
              "y": rng.normal(size=(1, 2, 4, 5)).astype("float32")}
    _check(mod, params, inputs, ["concatenate", "nn.pad"])


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2"])
def test_models_run_on_the_executor(name):
    m = build(name)  # 224 x 224, as the zoo makes them
    r = optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"],
                 "simplify; bn_fold; simplify; fusion")
    ex = Executor(r.module)
    assert not [s.label for s in ex.steps if "reference" in s.label]
    ref = run(m.module, m.inputs, m.params)
    out = ex.run(m.inputs)
    assert np.max(np.abs(out - ref)) <= 1e-4 * np.max(np.abs(ref))
    again = ex.run(m.inputs)  # buffers are reused across runs; results are copies
    np.testing.assert_array_equal(out, again)


def test_memory_plan_reuses_buffers():
    m = build("resnet18", image_size=64)
    r = optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"],
                 "simplify; bn_fold; simplify; fusion")
    ex = Executor(r.module)
    assert len(ex.blocks) < len(ex.buffers) / 2
    # as many bytes as the values alive at once need, give or take blocks grown to fit
    assert sum(b.nbytes for b in ex.blocks) < 2 * ex.peak_bytes
    # two outputs share memory only when the first is dead (its views too) before the step
    # writing the second
    last_use = {}
    for i, step in enumerate(ex.steps):
        for s in step.inputs:
            last_use[s] = i
    last_use[ex.out_slot] = len(ex.steps)
    end = {}
    for i, step in reversed(list(enumerate(ex.steps))):
        end[step.output] = max([last_use.get(step.output, i)] + [
            end[v.output] for v in ex.steps[i + 1:] if v.kind == "view" and
            v.inputs[0] == step.output])
    written = sorted(ex.buffers)
    for a, i in enumerate(written):
        for j in written[a + 1:]:
            if np.shares_memory(ex.buffers[i], ex.buffers[j]):
                assert end[ex.steps[i].output] < j, (ex.steps[i].label, ex.steps[j].label)
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype("float32")
    np.testing.assert_allclose(ex.run({"data": x}), run(r.module, {"data": x}), rtol=1e-4,
                               atol=1e-4)


def test_memory_plan_keeps_the_fields_of_a_tuple_alive():
    """Branches joined by concatenate: each branch's last reader is the tuple, but its block
    must stay alive until the join has read it (the join's output, of another shape, once
    took a branch's block and overwrote it while reading it)."""
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.input("x", (1, 8, 12, 12))
    parts = [b.call("nn.relu", b.call("nn.conv2d", x, b.param(
        f"w{i}", rng.normal(size=(4 + 4 * i, 8, 3, 3)).astype("f4")), padding=[1, 1, 1, 1]))
        for i in range(3)]
    joined = b.call("concatenate", b.tuple(*parts), axis=1)
    y = b.call("nn.conv2d", joined, b.param("wo", rng.normal(size=(8, 24, 1, 1)).astype("f4")))
    mod = bind_params(*b.finish(b.call("split", y, indices=[4], axis=1)))
    ex = Executor(mod)
    xs = {"x": rng.normal(size=(1, 8, 12, 12)).astype("float32")}
    for got, want in zip(ex.run(xs), run(mod, xs)):     # (a block overwritten: whole values
        # off; float32 sums in another order, as BLAS's: a few ulps of the largest)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_kernels_are_cached_on_disk():
    """cache=True: compiled kernels are written to disk (beside the module, or under
    NUMBA_CACHE_DIR), for the next process."""
    import pathlib
    import eqquant.runtime.kernels.fp32 as kernels
    from eqquant.runtime.kernels import fma
    from eqquant.runtime.codegen.launch import Driver
    from eqquant.runtime.lowering.fp32 import fp32_path
    m = build("resnet18_stem", image_size=32)
    r = optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"],
                 "simplify; bn_fold; simplify; fusion")
    Executor(r.module).run(m.inputs)
    conv_module, conv = (kernels, "im2col") if fp32_path() == "blas" else (fma, "conv")
    for module, name in ((kernels, "max_pool"), (conv_module, conv)):
        kernel = getattr(module, name)
        # (a kernel is cached as the C entries of the parts it launches: ``launch._entry``)
        parts = kernel.parts if isinstance(kernel, Driver) else (kernel,)
        entries = [e for p in parts for e in p._entries.values()]
        assert entries, name
        cache = pathlib.Path(entries[0]._cache._cache_path)
        index = {p.name.split(".")[1].rsplit("-", 1)[0] for p in cache.glob("launch.*.nbi")}
        assert {e.__name__ for e in entries} <= index, (cache, index)


@pytest.mark.parametrize("fp32_kernel, user_policy", [("", ""), ("blas", ""),
                                                      ("blas", "ACTIVE")])
def test_openmp_threads_sleep_at_once_only_beside_blas(fp32_kernel, user_policy):
    """One thread pool: OpenMP's workers keep libgomp's default (a moment's spin between
    ops) unless float convolutions run on numpy's BLAS, whose threads they would starve;
    a policy the user set stays."""
    import os
    import subprocess
    import sys
    from eqquant.runtime.codegen.llvm_loops import cpu_has
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "EQQUANT_FP32_KERNEL")}
    if fp32_kernel:
        env["EQQUANT_FP32_KERNEL"] = fp32_kernel
    if user_policy:
        env["OMP_WAIT_POLICY"] = user_policy
    out = subprocess.run([sys.executable, "-c", "import os, eqquant.runtime; "
                          "print(os.environ.get('OMP_WAIT_POLICY', 'default'))"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    blas = fp32_kernel == "blas" or not (cpu_has("avx2") and cpu_has("fma"))
    assert out == (user_policy or ("PASSIVE" if blas else "default"))


@pytest.mark.parametrize("path", ["fma", "avx512"])
def test_float_weights_pack_into_aligned_zero_padded_panels(path):
    """``fma.pack``: (O, K) -> [ceil(O / block)][K][block] panels on 64-byte lines, the last
    block's missing channels zero, for channel counts that fill no block, some blocks, and
    some blocks and a part."""
    from eqquant.runtime.kernels import fma
    block = fma.block_of(path)
    rng = np.random.default_rng(1)
    for o, k in [(1, 3), (block, 5), (block + 1, 9), (3 * block + 7, 27)]:
        w = rng.standard_normal((o, k)).astype(np.float32)
        got = fma.pack(w, path)
        assert got.shape == (-(-o // block), k, block) and got.ctypes.data % 64 == 0
        for c in range(got.shape[0] * block):
            want = w[c] if c < o else np.zeros(k, np.float32)
            np.testing.assert_array_equal(got[c // block, :, c % block], want)


@pytest.mark.parametrize("path", ["fma", "avx512"])
def test_float_gemms_in_slices_of_k_sum_every_product_once(path):
    """The float GEMMs run K in slices (``fma.K_BLOCK``), a group's sums waiting in C between
    two: with K of two slices and a part, small integers (every sum exact in float32) give
    the exact products, in the plain GEMM and in the finishing one (bias, clamp, a last block
    of which C has one vector of channels: the other never written)."""
    from eqquant.runtime.kernels import fma
    if not fma.available(path):
        pytest.skip(f"this CPU has no {path}")
    block = fma.block_of(path)
    rng = np.random.default_rng(3)
    k, o, p = 2 * fma.K_BLOCK + 37, 2 * block + 5, 21
    a = rng.integers(-8, 9, (p, k)).astype(np.float32)
    w = rng.integers(-8, 9, (o, k)).astype(np.float32)
    want = a.astype(np.int64) @ w.astype(np.int64).T
    packed = fma.pack(w, path)
    width = packed.shape[0] * block
    out = np.full((p, width), np.nan, np.float32)
    fma._sgemm(a.ctypes.data, k, packed, 0, packed.shape[0], out.ctypes.data, width, p)
    np.testing.assert_array_equal(out[:, :o], want)
    bias = rng.integers(-50, 50, width).astype(np.float32)
    cols = 2 * block + block // 2
    done = np.full((p, cols), np.nan, np.float32)
    fma._sgemm_finish(a.ctypes.data, k, packed, 0, packed.shape[0], done.ctypes.data,
                      cols, p, bias, np.float32(-100.0), np.float32(400.0))
    np.testing.assert_array_equal(done[:, :o], np.clip(want + bias[:o], -100, 400))


def test_the_runtime_starts_numba_without_scipy_linalg():
    """Numba's BLAS probe at its CPU target's set-up imports scipy.linalg (0.13-0.2 s of a
    first inference): the runtime answers it without SciPy's linear algebra, so a fresh
    process that compiles and runs a kernel has not loaded it, and loads it after as usual."""
    import subprocess
    import sys
    pytest.importorskip("scipy")
    code = "\n".join([
        "import sys, numpy as np",
        "import eqquant.runtime.execution.executor",
        "from numba import njit",
        "f = njit(lambda a: a.sum())",
        "assert f(np.ones(3)) == 3.0",
        "assert 'scipy.linalg' not in sys.modules, 'scipy.linalg was loaded'",
        "import scipy.linalg",
        "assert scipy.linalg.norm([3.0, 4.0]) == 5.0",
    ])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=6),
       dtype=st.sampled_from(["uint8", "int32", "float32"]), data=st.data())
@example(shape=[1, 2, 58, 28, 28], dtype="uint8", data=None)     # ShuffleNet's shuffle
@example(shape=[3, 20000], dtype="uint8", data=None)              # a long run, cut up
def test_a_strided_copy_merges_axes_and_copies_any_view(shape, dtype, data):
    """``strided_call``: any permuted, sliced (negative steps too) view of up to six axes
    copied with the view's values; axes that are one run in the view merged first, so that a
    channel shuffle's transpose copies rows of whole planes."""
    from eqquant.runtime.kernels.fp32 import strided_call
    x = (np.arange(int(np.prod(shape))) % 251).astype(dtype).reshape(shape)
    if data is None:       # the examples: a shuffle's transpose; a slice of one long row
        view = x.transpose(0, 2, 1, 3, 4) if x.ndim == 5 else x[1:, 8:]
    else:
        perm = data.draw(st.permutations(range(x.ndim)))
        steps = [data.draw(st.sampled_from([1, 1, 2, -1])) for _ in shape]
        view = x[tuple(slice(None, None, s) for s in steps)].transpose(perm)
    out = np.empty(view.shape, x.dtype)
    kernel, args = strided_call(view, out)
    kernel(*args)
    np.testing.assert_array_equal(out, view)
    if data is None and x.ndim == 5:
        assert args[0].shape[-1] == 28 * 28          # rows of whole planes
    elif data is None:
        assert args[0].shape[-1] < view.shape[-1]    # the long row cut for the threads


def test_the_float_sigmoid_is_within_a_few_ulps_of_the_reference_everywhere():
    """The sigmoid kernel (float32 in vectors: its own exp, ``kernels.fp32._sigmoid32``)
    against the reference's numpy on every magnitude: within 8 float32 ulps (4 measured),
    0 and 1 where the reference's exp under- or overflows, NaN where it is NaN, and the
    infinities' limits."""
    from eqquant.ops.tensor import _sigmoid
    from eqquant.runtime.kernels.fp32 import unary
    rng = np.random.default_rng(0)
    x = np.concatenate([
        (rng.normal(size=50_000) * 40).astype(np.float32),
        np.linspace(-130, 130, 100_001, dtype=np.float32),
        np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 88.72, 88.73, -88.72, -88.73, 103.97,
                  103.98, -103.98, 1e-30, -1e-30, 3e38, -3e38], np.float32)])
    out = np.empty_like(x)
    unary(x, 4, 0.0, 0.0, out)
    want = _sigmoid(x)
    assert np.array_equal(np.isnan(out), np.isnan(want))
    ok = ~np.isnan(want)
    ulps = np.abs(out[ok].view(np.int32).astype(np.int64) -
                  want[ok].view(np.int32).astype(np.int64))
    assert ulps.max() <= 8, x[ok][np.argmax(ulps)]
    assert out[x == np.inf][0] == 1.0 and out[x == -np.inf][0] == 0.0


@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide", "maximum", "minimum"])
@pytest.mark.parametrize("per", [(40,), (1, 1, 1, 40)])
def test_a_value_per_channel_along_the_last_axis_runs_as_rows(op, per):
    """A channel-last image and a value per channel (a batch norm's scale and shift after
    DenseNet's joins, moved channel-last): the rows kernel (``binary_rows``), with numpy's
    bits (a division by zero, NaN and infinities included)."""
    from eqquant.runtime.kernels import fp32 as kf
    rng = np.random.default_rng(len(per))
    b = Builder()
    x = b.input("x", (2, 3, 5, 40))
    mod, params = b.finish(b.call(op, x, b.param("c", rng.normal(size=per).astype("f4"))))
    bound = bind_params(mod, params)
    ex = Executor(bound)
    (step,) = ex.steps
    assert step.fn.kernel_call([np.zeros((2, 3, 5, 40), "f4"), np.zeros(per, "f4")],
                               np.zeros((2, 3, 5, 40), "f4"))[0] in (kf.binary_rows,
                                                                    kf.binary_rows.serial)
    xs = {"x": rng.normal(size=(2, 3, 5, 40)).astype("f4")}
    xs["x"][0, 0, 0, :3] = [np.nan, np.inf, 0.0]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(ex.run(xs), run(bound, xs))


@pytest.mark.parametrize("op", ["add", "multiply"])
def test_a_value_per_channel_first_runs_as_rows_too(op):
    """A sum or a product with the value per channel first (a channel-last squeeze-
    excitation's scales times the image, as EfficientNet's export writes it): the rows
    kernel, the operands taken the other way round, with numpy's bits."""
    from eqquant.runtime.kernels import fp32 as kf
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.input("x", (2, 3, 5, 40))
    s = b.input("s", (1, 1, 1, 40))
    mod = b.finish(b.call(op, s, x))[0]
    ex = Executor(mod)
    (step,) = ex.steps
    assert step.fn.kernel_call([np.zeros((1, 1, 1, 40), "f4"), np.zeros((2, 3, 5, 40), "f4")],
                               np.zeros((2, 3, 5, 40), "f4"))[0] in (kf.binary_rows,
                                                                    kf.binary_rows.serial)
    xs = {"x": rng.normal(size=(2, 3, 5, 40)).astype("f4"),
          "s": rng.normal(size=(1, 1, 1, 40)).astype("f4")}
    xs["x"][0, 0, 0, :3] = [np.nan, np.inf, 0.0]
    xs["s"][0, 0, 0, 5] = np.inf
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(ex.run(xs), run(mod, xs))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_softmax_kernels_exponentials_hold_across_magnitudes():
    """softmax_rows takes its exponentials by its own polynomial (vectorised): rows of every
    spread from 1 to 1e30 (exponents of every size down to the floor where a value is 0
    however divided), with an attention mask's -inf, a NaN, +inf, rows all -inf and of the
    largest floats: the reference's NaNs, and every other value within 2 float32 ulps."""
    from eqquant.ops.tensor import _softmax
    from eqquant.runtime.kernels.fp32 import softmax_rows
    rng = np.random.default_rng(0)
    for scale in (1, 10, 100, 1e4, 1e30):
        x = (rng.normal(size=(64, 131)) * scale).astype(np.float32)
        x[0, :5] = -np.inf
        x[1, 3] = np.nan
        x[2, :] = -np.inf
        x[3, 7] = np.inf
        x[4] = 0
        x[5, :] = np.float32(3e38)
        x[6, 0] = -3e38
        x[7] = -np.arange(131, dtype=np.float32)      # exp(0) to exp(-130), past the floor
        out = np.empty_like(x)
        softmax_rows(x, out)
        want = _softmax(x, axis=-1)
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(out), nan)
        spacing = np.abs(np.spacing(np.where(nan, 1, want)))
        assert (np.abs(np.where(nan, 0, out) - np.where(nan, 0, want)) <= 2 * spacing).all()
        assert (out[7, :104] > 0).all() and out[7, 110:].max() == 0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_gelu_kernel_holds_to_one_ulp_across_its_range():
    """The GELU kernel takes erfc by its own polynomials and exponential (vectorised): on values
    from -30 to 30, step by step (the far negative tail, where 1 + erf would cancel, values
    underflowing to -0.0, both sides of where its two polynomials meet), far beyond the end
    of its fit and the specials, every value within 1 float32 ulp of the reference's float64
    math.erfc, the signs of zeros and the NaNs and infinities the reference has."""
    from eqquant.ops.activation import _gelu
    from eqquant.runtime.kernels.fp32 import gelu
    x = np.concatenate([np.linspace(-30, 30, 120001),
                        np.random.default_rng(0).normal(size=20000) * 3,
                        np.linspace(-1.6, -1.4, 2001), np.linspace(1.4, 1.6, 2001),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 3e38, -3e38,
                         1e-45, -1e-45, -1e30, 1e30, -15.5, -14.2, -14.0, 15.5]]
                       ).astype(np.float32)
    out = np.empty_like(x)
    gelu(x, out, 0.0)
    want = _gelu(x, approximate="none")
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    inf = np.isinf(want)
    np.testing.assert_array_equal(out[inf], want[inf])
    fin = np.isfinite(want)
    spacing = np.abs(np.spacing(want[fin]))
    assert (np.abs(out[fin].astype(np.float64) - want[fin]) <= spacing).all()
    zero = fin & (want == 0)
    np.testing.assert_array_equal(np.signbit(out[zero]), np.signbit(want[zero]))
    assert zero.sum() > 1000 and (want[(x < -20) & np.isfinite(x)] == 0).all()   # (-0.0)


@settings(max_examples=30, deadline=None)
@given(lead=st.sampled_from([(), (1,), (3,), (2, 2)]), m=st.integers(1, 60),
       kd=st.integers(1, 70), n=st.integers(1, 40), ta=st.booleans(), tb=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_float_batch_matmul_runs_its_kernels_close_to_the_reference(lead, m, kd, n, ta, tb,
                                                                    seed):
    """nn.batch_matmul of float stacks (attention's products in float) runs on each kernel
    this CPU's target offers (pinned in the program: the FMA GEMMs, b packed at run time,
    and the portable rows), not the reference: every shape of stack, every transposition,
    within float32 rounding of the reference's float64 sums, and the same again on a second
    run (the scratch reused); unpinned, the plan takes a GEMM where the target has one."""
    from eqquant.runtime.target import current
    rng = np.random.default_rng(seed)
    a_shape = lead + ((kd, m) if ta else (m, kd))
    b_shape = lead + ((n, kd) if tb else (kd, n))
    xs = {"a": rng.normal(size=a_shape).astype("f4"), "b": rng.normal(size=b_shape).astype("f4")}
    kernels = [k for k in ("x86.avx512", "x86.fma", "portable") if current().offers(k)]
    for pin in kernels + [""]:
        b = Builder()
        x, y = b.input("a", a_shape), b.input("b", b_shape)
        mod = b.finish(b.call("nn.batch_matmul", x, y, transpose_a=ta, transpose_b=tb,
                              kernel=pin))[0]
        ex = Executor(mod)
        (step,) = ex.steps
        assert "reference" not in step.label, step.label
        assert step.fn.kernel == (pin or kernels[0])
        want = run(mod, xs)
        got = ex.run(xs)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(kd))
        np.testing.assert_array_equal(ex.run(xs), got)
