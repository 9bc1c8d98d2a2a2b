"""The integer kernels (portable Numba path) are bit-exact against the integer reference."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from eqquant.errors import EqquantError
from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.runtime.execution.executor import Executor
from kernel_paths import forced_int8_path, int8_paths

cases = st.fixed_dictionaries({
    "c": st.integers(1, 5), "o": st.integers(1, 5), "hw": st.integers(4, 9),
    "k": st.integers(1, 3), "stride": st.integers(1, 2), "pad": st.integers(0, 1),
    "groups": st.sampled_from([1, 2]), "unsigned": st.booleans(), "zx": st.integers(-5, 5),
    "per_channel": st.booleans(), "seed": st.integers(0, 999)})


@settings(max_examples=30, deadline=None)
@given(cases)
def test_int8_conv_requantize_chain_is_bit_exact(case):
    rng = np.random.default_rng(case["seed"])
    g = case["groups"]
    c, o = case["c"] * g, case["o"] * g
    hw, k = case["hw"], case["k"]
    xdt = "uint8" if case["unsigned"] else "int8"
    zx = abs(case["zx"]) + 100 if case["unsigned"] else case["zx"]
    b = Builder()
    x = b.input("x", (1, c, hw, hw), xdt)
    w = b.param("w", rng.integers(-127, 128, size=(o, c // g, k, k)).astype("int8"))
    zw = (rng.integers(-3, 4, size=(o,)) if case["per_channel"] else np.array(0)).astype("i4")
    acc = b.call("qnn.conv2d", x, w, b.param("zx", np.array(zx, np.int32)),
                 b.param("zw", zw), b.param("sx", np.array(0.05, np.float32)),
                 b.param("sw", np.array(0.01, np.float32)), strides=[case["stride"]] * 2,
                 padding=[case["pad"]] * 2, groups=g)
    acc = b.call("nn.relu", b.call("add", acc, b.param(
        "bias", rng.integers(-500, 500, size=(o, 1, 1)).astype("int32"))))
    q = b.call("qnn.requantize", acc, b.param("s1", np.array(0.0005, np.float32)),
               b.param("z1", np.array(0, np.int32)), b.param("s2", np.array(0.07, np.float32)),
               b.param("z2", np.array(3, np.int32)))
    from eqquant.errors import TypeCheckError
    try:
        q = b.call("nn.max_pool2d", q, pool_size=[2, 2])
    except TypeCheckError:  # the convolution's output is smaller than the window
        pass
    out = b.call("qnn.dequantize", q, b.param("s3", np.array(0.07, np.float32)),
                 b.param("z3", np.array(3, np.int32)))
    mod, params = b.finish(out)
    bound = bind_params(mod, params)
    ex = Executor(bound)
    assert not [s.label for s in ex.steps if "reference" in s.label]
    lo, hi = (0, 256) if case["unsigned"] else (-128, 128)
    xs = {"x": rng.integers(lo, hi, size=(1, c, hw, hw)).astype(xdt)}
    np.testing.assert_array_equal(ex.run(xs), run(bound, xs))


def test_quantize_kernel_rounds_half_to_even_like_the_reference():
    b = Builder()
    x = b.input("x", (8,))
    q = b.call("qnn.quantize", x, b.param("s", np.array(0.5, np.float32)),
               b.param("z", np.array(0, np.int32)))
    mod, params = b.finish(q)
    bound = bind_params(mod, params)
    xs = {"x": np.array([0.25, 0.75, -0.25, -0.75, 1.25, 100.0, -100.0, 0.0], np.float32)}
    got = Executor(bound).run(xs)
    np.testing.assert_array_equal(got, run(bound, xs))
    np.testing.assert_array_equal(got, [0, 2, 0, -2, 2, 127, -127, 0])  # int8: [-127, 127]


SPECIAL_FLOATS = [np.nan, np.inf, -np.inf, -0.0, 1e-45, 3e38, -3e38, 1e20, -1e20,
                  9.2233715e18, 9.223372e18, -9.223372e18, 2.2e9, -2.2e9, 0.5, 1.5, 2.5, -2.5,
                  126.5, 127.5, 128.5, -127.5, -128.5, 254.5, 255.5]


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(["int8", "uint8"]), zero=st.integers(-300, 300),
       scale=st.sampled_from([1.0, 0.5, 0.0187, 3.7, 1e-30, 1e30]),
       n=st.sampled_from([7, 100, 20_000]), seed=st.integers(0, 999))
@example(dtype="uint8", zero=-3, scale=1.0, n=7, seed=0)      # NaN: int64's least + zero
@example(dtype="int8", zero=0, scale=1.0, n=7, seed=1)
def test_quantize_to_8_bits_answers_as_the_reference_on_any_float(dtype, zero, scale, n, seed):
    """qnn.quantize to 8 bits runs in float32 lanes (``kernels_int8.quantize_narrow``, one
    thread below 16,384 elements, two from there): the reference's bits on NaN, the
    infinities, ties, values past int32 and past int64 (converted to int64's least value,
    to which the zero point is added, wrapping), any zero point."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.choice([1.0, 300.0, 1e12], n)).astype(np.float32)
    x[rng.choice(n, min(n, len(SPECIAL_FLOATS)), replace=False)] = \
        SPECIAL_FLOATS[:min(n, len(SPECIAL_FLOATS))]
    b = Builder()
    xi = b.input("x", (n,))
    q = b.call("qnn.quantize", xi, b.param("s", np.array(scale, np.float32)),
               b.param("z", np.array(zero, np.int32)), out_dtype=dtype)
    mod, params = b.finish(q)
    bound = bind_params(mod, params)
    ex = Executor(bound)
    assert any(getattr(s.fn, "narrow", False) for s in ex.steps)
    np.testing.assert_array_equal(ex.run({"x": x}), run(bound, {"x": x}))


