"""The integer epilogue's per-channel constants: a (TABLE_ROWS, O) int64 table per layer,
derived once as the executor binds it, in NumPy (vectorised over the channels: nothing here is
compiled, so a first start pays nothing for it, where as Numba kernels these were a
noticeable part of resnet18's). Its rows are named in ``requantize_ir``, which emits the epilogue that reads
them; ``kernels_int8.requantize_rows`` reads the full form's.

Every quantity is an int64 computed as the epilogue's int64 lanes compute it (NumPy's arrays
wrap as the lanes do): the table is the one the kernels were proven against, bit for bit.

    table = epilogue_params(add, clamp_lo, clamp_hi, multipliers, shifts, zin, zout, lo, hi,
                            bound)
"""
from __future__ import annotations

import numpy as np

from . import memory
from .requantize_ir import (ADD, BACK, FAST, FHI, FLO, FMULT, FOFFSET, HI, LEFT, LO, MULT,
                            OFFSET, TABLE_ROWS, TOTAL, WCHI, WCLO, WMULT, WOFFSET, WORDS, WSHIFT,
                            ZCHI, ZCLO, ZMULT, ZOFFSET, ZSHIFT)

_I32_MIN, _I32_MAX = -2147483648, 2147483647
SIGN = np.uint64(1 << 63)   # a 64-bit lane's sign bit (``kernels_int8.requantize_rows``)
WORDS_GROUP = 8     # channels a words' epilogue takes at once (``requantize_ir._narrowed_words``)
ZWORDS_GROUP = 16   # channels a vector of 512 bits takes (``requantize_ir.block_words``)
ZWORDS_BYTES = 64   # channels whose ZCLO, ZCHI bytes a group's columns hold


def epilogue_params(add, clamp_lo, clamp_hi, multipliers, shifts, zin: int, zout: int, lo: int,
                    hi: int, bound: int) -> np.ndarray:
    """The per-channel constants of the requantizing epilogue (``kernels_int8.requantize_acc``
    vectorised, ``requantize_rows`` and ``requantize_ir``), with what is per channel folded:
    the saturation to int32 and the clamp in one clamp (LO, HI: a clamp of a clamp is the
    clamp to the first's bounds clamped by the second, whatever the bounds); the zero point
    into the rounding offset (OFFSET = half - (zin << left) * multiplier: ((v - zin) << left)
    * m + half is (v << left) * m + OFFSET in int64's wrapping arithmetic, bit for bit); and
    the sign trick's correction with the output zero point (BACK = 2^63 >> total - zout, see
    ``requantize_rows``). ``add`` is the bias (minus any zero-point correction); [lo, hi] the
    8-bit range; ``bound`` bounds |sum| of the kernel's int32 sums. The rows FAST .. FOFFSET
    hold the same epilogue narrowed (``_narrowed``), FAST 1 in every column when every
    channel has it; the rows WORDS .. WSHIFT the narrowed epilogue on 32-bit words
    (``_words``), WORDS 1 in every column when every channel has it (and FAST), laid out as
    the kernels load them (``_lay_out_words``), and again as the 512-bit GEMMs load them
    (``_lay_out_zwords``)."""
    shifts = np.asarray(shifts, np.int64)
    m = np.asarray(multipliers, np.int64)
    clamp_lo, clamp_hi = np.asarray(clamp_lo, np.int64), np.asarray(clamp_hi, np.int64)
    n = shifts.size
    params = memory.empty((TABLE_ROWS, n), np.int64)   # (the kernels load it in vectors)
    params[...] = 0
    left = np.maximum(shifts, 0)
    total = np.maximum(-shifts, 0) + 31
    params[ADD] = add
    params[LO] = np.minimum(np.maximum(np.int64(_I32_MIN), clamp_lo), clamp_hi)
    params[HI] = np.minimum(np.maximum(np.int64(_I32_MAX), clamp_lo), clamp_hi)
    params[LEFT], params[MULT], params[TOTAL] = left, m, total
    with np.errstate(over="ignore"):      # int64 lanes wrap: so do these
        params[OFFSET] = (np.int64(1) << (total - 1)) - (np.int64(zin) << left) * m
    params[BACK] = (SIGN >> total.astype(np.uint64)).astype(np.int64) - np.int64(zout)
    narrowed = _narrowed(params, zin, zout, lo, hi, bound)
    per_channel = params.copy()
    # a channel's words are derived where every channel up to it is narrowed (they are
    # taken only where every channel has both)
    words = _words(per_channel, np.logical_and.accumulate(narrowed), lo, hi, bound)
    fast, words = bool(narrowed.all()), bool(narrowed.all() and words.all())
    params[FAST] = 1 if fast else 0
    params[WORDS] = 1 if words else 0
    if words:
        _lay_out_words(per_channel, params)
        _lay_out_zwords(per_channel, params)
    return params


