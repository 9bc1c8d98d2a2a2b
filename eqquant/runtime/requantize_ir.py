"""The integer epilogue in LLVM IR, for kernels that finish their int32 sums in registers
(the VNNI GEMM, the depthwise sweep): ``kernels_int8.requantize_rows``'s steps on vectors
of sums, with the per-channel constants of ``epilogue_params`` (a (TABLE_ROWS, O) int64
table whose rows are named here), giving the same bits. The full epilogue, in int64 lanes:

    v = clamp(sum + ADD, LO, HI)                      the int32 saturation and the activation
    p = (v << LEFT) * MULT + OFFSET                   the fixed-point multiply, zero point in
    r = ((p ^ 2^63) >>> TOTAL) - BACK                 rounding shift; the output zero point
    out = clamp(r, lo, hi), 8 bits

and the same narrowed, where ``kernels_int8._narrowed`` shows it gives the same bits (the
usual case: a scale below 1, a bias far from int32's ends):

    v = clamp(sum + ADD, FLO, FHI)                    int32 lanes; the output clamp moved here
    out = (v * FMULT + FOFFSET) >> TOTAL, 8 bits      one 32 x 32 -> 64-bit multiply

16 outputs take about 16 vector instructions narrowed, against about 29 in full (two int64
clamps, a shift and a 64 x 64-bit multiply more). A layer takes one or the other as a whole
(row FAST), chosen by a branch per block of channels.
"""
from __future__ import annotations

# the rows of ``kernels_int8.epilogue_params``: one per-channel constant each
ADD, LO, HI, LEFT, MULT, OFFSET, TOTAL, BACK = range(8)
FAST, FLO, FHI, FMULT, FOFFSET = range(8, 13)
TABLE_ROWS = 13