def _simd_used(ex, path):
    """How many steps run the SIMD GEMM of ``path``."""
    return sum(getattr(getattr(s.fn, "conv", s.fn), "gemm_path", "portable") == path
               for s in ex.steps) if path != "portable" else 0


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_every_int8_path_agrees_bit_for_bit(monkeypatch, dtype):
    """Every int8 GEMM path the CPU has (VNNI, AVX2, portable) runs the seed block and agrees
    with the reference bit for bit; forcing a path the CPU lacks (or no path) is an error,
    never a silent fallback, and the dispatcher picks the fastest the CPU has."""
    from eqquant.quant.flow import quantize
    from eqquant.runtime.lowering.int8 import int8_path
    from eqquant.runtime.target import INT8_PATHS, int8_paths
    from eqquant.zoo import build
    PATHS = (*INT8_PATHS, "portable")
    runs = (*int8_paths(), "portable")
    m = build("resnet18_stem", image_size=64)
    rng = np.random.default_rng(0)
    samples = [{"data": rng.normal(size=(1, 3, 64, 64)).astype("float32")} for _ in range(2)]
    r = quantize(m.module, m.params, samples, "minmax", per_channel=True, dtype=dtype)
    x = {"data": rng.normal(size=(1, 3, 64, 64)).astype("float32")}
    ref = run(r.module, x)
    for path in [*PATHS, "avx1024"]:
        monkeypatch.setenv("EQQUANT_INT8_KERNEL", path)
        if path not in runs:
            with pytest.raises(EqquantError, match=f"EQQUANT_INT8_KERNEL={path}: "
                               + ("this CPU runs" if path in PATHS else "not an int8 path")):
                Executor(r.module)
            continue
        ex = Executor(r.module)
        assert not [s.label for s in ex.steps if "reference" in s.label]
        assert _simd_used(ex, path) == (0 if path == "portable" else 3)
        np.testing.assert_array_equal(ex.run(x), ref)
    monkeypatch.delenv("EQQUANT_INT8_KERNEL")
    assert int8_path() == runs[0]


@pytest.mark.parametrize("path", ["amx", "vnni", "vnni16", "avxvnni", "avx2"])
def test_simd_gemms_exact_on_random_matrices(path):
    from eqquant.runtime.kernels import simd_module
    from eqquant.runtime.target import int8_paths
    if path not in int8_paths():
        pytest.skip(f"this CPU has no {path}: that path cannot run here")
    module = simd_module(path)
    rng = np.random.default_rng(1)
    shapes = [(7, 5, 64), (50, 147, 128), (3, 576, 64), (1, 1, module.BLOCK)]
    if module.PADS:                          # output channels that fill no block
        shapes += [(9, 30, 24), (200, 19, 1), (5, 64, module.BLOCK + 3)]
    for p, k, o in shapes:
        w = rng.integers(-128, 128, size=(o, k)).astype(np.int8)
        w[0] = -128
        a = rng.integers(0, 256, size=(p, k)).astype(np.uint8)
        a[0] = 255                            # the extremes: 255 x -128 in every product
        packed, _, kp = module.pack(w)
        rows = np.zeros((p, kp), np.uint8)
        rows[:, :k] = a
        width = packed.shape[0] * module.BLOCK
        out = np.empty((p, width), np.int32)
        module.gemm(rows, packed, out)
        np.testing.assert_array_equal(out[:, :o], a.astype(np.int64) @ w.astype(np.int64).T)
        assert not out[:, o:].any()
        out2 = np.empty((p, width), np.int32)
        module.gemm_parallel(rows, packed, out2)
        np.testing.assert_array_equal(out2, out)


@pytest.mark.parametrize("method, dtype", [("realize", "int8"), ("once", "uint8"),
                                           ("once", "int8")])
def test_qnn_add_kernel_is_bit_exact(method, dtype):
    rng = np.random.default_rng(5)
    b = Builder()
    x = b.input("a", (2, 3, 4), dtype)
    y = b.input("b", (2, 3, 4), dtype)
    shift = 128 if dtype == "uint8" else 0
    params = [np.array(v, dt) for v, dt in [(0.05, "f4"), (2 + shift, "i4"), (0.021, "f4"),
                                             (-3 + shift, "i4"), (0.07, "f4"), (1 + shift, "i4")]]
    out = b.call("qnn.add", x, y, *[b.param(f"p{i}", v) for i, v in enumerate(params)],
                 method=method)
    mod, values = b.finish(out)
    bound = bind_params(mod, values)
    ex = Executor(bound)
    assert [s.label for s in ex.steps] == ["qnn.add"]
    xs = {"a": (rng.integers(-128, 128, (2, 3, 4)) + shift).astype(dtype),
          "b": (rng.integers(-128, 128, (2, 3, 4)) + shift).astype(dtype)}
    got = ex.run(xs)
    np.testing.assert_array_equal(got, run(bound, xs))
    # both methods stay within their rules' tolerance of the exact sum
    s = [float(p) for p in params]
    exact = ((xs["a"].astype(float) - s[1]) * s[0] + (xs["b"].astype(float) - s[3]) * s[2]) \
        / s[4] + s[5]
    info = np.iinfo(dtype)
    err = np.abs(got - np.clip(exact, info.min, info.max))
    assert err.max() <= (0.5 + 1e-6 if method == "once" else 1.5)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["int8", "uint8"]), st.floats(1e-3, 63.0), st.floats(1e-3, 63.0),
       st.integers(0, 255), st.integers(0, 255),
       st.integers(-128, 255), st.integers(1, 3000), st.integers(0, 2 ** 31 - 1))
