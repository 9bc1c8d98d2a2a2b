"""The narrowed integer epilogue (``epilogue_table._narrowed``, emitted by ``requantize_ir``)
gives the full epilogue's bits wherever the constants say it may be taken, and the kernels
that finish sums in registers give the reference's bits on either epilogue."""
import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.runtime.execution.executor import Executor
from eqquant.runtime.codegen.epilogue_table import epilogue_params, words_constants
from eqquant.runtime.kernels.int8 import requantize_rows
from eqquant.runtime.codegen.llvm_loops import cpu_has
from eqquant.runtime.codegen.requantize_ir import ADD, FAST, FHI, FLO, FMULT, FOFFSET, TOTAL, WORDS

I32 = 2 ** 31


def _narrowed(params, sums):
    """The narrowed epilogue in Python's integers: (clamp(sum + ADD, FLO, FHI) * FMULT +
    FOFFSET) >> TOTAL, taken as 8 bits (the kernels keep the low byte)."""
    out = []
    for c, s in enumerate(sums):
        v = min(max(int(s) + int(params[ADD, c]), int(params[FLO, c])), int(params[FHI, c]))
        r = (v * int(params[FMULT, c]) + int(params[FOFFSET, c])) >> int(params[TOTAL, c])
        out.append(r & 0xFF)
    return out


def _words(params, sums, lo):
    """The narrowed epilogue on 32-bit words in Python's integers: clamp(sat8((sum * WMULT +
    WOFFSET) >> 32 >> WSHIFT), WCLO, WCHI) + lo, taken as 8 bits (sat8: to [0, 255], as the
    packs saturate); the product and the sum checked to stay within int64 (the signed 64-bit
    lanes), the factor within a signed word (``vpmuldq``'s)."""
    out = []
    for c, s in enumerate(sums):
        mult, offset, shift, c_lo, c_hi = words_constants(params, c)
        assert 0 < mult < 2 ** 31 and 0 <= c_lo <= c_hi <= 255
        p = int(s) * mult + offset
        assert -2 ** 63 <= p < 2 ** 63
        r = min(max((p >> 32) >> shift, 0), 255)
        out.append((min(max(r, c_lo), c_hi) + lo) & 0xFF)
    return out


def _table(chans, zin, zout, lo, hi, bound):
    """``epilogue_params`` of the drawn channels."""
    return epilogue_params(
        np.array([c["bias"] for c in chans], np.int64),
        np.array([c["clamp"][0] for c in chans], np.int64),
        np.array([c["clamp"][1] for c in chans], np.int64),
        np.array([c["multiplier"] for c in chans], np.int64),
        np.array([c["shift"] for c in chans], np.int64), zin, zout, lo, hi, bound)


def _probe_sums(params, n, bound, seed):
    """Rows of n int32 sums: the ends of [-bound, bound], 0, the steps around the narrowed
    clamp's bounds, random ones."""
    rng = np.random.default_rng(seed)
    rows = [np.full(n, -bound), np.full(n, bound), np.zeros(n, np.int64)]
    for edge in (FLO, FHI):
        for d in (-1, 0, 1):
            rows.append(np.clip(params[edge] - params[ADD] + d, -bound, bound))
    rows += list(rng.integers(-bound, bound + 1, (8, n)))
    return np.array(rows, np.int64).astype(np.int32)


channel = st.fixed_dictionaries({
    "multiplier": st.one_of(st.integers(2 ** 30, I32 - 1), st.integers(0, I32 - 1)),
    "shift": st.integers(-40, 3),
    "bias": st.one_of(st.integers(-5000, 5000), st.integers(-I32, I32 - 1)),
    "clamp": st.sampled_from([(-2 ** 40, 2 ** 40), (0, 2 ** 40), (0, 700), (-300, 20)]),
})


@settings(max_examples=300, deadline=None)
@given(st.lists(channel, min_size=1, max_size=4), st.integers(-128, 255),
       st.sampled_from([(0, 255), (-128, 127), (3, 100)]), st.integers(0, 255),
       st.sampled_from([0, 255 * 128 * 9, 255 * 128 * 4608, 2 ** 30]), st.integers(0, 2 ** 32))
