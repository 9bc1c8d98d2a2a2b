"""The integer epilogue in LLVM IR, for kernels that finish their int32 sums in registers
(the VNNI GEMM, the depthwise sweep): ``kernels_int8.requantize_rows``'s steps on a vector
of sums, with the per-channel constants of ``epilogue_params`` (an (8, O) int64 table whose
rows are named here), giving the same bits.

    v = clamp(sum + ADD, LO, HI)                      the int32 saturation and the activation
    p = (v << LEFT) * MULT + OFFSET                   the fixed-point multiply, zero point in
    r = ((p ^ 2^63) >>> TOTAL) - BACK                 rounding shift; the output zero point
    out = clamp(r, lo, hi), 8 bits
"""
from __future__ import annotations

# the rows of ``kernels_int8.epilogue_params``: one per-channel constant each
ADD, LO, HI, LEFT, MULT, OFFSET, TOTAL, BACK = range(8)


def load_constants(bc, table, stride, col, n: int) -> tuple:
    """The 8 constants (ADD .. BACK) of channels col..col+n as vectors of n int64, emitted
    with builder ``bc``: ``table`` an i8 pointer to the constants of channel 0 (row r of
    channel c at r * stride + c). Loaded once for all the rows a kernel finishes (a store of
    8-bit results between two loads of the table may alias it, as far as LLVM knows, so it
    would load them again for every row)."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    w64 = ir.VectorType(i64, n)
    table = bc.bitcast(table, i64.as_pointer())

    def const(row):
        at = bc.add(bc.mul(stride, ir.Constant(i64, row)), col)
        return bc.load(bc.bitcast(bc.gep(table, [at]), w64.as_pointer()), align=8)
    return tuple(const(row) for row in (ADD, LO, HI, LEFT, MULT, OFFSET, TOTAL, BACK))


def requantize_vector(bc, sums, constants, lo, hi):
    """The 8-bit values of ``sums`` (a vector of n int32), emitted with builder ``bc``:
    ``constants`` from ``load_constants`` for the same channels, ``lo`` and ``hi`` i64
    values."""
    from llvmlite import ir
    from .llvm_loops import splat
    n = sums.type.count
    i8, i64 = ir.IntType(8), ir.IntType(64)
    w64 = ir.VectorType(i64, n)
    add, c_lo, c_hi, left, mult, offset, total, back = constants

    def clamp(v, low, high):
        v = bc.select(bc.icmp_signed(">", low, v), low, v)
        return bc.select(bc.icmp_signed("<", high, v), high, v)

    v = clamp(bc.add(bc.sext(sums, w64), add), c_lo, c_hi)
    v = bc.add(bc.mul(bc.shl(v, left), mult), offset)
    v = bc.xor(v, ir.Constant(w64, [-(1 << 63)] * n))
    v = bc.sub(bc.lshr(v, total), back)
    return bc.trunc(clamp(v, splat(bc, lo, w64), splat(bc, hi, w64)), ir.VectorType(i8, n))