def _const_loader(bc, table, stride, col, n: int):
    """``load(row, bits)``: the constants of channels col..col+n in ``row`` as a vector of n
    int64 (narrowed to ``bits`` when asked), emitted with builder ``bc``."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    w64 = ir.VectorType(i64, n)
    table = bc.bitcast(table, i64.as_pointer())

    def load(row, bits=64):
        at = bc.add(bc.mul(stride, ir.Constant(i64, row)), col)
        v = bc.load(bc.bitcast(bc.gep(table, [at]), w64.as_pointer()), align=8)
        return v if bits == 64 else bc.trunc(v, ir.VectorType(ir.IntType(bits), n))
    return load


def load_constants(bc, table, stride, col, n: int) -> tuple:
    """The 8 constants (ADD .. BACK) of channels col..col+n as vectors of n int64, emitted
    with builder ``bc``: ``table`` an i8 pointer to the constants of channel 0 (row r of
    channel c at r * stride + c). Loaded once for all the rows a kernel finishes (a store of
    8-bit results between two loads of the table may alias it, as far as LLVM knows, so it
    would load them again for every row)."""
    load = _const_loader(bc, table, stride, col, n)
    return tuple(load(row) for row in (ADD, LO, HI, LEFT, MULT, OFFSET, TOTAL, BACK))


def _clamp(bc, v, low, high):
    v = bc.select(bc.icmp_signed(">", low, v), low, v)
    return bc.select(bc.icmp_signed("<", high, v), high, v)


def requantize_vector(bc, sums, constants, lo, hi):
    """The 8-bit values of ``sums`` (a vector of n int32) by the full epilogue, emitted with
    builder ``bc``: ``constants`` from ``load_constants`` for the same channels, ``lo`` and
    ``hi`` i64 values."""
    from llvmlite import ir
    from .llvm_loops import splat
    n = sums.type.count
    i8, i64 = ir.IntType(8), ir.IntType(64)
    w64 = ir.VectorType(i64, n)
    add, c_lo, c_hi, left, mult, offset, total, back = constants
    v = _clamp(bc, bc.add(bc.sext(sums, w64), add), c_lo, c_hi)
    v = bc.add(bc.mul(bc.shl(v, left), mult), offset)
    v = bc.xor(v, ir.Constant(w64, [-(1 << 63)] * n))
    v = bc.sub(bc.lshr(v, total), back)
    return bc.trunc(_clamp(bc, v, splat(bc, lo, w64), splat(bc, hi, w64)),
                    ir.VectorType(i8, n))


def _narrowed_vector(bc, sums, constants):
    """The 8-bit values of ``sums`` by the narrowed epilogue (``constants``: ADD, FLO, FHI
    as int32 vectors, FMULT, FOFFSET, TOTAL as int64 ones)."""
    from llvmlite import ir
    add, f_lo, f_hi, f_mult, f_offset, total = constants
    w64 = f_offset.type
    v = _clamp(bc, bc.add(sums, add), f_lo, f_hi)
    # both factors sign-extended int32: one vpmuldq per 64-bit lane
    p = bc.add(bc.mul(bc.sext(v, w64), f_mult), f_offset)
    return bc.trunc(bc.ashr(p, total), ir.VectorType(ir.IntType(8), w64.count))


def _narrowed_pairs(bc, sums, constants, lo):
    """``_narrowed_vector`` for CPUs without AVX-512 (``with_epilogue`` chooses it there),
    the same bits: AVX2 has no arithmetic shift of 64-bit lanes (LLVM emulates one in three
    instructions a vector) and no narrowing of 64-bit lanes to bytes (a chain of packs), so

    - the products are taken on the int32 lanes in place, the even ones and the odd ones
      (one ``vpmuldq`` each, no widening of the sums first);
    - the offset is moved by -lo * 2^TOTAL, which makes every sum nonnegative, so the
      shift is logical (``vpsrlvq``): v in [FLO, FHI] gives lo <= (v * FMULT + FOFFSET) >>
      TOTAL <= hi (``kernels_int8._narrowed``), so 0 <= v * FMULT + FOFFSET - lo * 2^TOTAL
      < (hi - lo + 1) * 2^TOTAL <= 2^62 (TOTAL <= 53), and the shift gives out - lo in
      [0, 255];
    - the odd results are shifted up into the even ones' zero upper halves (one int32
      vector in order), their low bytes taken by one byte shuffle, and lo added back in
      8-bit lanes (out - lo + lo wraps to out's byte, signed or not)."""
    from llvmlite import ir
    from .llvm_loops import splat
    add, f_lo, f_hi, f_mult, f_offset, total = constants
    n = sums.type.count
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    half = ir.VectorType(i64, n // 2)
    c32 = ir.Constant(half, [32] * (n // 2))
    even = list(range(0, n, 2))
    odd = list(range(1, n, 2))

    def pick(v, lanes):
        return bc.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                 ir.Constant(ir.VectorType(i32, len(lanes)), lanes))
    v = _clamp(bc, bc.add(sums, add), f_lo, f_hi)
    v2, m2 = bc.bitcast(v, half), bc.bitcast(f_mult, half)
    # (sign-extended in place: LLVM takes a product of two such for one vpmuldq)
    low = lambda x: bc.ashr(bc.shl(x, c32), c32)  # noqa: E731
    products = (bc.mul(low(v2), low(m2)), bc.mul(bc.ashr(v2, c32), bc.ashr(m2, c32)))
    moved = bc.sub(f_offset, bc.shl(splat(bc, lo, f_offset.type), total))
    shifted = [bc.lshr(bc.add(prod, pick(moved, lanes)), pick(total, lanes))
               for prod, lanes in zip(products, (even, odd))]
    both = bc.or_(shifted[0], bc.shl(shifted[1], c32))
    out = pick(bc.bitcast(both, ir.VectorType(i8, 4 * n)), list(range(0, 4 * n, 4)))
    return bc.add(out, splat(bc, bc.trunc(lo, i8), out.type))


def with_epilogue(bc, table, stride, col, n: int, lo, hi, body, pairs: bool | None = None):
    """Emit ``body(bc, requantize)`` under a branch on the layer's row FAST, with builder
    ``bc``: ``requantize(bc, sums)`` gives the 8-bit values of a vector of n int32 sums of
    the channels col..col+n, by the narrowed epilogue where the layer has it, else the full
    one, from constants loaded once before ``body`` (``table``: as for ``load_constants``;
    ``lo``, ``hi`` i64). ``body`` is emitted twice, once in each branch. The narrowed
    epilogue is emitted as ``_narrowed_pairs`` where ``pairs`` says so (by default on a CPU
    without AVX-512, for an even n), else as ``_narrowed_vector``."""
    from llvmlite import ir
    from .llvm_loops import cpu_has
    if pairs is None:
        pairs = n % 2 == 0 and not cpu_has("avx512f")
    i64 = ir.IntType(64)
    at = bc.add(bc.mul(stride, ir.Constant(i64, FAST)), col)
    flag = bc.load(bc.gep(bc.bitcast(table, i64.as_pointer()), [at]), align=8)
    with bc.if_else(bc.icmp_signed("!=", flag, ir.Constant(i64, 0)), likely=True) as (
            narrowed, full):
        with narrowed:
            load = _const_loader(bc, table, stride, col, n)
            f_mult = load(FMULT, 32) if pairs else bc.sext(load(FMULT, 32), load(FOFFSET).type)
            fast = (load(ADD, 32), load(FLO, 32), load(FHI, 32), f_mult, load(FOFFSET),
                    load(TOTAL))
            if pairs:
                body(bc, lambda bd, sums: _narrowed_pairs(bd, sums, fast, lo))
            else:
                body(bc, lambda bd, sums: _narrowed_vector(bd, sums, fast))
        with full:
            constants = load_constants(bc, table, stride, col, n)
            body(bc, lambda bd, sums: requantize_vector(bd, sums, constants, lo, hi))