@example([{"multiplier": 2 ** 31 - 1, "shift": 0, "bias": 0, "clamp": (-2 ** 40, 2 ** 40)}],
         0, (0, 255), 0, 255 * 128 * 9, 1)         # a scale of (almost) exactly 1
@example([{"multiplier": 2 ** 30, "shift": 1, "bias": 7, "clamp": (0, 2 ** 40)}],
         0, (-128, 127), 3, 255 * 128 * 9, 2)       # a scale of exactly 1, shifted left
@example([{"multiplier": 2 ** 31 - 5, "shift": 0, "bias": -900, "clamp": (0, 2 ** 40)},
          {"multiplier": 2 ** 30 + 3, "shift": -1, "bias": 40, "clamp": (-300, 20)}],
         7, (0, 255), 128, 255 * 128 * 9, 5)        # TOTAL 31 and 32: words moved up by 1, 0
def test_the_narrowed_epilogue_gives_the_full_epilogues_bits(chans, zin, out_range, zout,
                                                              bound, seed):
    """Sums anywhere in [-bound, bound] (its ends, the steps around the narrowed clamp's
    bounds, random ones) through the narrowed epilogue equal ``requantize_rows``'s bits in
    every layer whose table says FAST, and through its form on words in every layer whose
    table says WORDS; scales above 1, biases near int32's ends and rounding shifts past 53
    bits turn FAST off, and WORDS with it."""
    lo, hi = out_range
    zout = min(max(zout, lo), hi)
    n = len(chans)
    params = _table(chans, zin, zout, lo, hi, bound)
    fast = bool(params[FAST, 0])
    words = bool(params[WORDS, 0])
    assert (params[FAST] == params[FAST, 0]).all() and (params[WORDS] == words).all()
    assert fast or not words
    for c in chans:     # what must turn it off (a channel scaled above 1 may)
        if abs(c["bias"]) + bound >= I32 or -c["shift"] + 31 > 53:
            assert not fast
    if not fast:
        return
    acc = _probe_sums(params, n, bound, seed)
    dtype = np.uint8 if lo >= 0 else np.int8
    full = np.zeros(acc.shape, dtype)
    requantize_rows(acc, params, 0, n, lo, hi, full, 0, 0)
    for r in range(len(acc)):
        assert _narrowed(params, acc[r]) == [int(b) & 0xFF for b in full[r]], r
        if words:
            assert _words(params, acc[r], lo) == [int(b) & 0xFF for b in full[r]], r


def _emitted_epilogue(form: str, lanes: int, col: int):
    """``run(sums, table, out, lo, hi)``: ``lanes`` int32 sums of the table's channels col..
    through the epilogue as the kernels emit it (``requantize_ir.with_epilogue``, narrowed
    in ``form``: "words", "lanes" or "block"), into ``lanes`` bytes."""
    from numba import njit, types
    from numba.extending import intrinsic
    from eqquant.runtime.codegen.requantize_ir import with_epilogue

    @intrinsic
    def epilogue(typingctx, sums, table, stride, out, lo, hi):
        def codegen(context, builder, signature, args):
            from llvmlite import ir
            s, t, stride_, o, lo_, hi_ = args
            v = builder.load(builder.inttoptr(
                s, ir.VectorType(ir.IntType(32), lanes).as_pointer()), align=4)

            def body(bc, requantize):
                r = requantize(bc, v)
                bc.store(r, bc.inttoptr(o, r.type.as_pointer()), align=1)
            with_epilogue(builder, builder.inttoptr(t, ir.IntType(8).as_pointer()), stride_,
                          ir.Constant(ir.IntType(64), col), lanes, lo_, hi_, body, form)
            return context.get_dummy_value()
        return types.void(*[types.intp] * 4, types.int64, types.int64), codegen

    @njit
    def run(sums, table, out, lo, hi):
        epilogue(sums.ctypes.data, table.ctypes.data, table.shape[1], out.ctypes.data, lo, hi)
    return run


