"""QNN ops: reference semantics against float formulas and direct integer arithmetic."""
import numpy as np
import pytest

from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.ir.typecheck import check_module
from eqquant.ops.fixed_point import fixed_point_multiply, quantize_multiplier


def _run1(op, inputs, consts, **attrs):
    b = Builder()
    args = [b.input(k, v.shape, str(v.dtype)) for k, v in inputs.items()]
    args += [b.param(f"c{i}", np.asarray(c)) for i, c in enumerate(consts)]
    mod, params = b.finish(b.call(op, *args, **attrs))
    assert parse(print_module(mod)) == mod
    check_module(mod)
    return run(mod, inputs, params)


def test_quantize_dequantize_round_trip_per_tensor_and_per_channel():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    s, z = np.float32(0.02), np.int32(3)
    q = _run1("qnn.quantize", {"x": x}, [s, z])
    assert q.dtype == np.int8
    np.testing.assert_array_equal(q, np.clip(np.round(x / s) + 3, -127, 127).astype(np.int8))
    back = _run1("qnn.dequantize", {"q": q}, [s, z])
    assert np.max(np.abs(back - x)[np.abs(x) < 2.4]) <= s / 2 + 1e-6
    sc = np.array([0.01, 0.02, 0.05], np.float32)
    zc = np.array([0, 1, -2], np.int32)
    qc = _run1("qnn.quantize", {"x": x}, [sc, zc], axis=1, out_dtype="uint8")
    want = np.clip(np.round(x / sc[None, :, None]) + zc[None, :, None], 0, 255)
    np.testing.assert_array_equal(qc, want.astype(np.uint8))


def test_requantize_is_the_fixed_point_formula():
    rng = np.random.default_rng(1)
    q = rng.integers(-2**20, 2**20, size=(4, 5)).astype(np.int32)
    s1, s2 = np.float32(0.003), np.float32(0.21)
    out = _run1("qnn.requantize", {"q": q}, [s1, np.int32(7), s2, np.int32(-4)])
    m, sh = quantize_multiplier(float(s1) / float(s2))
    want = np.clip(fixed_point_multiply(q.astype(np.int64) - 7, m, sh) - 4, -127, 127)
    np.testing.assert_array_equal(out, want.astype(np.int8))
    # and it is the real-valued rescale to within one step
    real = np.clip(np.round((q.astype(np.float64) - 7) * float(s1) / float(s2)) - 4, -127, 127)
    assert np.max(np.abs(out.astype(np.int64) - real)) <= 1


def test_qnn_conv2d_and_dense_are_exact_integer_sums():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, size=(1, 4, 6, 6)).astype(np.uint8)
    w = rng.integers(-127, 128, size=(5, 4, 3, 3)).astype(np.int8)
    zx, zw = np.int32(128), np.array([0, 1, -1, 2, 0], np.int32)
    out = _run1("qnn.conv2d", {"x": x}, [w, zx, zw, np.float32(0.1), np.float32(0.01)],
                padding=[1, 1])
    assert out.dtype == np.int32
    xf = x.astype(np.float64) - 128
    wf = w.astype(np.float64) - zw[:, None, None, None]
    ref = np.zeros((1, 5, 6, 6))
    xp = np.pad(xf, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for o in range(5):
        for i in range(6):
            for j in range(6):
                ref[0, o, i, j] = np.sum(xp[0, :, i:i + 3, j:j + 3] * wf[o])
    np.testing.assert_array_equal(out, ref.astype(np.int64))
    xd = rng.integers(-128, 128, size=(3, 8)).astype(np.int8)
    wd = rng.integers(-128, 128, size=(2, 8)).astype(np.int8)
    d = _run1("qnn.dense", {"x": xd}, [wd, np.int32(0), np.int32(0), np.float32(1),
                                       np.float32(1)])
    np.testing.assert_array_equal(d, xd.astype(np.int64) @ wd.astype(np.int64).T)


def test_qnn_add_requantizes_both_operands():
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, size=(2, 8)).astype(np.int8)
    b = rng.integers(-128, 128, size=(2, 8)).astype(np.int8)
    sa, sb, so = np.float32(0.05), np.float32(0.02), np.float32(0.06)
    out = _run1("qnn.add", {"a": a, "b": b}, [sa, np.int32(1), sb, np.int32(-2), so,
                                               np.int32(3)])
    real = ((a.astype(np.float64) - 1) * float(sa) + (b.astype(np.float64) + 2) * float(sb))
    want = np.clip(np.round(real / float(so)) + 3, -128, 127)
    assert np.max(np.abs(out.astype(np.int64) - want)) <= 1


