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


def with_epilogue(bc, table, stride, col, n: int, lo, hi, body):
    """Emit ``body(bc, requantize)`` under a branch on the layer's row FAST, with builder
    ``bc``: ``requantize(bc, sums)`` gives the 8-bit values of a vector of n int32 sums of
    the channels col..col+n, by the narrowed epilogue where the layer has it, else the full
    one, from constants loaded once before ``body`` (``table``: as for ``load_constants``;
    ``lo``, ``hi`` i64). ``body`` is emitted twice, once in each branch."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    at = bc.add(bc.mul(stride, ir.Constant(i64, FAST)), col)
    flag = bc.load(bc.gep(bc.bitcast(table, i64.as_pointer()), [at]), align=8)
    with bc.if_else(bc.icmp_signed("!=", flag, ir.Constant(i64, 0)), likely=True) as (
            narrowed, full):
        with narrowed:
            load = _const_loader(bc, table, stride, col, n)
            f_mult = bc.sext(load(FMULT, 32), load(FOFFSET).type)
            fast = (load(ADD, 32), load(FLO, 32), load(FHI, 32), f_mult, load(FOFFSET),
                    load(TOTAL))
            body(bc, lambda bd, sums: _narrowed_vector(bd, sums, fast))
        with full:
            constants = load_constants(bc, table, stride, col, n)
            body(bc, lambda bd, sums: requantize_vector(bd, sums, constants, lo, hi))