_EMITTED = {}


@settings(max_examples=150, deadline=None)
@given(st.lists(channel, min_size=1, max_size=8), st.integers(-128, 255),
       st.sampled_from([(0, 255), (-128, 127), (3, 100), (-100, -2)]), st.integers(-128, 255),
       st.sampled_from([255 * 128 * 9, 255 * 128 * 4608, 2 ** 30]), st.integers(0, 2 ** 32))
@example([{"multiplier": 2 ** 31 - 1, "shift": -22, "bias": 0, "clamp": (-2 ** 40, 2 ** 40)}],
         0, (-128, 127), -128, 2 ** 30, 3)          # a rounding shift of 53 bits, signed
def test_the_emitted_epilogue_gives_the_references_bits(chans, zin, out_range, zout, bound,
                                                         seed):
    """The epilogue as the kernels emit it, the narrowed one in each form (on 32-bit words
    as CPUs without AVX-512 take it, on AVX-512's words where the CPU has it, and on 64-bit
    lanes), and the full one, equals
    ``requantize_rows``'s bits on sums at the ends of [-bound, bound], around the narrowed
    clamp's bounds and between."""
    _check_emitted(chans, zin, out_range, zout, bound, seed)


def _check_emitted(chans, zin, out_range, zout, bound, seed):
    """The emitted epilogue in each form, on vectors of 8 and of 16 (the kernels' widths)
    from the table's first channel, and of 8 from its ninth (the constants of a later group
    of channels), on AVX-512's words of 16 and 32 from the first and of 16 from the 17th,
    against ``requantize_rows`` on 32 channels drawn from ``chans``; the table."""
    lo, hi = out_range
    zout = min(max(zout, lo), hi)
    cols = [i % len(chans) for i in range(32)]
    chans = [chans[i] for i in cols]
    params = _table(chans, zin, zout, lo, hi, bound)
    acc = _probe_sums(params, 32, bound, seed)
    dtype = np.uint8 if lo >= 0 else np.int8
    want = np.zeros(acc.shape, dtype)
    requantize_rows(acc, params, 0, 32, lo, hi, want, 0, 0)
    forms = [(form, lanes, col) for form in ("words", "lanes")
             for lanes, col in ((8, 0), (16, 0), (8, 8))]
    if cpu_has("avx512bw"):
        forms += [("block", 16, 0), ("block", 16, 16), ("block", 32, 0)]
    for form, lanes, col in forms:
        run = _EMITTED.setdefault((form, lanes, col), _emitted_epilogue(form, lanes, col))
        for r in range(len(acc)):
            got = np.zeros(lanes, dtype)
            run(np.ascontiguousarray(acc[r, col:col + lanes]), params, got, lo, hi)
            np.testing.assert_array_equal(got, want[r, col:col + lanes],
                                          err_msg=f"{form}, {lanes} lanes from {col}, row {r}")
    return params


def _emitted_block(col: int, vectors: int):
    """``run(sums, table, out, lo, base)``: 16 x ``vectors`` int32 sums of the table's
    channels base + col.. through ``requantize_ir.block_words`` (the 512-bit GEMMs' words'
    form for a whole block, taken as vectors of 16) handed the table from its column
    ``base`` on (as the GEMMs are from their first block's), into as many bytes."""
    from numba import njit, types
    from numba.extending import intrinsic
    from eqquant.runtime.codegen.requantize_ir import block_words

    @intrinsic
    def epilogue(typingctx, sums, table, stride, out, lo):
        def codegen(context, builder, signature, args):
            from llvmlite import ir
            s, t, stride_, o, lo_ = args     # (t: the address of the table's column base)
            vt = ir.VectorType(ir.IntType(32), 16)
            at = builder.inttoptr(s, vt.as_pointer())
            sums = [builder.load(builder.gep(at, [ir.Constant(ir.IntType(64), g)]), align=4)
                    for g in range(vectors)]
            requantize = block_words(builder, builder.inttoptr(t, ir.IntType(8).as_pointer()),
                                     stride_, ir.Constant(ir.IntType(64), col), lo_)
            r = requantize(builder, sums)
            builder.store(r, builder.inttoptr(o, r.type.as_pointer()), align=1)
            return context.get_dummy_value()
        return types.void(*[types.intp] * 4, types.int64), codegen

    @njit
    def run(sums, table, out, lo, base):
        epilogue(sums.ctypes.data, table.ctypes.data + 8 * base, table.shape[1],
                 out.ctypes.data, lo)
    return run