@example("uint8", 63.99, 63.99, 0, 255, 255, 7, 1)       # multipliers near 2^30
@example("int8", 1.0, 1.0, 0, 255, -128, 7, 2)
def test_qnn_add_once_in_int32_lanes_is_bit_exact(dtype, ra, rb, za, zb, zo, n, seed):
    """qnn.add(method="once") on int32 lanes (the multipliers split at 15 bits,
    ``qadd_once_split``) gives the reference's bits for any scale ratios below 64, zero
    points across their range and both 8-bit types, in parallel and on one thread."""
    from eqquant.ops.qnn import ADD_FRACTION_BITS, _qadd, add_multiplier
    from eqquant.ops.numerics import qrange
    from eqquant.runtime.kernels import int8 as k8
    rng = np.random.default_rng(seed)
    lo, hi = qrange(dtype)
    za, zb = lo + za % (hi - lo + 1), lo + zb % (hi - lo + 1)
    zo = min(max(zo, lo), hi)
    a = rng.integers(lo, hi + 1, n).astype(dtype)
    b = rng.integers(lo, hi + 1, n).astype(dtype)
    so = 0.01
    ma, mb = add_multiplier(ra * so, so), add_multiplier(rb * so, so)
    split = k8.split_multipliers(ma, mb)
    assert split is not None and ADD_FRACTION_BITS == 24
    want = _qadd(a, b, ra * so, za, rb * so, zb, so, zo, method="once")
    assert want.dtype == dtype
    for kernel in (k8.qadd_once_split, k8.qadd_once_split.serial):
        got = np.zeros(n, dtype)
        kernel(a, np.int32(za), b, np.int32(zb), *split, zo, lo, hi, got)
        np.testing.assert_array_equal(got, want)


def test_qnn_add_once_keeps_int64_lanes_for_a_large_ratio():
    """A scale ratio of 64 or more makes a multiplier of 2^30 or more: no int32 split, the
    int64 kernel (and the reference's bits) instead."""
    from eqquant.ops.qnn import add_multiplier
    from eqquant.runtime.kernels import int8 as k8
    assert k8.split_multipliers(add_multiplier(64.0, 1.0), 1 << 20) is None
    assert k8.split_multipliers(add_multiplier(63.99, 1.0), 1 << 20) is not None
    b = Builder()
    x, y = b.input("a", (1, 50), "uint8"), b.input("b", (1, 50), "uint8")
    params = [np.array(v, dt) for v, dt in [(6.4, "f4"), (3, "i4"), (0.02, "f4"), (250, "i4"),
                                             (0.1, "f4"), (7, "i4")]]
    out = b.call("qnn.add", x, y, *[b.param(f"p{i}", v) for i, v in enumerate(params)],
                 method="once")
    mod, values = b.finish(out)
    bound = bind_params(mod, values)
    ex = Executor(bound)
    assert ex.steps[0].fn.split is None
    rng = np.random.default_rng(3)
    xs = {k: rng.integers(0, 256, (1, 50)).astype(np.uint8) for k in "ab"}
    np.testing.assert_array_equal(ex.run(xs), run(bound, xs))


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 14), st.integers(1, 40), st.integers(1, 12), st.booleans(),
       st.integers(-4, 4), st.booleans(), st.integers(0, 999))
@example(1, 33, 7, True, 2, False, 1)
@example(7, 33, 7, True, 2, False, 2)
def test_int8_dense_is_bit_exact(n, k, units, unsigned, zx, per_unit, seed):
    """Both paths: nonzero weight zero points, or fewer rows than the SIMD GEMM's tile, take
    the dot-product kernel; zero points 0 and a batch that fills the tile the SIMD GEMM
    where the CPU has one (any number of units: the last block padded)."""
    for units_, per_unit_ in ((units, per_unit), (64 * ((units + 3) // 4), False)):
        _check_dense(n, k, units_, unsigned, zx, per_unit_, seed)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 3), st.integers(1, 300), st.integers(1, 40), st.booleans(),
       st.sampled_from([0, 3, -128, 255, 40000, -70000]), st.booleans(), st.integers(0, 999))
def test_portable_int8_dense_is_bit_exact(n, k, units, unsigned, zx, per_unit, seed):
    """EQQUANT_INT8_KERNEL=portable: the dot-product kernel (``dense_i8``), its image less
    the zero point in 16 bits, or in 32 where a zero point far outside the data's range
    would overflow them; long rows (the vectorized loop and its remainder), sums that wrap."""
    with forced_int8_path("portable"):
        _check_dense(n, k, units, unsigned, zx - (128 if unsigned else 0), per_unit, seed)


def _check_dense(n, k, units, unsigned, zx, per_unit, seed):
    rng = np.random.default_rng(seed)
    xdt = "uint8" if unsigned else "int8"
    zx = zx + 128 if unsigned else zx
    b = Builder()
    x = b.input("x", (n, k), xdt)
    zw = (rng.integers(-3, 4, size=(units,)) if per_unit else np.array(0)).astype("i4")
    y = b.call("qnn.dense", x, b.param("w", rng.integers(-128, 128, (units, k)).astype("i1")),
               b.param("zx", np.array(zx, np.int32)), b.param("zw", zw),
               b.param("sx", np.array(0.1, np.float32)), b.param("sw", np.array(0.2, np.float32)))
    bound = bind_params(*b.finish(y))
    ex = Executor(bound)
    assert [s.label for s in ex.steps] == ["qnn.dense"]
    from eqquant.runtime.kernels import simd_module
    from eqquant.runtime.lowering.plan import Site, choose
    from eqquant.runtime.target import current, gemm_path
    # the lowering's choice for the layer (see its table): a GEMM, or the dot products
    kernel = choose(Site("qnn.dense", units, k, 1, bool(np.any(zw)), False, n),
                    current()).kernel
    assert ex.steps[0].fn.path == kernel
    path = gemm_path(kernel)
    module = simd_module(path) if path else None
    simd = module is not None and not np.any(zw) and (units % module.BLOCK == 0 or
                                                      module.PADS) and n >= module.ROWS
    assert ex.steps[0].fn.gemm_path == (path if simd else "portable")
    assert simd == (path is not None)
    lo, hi = (0, 256) if unsigned else (-128, 128)
    xs = {"x": rng.integers(lo, hi, size=(n, k)).astype(xdt)}
    np.testing.assert_array_equal(ex.run(xs), run(bound, xs))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["int8", "uint8", "int32"]), st.integers(1, 3), st.integers(1, 2),
       st.integers(0, 1), st.booleans(), st.integers(0, 999))
