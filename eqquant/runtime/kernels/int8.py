"""Numba kernels for the integer ops of a quantized program (portable: plain loops, no
instruction-set intrinsics), compiled once and cached on disk like the fp32 kernels.

Convolutions are im2col (int8) then an int8 x int8 -> int32 GEMM, parallel over output
channels; requantization is TVM's fixed-point multiply (Q31 multiplier, shift, ties upward),
bit for bit.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .depthwise import call_sweep
from .fp32 import inside, interior, kernel_rows
from ..codegen.launch import parallel, share
from ...ops.numerics import range_params
from ...ops.qnn import ADD_FRACTION_BITS
# the rows of ``epilogue_table.epilogue_params`` (requantize_ir.py emits the same steps in
# LLVM IR)
from ..codegen.requantize_ir import ADD, BACK, HI, LEFT, LO, MULT, OFFSET, TOTAL
from ..codegen.epilogue_table import SIGN as _SIGN


@parallel
def im2col_i8(thread, threads, args):
    """x: (C, H, W) int8/uint8 -> col: (C*kh*kw, oh*ow); padding reads ``zero`` (the input's
    zero point, so that padding stands for the real value 0)."""
    x, zero, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, col = args
    c_in, h, w = x.shape
    for row in range(*share(c_in * kh * kw, thread, threads)):
        c = row // (kh * kw)
        i = (row // kw) % kh
        j = row % kw
        for y in range(oh):
            iy = y * sh - pt + i * dh
            base = y * ow
            for xo in range(ow):
                ix = xo * sw - pl + j * dw
                if iy >= 0 and iy < h and ix >= 0 and ix < w:
                    col[row, base + xo] = x[c, iy, ix]
                else:
                    col[row, base + xo] = zero


@parallel
def gemm_i8(thread, threads, args):
    """out[o, p] = sum_k (w[o, k] - zw[o]) * (col[k, p] - zx), in int32."""
    w, zw, col, zx, out = args
    rows, depth = w.shape
    cols = col.shape[1]
    for o in range(*share(rows, thread, threads)):
        acc = np.zeros(cols, np.int32)
        for k in range(depth):
            a = np.int32(w[o, k]) - zw[o]
            if a == 0:
                continue
            for p in range(cols):
                acc[p] += a * (np.int32(col[k, p]) - zx)
        for p in range(cols):
            out[o, p] = acc[p]


@parallel
def dense_i8(thread, threads, args):
    """out[n, o] = sum_k (w[o, k] - zw[o]) * (x[n, k] - zx), in int32 (wrapping, as the
    reference's int64 sum cast to int32), for x (N, K) and w (units, K): each output one dot
    product along K, which LLVM vectorizes (a weight row streams past once per image, so a
    large layer runs at memory speed). Each thread first shifts the image by its zero point
    into a buffer of its own (N x K values, against its share of N x K x units products),
    of ``like``'s type: int16 where the differences fit (8-bit data, a zero point of 16
    bits), so the products widen from 16 bits; the weights' zero points come off as zw[o] *
    sum(xs[n]). The image's zero point is ``zero[0]`` (a constant, or computed at run time:
    dynamic quantization)."""
    x, zero, w, zw, like, out = args
    zx = np.int32(zero[0])
    n_, k_ = x.shape
    xs = np.empty((n_, k_), like.dtype)
    sums = np.zeros(n_, np.int64)
    for n in range(n_):
        for k in range(k_):
            v = np.int32(x[n, k]) - zx
            xs[n, k] = v
            sums[n] += v
    for o in range(*share(w.shape[0], thread, threads)):
        for n in range(n_):
            out[n, o] = _dot_i32(w[o], xs[n]) - zw[o] * sums[n]


@njit(inline="always")
def _dot_i32(a, b):
    """sum(a * b) wrapped to int32 at every step: held to 32 bits, LLVM's vectorized
    reduction multiplies 16-bit pairs (vpmaddwd; vpdpwssd with VNNI). Summed in int64, as
    Numba types a product of two int32, it took vpmulld, about twice as slow."""
    acc = np.int32(0)
    for k in range(a.shape[0]):
        acc = np.int32(acc + np.int32(a[k]) * np.int32(b[k]))
    return acc


@parallel
def requantize(thread, threads, args):
    """Flat: out = clip(fixed_point_multiply(q - zin, multiplier, shift) + zout, lo, hi)."""
    q, zin, multiplier, shift, zout, lo, hi, out = args
    left = max(shift, 0)
    total = max(-shift, 0) + 31
    half = np.int64(1) << (total - 1)
    for i in range(*share(q.size, thread, threads)):
        v = (np.int64(q[i]) - zin) << left
        v = (v * multiplier + half) >> total
        v = v + zout
        out[i] = min(max(v, lo), hi)


@parallel
def qmul(thread, threads, args):
    """qnn.mul on 4-D operands of the output's shape (broadcast views: strides of 0):
    out = clip(fixed_point_multiply((a - za) * (b - zb), multiplier, shift) + zo, lo, hi)
    (``requantize``'s rounding: ties up), one output row of the last axis a unit."""
    a, b, za, zb, multiplier, shift, zo, lo, hi, out = args
    d0, d1, d2, d3 = out.shape
    left = max(shift, 0)
    total = max(-shift, 0) + 31
    half = np.int64(1) << (total - 1)
    for r in range(*share(d0 * d1 * d2, thread, threads)):
        i0, i1, i2 = r // (d1 * d2), (r // d2) % d1, r % d2
        for j in range(d3):
            v = (np.int64(a[i0, i1, i2, j]) - za) * (np.int64(b[i0, i1, i2, j]) - zb)
            v = ((v << left) * multiplier + half) >> total
            out[i0, i1, i2, j] = min(max(v + zo, lo), hi)


@parallel
def quantize(thread, threads, args):
    """Flat: out = clip(round_half_even(x / scale) + zero, lo, hi), the rounded quotient
    converted to int64 as the reference's ``astype`` does (NaN, the infinities and values
    of 2^63 or more in magnitude: int64's least value, to which zero is added, wrapping).
    The scale and zero point are ``scale[0]`` and ``zero[0]``: constants, or computed at
    run time (dynamic quantization)."""
    x, scale, zero, lo, hi, out = args
    s, z = np.float32(scale[0]), np.int64(zero[0])
    for i in range(*share(x.size, thread, threads)):
        v = np.int64(np.rint(np.float32(x[i]) / s)) + z
        out[i] = min(max(v, lo), hi)


TWO_63 = np.float32(2.0 ** 63)


@njit(cache=True)
def quantize_unconvertible(zero, lo, hi):
    """What ``quantize`` gives where the rounded quotient has no int64 value (NaN, the
    infinities, 2^63 or more in magnitude): int64's least value plus zero, wrapping as
    int64 does, clipped to [lo, hi] (bounds of 32 bits at most). For a zero point of 32
    bits that sum is below every bound, or wraps past 2^62 when the zero point is negative:
    lo or hi, written so (a wrapping add is undefined in the code Numba emits)."""
    return np.int64(lo) if zero >= 0 else np.int64(hi)


@parallel
def quantize_narrow(thread, threads, args):
    """``quantize``'s bits for an 8-bit output and a zero point below 2^24 in magnitude, in
    float32 lanes: the rounded quotient r is clipped to [lo - zero, hi - zero] as a float
    (those bounds and r are integers, exactly represented), converted to int32 and zero
    added; where r has no int64 value (not below 2^63 in magnitude: NaN too),
    ``quantize_unconvertible``. AVX2 has no conversion of floats to int64, and
    ``quantize`` converted one lane at a time, this form a vector at a time."""
    x, scale, zero, lo, hi, out = args
    s, zero64 = np.float32(scale[0]), np.int64(zero[0])
    unconvertible = quantize_unconvertible(zero64, lo, hi)
    flo, fhi = np.float32(lo - zero64), np.float32(hi - zero64)
    z = np.int32(zero64)
    for i in range(*share(x.size, thread, threads)):
        r = np.rint(np.float32(x[i]) / s)
        c = min(max(r, flo), fhi)
        out[i] = np.int32(c) + z if abs(r) < TWO_63 else unconvertible


LUT_STRIP = 64     # channels a unit of ``lut`` on channel-last codes (their tables: 16 KB)
LUT_ROWS = 128     # rows a unit


@parallel
def lut(thread, threads, args):
    """Flat 8-bit codes and output (as uint8 views): out[i] = table[c * 256 + (codes[i] ^
    flip)], where c = (i // inner) % channels is element i's channel (channels 1: one
    table); flip 0x80 turns an int8 code into its index (-128 -> 0)."""
    codes, flip, table, channels, inner, out = args
    n = codes.size
    if n == 0:
        return
    if channels == 1:
        chunk = 16384
        for b in range(*share((n + chunk - 1) // chunk, thread, threads)):
            for i in range(b * chunk, min(n, (b + 1) * chunk)):
                out[i] = table[codes[i] ^ flip]
    elif inner == 1:
        # channel-last: a unit is a strip of LUT_STRIP channels down a run of LUT_ROWS rows,
        # the units strip-major, so that a thread walks down one strip's rows while its
        # tables (LUT_STRIP x 256 bytes) stay in L1 (row by row, each element read its own
        # channel's table out of all of them: ConvNeXt's 1536 and 3072 channels, tables of
        # 384 and 768 KB, missed the core's caches); unsigned index arithmetic (no
        # wraparound of a negative index to test for)
        rows = n // channels
        strips = (channels + LUT_STRIP - 1) // LUT_STRIP
        runs = (rows + LUT_ROWS - 1) // LUT_ROWS
        f = np.uint32(flip)
        for u in range(*share(strips * runs, thread, threads)):
            c0 = (u // runs) * LUT_STRIP
            c1 = min(channels, c0 + LUT_STRIP)
            r0 = (u % runs) * LUT_ROWS
            for r in range(r0, min(rows, r0 + LUT_ROWS)):
                base = r * channels
                for c in range(c0, c1):
                    out[base + c] = table[np.uint32(c) * np.uint32(256) +
                                          (np.uint32(codes[base + c]) ^ f)]
    else:
        for b in range(*share(n // inner, thread, threads)):
            base = (b % channels) * 256
            for i in range(b * inner, (b + 1) * inner):
                out[i] = table[base + (codes[i] ^ flip)]


@parallel
def dequantize(thread, threads, args):
    """Flat q, out: (q - zero[0]) * scales[c], c the channel of element i: (i // inner) % C
    (one scale: C = 1). Walked as rows: the flat values with one scale; else (outer, C,
    inner) a channel's run of ``inner`` values a unit, or with inner 1 (channels last: a
    dense layer's (rows, units)) a row of C a unit. (A division and a remainder per value
    took most of its time.)"""
    q, zero, scales, inner, out = args
    c_n = scales.size
    z = np.int64(zero[0])
    if c_n == 1:
        s = scales[0]
        for i in range(*share(q.size, thread, threads)):
            out[i] = np.float32(np.int64(q[i]) - z) * s
    elif inner == 1:
        for r in range(*share(q.size // c_n, thread, threads)):
            base = r * c_n
            for c in range(c_n):
                out[base + c] = np.float32(np.int64(q[base + c]) - z) * scales[c]
    else:
        for r in range(*share(q.size // inner, thread, threads)):
            s = scales[r % c_n]
            base = r * inner
            for k in range(inner):
                out[base + k] = np.float32(np.int64(q[base + k]) - z) * s


@parallel
def clip_channels(thread, threads, args):
    """q, out: (A, C, B); bounds per channel c (or one pair for all)."""
    q, lo, hi, out = args
    a_n, c_n, b_n = q.shape
    for a in range(a_n):
        for c in range(*share(c_n, thread, threads)):
            k = c if lo.size > 1 else c - c
            for b in range(b_n):
                out[a, c, b] = min(max(q[a, c, b], lo[k]), hi[k])


@parallel
def flip_top_bits(thread, threads, args):
    """Flat bytes with their top bit flipped: int8 + 128 as the unsigned bytes vpdpbusd
    reads (``np.bitwise_xor(x.view(np.uint8), 0x80)``)."""
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        out[i] = x[i] ^ np.uint8(0x80)


@parallel
def to_hwc(thread, threads, args):
    """x: (C, H, W) 8-bit -> out: (H, W, C) uint8, each value plus ``shift`` (128 turns int8
    into the unsigned bytes vpdpbusd reads)."""
    x, shift, out = args
    c_n, h, w = x.shape
    for y in range(*share(h, thread, threads)):
        for i in range(w):
            for c in range(c_n):
                out[y, i, c] = np.uint8(np.int32(x[c, y, i]) + shift)


@parallel
def finish_gemm(thread, threads, args):
    """acc: (P, O') int32 from a SIMD GEMM (O' >= O: padded channels are ignored) -> out:
    (O, P), minus the per-channel correction."""
    acc, correction, out = args
    p_n = acc.shape[0]
    o_n = out.shape[0]
    for o in range(*share(o_n, thread, threads)):
        c = correction[o]
        for p in range(p_n):
            out[o, p] = acc[p, o] - c


@parallel
def offset_correction(thread, threads, args):
    """correction[o] = column_sums[o] * (shift + zero[0]): the SIMD GEMM's correction for
    rows shifted by ``shift`` whose zero point is computed at run time (dynamic
    quantization; a constant zero point's correction is made once, when bound)."""
    column_sums, shift, zero, correction = args
    offset = np.int32(shift + zero[0])
    for o in range(*share(correction.size, thread, threads)):
        correction[o] = column_sums[o] * offset


_range_params = njit(cache=True)(range_params)     # (the reference's function, compiled)
LANES = 16          # range_parts' running minima and maxima


@parallel
def range_parts(thread, threads, args):
    """The finite range of the flat float32 ``x``, a share of it a thread: parts[t] = (least,
    greatest) finite value of thread t's share ((inf, -inf) where it has none; the rows of
    threads that do not run, too). ``range_of_parts`` finishes it."""
    x, parts = args
    workers = min(threads, parts.shape[0])     # (a row of parts each)
    if thread >= workers:
        return
    if thread == 0:
        for t in range(workers, parts.shape[0]):
            parts[t, 0] = np.float32(np.inf)
            parts[t, 1] = np.float32(-np.inf)
    # LANES running minima and maxima (independent: the loop vectorises), each a select that
    # a NaN or an infinity never wins; min and max are exact in any order
    inf = np.float32(np.inf)
    los = np.full(LANES, inf, np.float32)
    his = np.full(LANES, -inf, np.float32)
    i0, i1 = share(x.size, thread, workers)
    whole = i1 - (i1 - i0) % LANES
    for i in range(i0, whole, LANES):
        for j in range(LANES):
            v = x[i + j]
            finite = abs(v) < inf
            los[j] = v if finite and v < los[j] else los[j]
            his[j] = v if finite and v > his[j] else his[j]
    for i in range(whole, i1):
        v = x[i]
        if abs(v) < inf:
            los[0] = min(los[0], v)
            his[0] = max(his[0], v)
    parts[thread, 0] = los.min()
    parts[thread, 1] = his.max()


@parallel
def range_of_parts(thread, threads, args):
    """out = [least, greatest]: the range ``range_parts`` found in shares, put together on
    one thread ([0, 0] where no share had a finite value)."""
    parts, out = args
    for _ in range(*share(1, thread, threads)):
        lo, hi = parts[:, 0].min(), parts[:, 1].max()
        if lo > hi:                 # (no finite value)
            lo, hi = np.float32(0.0), np.float32(0.0)
        out[0] = lo
        out[1] = hi


@parallel
def params_of_range(thread, threads, args):
    """scale[0], zero[0]: the parameters (``numerics.range_params``, compiled: the
    reference's function) of the range [r[0], r[1]] (``range_of_parts``'), on one thread."""
    r, symmetric, scale, zero = args
    for _ in range(*share(1, thread, threads)):
        s, z = _range_params(np.float64(r[0]), np.float64(r[1]), symmetric)
        scale[0] = s
        zero[0] = z


@parallel
def finish_rows(thread, threads, args):
    """acc: (P, O') int32 from a SIMD GEMM (O' >= O: padded channels are ignored) -> out:
    (P, O), minus the per-channel correction (``finish_gemm`` in row order)."""
    acc, correction, out = args
    o_n = out.shape[1]
    for p in range(*share(out.shape[0], thread, threads)):
        for o in range(o_n):
            out[p, o] = acc[p, o] - correction[o]


@parallel
def shifted_rows(thread, threads, args):
    """x: (P, K) 8-bit -> rows: (P, Kp) uint8 (Kp >= K), each value plus ``shift`` (128 turns
    int8 into the unsigned bytes vpdpbusd reads), the padding columns 0 (a GEMM's left
    operand)."""
    x, shift, rows = args
    k_n, kp = x.shape[1], rows.shape[1]
    for p in range(*share(x.shape[0], thread, threads)):
        for k in range(k_n):
            rows[p, k] = np.uint8(np.int32(x[p, k]) + shift)
        for k in range(k_n, kp):
            rows[p, k] = 0


@parallel
def requantize_channels(thread, threads, args):
    """q, out: (N, C, P); one multiplier and shift per channel C (per-channel scales)."""
    q, zin, multipliers, shifts, zout, lo, hi, out = args
    n, channels, size = q.shape
    for c in range(*share(channels, thread, threads)):
        left = max(shifts[c], 0)
        total = max(-shifts[c], 0) + 31
        half = np.int64(1) << (total - 1)
        m = multipliers[c]
        for b in range(n):
            for i in range(size):
                v = (np.int64(q[b, c, i]) - zin) << left
                v = (v * m + half) >> total
                v = v + zout
                out[b, c, i] = min(max(v, lo), hi)


@parallel
def requantize_channels_last(thread, threads, args):
    """q, out: (R, C); one multiplier and shift per channel C, the last axis (a dense layer's
    output, channel-last values): ``requantize_channels``' arithmetic a row at a time (taken a
    channel at a time, a column of ConvNeXt's (3136, 384) sums went element by element down
    the rows)."""
    q, zin, multipliers, shifts, zout, lo, hi, out = args
    rows, channels = q.shape
    for r in range(*share(rows, thread, threads)):
        for c in range(channels):
            s = shifts[c]
            left = max(s, 0)
            total = max(-s, 0) + 31
            v = (np.int64(q[r, c]) - zin) << left
            v = (v * multipliers[c] + (np.int64(1) << (total - 1))) >> total
            out[r, c] = min(max(v + zout, lo), hi)


@parallel
def qadd(thread, threads, args):
    """Flat qnn.add: b rescaled to a's scale (mb, shb), added to a in int32, the sum rescaled to
    the output's (mo, sho); fixed-point steps as in ``requantize``."""
    a, za, b, zb, mb, shb, mo, sho, zo, lo, hi, out = args
    lb, tb = max(shb, 0), max(-shb, 0) + 31
    lo_, to = max(sho, 0), max(-sho, 0) + 31
    hb = np.int64(1) << (tb - 1)
    ho = np.int64(1) << (to - 1)
    for i in range(*share(a.size, thread, threads)):
        vb = ((np.int64(b[i]) - zb) << lb) * mb
        vb = (vb + hb) >> tb
        total = np.int64(a[i]) - za + vb
        total = min(max(total, -2147483648), 2147483647)
        v = ((total << lo_) * mo + ho) >> to
        v = v + zo
        out[i] = min(max(v, lo), hi)


@parallel
def qadd_once(thread, threads, args):
    """Flat qnn.add(method="once"): ((a - za) * ma + (b - zb) * mb) rounded once at ``bits``
    fractional bits, plus zo, saturated."""
    a, za, b, zb, ma, mb, bits, zo, lo, hi, out = args
    half = np.int64(1) << (bits - 1)
    for i in range(*share(a.size, thread, threads)):
        v = ((np.int64(a[i]) - za) * ma + (np.int64(b[i]) - zb) * mb + half) >> bits
        v = v + zo
        out[i] = min(max(v, lo), hi)


# qnn.add(method="once") in int32 lanes: each multiplier split at SPLIT bits
SPLIT = 15
_ONCE_SHIFT = ADD_FRACTION_BITS - SPLIT


def split_multipliers(ma: int, mb: int):
    """(high, low) halves of the two multipliers of ``qadd_once_split``, or None where one
    is negative or 2^30 or more (a scale ratio of 64 or more: ``qadd_once`` then)."""
    if not (0 <= ma < 1 << 30 and 0 <= mb < 1 << 30):
        return None
    low = (1 << SPLIT) - 1
    return tuple(np.int32(v) for v in (ma >> SPLIT, ma & low, mb >> SPLIT, mb & low))


@njit(cache=True, inline="always")
def _sum_once(a, b, za, zb, ah, al, bh, bl, c):
    """One sum of ``qadd_once_split`` in int32 (``c``: 2^8 + zo * 2^9), unsaturated."""
    da = np.int32(np.int32(a) - za)
    db = np.int32(np.int32(b) - zb)
    h = np.int32(np.int32(da * ah) + np.int32(db * bh) + c)
    low = np.int32(np.int32(da * al) + np.int32(db * bl))
    return np.int32(np.int32(h + np.int32(low >> SPLIT)) >> _ONCE_SHIFT)


@parallel
def qadd_once_split(thread, threads, args):
    """``qadd_once``'s bits in int32 lanes (16 to a 512-bit vector, not 8), for multipliers
    below 2^30 (``split_multipliers``) and 8-bit operands. With ma = ah * 2^15 + al (the
    same for mb), da = a - za and db = b - zb (|d| <= 255), half = 2^23 = 2^15 * 2^8:

        (da*ma + db*mb + half) >> 24  =  (H + (L >> 15)) >> 9
        H = da*ah + db*bh + 2^8,  L = da*al + db*bl

    exactly (a floor division by 2^24 is one by 2^15 and then one by 2^9, and 2^15 * H is
    a multiple of 2^15); |H|, |L| < 2^24. The output zero point joins H as zo * 2^9."""
    a, za, b, zb, ah, al, bh, bl, zo, lo, hi, out = args
    c = np.int32((1 << (_ONCE_SHIFT - 1)) + (zo << _ONCE_SHIFT))
    lo32, hi32 = np.int32(lo), np.int32(hi)
    for i in range(*share(a.size, thread, threads)):
        out[i] = min(max(_sum_once(a[i], b[i], za, zb, ah, al, bh, bl, c), lo32), hi32)


def residual_params(za: int, zb: int, split: tuple, zo: int) -> np.ndarray:
    """``add_tile``'s parameters, in the order it reads them: the two zero points, the split
    multipliers (``split_multipliers``), the output zero point."""
    return np.array([za, zb, *split, zo], np.int32)


@njit(inline="always")
def add_residual(out, res, b, p0, n, c0, c1, add, lo, hi):
    """``add_tile`` on image b's tile where the convolution has a residual (``res`` of a
    convolution without one: (0, 0, 0)): the SIMD drivers' last step of a work item.
    Inlined into its callers, as ``add_tile`` and ``requantize_rows`` are: compiled apart
    and linked into each driver's items, their code went through Numba and LLVM twice (0.28
    s of resnet18 int8's first start, with an empty cache)."""
    if res.shape[0]:
        add_tile(out[b], res[b], p0, n, c0, c1, add, lo, hi)


@njit(inline="always")
def add_tile(out, res, p0, n, c0, c1, add, lo, hi):
    """out[p0:p0 + n, c0:c1] (8-bit, (P, O)) summed in place with the same tile of ``res``
    as ``qadd_once_split`` sums (out the lhs; ``add``: ``residual_params``): the residual sum of
    a fused convolution (fused.qconv2d_add), taken on each work item's tile as it is
    finished, while it is in cache. A tile of whole rows is summed as one run of n * O
    values: row by row, LLVM's loop (32 lanes a step) left MobileNet-v2's rows of 24
    channels to its scalar remainder."""
    za, zb, ah, al, bh, bl = add[0], add[1], add[2], add[3], add[4], add[5]
    c = np.int32((1 << (_ONCE_SHIFT - 1)) + (add[6] << _ONCE_SHIFT))
    lo32, hi32 = np.int32(lo), np.int32(hi)
    w = c1 - c0
    if w == out.shape[1]:
        # (sliced, then indexed from 0: an index from p0 * w, which LLVM cannot know is not
        # negative, kept Numba's wraparound test in the loop, 10x the time)
        o = out.reshape(out.size)[p0 * w:(p0 + n) * w]
        q = res.reshape(res.size)[p0 * w:(p0 + n) * w]
        for j in range(n * w):
            o[j] = min(max(_sum_once(o[j], q[j], za, zb, ah, al, bh, bl, c), lo32), hi32)
        return
    for r in range(n):
        o = out[p0 + r, c0:c1]
        q = res[p0 + r, c0:c1]
        for j in range(w):
            o[j] = min(max(_sum_once(o[j], q[j], za, zb, ah, al, bh, bl, c), lo32), hi32)


@njit(cache=True)
def requantize_acc(v, clamp_lo, clamp_hi, zin, left, multiplier, half, total, zout, lo, hi):
    """One int64 sum (accumulator plus bias) to its 8-bit output: saturated to int32, clamped
    (relu, clip or nothing), requantized with UPWARD fixed point, saturated to [lo, hi]. The
    epilogue of every fused integer convolution kernel."""
    v = min(max(v, -2147483648), 2147483647)
    v = min(max(v, clamp_lo), clamp_hi)
    v = (((v - zin) << left) * multiplier + half) >> total
    return min(max(v + zout, lo), hi)


@parallel
def bias_clamp_requantize(thread, threads, args):
    """acc: (O, P) int32 -> out: (O, P): requantize(clamp(acc + bias[o])) with one clamp (relu:
    [0, max]; clip: its integer bounds; none: the int32 range), multiplier and shift per
    channel, saturated to [lo, hi]."""
    acc, bias, clamp_lo, clamp_hi, multipliers, shifts, zin, zout, lo, hi, out = args
    o_n, p_n = acc.shape
    for o in range(*share(o_n, thread, threads)):
        left = max(shifts[o], 0)
        total = max(-shifts[o], 0) + 31
        half = np.int64(1) << (total - 1)
        m = multipliers[o]
        b = np.int64(bias[o])
        for p in range(p_n):
            out[o, p] = requantize_acc(np.int64(acc[o, p]) + b, clamp_lo[o], clamp_hi[o], zin,
                                       left, m, half, total, zout, lo, hi)


@njit(cache=True)
def _depthwise_row(x, zx, wt, mult, oy, sh, sw, pt, pl, dh, dw, ow, acc, rowbuf):
    """acc (ow, O) int32 = output row oy of a depthwise convolution of (x - zx), x (C, H, W)
    8-bit, wt (kh, kw, O) int32 (weight minus its zero point), output channel o reading input
    channel o // mult. Each input row it needs is gathered channel-last, minus zx, as int16
    (rowbuf (W, O)), so that the sums run along the channels, contiguous and vectorised; taps
    outside the image contribute nothing (they hold zx: x - zx = 0)."""
    c_in, h, wd = x.shape
    kh, kw, o_n = wt.shape
    acc[:, :] = 0
    for i in range(kh):
        iy = oy * sh - pt + i * dh
        if iy < 0 or iy >= h:
            continue
        for ix in range(wd):
            for o in range(o_n):
                rowbuf[ix, o] = np.int16(x[o // mult, iy, ix]) - np.int16(zx)
        for j in range(kw):
            taps = wt[i, j]
            for ox in range(ow):
                ix = ox * sw - pl + j * dw
                if ix < 0 or ix >= wd:
                    continue
                src = rowbuf[ix]
                a = acc[ox]
                for o in range(o_n):
                    a[o] += taps[o] * np.int32(src[o])


@parallel
def depthwise_i8(thread, threads, args):
    """qnn.conv2d with groups = input channels (any channel multiplier): x (C, H, W) 8-bit,
    wt (kh, kw, O) int32, out (O, oh*ow) int32. One output row per work item."""
    x, zx, wt, mult, sh, sw, pt, pl, dh, dw, oh, ow, out = args
    o_n = out.shape[0]
    for oy in range(*share(oh, thread, threads)):
        acc = np.empty((ow, o_n), np.int32)
        rowbuf = np.empty((x.shape[2], o_n), np.int16)
        _depthwise_row(x, zx, wt, mult, oy, sh, sw, pt, pl, dh, dw, ow, acc, rowbuf)
        for o in range(o_n):
            for ox in range(ow):
                out[o, oy * ow + ox] = acc[ox, o]


@njit(inline="always")
def requantize_rows(acc, params, o0, cols, lo, hi, dst, r0, d0):
    """dst[r0 + r, d0 + c] = requantize_acc(acc[r, c] + bias[o], ...) for o = o0 + c, c <
    cols, every row r of acc: the epilogue of the integer convolutions, ``params`` from
    ``epilogue_table.epilogue_params``. The constants are sliced to the run once and every
    row is one loop over contiguous arrays indexed by the loop's counter alone, so that it
    vectorises (an index o0 + c may be negative as far as LLVM knows: Numba's wrap-around
    of negative indices turned the loads into gathers and the stores into byte extractions,
    and a call per row paid its set-up per row: 2.8 cycles an output, against 1.1). AVX2 has
    no arithmetic right shift of 64-bit lanes by a per-lane amount, so the rounding shift is
    taken on the sum moved into the unsigned range (its top bit flipped: + 2^63) and moved
    back after (- 2^63 >> total): the same floor, the same bits, even where the sum wraps."""
    e = o0 + cols
    b, c_lo, c_hi = params[ADD, o0:e], params[LO, o0:e], params[HI, o0:e]
    sl, m, off = params[LEFT, o0:e], params[MULT, o0:e], params[OFFSET, o0:e]
    tt, back = params[TOTAL, o0:e], params[BACK, o0:e]
    for r in range(acc.shape[0]):
        a = acc[r, :cols]
        out = dst[r0 + r, d0:d0 + cols]
        for c in range(cols):
            v = min(max(np.int64(a[c]) + b[c], c_lo[c]), c_hi[c])
            p = (v << sl[c]) * m[c] + off[c]
            out[c] = min(max(np.int64((np.uint64(p) ^ _SIGN) >> np.uint64(tt[c])) - back[c],
                             lo), hi)


@njit(cache=True)
def _taps_along(acc, row, tap, ox0, ox1, sw, offset, zx, mult):
    """acc[ox] += tap * (row[ox * sw + offset] - zx) for ox0 <= ox < ox1, along the channels
    (output channel o reads input channel o // mult)."""
    o_n = acc.shape[1]
    for ox in range(ox0, ox1):
        src = row[ox * sw + offset]
        a = acc[ox]
        if mult == 1:
            for c in range(o_n):
                a[c] += tap[c] * (np.int32(src[c]) - zx)
        else:
            for c in range(o_n):
                a[c] += tap[c] * (np.int32(src[c // mult]) - zx)


@parallel
def depthwise_channels_last(thread, threads, args):
    """fused.qconv2d with groups = input channels on a channel-last batch: x (N, H, W, C)
    8-bit, wt (kh, kw, O) int32 (weight minus its zero point), out (N, oh*ow, O), all
    C-contiguous. One output row of one image per work item, the batch's rows image by image
    in one launch, each thread a run of them (the first images' on the first thread, as the
    GEMM drivers' items give them: a thread reads rows its own core wrote); with one output
    channel per input channel, the SIMD sweep
    (``depthwise_simd``: 16 channels at a time, the sums in registers across the taps and
    through the epilogue) sums and requantizes the whole row, its border pixels reading a
    pixel of zx (x - zx = 0) for a tap outside the image; with a channel multiplier, the
    sums go tap by tap along the channels (``_taps_along``: taps outside the image hold zx,
    and are skipped), then their bias, clamp and requantization (``requantize_rows``).
    Integer sums: the same in any order. ``params``: ``epilogue_table.depthwise_params``'s
    table; ``inits``: ``epilogue_table.depthwise_inits``'s; ``sweep``: the sweep of x's type
    (``depthwise_simd.entry``: "u8" or "i8"), called where mult is 1 only."""
    x, zx, wt, mult, sh, sw, pt, pl, dh, dw, oh, ow, params, inits, lo, hi, out, sweep = args
    h, w = x.shape[1], x.shape[2]
    kh, kw, o_n = wt.shape
    first, last = interior(ow, sw, pl, dw, kw, w)
    zrow = np.empty(o_n if mult == 1 else 0, x.dtype)     # a padding pixel, for the sweep
    zrow[:] = zx
    for item in range(*share(x.shape[0] * oh, thread, threads)):
        b, oy = item // oh, item % oh
        i0, i1 = kernel_rows(oy, sh, pt, dh, kh, h)
        if mult == 1 and i1 > i0:   # the whole row summed and requantized straight into out
            call_sweep(sweep, x[b, oy * sh - pt + i0 * dh].ctypes.data, wt[i0].ctypes.data,
                       inits[i0, i1].ctypes.data, out[b, oy * ow].ctypes.data,
                       params.ctypes.data,
                       zrow.ctypes.data, first, last, o_n, i1 - i0, dh * w * o_n, kw, sw, dw,
                       -pl, np.float32(0.0), np.float32(0.0), params.shape[1], lo, hi, 0, ow,
                       w)
            continue
        acc = np.zeros((ow, o_n), np.int32)
        for i in range(i0, i1):
            row = x[b, oy * sh - pt + i * dh]
            for j in range(kw):
                offset = j * dw - pl
                f, l_ = inside(ow, sw, offset, w)
                _taps_along(acc, row, wt[i, j], f, l_, sw, offset, zx, mult)
        # (np.intp: a literal 0 would compile requantize_rows again, for Literal[int](0))
        requantize_rows(acc, params, np.intp(0), o_n, lo, hi, out[b], oy * ow, np.intp(0))


@njit(inline="always")
def _channel_sums(x, z, s, acc):
    """acc[c] += float64(float32((x[p, c] - z) * s)) over the pixels p. The difference is
    taken in float32 (exact: two integers under 2^24 apart), so the loop converts bytes to
    floats in vectors; in integers Numba widens it to int64, which AVX2 converts one lane at
    a time (2.5x the time)."""
    p_n, c_n = x.shape
    for p in range(p_n):
        for c in range(c_n):
            acc[c] += np.float64((np.float32(x[p, c]) - z) * s)


@parallel
def global_average(thread, threads, args):
    """qnn.global_avg_pool2d on x (N, P, C) 8-bit (P the pixels) -> out (N, C): for each
    channel, the mean of the dequantized values (float32((q - z) * s)), then quantized with
    (so, zo), saturated to [lo, hi]. The reference takes the mean of the float32 values in
    float64; their sum is exact in any order (each a float32 multiple of the smallest one's
    ulp, 8 bits of spread, so fewer than 2^21 of them fill no float64 mantissa), so summing
    them in float64 here, divided by P and rounded to float32, gives the same bits. Each
    image's channels are summed in ``parts`` parts, one task each."""
    x, s, z, so, zo, lo, hi, out, parts = args
    n, p_n, c_n = x.shape
    width = -(-c_n // parts)
    zf = np.float32(z)
    for t in range(*share(n * parts, thread, threads)):
        b = t // parts
        c0 = (t % parts) * width
        c1 = min(c0 + width, c_n)
        acc = np.zeros(c1 - c0, np.float64)
        _channel_sums(x[b, :, c0:c1], zf, s, acc)
        for c in range(c0, c1):
            mean = np.float32(acc[c - c0] / p_n)
            q = np.int64(np.rint(mean / so)) + zo
            out[b, c] = min(max(q, lo), hi)


@parallel
def qbatch_matmul(thread, threads, args):
    """qnn.batch_matmul on (B, M, K) operands a and, as ``dot`` says, b as (B, N, K) (its
    rows and a's dotted: q @ k^T) or (B, K, N) (a's row times b, row by row: softmax @ v):
    out[i, j] = sum over k of (a[i, k] - za) * (b - zb), an output row a unit. Either form
    reads both operands along their contiguous axis. The zero points are ``zeros_a[0]`` and
    ``zeros_b[0]`` (constants, or computed at run time). The operands less their zero points
    are held in ``like``'s type (int16 where they fit: 8-bit values, zero points of 15 bits;
    the dot form's b a matrix at a time, per thread), and summed in int32, exact: the type
    relation bounds the depth (depth * 255 * 255 < 2^31; a wider zero point wraps the sums
    as the reference's int32 result does). In int64 they ran a product at a time."""
    a, b, zeros_a, zeros_b, dot, like, out = args
    za, zb = np.int32(zeros_a[0]), np.int32(zeros_b[0])
    nb, m, n = out.shape
    depth = a.shape[2]
    acc = np.empty(n, np.int32)
    row = np.empty(depth, like.dtype)
    shifted = np.empty((n if dot else 0, depth), like.dtype)
    held = -1                                   # the batch whose b ``shifted`` holds
    for r in range(*share(nb * m, thread, threads)):
        bi, i = r // m, r % m
        for k in range(depth):
            row[k] = np.int32(a[bi, i, k]) - za
        if dot:
            if bi != held:
                for j in range(n):
                    for k in range(depth):
                        shifted[j, k] = np.int32(b[bi, j, k]) - zb
                held = bi
            for j in range(n):
                out[bi, i, j] = _dot_i32(row, shifted[j])
        else:
            for j in range(n):
                acc[j] = 0
            for k in range(depth):
                x = np.int32(row[k])
                bk = b[bi, k]
                for j in range(n):
                    acc[j] = np.int32(acc[j] + x * (np.int32(bk[j]) - zb))
            for j in range(n):
                out[bi, i, j] = acc[j]