# channels scaled below 1/2 (rounding shifts of 32 to 53 bits): the layers the words' form is for
words_channel = st.fixed_dictionaries({
    "multiplier": st.integers(2 ** 30, I32 - 1), "shift": st.integers(-22, -1),
    "bias": st.integers(-50000, 50000),
    "clamp": st.sampled_from([(-2 ** 40, 2 ** 40), (0, 2 ** 40), (0, 700), (-300, 20)]),
})


@pytest.mark.skipif(not cpu_has("avx512bw"), reason="the 512-bit words' form needs AVX-512")
@settings(max_examples=60, deadline=None)
@given(st.lists(words_channel, min_size=1, max_size=8), st.integers(-128, 255),
       st.sampled_from([(0, 255), (-128, 127), (3, 100), (-100, -2)]), st.integers(-128, 255),
       st.sampled_from([255 * 128 * 9, 255 * 128 * 4608]), st.integers(0, 2 ** 32),
       st.integers(0, 7))
def test_the_512_bit_words_give_the_references_bits(chans, zin, out_range, zout, bound, seed,
                                                    turn):
    """``block_words`` (a block of 64, 32 or 16 channels finished together, the vectors'
    words packed into bytes) equals ``requantize_rows``'s bits, on blocks at the first
    channel and later ones (the constants of a later group, found from the first's column or
    handed from its own, as a GEMM is), in a table of 152 channels (a last group of 8, not
    whole), wherever the table says WORDS."""
    lo, hi = out_range
    zout = min(max(zout, lo), hi)
    chans = [chans[(i * 3 + turn) % len(chans)] for i in range(152)]
    params = _table(chans, zin, zout, lo, hi, 255 * 128 * 4608)
    assume(params[WORDS, 0])       # (a clamp no output meets turns the narrowed form off)
    acc = _probe_sums(params, 152, bound, seed)
    dtype = np.uint8 if lo >= 0 else np.int8
    want = np.zeros(acc.shape, dtype)
    requantize_rows(acc, params, 0, 152, lo, hi, want, 0, 0)
    for vectors, col, base in ((4, 0, 0), (4, 64, 0), (4, 0, 64), (4, 48, 32), (2, 32, 0),
                               (2, 0, 96), (1, 0, 0), (1, 16, 112), (1, 128, 0)):
        run = _EMITTED.setdefault(("block", col, vectors), _emitted_block(col, vectors))
        n, first = 16 * vectors, base + col
        for r in range(len(acc)):
            got = np.zeros(n, dtype)
            run(np.ascontiguousarray(acc[r, first:first + n]), params, got, lo, base)
            np.testing.assert_array_equal(got, want[r, first:first + n],
                                          err_msg=f"{n} from {base} + {col}, row {r}")


@pytest.mark.parametrize("out_range, zout", [((0, 255), 128), ((-128, 127), -3), ((0, 6), 0)])
def test_the_emitted_words_where_the_shift_is_32_and_more(out_range, zout):
    """Channels scaled below 1/2 (rounding shifts of 32 bits and more) take the words' form
    (the table says WORDS), and a scale in [1/2, 1) (31 bits: a factor of 2^31 or more as a
    word) turns it off, the narrowed epilogue on 64-bit lanes staying on; both give the
    reference's bits as emitted."""
    chans = [{"multiplier": 2 ** 30 + 3, "shift": -1, "bias": 40, "clamp": (-300, 20)},
             {"multiplier": 1_700_000_000, "shift": -9, "bias": 0, "clamp": (-2 ** 40, 2 ** 40)}]
    params = _check_emitted(chans, 7, out_range, zout, 255 * 128 * 9, 5)
    assert params[WORDS].tolist() == [1] * 32
    assert sorted(set(params[TOTAL].tolist())) == [32, 40]
    half = [{"multiplier": 2 ** 31 - 5, "shift": 0, "bias": -900, "clamp": (0, 2 ** 40)}]
    params = _check_emitted(half + chans, 7, out_range, zout, 255 * 128 * 9, 5)
    assert params[WORDS].tolist() == [0] * 32 and params[FAST].tolist() == [1] * 32