@pytest.mark.parametrize("src,word", [
    ("qnn.quantize(%x, 0.1f, 0)", "float tensor"),     # int input
    ("qnn.dequantize(%f, 0.1f, 0)", "integer tensor"),  # float input
    ("qnn.quantize(%f, 0.1f, 0f)", "int32"),            # zero point must be int32
])
def test_qnn_type_errors(src, word):
    text = ("def @main(%x: Tensor[(4), int8], %f: Tensor[(4), float32]) {\n  "
            + src + "\n}\n")
    from eqquant.errors import TypeCheckError
    with pytest.raises(TypeCheckError, match=word):
        check_module(parse(text))


@pytest.mark.parametrize("src", ['annotation.calibrated(%f, 0.1f, 0, dtype="int32")',
                                 'qnn.dynamic_scale(%f, dtype="int32")'])
def test_an_eight_bit_mark_refuses_another_dtype_where_it_is_written(src):
    """The calibration mark and the dynamic parameters quantize to int8 or uint8: their
    attribute says so, so another dtype is refused as the text is read, at the attribute
    (and the rule checker draws only those two for them)."""
    from eqquant.errors import EqquantError
    text = "def @main(%f: Tensor[(4), float32]) {\n  " + src + "\n}\n"
    with pytest.raises(EqquantError) as e:
        parse(text, "mark.ir")
    assert e.value.loc is not None and e.value.loc.line == 2, e.value.format()
    assert "(int8, uint8)" in e.value.message and "int32" in e.value.message


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(shapes=st.sampled_from([((1, 8, 1, 1), (1, 8, 5, 5)), ((1, 8, 5, 5), (1, 8, 5, 5)),
                               ((2, 3, 4), (4,)), ((6,), (1,)), ((1, 4, 3, 3), (1, 1, 3, 1))]),
       dtype=st.sampled_from(["uint8", "int8"]),
       scales=st.tuples(*[st.floats(1e-4, 4.0) for _ in range(3)]),
       zeros=st.tuples(*[st.integers(-128, 127) for _ in range(3)]),
       seed=st.integers(0, 999))
def test_qnn_mul_runs_on_its_kernel_with_the_references_bits(shapes, dtype, scales, zeros,
                                                            seed):
    """qnn.mul on its kernel (``kernels_int8.qmul``, broadcast operands as views of stride 0),
    either operand the broadcast one, scales whose ratio shifts the product far left or
    right (saturating), against the reference; and a launch, so a library can hold it."""
    from eqquant.deploy.build import not_launches
    from eqquant.runtime.execution.executor import Executor
    rng = np.random.default_rng(seed)
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    za, zb, zo = (min(max(z, lo), hi) for z in zeros)
    sa, sb, so = scales
    for a_shape, b_shape in (shapes, shapes[::-1]):
        mod = parse(f"""def @main(%a: Tensor[{a_shape}, {dtype}], %b: Tensor[{b_shape}, {dtype}]) {{
  qnn.mul(%a, %b, {sa}f, {za}, {sb}f, {zb}, {so}f, {zo}, out_dtype="{dtype}")
}}
""".replace(",)", ")"))
        x = {"a": rng.integers(lo, hi + 1, a_shape).astype(dtype),
             "b": rng.integers(lo, hi + 1, b_shape).astype(dtype)}
        ex = Executor(mod)
        assert [type(s.fn).__name__ for s in ex.steps] == ["QMul"]
        assert not_launches(ex) == []
        np.testing.assert_array_equal(ex.run(x), run(mod, x))


@settings(max_examples=20, deadline=None)
@given(layout=st.sampled_from(["NCHW", "NHWC"]), dtype=st.sampled_from(["uint8", "int8"]),
       pool=st.sampled_from([3, 2]), stride=st.sampled_from([1, 2]),
       pad=st.sampled_from([0, 1]), ceil=st.booleans(), include=st.booleans(),
       batch=st.sampled_from([1, 2]), seed=st.integers(0, 999))
def test_average_pools_run_on_their_kernels_with_the_references_bits(layout, dtype, pool,
                                                                     stride, pad, ceil, include,
                                                                     batch, seed):
    """qnn.avg_pool2d (dequantize, the float pool, quantize: three launches) and
    nn.avg_pool2d, channel-first and channel-last, with padding counted or not and ceil
    mode, against the reference bit for bit; and launches, so a library can hold them."""
    from eqquant.deploy.build import not_launches
    from eqquant.runtime.execution.executor import Executor
    rng = np.random.default_rng(seed)
    shape = (batch, 5, 7, 6) if layout == "NCHW" else (batch, 7, 6, 5)
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    attrs = (f"pool_size=[{pool}, {pool}], strides=[{stride}, {stride}], "
             f"padding=[{pad}, {pad}, {pad}, {pad}], ceil_mode={ceil}, "
             f"count_include_pad={include}, layout=\"{layout}\"")
    for src, x in (
            (f"""def @main(%x: Tensor[{shape}, {dtype}]) {{
  qnn.avg_pool2d(%x, 0.05f, {lo + 7}, 0.04f, {lo + 3}, {attrs}, out_dtype="{dtype}")
}}
""", rng.integers(lo, hi + 1, shape).astype(dtype)),
            (f"""def @main(%x: Tensor[{shape}, float32]) {{
  nn.avg_pool2d(%x, {attrs})
}}
""", rng.standard_normal(shape).astype(np.float32))):
        mod = parse(src)
        ex = Executor(mod)
        assert not_launches(ex) == []
        np.testing.assert_array_equal(ex.run({"x": x}), run(mod, {"x": x}))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int8 wide"])