def _narrowed(params, zin: int, zout: int, lo: int, hi: int, bound: int) -> np.ndarray:
    """Fill the rows FLO, FHI, FMULT, FOFFSET of the channels whose epilogue may be taken
    narrowed, and say which may: out = ((clamp(sum + ADD, FLO, FHI) * FMULT + FOFFSET) >>
    TOTAL) as 8 bits, the sum and the clamp in int32 lanes, one 32 x 32 -> 64-bit multiply,
    no final clamp. The same bits as the full epilogue when:

    - |ADD| + bound < 2^31: sum + ADD is exact in int32, so the saturation does nothing;
    - FMULT = MULT << LEFT < 2^31, positive, TOTAL <= 53, |zin| < 2^29 and the 8-bit
      range, zout in it, within [-256, 256]: v * FMULT + FOFFSET is exact in int64 (no
      wrap-around) for every int32 v, so g(v) = (v * FMULT + FOFFSET) >> TOTAL
      = floor((v * FMULT + OFFSET) / 2^TOTAL) + zout (FOFFSET = OFFSET + zout << TOTAL) is
      the full epilogue before its clamp, and it never decreases as v grows;
    - FMULT <= 2^TOTAL (a scale of at most 1): g rises by at most 1 a step of v, so the
      clamp of g to [lo, hi] equals g of v clamped to [FLO, FHI], the v where lo <= g(v) <=
      hi (FLO the least v with g(v) >= lo, FHI the greatest with g(v) <= hi, both within
      [LO, HI]), and the two clamps of v are one.

    A channel that passes these tests has its four rows filled even where FLO > FHI (then it
    may not be taken); the others keep zeros."""
    left, m, total = params[LEFT], params[MULT], params[TOTAL]
    ok = (total <= 53) & (m > 0) & (left <= 30)
    ok &= m < np.int64(1) << np.where(ok, 31 - left, 0)
    if abs(zin) >= 1 << 29 or lo < -256 or hi > 256 or not lo <= zout <= hi:
        ok[:] = False
    t = np.where(ok, total, 0)
    fm = m << np.where(ok, left, 0)
    ok &= (fm <= np.int64(1) << t) & (np.abs(params[ADD]) <= _I32_MAX - bound)
    fm = np.where(ok, fm, 1)
    foff = params[OFFSET] + (np.int64(zout) << t)
    v_lo = -((foff - (np.int64(lo) << t)) // fm)          # ceil((lo * 2^t - foff) / fm)
    v_hi = (((np.int64(hi) + 1) << t) - 1 - foff) // fm
    flo, fhi = np.maximum(params[LO], v_lo), np.minimum(params[HI], v_hi)
    for row, value in ((FLO, flo), (FHI, fhi), (FMULT, fm), (FOFFSET, foff)):
        params[row] = np.where(ok, value, params[row])
    return ok & (flo <= fhi)


def _words(per_channel, candidates, lo: int, hi: int, bound: int) -> np.ndarray:
    """Fill the rows WMULT .. WCHI of ``per_channel`` for the narrowed ``candidates`` whose
    epilogue may be taken on 32-bit words (``requantize_ir._narrowed_words``), and say which
    may:

        out = clamp(sat8((sum * WMULT + WOFFSET) >> 32 >> WSHIFT), WCLO, WCHI) + lo, 8 bits

    where WMULT = FMULT, WOFFSET = ADD * FMULT + FOFFSET - lo << TOTAL, WSHIFT = TOTAL - 32,
    sat8 saturates an int32 to [0, 255] and [WCLO, WCHI] is the range of out - lo over the
    narrowed clamp's [FLO, FHI]. It is ``_narrowed``'s value: for v = sum + ADD in [FLO,
    FHI], sum * WMULT + WOFFSET is v * FMULT + FOFFSET - lo * 2^TOTAL, which lies in [0, (hi
    - lo + 1) * 2^TOTAL), so the floor division by 2^32 then by 2^WSHIFT (one by 2^TOTAL)
    gives out - lo, within [WCLO, WCHI]; and as the sum grows the value never decreases (a
    product by WMULT > 0, floor divisions, saturation), so a sum below FLO - ADD gives WCLO
    or less and one above FHI - ADD gives WCHI or more: the clamp at the end is the narrowed
    clamp of the sum. One signed 32 x 32 -> 64-bit multiply (``vpmuldq``) takes 4 lanes, one
    arithmetic shift of words (``vpsravd``) 8, two saturating packs 16. It may when sum +
    ADD - FLO is exact in int32 for |sum| <= bound and FHI - FLO fits in int32 (then |sum *
    WMULT + WOFFSET| < 2^63: exact in int64), WMULT < 2^31 (a signed word) and TOTAL >= 32
    (a scale below 1/2: the usual layer; one in [1/2, 1) takes the full epilogue), and the
    8-bit range is at most 256 wide (out - lo is a byte)."""
    pc = per_channel
    total, wm = pc[TOTAL], pc[FMULT]
    wadd, whi = pc[ADD] - pc[FLO], pc[FHI] - pc[FLO]
    ok = candidates & (total >= 32) & (np.abs(wadd) <= _I32_MAX - bound) & (whi <= _I32_MAX)
    ok &= wm < np.int64(1) << 31
    if hi - lo > 255:
        ok[:] = False
    # in int64, wrapping: the value at v = FLO lies in [0, 2^(TOTAL + 8)) and (sum + ADD -
    # FLO) * FMULT within +-2^62, so the wrapped sums are the exact ones
    t = np.where(ok, total, 0)
    with np.errstate(over="ignore"):
        at_flo = pc[FLO] * wm + pc[FOFFSET] - (np.int64(lo) << t)
        values = ((WMULT, wm), (WSHIFT, total - 32), (WOFFSET, at_flo + wadd * wm),
                  (WCLO, at_flo >> t), (WCHI, (whi * wm + at_flo) >> t))
    for row, value in values:
        pc[row] = np.where(ok, value, pc[row])
    return ok


def _or_into(row, at, values) -> None:
    """row[at[j]] |= values[j] for every j (indices may repeat)."""
    np.bitwise_or.at(row, at, values)


def _lay_out_words(per_channel, params) -> None:
    """The rows WMULT and WSHIFT as int32, WOFFSET reordered and WCLO, WCHI as bytes, within
    each group of WORDS_GROUP channels (whose constants are the group's WORDS_GROUP int64 of
    each row: a kernel handed the table from a later group's column on reads the same
    layout): the group's int32 in its first half (two channels an int64, the even one in the
    low half, the second half 0), its WOFFSET as its even channels then its odd ones, its
    bytes in its first int64 (channel c's byte c % 8 of it) and again in the group before's
    second (so that 16 channels' bytes from any group are one load of 16). The kernels
    then load every constant of a group of 8 channels in one or two plain loads (taken from
    64-bit lanes, they took 3 instructions each and their picks more, for every tile of a
    GEMM). A last group of fewer channels keeps the same order where it has them; the
    kernels never take it on words. ``words_constants`` reads them back."""
    n = per_channel.shape[1]
    c = np.arange(n)
    at = word_at(c)
    group = c - c % WORDS_GROUP
    later = group >= WORDS_GROUP
    for row in (WMULT, WSHIFT, WCLO, WCHI):
        params[row] = 0
    for row in (WMULT, WSHIFT):
        _or_into(params[row], at // 2, (per_channel[row] & 0xFFFFFFFF) << (32 * (at % 2)))
    for row in (WCLO, WCHI):     # its group's first int64 and the group before's second
        byte = (per_channel[row] & 0xFF) << (8 * (c % WORDS_GROUP))
        _or_into(params[row], group, byte)
        _or_into(params[row], group[later] - WORDS_GROUP + 1, byte[later])
    params[WOFFSET, offset_at(c, n)] = per_channel[WOFFSET]


def _lay_out_zwords(per_channel, params) -> None:
    """The rows ZMULT .. ZCHI: the words' constants (WMULT .. WCHI, one per channel in
    ``per_channel``) as ``requantize_ir.block_words`` loads them, within each group of 16
    channels (whose constants are the group's 16 int64 of each row: a GEMM handed the table
    from a later group's column on reads the same layout): ZMULT and ZSHIFT the group's
    int32 in channel order in its first half, ZOFFSET its int64 as its even channels then its
    odd ones (a last group of fewer in channel order: the kernels never take it on words),
    and ZCLO, ZCHI the bytes of the 64 channels from the group's first on (fewer at the
    end) in channel order, so that a block of 16, 32 or 64 channels loads its bytes in one."""
    n = per_channel.shape[1]
    c = np.arange(n)
    g, i = c - c % ZWORDS_GROUP, c % ZWORDS_GROUP
    for row in (ZMULT, ZSHIFT, ZCLO, ZCHI):
        params[row] = 0
    for row, src in ((ZMULT, WMULT), (ZSHIFT, WSHIFT)):
        _or_into(params[row], g + i // 2, (per_channel[src] & 0xFFFFFFFF) << (32 * (i % 2)))
    whole = g + ZWORDS_GROUP <= n
    params[ZOFFSET, np.where(whole, g + np.where(i % 2 == 0, i // 2, 8 + i // 2), c)] = \
        per_channel[WOFFSET]
    # channel c's bytes in each group from which it is among the next 64 channels
    for back in range(0, ZWORDS_BYTES, ZWORDS_GROUP):
        first = g - back
        takes = (first >= 0) & (first > c - ZWORDS_BYTES)
        byte = (c - first)[takes]      # channel c's byte among those of group ``first``
        for row, src in ((ZCLO, WCLO), (ZCHI, WCHI)):
            _or_into(params[row], first[takes] + byte // 8,
                     (per_channel[src][takes] & 0xFF) << (8 * (byte % 8)))


def word_at(c):
    """Where channel c's int32 constants are in their rows, counted in int32: the first half
    of its group's int64 (``_lay_out_words``); c an int or an array."""
    return 2 * (c - c % WORDS_GROUP) + c % WORDS_GROUP


def offset_at(c, n: int):
    """Where channel c's WOFFSET is in a row of n (``_lay_out_words``); c an int or an
    array."""
    g, i = c - c % WORDS_GROUP, c % WORDS_GROUP
    in_group = np.where(i % 2 == 0, i // 2, WORDS_GROUP // 2 + i // 2)  # evens, then odds
    return np.where(g + WORDS_GROUP > n, c, g + in_group)


def words_constants(params: np.ndarray, c: int) -> tuple[int, int, int, int, int]:
    """Channel c's (WMULT, WOFFSET, WSHIFT, WCLO, WCHI) from a table of ``epilogue_params``
    whose row WORDS is set (``_lay_out_words``'s layout)."""
    at = word_at(c)

    def word(row):
        return int(params[row].view(np.int32)[at])

    def byte(row):
        return int(params[row].view(np.uint8)[8 * (c - c % WORDS_GROUP) + c % WORDS_GROUP])
    return (word(WMULT), int(params[WOFFSET, offset_at(c, params.shape[1])]), word(WSHIFT),
            byte(WCLO), byte(WCHI))


def requantize_params(bias, correction, clamp_lo, clamp_hi, multipliers, shifts, zin, zout,
                      lo, hi, kp) -> np.ndarray:
    """The table of a SIMD GEMM's fused convolution (``vnni.conv_requantize``,
    ``avx2.conv_requantize``): the bias minus the zero-point correction; the sums are of kp
    products of a byte (0..255) and an int8 (every SIMD GEMM's)."""
    return epilogue_params(np.asarray(bias, np.int64) - correction, clamp_lo, clamp_hi,
                           multipliers, shifts, zin, zout, lo, hi, kp * 255 * 128)


def depthwise_params(wt, bias, clamp_lo, clamp_hi, multipliers, shifts, zin, zout, lo,
                     hi) -> np.ndarray:
    """The table of ``kernels_int8.depthwise_channels_last`` with taps ``wt``: its sums are
    of kh * kw products (x - zx) * w, |x - zx| <= 255."""
    bound = wt.shape[0] * wt.shape[1] * 255 * int(np.abs(wt).max())
    return epilogue_params(np.asarray(bias, np.int64), clamp_lo, clamp_hi, multipliers, shifts,
                           zin, zout, lo, hi, bound)


def depthwise_inits(wt, zx: int) -> np.ndarray:
    """(kh + 1, kh + 1, O) int32: at [i0, i1], -zx times the sum of the taps ``wt`` of kernel
    rows i0..i1, what the SIMD sweep's sums start from when those rows lie inside the image
    (its taps then add x * w: the sum of (x - zx) * w)."""
    kh, kw, o_n = wt.shape
    rows = np.asarray(wt, np.int64).sum(axis=1)                     # (kh, O)
    upto = np.concatenate([np.zeros((1, o_n), np.int64), np.cumsum(rows, axis=0)])
    inits = memory.empty((kh + 1, kh + 1, o_n), np.int32)   # (the sweep loads it in vectors)
    inits[...] = 0
    for i0 in range(kh):
        for i1 in range(i0 + 1, kh + 1):
            inits[i0, i1] = -np.int64(zx) * (upto[i1] - upto[i0])
    return inits