def test_the_usual_layer_takes_the_narrowed_epilogue():
    """A convolution scaled below 1, with a small bias, takes the narrowed epilogue (the
    property above would hold vacuously if none did)."""
    params = epilogue_params(np.array([120, -4000], np.int64), np.array([0, 0], np.int64),
                             np.array([2 ** 40, 2 ** 40], np.int64),
                             np.array([1_500_000_000, 1_200_000_000], np.int64),
                             np.array([-9, -12], np.int64), 0, 5, 0, 255, 255 * 128 * 1152)
    assert params[FAST].tolist() == [1, 1] and params[WORDS].tolist() == [1, 1]


@pytest.mark.parametrize("scale", ["below one", "above one"])
@pytest.mark.parametrize("depthwise", [False, True])
def test_kernels_give_the_reference_bits_on_either_epilogue(monkeypatch, scale, depthwise):
    """A channel-last fused.qconv2d (the GEMM's and the depthwise sweep's epilogue in
    registers) scaled below 1 (narrowed) and above 1 (full), on every int8 path the CPU has,
    against the integer reference."""
    from eqquant.ops.fixed_point import quantize_multiplier
    from eqquant.runtime.target import int8_paths
    rng = np.random.default_rng(7)
    c, o, size = (48, 48, 10) if depthwise else (24, 80, 9)
    s1 = np.float32(0.002 if scale == "below one" else 3.0)
    b = Builder()
    x = b.input("x", (1, size, size, c), "uint8")
    w = rng.integers(-128, 128, (3, 3, 1 if depthwise else c, o)).astype("i1")
    y = b.call("fused.qconv2d", x, b.param("w", w),
               b.param("b", rng.integers(-900, 900, o).astype("i4")),
               b.param("zx", np.array(9, np.int32)), b.param("zw", np.array(0, np.int32)),
               b.param("sx", np.array(0.05, np.float32)),
               b.param("sw", rng.uniform(0.01, 0.02, o).astype(np.float32)),
               b.param("s1", np.full(o, s1, np.float32)), b.param("z1", np.array(0, np.int32)),
               b.param("s2", np.array(0.1, np.float32)), b.param("z2", np.array(5, np.int32)),
               strides=[1, 1], padding=[1, 1, 1, 1], activation="relu", out_dtype="uint8",
               axis=3, data_layout="NHWC", kernel_layout="HWIO", groups=c if depthwise else 1)
    bound = bind_params(*b.finish(y))
    xs = {"x": rng.integers(0, 256, (1, size, size, c)).astype("uint8")}
    want = run(bound, xs)
    paths = [*int8_paths(), "portable"]
    assert paths
    for path in paths:
        monkeypatch.setenv("EQQUANT_INT8_KERNEL", path)
        ex = Executor(bound)
        (step,) = ex.steps      # the fused kernel itself, not the reference semantics
        conv = step.fn.conv
        assert conv.depthwise if depthwise else (conv.simd is not None) == (path != "portable")
        np.testing.assert_array_equal(ex.run(xs), want)
    # which epilogue the layer took: its multiplier s1 / s2 in the kernels' table
    multiplier, shift = quantize_multiplier(float(s1) / 0.1)
    table = epilogue_params(np.zeros(1, np.int64), np.zeros(1, np.int64),
                            np.full(1, 2 ** 40, np.int64), np.array([multiplier], np.int64),
                            np.array([shift], np.int64), 9, 5, 0, 255, 255 * 128 * 9 * c)
    assert bool(table[FAST, 0]) == (scale == "below one")