@pytest.mark.parametrize("ta,tb", [(False, True), (False, False), (True, False), (True, True)])
@pytest.mark.parametrize("batch", [(), (3,), (1, 2)])
def test_integer_batch_matmul_runs_on_its_kernel_with_the_references_bits(dtype, ta, tb, batch):
    """qnn.batch_matmul (attention's q @ k^T and softmax @ v) on its launch kernel, each
    transpose form, stacks of any rank: the reference's int32 sums, bit for bit, at the
    dtype's ends too (saturated operands, zero points at the other end; "wide": zero points
    past 16 bits, the kernel's 32-bit operands, its sums wrapping as the reference's)."""
    wide = dtype == "int8 wide"
    dtype = dtype.split()[0]
    from eqquant import parse
    from eqquant.ir.interp import run
    from eqquant.runtime.execution.executor import Executor
    m, k, n = 5, 33, 7
    sa = batch + ((k, m) if ta else (m, k))
    sb = batch + ((n, k) if tb else (k, n))
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    za, zb = (hi, lo) if dtype == "uint8" else (40_000, -70_000) if wide else (3, -4)
    text = (f"def @main(%a: Tensor[{sa}, {dtype}], %b: Tensor[{sb}, {dtype}]) {{ "
            f"qnn.batch_matmul(%a, %b, {za}, {zb}, 0.5f, 0.25f, transpose_a={ta}, "
            f"transpose_b={tb}) }}")
    mod = parse(text)
    rng = np.random.default_rng(0)
    a = rng.integers(lo, hi + 1, sa).astype(dtype)
    b = rng.integers(lo, hi + 1, sb).astype(dtype)
    a.reshape(-1)[:3] = lo
    b.reshape(-1)[:3] = hi
    ex = Executor(mod)
    got = ex.run({"a": a, "b": b})
    assert [s.kind for s in ex.steps] == ["kernel"]
    want = run(mod, {"a": a, "b": b})
    np.testing.assert_array_equal(got, want)
    x = a.astype(np.int64) - za
    y = b.astype(np.int64) - zb
    x = np.swapaxes(x, -1, -2) if ta else x
    y = np.swapaxes(y, -1, -2) if tb else y
    np.testing.assert_array_equal(want, np.matmul(x, y).astype(np.int32))


def test_an_int8_attention_block_is_saved_in_a_library_with_the_references_bits(tmp_path):
    """Scores, softmax and weighted values in integers around a float softmax: every op a
    launch (the softmax's rows and qnn.batch_matmul's too), so `eqquant compile` saves the
    program, and the library computes the reference's bits."""
    from eqquant import parse
    from eqquant.deploy.build import build
    from eqquant.deploy.loader import Library
    from eqquant.ir.interp import run
    from eqquant.runtime.execution.executor import Executor
    text = """
def @main(%q: Tensor[(1, 2, 16, 8), uint8], %k: Tensor[(1, 2, 16, 8), uint8],
          %v: Tensor[(1, 2, 16, 8), uint8]) {
  %0 = qnn.batch_matmul(%q, %k, 120, 131, 0.02f, 0.03f);
  %1 = qnn.dequantize(%0, 0.0006f, 0);
  %2 = nn.softmax(%1, axis=-1);
  %3 = qnn.quantize(%2, 0.004f, 0, out_dtype="uint8");
  %4 = qnn.batch_matmul(%3, %v, 0, 128, 0.004f, 0.05f, transpose_b=False);
  qnn.requantize(%4, 0.0002f, 0, 0.03f, 128, out_dtype="uint8")
}
"""
    mod = parse(text)
    rng = np.random.default_rng(1)
    x = {n: rng.integers(0, 256, (1, 2, 16, 8)).astype("uint8") for n in "qkv"}
    build(Executor(mod), tmp_path / "lib")
    got = Library(tmp_path / "lib").run(x)
    np.testing.assert_array_equal(got, run(mod, x))