def test_integer_average_pools_are_bit_exact(dtype, k, stride, pad, include_pad, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    b = Builder()
    x = b.input("x", (1, 3, 7, 7), dtype)
    pad = min(pad, k // 2)
    avg = b.call("nn.avg_pool2d", x, pool_size=[k, k], strides=[stride] * 2,
                 padding=[pad] * 4, count_include_pad=include_pad)
    glob = b.call("nn.global_avg_pool2d", x)
    bound = bind_params(*b.finish(b.tuple(avg, glob)))
    ex = Executor(bound)
    assert not [s.label for s in ex.steps if "reference" in s.label]
    lo, hi = max(info.min, -2 ** 20), min(info.max, 2 ** 20)
    xs = {"x": rng.integers(lo, hi, size=(1, 3, 7, 7), endpoint=True).astype(dtype)}
    for got, want in zip(ex.run(xs), run(bound, xs)):
        np.testing.assert_array_equal(got, want)


def _cpu_runs(path: str) -> None:
    """Skip a test of ``path`` where this CPU lacks it (forcing it would be an error)."""
    from eqquant.runtime.target import int8_paths
    if path not in (*int8_paths(), "portable"):
        pytest.skip(f"this CPU has no {path} path")


@pytest.mark.parametrize("path", ["portable", "amx", "vnni", "vnni16", "avxvnni", "avx2"])
def test_relu6_convolutions_are_bit_exact_on_every_path(monkeypatch, path):
    """fused.qconv2d with a clip (ReLU6) epilogue: a MobileNet block whose 1x1 expansion has 64
    channels (the VNNI path's block), its depthwise and projection convolutions."""
    import onnx_models as om
    pytest.importorskip("onnx")
    from eqquant.interop.onnx_import import import_onnx
    from eqquant.quant.flow import quantize
    _cpu_runs(path)
    monkeypatch.setenv("EQQUANT_INT8_KERNEL", path)
    mod, params, _ = import_onnx(om.mobilenet_block(c=16, t=4))
    rng = np.random.default_rng(4)
    samples = [{"x": rng.standard_normal((1, 16, 16, 16)).astype(np.float32)} for _ in range(3)]
    q = quantize(mod, params, samples, "minmax", per_channel=True)
    from eqquant.core.nodes import Call, post_order
    acts = [n.attrs["activation"] for n in post_order(q.module.main.body)
            if isinstance(n, Call) and n.op_name == "fused.qconv2d"]
    assert acts.count("clip") == 2
    ex = Executor(q.module)
    # the 64-channel expansion and the 16-channel projection (a path forced takes every
    # layer: on the VNNI path the 16 channels are padded to a block of 64)
    assert _simd_used(ex, path) == {"portable": 0, "amx": 2, "vnni": 2, "vnni16": 2,
                                    "avxvnni": 2, "avx2": 2}[path]
    assert not [s.label for s in ex.steps if "reference" in s.label]
    np.testing.assert_array_equal(ex.run(samples[0]), run(q.module, samples[0]))


def test_epilogue_tables_are_derived_without_compiling():
    """A fused int8 convolution's epilogue table (``epilogue_table``: its per-channel
    constants, the depthwise sweep's initial sums) is derived in NumPy as the executor binds
    the layer: nothing is compiled for it. As Numba kernels, the derivations took 1.4 s of
    resnet18's first start, and were compiled again for each new type of their arguments."""
    from numba.core.dispatcher import Dispatcher
    from eqquant.runtime.kernels import amx
    from eqquant.runtime.kernels import avx2
    from eqquant.runtime.codegen import epilogue_table
    from eqquant.runtime.kernels import vnni
    vnni16, avxvnni = vnni.PATHS["vnni16"], vnni.PATHS["avxvnni"]
    assert not [k for k, v in vars(epilogue_table).items() if isinstance(v, Dispatcher)]
    for simd in (amx, avx2, avxvnni, vnni, vnni16):
        assert simd.requantize_params is epilogue_table.requantize_params


@pytest.mark.parametrize("per_channel", [False, True])
def test_qnn_clip_kernel_is_bit_exact(per_channel):
    rng = np.random.default_rng(6)
    b = Builder()
    x = b.input("q", (2, 4, 5), "int32")
    s = np.array([0.5, 0.25, 0.1, 2.0] if per_channel else 0.3, np.float32)
    y = b.call("qnn.clip", x, b.param("s", s), b.param("z", np.array(0, np.int32)), a_min=-1.0,
               a_max=6.0, axis=1)
    bound = bind_params(*b.finish(y))
    ex = Executor(bound)
    assert [st.label for st in ex.steps] == ["qnn.clip"]
    xs = {"q": rng.integers(-100, 100, (2, 4, 5)).astype("int32")}
    got = ex.run(xs)
    np.testing.assert_array_equal(got, run(bound, xs))
    real = xs["q"] * (s.reshape(1, -1, 1) if per_channel else s)
    assert np.all(np.abs(got * (s.reshape(1, -1, 1) if per_channel else s)
                         - np.clip(real, -1, 6)) <= 0.5 * np.max(s) + 1e-6)


@pytest.mark.parametrize("path", ["portable", "amx", "vnni", "vnni16", "avxvnni", "avx2"])
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_unfused_int8_conv_on_every_path(monkeypatch, path, dtype):
    """qnn.conv2d on its own (64 output channels: the VNNI path's block), strided and padded,
    with a nonzero input zero point."""
    _cpu_runs(path)
    monkeypatch.setenv("EQQUANT_INT8_KERNEL", path)
    rng = np.random.default_rng(11)
    b = Builder()
    x = b.input("x", (1, 5, 9, 9), dtype)
    zx = 130 if dtype == "uint8" else -3
    y = b.call("qnn.conv2d", x, b.param("w", rng.integers(-128, 128, (64, 5, 3, 3)).astype("i1")),
               b.param("zx", np.array(zx, np.int32)), b.param("zw", np.array(0, np.int32)),
               b.param("sx", np.array(0.1, np.float32)), b.param("sw", np.array(0.2, np.float32)),
               strides=[2, 2], padding=[1, 1, 1, 1])
    bound = bind_params(*b.finish(y))
    ex = Executor(bound)
    from eqquant.runtime.lowering.int8 import int8_path
    assert ex.steps[0].fn.gemm_path == int8_path()
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    xs = {"x": rng.integers(lo, hi, (1, 5, 9, 9)).astype(dtype)}
    np.testing.assert_array_equal(ex.run(xs), run(bound, xs))


# A convolution NCHW/OIHW as written, or channel-last (NHWC/HWIO, bias and scales along the
# last axis): the shapes and attributes of each.
def _image_in(layout, nchw):
    n, c, h, w = nchw
    return (n, h, w, c) if layout == "NHWC" else nchw


def _kernel_in(layout, oihw):
    return np.ascontiguousarray(oihw.transpose(2, 3, 1, 0)) if layout == "NHWC" else oihw


def _bias_shape(layout, o):
    return (o,) if layout == "NHWC" else (o, 1, 1)


def _channel_axis(layout):
    return 3 if layout == "NHWC" else 1


def _layouts(layout):
    return dict(data_layout=layout, kernel_layout="HWIO" if layout == "NHWC" else "OIHW")


def _fused_operands(b, rng, layout, w, o, zx, dtype) -> list:
    """fused.qconv2d's operands after its image: the weights ``w`` (in ``layout``'s kernel
    layout), a random bias, the input zero point ``zx``, random per-channel weight scales and
    requantization, the output's zero point (5 for uint8)."""
    return [b.param("w", w),
            b.param("b", rng.integers(-900, 900, _bias_shape(layout, o)).astype("i4")),
            b.param("zx", np.array(zx, np.int32)), b.param("zw", np.array(0, np.int32)),
            b.param("sx", np.array(0.05, np.float32)),
            b.param("sw", rng.uniform(0.01, 0.02, o).astype(np.float32)),
            b.param("s1", (0.05 * rng.uniform(0.01, 0.02, o)).astype(np.float32)),
            b.param("z1", np.array(0, np.int32)), b.param("s2", np.array(0.1, np.float32)),
            b.param("z2", np.array(5 if dtype == "uint8" else 0, np.int32))]


@settings(max_examples=40, deadline=None)
@given(c=st.integers(2, 40), mult=st.integers(1, 3), k=st.sampled_from([1, 3, 5]),
       stride=st.integers(1, 3), pad=st.integers(0, 2), dil=st.integers(1, 2),
       size=st.integers(3, 11), dtype=st.sampled_from(["int8", "uint8"]),
       act=st.sampled_from(["none", "relu", "clip"]), seed=st.integers(0, 999),
       layout=st.sampled_from(["NCHW", "NHWC"]))
# 3 x 3 taps in pairs (strips of 16 channels, then a tail), stride 1 and 2, dilated, weight
# zero points (odd seeds)
@example(c=33, mult=1, k=3, stride=1, pad=1, dil=1, size=9, dtype="uint8", act="none", seed=1,
         layout="NHWC")
@example(c=32, mult=1, k=3, stride=2, pad=1, dil=1, size=10, dtype="int8", act="relu", seed=3,
         layout="NHWC")
@example(c=17, mult=1, k=3, stride=1, pad=2, dil=2, size=11, dtype="uint8", act="clip", seed=4,
         layout="NHWC")
def test_depthwise_int8_convolutions_are_bit_exact(c, mult, k, stride, pad, dil, size, dtype,
                                                   act, seed, layout):
    """Depthwise qnn.conv2d and fused.qconv2d (groups = input channels, channel multipliers,
    strides, padding, dilation, channel counts that fill no vector or some vectors of 16 and
    a tail, images with no pixel all of whose taps lie inside), NCHW and channel-last (the
    SIMD sweep, border pixels included, 3 x 3 taps in pairs; the tap loop with a
    multiplier), on the direct kernel, against the integer reference."""
    rng = np.random.default_rng(seed)
    if (size + 2 * pad - dil * (k - 1) - 1) < 0:
        return
    o = c * mult
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    zx = int(rng.integers(lo, hi)) if dtype == "uint8" else int(rng.integers(-5, 6))
    w = _kernel_in(layout, rng.integers(-128, 128, (o, 1, k, k)).astype("i1"))
    conv = dict(strides=[stride] * 2, padding=[pad] * 4, dilation=[dil] * 2, groups=c,
                **_layouts(layout))
    b = Builder()
    x = b.input("x", _image_in(layout, (2, c, size, size)), dtype)
    # a weight zero point anywhere in int8's range: taps w - zw of up to 9 bits
    zw = int(rng.integers(-128, 128)) if seed % 2 else 0
    qa = (b.param("zx", np.array(zx, np.int32)), b.param("zw", np.array(zw, np.int32)),
          b.param("sx", np.array(0.05, np.float32)),
          b.param("sw", rng.uniform(0.01, 0.02, o).astype(np.float32)))
    plain = b.call("qnn.conv2d", x, b.param("w", w), *qa, **conv)
    bias = rng.integers(-500, 500, _bias_shape(layout, o)).astype("i4")
    s1 = (0.05 * rng.uniform(0.01, 0.02, o)).astype(np.float32)
    extra = dict(a_min=0.0, a_max=2.0) if act == "clip" else {}
    fused = b.call("fused.qconv2d", x, b.param("w2", w), b.param("b", bias), qa[0], qa[1],
                   qa[2], qa[3], b.param("s1", s1), b.param("z1", np.array(0, np.int32)),
                   b.param("s2", np.array(0.1, np.float32)),
                   b.param("z2", np.array(3 if dtype == "uint8" else 0, np.int32)),
                   **conv, activation=act, out_dtype=dtype, axis=_channel_axis(layout), **extra)
    bound = bind_params(*b.finish(b.tuple(plain, fused)))
    ex = Executor(bound)
    assert not [s.label for s in ex.steps if "reference" in s.label]
    assert all(getattr(getattr(s.fn, "conv", s.fn), "depthwise", False)
               for s in ex.steps if s.label in ("qnn.conv2d", "fused.qconv2d"))
    xs = {"x": rng.integers(lo, hi, _image_in(layout, (2, c, size, size))).astype(dtype)}
    for got, want in zip(ex.run(xs), run(bound, xs)):
        np.testing.assert_array_equal(got, want)


def _emitted_madd(form: str):
    """``run(x, w, out)``: ``depthwise_simd.madd`` in ``form`` on x and w (32 int16 each,
    as two <16 x i16> halves) into out (16 int32)."""
    from numba import njit, types
    from numba.extending import intrinsic
    from eqquant.runtime.kernels.depthwise import madd

    @intrinsic
    def emitted(typingctx, x, w, out):
        def codegen(context, builder, signature, args):
            from llvmlite import ir
            half = ir.VectorType(ir.IntType(16), 16).as_pointer()

            def halves(address):
                p = builder.inttoptr(address, half)
                return [builder.load(builder.gep(p, [ir.Constant(ir.IntType(64), h)]),
                                     align=2) for h in (0, 1)]
            r = madd(builder, halves(args[0]), halves(args[1]), form)
            builder.store(r, builder.inttoptr(args[2], r.type.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.void(types.intp, types.intp, types.intp), codegen

    @njit
    def run(x, w, out):
        emitted(x.ctypes.data, w.ctypes.data, out.ctypes.data)
    return run


_MADD = {}


def _madd_forms():
    from eqquant.runtime.codegen.llvm_loops import cpu_has
    return [pytest.param(f, marks=pytest.mark.skipif(
        f != "generic" and not cpu_has(f), reason=f"this CPU has no {f}"))
        for f in ("generic", "avx2", "avx512bw")]


@pytest.mark.parametrize("form", _madd_forms())
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_the_paired_taps_multiply_add_is_exact_in_every_form(form, seed):
    """The depthwise sweep's multiply-add of 16-bit pairs (``pmaddwd`` on AVX2 and AVX-512,
    LLVM's multiplies elsewhere): x[2k] * w[2k] + x[2k+1] * w[2k+1] in lane k, wrapped to 32
    bits (the one pair that wraps, two products of -32768, included)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-2 ** 15, 2 ** 15, 32).astype(np.int16)
    w = rng.integers(-2 ** 15, 2 ** 15, 32).astype(np.int16)
    x[:2] = w[:2] = -2 ** 15
    x[2:4], w[2:4] = 255, 2 ** 15 - 1
    want = (x.astype(np.int64) * w).reshape(16, 2).sum(1).astype(np.uint32).view(np.int32)
    got = np.zeros(16, np.int32)
    _MADD.setdefault(form, _emitted_madd(form))(x, w, got)
    np.testing.assert_array_equal(got, want)


def test_depthwise_taps_past_16_bits_leave_the_direct_kernel():
    """The depthwise sweep multiplies 16-bit taps (w - zw); a weight zero point that puts a
    tap past 16 bits makes the convolution run on the portable loops instead, with the
    reference's bits."""
    rng = np.random.default_rng(3)
    c = 20
    b = Builder()
    x = b.input("x", (1, 9, 9, c), "uint8")
    y = b.call("qnn.conv2d", x, b.param("w", rng.integers(-128, 128, (3, 3, 1, c)).astype("i1")),
               b.param("zx", np.array(7, np.int32)), b.param("zw", np.array(40000, np.int32)),
               b.param("sx", np.array(0.05, np.float32)),
               b.param("sw", np.array(0.01, np.float32)), padding=[1, 1, 1, 1], groups=c,
               data_layout="NHWC", kernel_layout="HWIO")
    bound = bind_params(*b.finish(y))
    ex = Executor(bound)
    (step,) = ex.steps
    assert not step.fn.depthwise
    xs = {"x": rng.integers(0, 256, (1, 9, 9, c)).astype("uint8")}
    np.testing.assert_array_equal(ex.run(xs), run(bound, xs))


@settings(max_examples=30, deadline=None)
@given(c=st.integers(1, 9), o=st.integers(1, 150), k=st.sampled_from([1, 3]),
       stride=st.integers(1, 2), pad=st.integers(0, 1), size=st.integers(3, 22),
       dtype=st.sampled_from(["int8", "uint8"]), act=st.sampled_from(["none", "relu", "clip"]),
       seed=st.integers(0, 999), layout=st.sampled_from(["NCHW", "NHWC"]),
       batch=st.integers(1, 3))
# channel-last widths whose last block is partial but fills whole vectors (requantized in
# the GEMM's registers, vector by vector) or does not (24 on the 64-wide GEMM)
@example(c=5, o=96, k=1, stride=1, pad=0, size=14, dtype="uint8", act="relu", seed=1,
         layout="NHWC", batch=1)
@example(c=7, o=24, k=3, stride=2, pad=1, size=15, dtype="int8", act="clip", seed=2,
         layout="NHWC", batch=2)
@example(c=3, o=144, k=3, stride=1, pad=1, size=9, dtype="uint8", act="none", seed=3,
         layout="NHWC", batch=1)
def test_fused_int8_convolutions_of_any_width_are_bit_exact_on_every_path(
        c, o, k, stride, pad, size, dtype, act, seed, layout, batch):
    """fused.qconv2d with output channels that fill no SIMD block (AVX2 pads them), NCHW and
    channel-last, on every path the CPU has, against the integer reference; images of 192 to
    484 pixels make too few chunks to share out, and are split by channel blocks too; the
    images of a batch are work items of one kernel call."""
    rng = np.random.default_rng(seed)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    b = Builder()
    x = b.input("x", _image_in(layout, (batch, c, size, size)), dtype)
    extra = dict(a_min=0.0, a_max=2.0) if act == "clip" else {}
    w = _kernel_in(layout, rng.integers(-128, 128, (o, c, k, k)).astype("i1"))
    zx = int(rng.integers(lo, hi)) if dtype == "uint8" else 0
    y = b.call("fused.qconv2d", x, *_fused_operands(b, rng, layout, w, o, zx, dtype),
               strides=[stride] * 2, padding=[pad] * 4, activation=act, out_dtype=dtype,
               axis=_channel_axis(layout), **_layouts(layout), **extra)
    bound = bind_params(*b.finish(y))
    xs = {"x": rng.integers(lo, hi, _image_in(layout, (batch, c, size, size))).astype(dtype)}
    want = run(bound, xs)
    for path in int8_paths():
        with forced_int8_path(path):
            np.testing.assert_array_equal(Executor(bound).run(xs), want)


# (groups, input channels a group, outputs a group): sets of 2 groups (RegNet's 8), groups
# that no set size but 1 divides (13, 5), sets of 4 (ResNeXt's first stage), a group filling
# a block of 16 or two, and groups of other widths in than out
GROUPED = [(6, 8, 8), (13, 8, 8), (32, 4, 4), (4, 16, 16), (3, 32, 32), (4, 2, 6), (5, 3, 3)]
MASKED_PATHS = ("vnni", "vnni16")     # (their sets' last vectors stored under a byte mask)


@settings(max_examples=20, deadline=None)
@given(shape=st.sampled_from(GROUPED), k=st.sampled_from([1, 3]), stride=st.integers(1, 2),
       pad=st.integers(0, 1), size=st.integers(3, 16), dtype=st.sampled_from(["int8", "uint8"]),
       act=st.sampled_from(["none", "relu", "clip"]), seed=st.integers(0, 999),
       layout=st.sampled_from(["NCHW", "NHWC"]), batch=st.integers(1, 2),
       residual=st.booleans())
@example(shape=(6, 8, 8), k=3, stride=1, pad=1, size=14, dtype="uint8", act="relu", seed=1,
         layout="NHWC", batch=1, residual=False)
@example(shape=(13, 8, 8), k=3, stride=2, pad=1, size=15, dtype="int8", act="clip", seed=2,
         layout="NHWC", batch=2, residual=True)
@example(shape=(5, 3, 3), k=3, stride=1, pad=0, size=9, dtype="uint8", act="none", seed=3,
         layout="NCHW", batch=1, residual=False)
def test_grouped_int8_convolutions_are_bit_exact_on_every_path(
        shape, k, stride, pad, size, dtype, act, seed, layout, batch, residual):
    """A grouped fused.qconv2d (and fused.qconv2d_add) runs on the VNNI GEMMs as sets of
    groups, each set a GEMM of block-diagonal weights requantized in registers and stored at
    its channels (``vnni.grouped_requantize``), with the reference's bits on every path this
    CPU has; the 256-bit kernels (AVX-VNNI's, AVX2's 16-bit one: ``avx2.grouped_requantize``)
    take the sets whose outputs fill whole vectors of 8, the other paths run the portable
    loops."""
    groups, cg, og = shape
    c, o = groups * cg, groups * og
    rng = np.random.default_rng(seed)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    b = Builder()
    x = b.input("x", _image_in(layout, (batch, c, size, size)), dtype)
    extra = dict(a_min=0.0, a_max=2.0) if act == "clip" else {}
    w = _kernel_in(layout, rng.integers(-128, 128, (o, cg, k, k)).astype("i1"))
    args = [x, *_fused_operands(b, rng, layout, w, o, int(rng.integers(lo, hi)), dtype)]
    attrs = dict(strides=[stride] * 2, padding=[pad] * 4, groups=groups, activation=act,
                 out_dtype=dtype, axis=_channel_axis(layout), **_layouts(layout), **extra)
    oh = (size + 2 * pad - k) // stride + 1
    op = "fused.qconv2d_add" if residual else "fused.qconv2d"
    if residual:
        args += [b.input("r", _image_in(layout, (batch, o, oh, oh)), dtype)] + [
            b.param(name, np.array(v, dt)) for name, v, dt in [
                ("sa", 0.1, np.float32), ("za", 5 if dtype == "uint8" else 0, np.int32),
                ("sr", 0.07, np.float32), ("zr", 4, np.int32), ("so", 0.12, np.float32),
                ("zo", 6, np.int32)]]
    bound = bind_params(*b.finish(b.call(op, *args, **attrs)))
    xs = {"x": rng.integers(lo, hi, _image_in(layout, (batch, c, size, size))).astype(dtype)}
    if residual:
        xs["r"] = rng.integers(lo, hi, _image_in(layout, (batch, o, oh, oh))).astype(dtype)
    want = run(bound, xs)
    span = og * max(g for g in range(1, groups + 1) if groups % g == 0 and
                    g * og <= max(16, og))
    for path in int8_paths():
        with forced_int8_path(path):
            ex = Executor(bound)
            np.testing.assert_array_equal(ex.run(xs), want)
            (step,) = [s for s in ex.steps if s.label == op]
            on_gemm = path in MASKED_PATHS or (path in ("avxvnni", "avx2") and span % 8 == 0)
            assert (step.fn.conv.slots is not None) == on_gemm, (path, step.fn.path)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.sampled_from(["int8", "uint8"]),
       st.sampled_from(["int8", "uint8"]), st.booleans(), st.integers(0, 3),
       st.integers(0, 2 ** 16))
@example([2, 9, 10, 5], "uint8", "int8", True, 3, 1)    # tables along the last axis (NHWC):
@example([1, 3, 70, 24], "int8", "uint8", True, 3, 2)   # rows of channels, in shares of 64
@example([1, 7, 43, 200], "int8", "uint8", True, 3, 2)   # strips of 64 channels (the last of
                                                         # 8), down runs of 128 rows
def test_lookup_table_kernel_is_bit_exact(shape, in_dtype, out_dtype, per_channel, axis, seed):
    """qnn.lut's kernel (one table, or one per channel along any axis, negative too) reads
    the reference's table entry for every element, int8 and uint8 in and out."""
    rng = np.random.default_rng(seed)
    axis = axis % len(shape) - (len(shape) if seed % 2 else 0)
    rows = (shape[axis],) if per_channel else ()
    lo, hi = (-128, 127) if out_dtype == "int8" else (0, 255)
    table = rng.integers(lo, hi + 1, rows + (256,)).astype(out_dtype)
    b = Builder()
    x = b.input("q", tuple(shape), in_dtype)
    y = b.call("qnn.lut", x, b.param("t", table), b.scalar(0.5), b.scalar(0, "int32"),
               axis=axis)
    bound = bind_params(*b.finish(y))
    ex = Executor(bound)
    assert [s.label for s in ex.steps] == ["qnn.lut"]
    qlo, qhi = (-128, 127) if in_dtype == "int8" else (0, 255)
    xs = {"q": rng.integers(qlo, qhi + 1, shape).astype(in_dtype)}
    got = ex.run(xs)
    np.testing.assert_array_equal(got, run(bound, xs))
    assert got.dtype == np.dtype(out_dtype)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 40), h=st.integers(1, 9), w=st.integers(1, 9),
       layout=st.sampled_from(["NCHW", "NHWC"]), dtype=st.sampled_from(["int8", "uint8"]),
       out_dtype=st.sampled_from(["int8", "uint8"]), seed=st.integers(0, 2 ** 16))
@example(n=1, c=1280, h=7, w=7, layout="NHWC", dtype="uint8", out_dtype="uint8", seed=1)
@example(n=2, c=301, h=3, w=5, layout="NHWC", dtype="int8", out_dtype="uint8", seed=3)
@example(n=1, c=3, h=224, w=224, layout="NCHW", dtype="int8", out_dtype="int8", seed=2)
def test_the_integer_global_average_is_bit_exact(n, c, h, w, layout, dtype, out_dtype, seed):
    """qnn.global_avg_pool2d's kernel (one pass per channel, a float64 sum of the dequantized
    values; from 256 channels, each worker a part of them) against the reference (dequantize,
    float mean, quantize), any layout and sizes, scales and zero points drawn: the same
    codes."""
    rng = np.random.default_rng(seed)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    b = Builder()
    x = b.input("x", shape, dtype)
    y = b.call("qnn.global_avg_pool2d", x,
               b.param("s", np.array(rng.uniform(1e-3, 0.5), np.float32)),
               b.param("z", np.array(rng.integers(lo, hi), np.int32)),
               b.param("so", np.array(rng.uniform(1e-3, 0.5), np.float32)),
               b.param("zo", np.array(rng.integers(0, 256) if out_dtype == "uint8" else
                                      rng.integers(-128, 128), np.int32)),
               layout=layout, out_dtype=out_dtype)
    bound = bind_params(*b.finish(y))
    xs = {"x": rng.integers(lo, hi, shape).astype(dtype)}
    ex = Executor(bound)
    assert [s.label for s in ex.steps if "global" in s.label] == ["qnn.global_avg_pool2d"]
    np.testing.assert_array_equal(ex.run(xs), run(bound, xs))


@pytest.mark.parametrize("block,group,dtype", [(64, 4, np.int8), (16, 4, np.int8),
                                               (16, 2, np.int16)])
def test_int8_weights_pack_into_aligned_zero_padded_panels(block, group, dtype):
    """``vnni.pack_panels`` (the VNNI, AVX-VNNI and AVX2 layouts): (O, K) -> [ceil(O / block)]
    [Kp / group][block][group] on 64-byte lines, Kp = K rounded up to 4, the missing channels
    and k-values zero; and 128 times each channel's sum."""
    from eqquant.runtime.kernels.vnni import pack_panels
    rng = np.random.default_rng(2)
    for o, k in [(1, 3), (block, 8), (block + 1, 27), (2 * block + 5, 36)]:
        w = rng.integers(-128, 128, (o, k)).astype(np.int8)
        got, sums, kp = pack_panels(w, block, group, dtype)
        assert kp == -(-k // 4) * 4 and got.dtype == dtype and got.ctypes.data % 64 == 0
        assert got.shape == (-(-o // block), kp // group, block, group)
        full = np.zeros((got.shape[0] * block, kp), np.int64)
        full[:o, :k] = w
        for c in range(full.shape[0]):
            np.testing.assert_array_equal(got[c // block, :, c % block].reshape(-1), full[c])
        np.testing.assert_array_equal(sums, 128 * w.astype(np.int64).sum(axis=1))


@settings(max_examples=30, deadline=None)
@given(shape=st.sampled_from([(7, 5), (300, 24), (2, 6, 3, 4), (1, 3, 1, 1)]),
       out_dtype=st.sampled_from(["int8", "uint8"]), zin=st.integers(-20, 20),
       seed=st.integers(0, 2 ** 16))
def test_per_channel_requantize_kernels_are_bit_exact(shape, out_dtype, zin, seed):
    """qnn.requantize with a scale per channel along axis 1: a row of channels at a time where
    the channels are the last axis (a dense layer's sums), a plane a channel elsewhere; scale
    ratios from 1e-6 to 0.99 (a fixed-point ratio holds only below 1) on sums up to the int32
    extremes."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    b = Builder()
    x = b.input("q", shape, "int32")
    s1 = np.exp(rng.uniform(np.log(1e-6), np.log(0.99), c)).astype(np.float32)
    y = b.call("qnn.requantize", x, b.param("s1", s1), b.scalar(zin, "int32"),
               b.scalar(1.0), b.scalar(3, "int32"), axis=1, out_dtype=out_dtype)
    bound = bind_params(*b.finish(y))
    ex = Executor(bound)
    assert [s.kind for s in ex.steps] == ["kernel"]
    q = rng.integers(-2 ** 31, 2 ** 31, shape, dtype=np.int64)
    q[..., 0] = rng.integers(-300, 300, q[..., 0].shape)
    xs = {"q": q.astype(np.int32)}
    np.testing.assert_array_equal(ex.run(xs), run(bound, xs))
