"""Numba kernels for float32 inference, NCHW, batch by batch.

They are compiled once and cached on disk (``cache=True``: a second process loads them in
milliseconds) and run in parallel over channels. Convolutions are im2col (Numba) then a BLAS
GEMM then a fused epilogue (Numba: bias, then the activation as a clamp to [lo, hi], in one
pass over the output; ``ops.fused.epilogue_bounds`` gives the bounds: none is (-inf, inf),
relu (0, inf)); depthwise convolutions and pools are direct loops.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .depthwise import call_sweep
from ..codegen.launch import parallel, share
from ..codegen.llvm_loops import copy_runs_intrinsic
from .pools import ROWS as POOL_ROWS
from ..codegen.serial import twin

_copy_runs = copy_runs_intrinsic()


@njit(inline="always")
def clamp(v, lo, hi):
    """The fused epilogue's activation: v clamped to [lo, hi] (NaN stays NaN)."""
    return min(max(v, lo), hi)


@njit(inline="always")
def inside(n_out, stride, offset, size):
    """The output columns [first, last) whose input column, out * stride + offset, lies in
    [0, size): sweeping only those needs no bounds test in the inner loop."""
    first = 0
    while first < n_out and first * stride + offset < 0:
        first += 1
    last = n_out
    while last > first and (last - 1) * stride + offset >= size:
        last -= 1
    return first, last


@parallel
def im2col(thread, threads, args):
    """x: (C, H, W) -> col: (C*kh*kw, oh*ow), zero where a window reads padding. Parallel over
    the rows of col (a 3-channel input still has 3*kh*kw rows to share out)."""
    x, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, col = args
    c_in, h, w = x.shape
    for row in range(*share(c_in * kh * kw, thread, threads)):
        c = row // (kh * kw)
        i = (row // kw) % kh
        j = row % kw
        lo, hi = inside(ow, sw, j * dw - pl, w)
        for y in range(oh):
            iy = y * sh - pt + i * dh
            base = y * ow
            if iy < 0 or iy >= h:
                for xo in range(ow):
                    col[row, base + xo] = 0.0
                continue
            for xo in range(lo):
                col[row, base + xo] = 0.0
            off = j * dw - pl
            for xo in range(lo, hi):
                col[row, base + xo] = x[c, iy, xo * sw + off]
            for xo in range(hi, ow):
                col[row, base + xo] = 0.0


@parallel
def bias_act(thread, threads, args):
    """In place on y: (O, P): y = clamp(y + bias[o], lo, hi)."""
    y, bias, lo, hi = args
    rows, cols = y.shape
    lo32, hi32 = np.float32(lo), np.float32(hi)
    for o in range(*share(rows, thread, threads)):
        b = bias[o]
        for p in range(cols):
            y[o, p] = clamp(y[o, p] + b, lo32, hi32)


@njit(inline="always")
def kernel_rows(y, sh, pt, dh, kh, h):
    """The kernel rows [i0, i1) whose input row, y * sh - pt + i * dh, lies in [0, h)."""
    i0 = 0
    while i0 < kh and y * sh - pt + i0 * dh < 0:
        i0 += 1
    i1 = kh
    while i1 > i0 and y * sh - pt + (i1 - 1) * dh >= h:
        i1 -= 1
    return i0, i1


@njit(inline="always")
def interior(ow, sw, pl, dw, kw, wd):
    """The output columns [first, last) all of whose kw taps lie inside a row of wd pixels
    (first >= last when there are none)."""
    first = inside(ow, sw, -pl, wd)[0]
    last = inside(ow, sw, (kw - 1) * dw - pl, wd)[1]
    return first, max(first, last)


@parallel
def depthwise_channels_last(thread, threads, args):
    """x: (N, H, W, C), w: (kh, kw, C), out: (N, oh, ow, C); one filter per channel; all
    three C-contiguous. One output row of one image per work item, the batch's in one launch,
    each thread a run of them (the first images' on the first thread, as the GEMM drivers'
    items give them): the pixels all of whose taps lie inside the
    row go to the SIMD sweep (``sweep``: ``depthwise_simd.entry("float")``, 16 channels at a
    time, the sums in registers across the taps, then the clamp to [lo, hi]); the few at the
    borders are summed here over their inside taps, in the same order (kernel row, then
    column)."""
    x, w, bias, sh, sw, pt, pl, dh, dw, lo, hi, out, sweep = args
    n, h, wd, c_n = x.shape
    kh, kw, _ = w.shape
    _, oh, ow, _ = out.shape
    lo32 = np.float32(lo)
    hi32 = np.float32(hi)
    first, last = interior(ow, sw, pl, dw, kw, wd)
    for item in range(*share(n * oh, thread, threads)):
        b, y = item // oh, item % oh
        i0, i1 = kernel_rows(y, sh, pt, dh, kh, h)
        if i1 > i0 and last > first:
            call_sweep(sweep, x[b, y * sh - pt + i0 * dh].ctypes.data, w[i0].ctypes.data,
                       bias.ctypes.data, out[b, y].ctypes.data, 0, 0, first, last, c_n,
                       i1 - i0, dh * wd * c_n, kw, sw, dw, -pl, lo32, hi32, 0, 0, 0, first,
                       last, wd)
        for xo in range(ow):
            if first <= xo < last and i1 > i0:
                continue
            a = out[b, y, xo]   # summed in place (float32, as a buffer would be), no buffer
            for c in range(c_n):
                a[c] = bias[c]
            for i in range(i0, i1):
                src = x[b, y * sh - pt + i * dh]
                for j in range(kw):
                    ix = xo * sw - pl + j * dw
                    if ix >= 0 and ix < wd:
                        pixel = src[ix]
                        tap = w[i, j]
                        for c in range(c_n):
                            a[c] += pixel[c] * tap[c]
            for c in range(c_n):
                a[c] = clamp(a[c], lo32, hi32)


@parallel
def grouped(thread, threads, args):
    """x: (C, H, W), w: (O, cg, kh, kw), out: (O, oh, ow): a grouped convolution (groups =
    C / cg; depthwise: cg = 1, O = C), output channel o reading the cg input channels of its
    group. Row by row: each filter tap of each input channel is swept over the output columns
    whose input is inside the image, so the inner loop has no test; the epilogue runs on the
    finished row. The sums go to a row of their own and read contiguous slices indexed from 0
    (Numba then proves no aliasing and no negative index, and the loop vectorises); with a
    stride, each input row is first split into ``sw`` phase planes (plane r holds columns r,
    r + sw, ...), so that a tap reads a contiguous slice of one plane. The sums run over the
    group's input channels, then kernel rows, then columns."""
    x, w, bias, sh, sw, pt, pl, dh, dw, lo, hi, out = args
    c_in, h, wd = x.shape
    o_n, cg, kh, kw = w.shape
    _, oh, ow = out.shape
    per_group = o_n // (c_in // cg)      # output channels per group
    lo32 = np.float32(lo)
    hi32 = np.float32(hi)
    pw = (wd + sw - 1) // sw
    for o in range(*share(o_n, thread, threads)):
        first_in = (o // per_group) * cg
        b = bias[o]
        acc = np.empty(ow, np.float32)
        planes = np.empty((sw, pw), np.float32)
        for y in range(oh):
            acc[:] = b
            for ci in range(cg):
                for i in range(kh):
                    iy = y * sh - pt + i * dh
                    if iy < 0 or iy >= h:
                        continue
                    src = x[first_in + ci, iy]
                    if sw > 1:
                        for r in range(sw):
                            for k in range((wd - r + sw - 1) // sw):
                                planes[r, k] = src[k * sw + r]
                    for j in range(kw):
                        off = j * dw - pl
                        first, last = inside(ow, sw, off, wd)
                        if last <= first:
                            continue
                        tap = w[o, ci, i, j]
                        r = off % sw
                        q = (off - r) // sw   # input column xo * sw + off = (xo + q) * sw + r
                        part = src[first + off:last + off] if sw == 1 else \
                            planes[r, first + q:last + q]
                        dst = acc[first:last]
                        for t in range(last - first):
                            dst[t] += part[t] * tap
            row = out[o, y]
            for xo in range(ow):
                row[xo] = clamp(acc[xo], lo32, hi32)


@njit(inline="always")
def _max(a, b):
    """The larger of a and b, NaN where either is (as numpy's maximum and the reference's
    max over a window; Python's ``max`` kept the running maximum past a NaN tap). For
    integers, ``b != b`` is never true and this is ``max``. Two selects: one ``or`` of the
    two tests kept integer pools from vectorising (1.8x as long).

    The NCHW pool keeps its running maxima in two buffers, each tap's written into the other
    one: kept in place (``acc[i] = _max(acc[i], src[i])``), acc[i] is stored back where it
    is the larger, and LLVM makes that a store of src[i] only where src[i] is larger, a masked
    store (``vmaskmovps``), microcoded on an AMD EPYC (Zen 3): between two buffers the pool
    ran several times faster (and faster still in registers, ``pool_simd``, which emits these
    two selects). Integers take ``vpmaxub``, no masked store; their NCHW pool gained too."""
    m = b if b > a else a
    return b if b != b else m


@njit(inline="always")
def _max_into(dst, a, b):
    """dst = the elementwise ``_max`` of a and b (dst another buffer than a): the NCHW pool's
    step on its own planes and rows. Written in the pool's body instead, the same loop on
    the same views took several times as long (not understood). (Called with a view of an
    image all threads read, it counts references to it, a counter the threads contend for:
    a channel-last pool that did ran many times slower.)"""
    for i in range(dst.size):
        dst[i] = _max(a[i], b[i])


@parallel
def max_pool(thread, threads, args):
    """Per channel: each input row is first split into ``sw`` phase planes (plane r holds
    columns r, r + sw, r + 2 sw, ...), so that every window tap is a contiguous slice of one
    plane at a fixed shift and the running maxima (``_max``, not a branch) vectorise.
    ``lowest`` is the dtype's least value (any dtype: int8 programs pool too)."""
    x, kh, kw, sh, sw, pt, pl, dh, dw, lowest, out = args
    c_in, h, w = x.shape
    _, oh, ow = out.shape
    pw = (w + sw - 1) // sw + kw * dw + 2          # a plane, with room for the shifts
    for c in range(*share(c_in, thread, threads)):
        planes = np.empty((h, sw, pw), x.dtype)
        for iy in range(h):
            for r in range(sw):
                n = (w - r + sw - 1) // sw
                row = planes[iy, r]
                for i in range(n):
                    row[i] = x[c, iy, i * sw + r]
                for i in range(n, pw):
                    row[i] = lowest
        cur, nxt = np.empty(ow, x.dtype), np.empty(ow, x.dtype)    # (``_max``)
        for y in range(oh):
            for xo in range(ow):
                cur[xo] = lowest
            for i in range(kh):
                iy = y * sh - pt + i * dh
                if iy < 0 or iy >= h:
                    continue
                for j in range(kw):
                    off = j * dw - pl                 # input column xo * sw + off
                    r = off % sw
                    q = (off - r) // sw               # floor(off / sw)
                    start = 0
                    while start < ow and start + q < 0:
                        start += 1
                    stop = max(start, min(ow, pw - q))    # past the plane: padding
                    for xo in range(start):
                        nxt[xo] = cur[xo]
                    # (a loop here, on these views or on src[xo + q], was 8x slower)
                    _max_into(nxt[start:stop], cur[start:stop],
                              planes[iy, r][start + q:stop + q])
                    for xo in range(stop, ow):
                        nxt[xo] = cur[xo]
                    cur, nxt = nxt, cur
            for xo in range(ow):
                out[c, y, xo] = cur[xo]


maxpool_row = None   # bound in each twin of _max_pool_rows to its element type's row


def _max_pool_rows(thread, threads, args):
    """x (N, H, W, C) -> out (N, oh, ow, C), both C-contiguous: one output row of one image
    per work item (the batch's in one launch, each thread a run of them), each
    computed by ``pool_simd``'s row ``maxpool_row`` (its channels in vectors, their running
    maxima in registers across the taps; taps outside the image skipped: padding is the
    dtype's least value, never a maximum). Compiled once per element type, as
    ``max_pool_channels_last[kind]`` (``pool_simd.KINDS``), with that type's row: a
    program compiles the one it uses (the four in one kernel took more than twice as long
    to compile as one)."""
    x, kh, kw, sh, sw, pt, pl, dh, dw, out = args
    n, h, w, c_n = x.shape
    _, oh, ow, _ = out.shape
    size = x.itemsize
    for item in range(*share(n * oh, thread, threads)):
        b, y = item // oh, item % oh
        i0, i1 = kernel_rows(y, sh, pt, dh, kh, h)
        src = x.ctypes.data + ((b * h + max(0, y * sh - pt + i0 * dh)) * w * c_n) * size
        dst = out.ctypes.data + ((b * oh + y) * ow * c_n) * size
        maxpool_row(src, dst, i1 - i0, dh * w * c_n, c_n, w, ow, kw, sw, dw, -pl)


max_pool_channels_last = {
    kind: parallel(twin(_max_pool_rows, f"_{kind}", maxpool_row=row))
    for kind, row in POOL_ROWS.items()}


@njit(inline="always")
def _average(x, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, include_pad, out, y0, y1, c0, c1,
             acc):
    """Output rows y0..y1, channels c0..c1 of an average pool of x (H, W, C) into out (oh,
    ow, C): each window's taps summed in float64 in row-major order (acc: C float64s), over
    the taps inside the image, plus the padding's where include_pad."""
    h, w, _ = x.shape
    for y in range(y0, y1):
        for xo in range(out.shape[1]):
            for c in range(c0, c1):
                acc[c] = 0.0
            n = 0
            for i in range(kh):
                iy = y * sh - pt + i * dh
                for j in range(kw):
                    ix = xo * sw - pl + j * dw
                    if iy >= 0 and iy < h and ix >= 0 and ix < w:
                        for c in range(c0, c1):
                            acc[c] += x[iy, ix, c]
                        n += 1
                    elif include_pad and iy >= -pt and iy < h + pb and ix >= -pl \
                            and ix < w + pr:
                        n += 1
            for c in range(c0, c1):
                out[y, xo, c] = acc[c] / n


@parallel
def avg_pool(thread, threads, args):
    """One image (C, H, W) -> (C, oh, ow), given as its transposed views xt (H, W, C) and ot
    (oh, ow, C) (made by the caller: Numba's ``transpose`` with axes calls a runtime function
    a library saved ahead of time does not hold); a unit of work a channel."""
    xt, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, include_pad, ot = args
    acc = np.empty(xt.shape[2], np.float64)
    for c in range(*share(xt.shape[2], thread, threads)):
        _average(xt, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, include_pad, ot, 0, ot.shape[0],
                 c, c + 1, acc)


@parallel
def avg_pool_channels_last(thread, threads, args):
    """``avg_pool`` on a channel-last batch x (N, H, W, C) -> out (N, oh, ow, C): each
    channel's window summed in the same order of taps, the same bits. A unit of work an
    output row of one image (the batch's in one launch)."""
    x, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, include_pad, out = args
    acc = np.empty(x.shape[3], np.float64)
    oh = out.shape[1]
    for item in range(*share(x.shape[0] * oh, thread, threads)):
        b, y = item // oh, item % oh
        _average(x[b], kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, include_pad, out[b], y, y + 1,
                 0, x.shape[3], acc)


@parallel
def global_avg_pool(thread, threads, args):
    """x: (C, H, W) -> out: (C,)."""
    x, out = args
    c_in, h, w = x.shape
    for c in range(*share(c_in, thread, threads)):
        s = 0.0
        for i in range(h):
            for j in range(w):
                s += x[c, i, j]
        out[c] = s / (h * w)


REDUCE_BLOCK = 256


@parallel
def reduce_middle(thread, threads, args):
    """x: (A, R, B) -> out: (A, B), the middle axis reduced: code 0 sum, 1 mean (both summed
    in float64, in the order of r), 2 max, 3 min (NaN propagates, as numpy's). A thread's
    share is a run of the pairs (a, b-block): one pass down the rows of a, each row's block
    added into a row of sums, so the inner loop runs along contiguous memory."""
    x, code, out = args
    a_n, r_n, b_n = x.shape
    # blocks of up to 256 columns, narrower (down to a line of 16 floats) where fewer would
    # leave a thread idle: a channel-last global pool of one image, 32 channels, is two
    block = min(REDUCE_BLOCK, max(16, -(-b_n // (threads * 16)) * 16))
    blocks = (b_n + block - 1) // block
    acc = np.empty(block, np.float64)
    for item in range(*share(a_n * blocks, thread, threads)):
        a = item // blocks
        b0 = (item % blocks) * block
        b1 = min(b0 + block, b_n)
        width = b1 - b0
        first = x[a, 0, b0:b1]
        for j in range(width):
            acc[j] = first[j]
        for r in range(1, r_n):
            row = x[a, r, b0:b1]
            if code <= 1:
                for j in range(width):
                    acc[j] += row[j]
            else:           # a NaN taken stays (acc == acc is False for it), as numpy's
                for j in range(width):
                    v = np.float64(row[j])
                    if acc[j] == acc[j] and (v != v or (v > acc[j] if code == 2 else
                                                        v < acc[j])):
                        acc[j] = v
        dst = out[a, b0:b1]
        for j in range(width):
            dst[j] = acc[j] / r_n if code == 1 else acc[j]


@njit(inline="always")
def _other(x, y, op):
    """The binary ops past the four arithmetic ones: 4 maximum, 5 minimum, as numpy's (a
    NaN operand is the result; of two equal values the first: max(-0.0, 0.0) is -0.0)."""
    if op == 4:
        return x if (x >= y or x != x) else y
    return x if (x <= y or x != x) else y


@parallel(error_model="numpy")
def binary_same(thread, threads, args):
    """Flat arrays of one size: out = act(a op b); op 0 add, 1 subtract, 2 multiply,
    3 divide, 4 maximum, 5 minimum (``_other``) (IEEE's: x / 0 is +-inf or NaN, as numpy's
    divide in the reference; Numba's default error model raised ZeroDivisionError)."""
    a, b, op, act, out = args
    for i in range(*share(a.size, thread, threads)):
        x = a[i]
        y = b[i]
        if op == 0:
            v = x + y
        elif op == 1:
            v = x - y
        elif op == 2:
            v = x * y
        elif op == 3:
            v = x / y
        else:
            v = _other(x, y, op)
        if act == 1:
            v = max(v, 0.0)
        out[i] = v


@parallel(error_model="numpy")
def binary_channel(thread, threads, args):
    """a, out: (C, P); b: (C,): out = a op b[c] (a division by zero as ``binary_same``'s)."""
    a, b, op, out = args
    rows, cols = a.shape
    for c in range(*share(rows, thread, threads)):
        y = b[c]
        for p in range(cols):
            x = a[c, p]
            if op == 0:
                out[c, p] = x + y
            elif op == 1:
                out[c, p] = x - y
            elif op == 2:
                out[c, p] = x * y
            elif op == 3:
                out[c, p] = x / y
            else:
                out[c, p] = _other(x, y, op)


@njit(inline="always", error_model="numpy")
def _row(x, y, z, op):
    """z = x op y along one row (the codes of ``binary_same``); Numba compiles it for each
    kind of row it is given: contiguous ones vectorise."""
    n = z.shape[0]
    if op == 0:
        for j in range(n):
            z[j] = x[j] + y[j]
    elif op == 1:
        for j in range(n):
            z[j] = x[j] - y[j]
    elif op == 2:
        for j in range(n):
            z[j] = x[j] * y[j]
    elif op == 3:
        for j in range(n):
            z[j] = x[j] / y[j]
    else:
        for j in range(n):
            z[j] = _other(x[j], y[j], op)


@parallel(error_model="numpy")
def binary_rows(thread, threads, args):
    """a, out: (R, C); b: (C,): out[r] = a[r] op b, the codes of ``binary_same`` (a
    channel-last image and a value per channel: a batch norm's scale and shift after a
    join, NHWC). Contiguous rows: each row's loop vectorises, where ``binary_broadcast``'s
    views of unknown strides kept it scalar."""
    a, b, op, out = args
    for r in range(*share(a.shape[0], thread, threads)):
        _row(a[r], b, out[r], op)


@parallel(error_model="numpy")
def binary_broadcast(thread, threads, args):
    """4-D operands of the output's shape (broadcast views: strides of 0 along the axes
    they do not vary on): out = a op b, the codes of ``binary_same``; one output row of the
    last axis a unit."""
    a, b, op, out = args
    d0, d1, d2, d3 = out.shape
    for r in range(*share(d0 * d1 * d2, thread, threads)):
        i0, i1, i2 = r // (d1 * d2), (r // d2) % d1, r % d2
        _row(a[i0, i1, i2], b[i0, i1, i2], out[i0, i1, i2], op)


MATMUL_ROWS = 4     # rows of a a work item of ``batch_matmul_rows``: each row of b read once


@parallel(error_model="numpy", fastmath={"contract"})   # (FMAs)
def batch_matmul_rows(thread, threads, args):
    """a: (B, M, K), b: (B, K, N), out: (B, M, N): out[i] = a[i] @ b[i] for each matrix of
    the stacks. A work item is MATMUL_ROWS rows of one matrix: its output rows are sums
    grown in place, one row of b at a time (k in order), each sum a run of FMAs along the
    row (it vectorises). float32 sums: close to the reference's float64 ones, as the GEMMs'."""
    a, b, out = args
    nb, m, depth = a.shape
    n = b.shape[2]
    blocks = (m + MATMUL_ROWS - 1) // MATMUL_ROWS
    for item in range(*share(nb * blocks, thread, threads)):
        bt = item // blocks
        i0 = (item % blocks) * MATMUL_ROWS
        i1 = min(i0 + MATMUL_ROWS, m)
        for i in range(i0, i1):
            row = out[bt, i]
            for j in range(n):
                row[j] = np.float32(0.0)
        for kk in range(depth):
            brow = b[bt, kk]
            for i in range(i0, i1):
                av = a[bt, i, kk]
                row = out[bt, i]
                for j in range(n):
                    row[j] += av * brow[j]


@parallel
def layer_norm_rows(thread, threads, args):
    """x, out: (R, C); each row normalized as ``nn.layer_norm`` defines it, in float64:
    (v - mean) / sqrt(var + eps), times gamma (``scale``), plus beta (``center``); a thread's
    share a run of rows."""
    x, gamma, beta, eps, scale, center, out = args
    rows, c_n = x.shape
    for r in range(*share(rows, thread, threads)):
        v = x[r]
        mean = 0.0
        for c in range(c_n):
            mean += v[c]
        mean /= c_n
        var = 0.0
        for c in range(c_n):
            d = v[c] - mean
            var += d * d
        inv = 1.0 / np.sqrt(var / c_n + eps)
        y = out[r]
        for c in range(c_n):
            t = (v[c] - mean) * inv
            if scale:
                t = t * np.float64(gamma[c])
            if center:
                t = t + np.float64(beta[c])
            y[c] = t


@parallel(error_model="numpy")     # (no zero test in the sigmoid's division: it vectorises)
def unary(thread, threads, args):
    """Flat: relu (1), clip to [lo, hi] (2), leaky relu with slope lo (3), sigmoid (4);
    relu keeps the dtype (int32 accumulators too): a value below zero becomes 0 of it, -0.0
    and NaN stay (the reference's ``tensor._relu``; v - v had made -inf NaN)."""
    a, act, lo, hi, out = args
    if act == 4 and a.itemsize == 4:        # float32: in vectors (``_sigmoid32``)
        for i in range(*share(a.size, thread, threads)):
            out[i] = _sigmoid32(a[i])
        return
    zero = np.zeros(1, a.dtype)[0]
    for i in range(*share(a.size, thread, threads)):
        v = a[i]
        if act == 1:
            if v < 0:
                v = zero
        elif act == 2:
            v = min(max(v, lo), hi)
        elif act == 3:
            if v < 0:
                v = v * lo
        else:
            v = 1 / (1 + np.exp(-v))
        out[i] = v


_LOG2E, _LN2_HI, _LN2_LO = np.float32(1.44269504), np.float32(0.693359375), \
    np.float32(-2.12194440e-4)
_EXP_MAX = np.float32(88.72283935546875)    # e^t overflows float32 above it
_EXP_MIN = np.float32(-103.97207641601562)  # and is 0 below it


@njit(inline="always")
def _sigmoid32(v):
    """1 / (1 + exp(-v)) for a float32 v, in operations LLVM vectorises across a loop's values
    (a call of libm's ``expf`` a value took half of EfficientNet-b0's float run): exp(t) =
    2^k * p(r), k the nearest integer to t / ln 2, r = t - k ln 2 in two parts (Cody and
    Waite), p Cephes' degree-7 polynomial for ``expf`` (about 1 ulp), 2^k as two powers of
    two made from their bits, so that k may reach 2^-150 and 2^128; t above the largest
    float's log gives inf (the sigmoid 0), below the least denormal's 0 (the sigmoid 1); NaN
    stays NaN. Plain selects, no branches. Within a few float32 ulps of the reference's
    numpy (``tensor._sigmoid``)."""
    tc = -v
    tc = _EXP_MAX if tc > _EXP_MAX else tc
    tc = _EXP_MIN if tc < _EXP_MIN else tc
    tc = tc if tc == tc else np.float32(0.0)
    k = np.float32(np.floor(tc * _LOG2E + np.float32(0.5)))
    r = tc - k * _LN2_HI - k * _LN2_LO
    q = np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)
    q = q * r + np.float32(8.3334519073e-3)
    q = q * r + np.float32(4.1665795894e-2)
    q = q * r + np.float32(1.6666665459e-1)
    q = q * r + np.float32(5.0000001201e-1)
    p = q * r * r + r + np.float32(1.0)
    ki = np.int32(k)
    h = ki >> 1                 # (floor(k / 2), negative k too)
    s1 = np.int32((h + 127) << 23).view(np.float32)
    s2 = np.int32((ki - h + 127) << 23).view(np.float32)
    t = -v
    e = p * s1 * s2
    e = np.float32(np.inf) if t > _EXP_MAX else e
    e = np.float32(0.0) if t < _EXP_MIN else e
    e = t if t != t else e
    return np.float32(1.0) / (np.float32(1.0) + e)


@njit(inline="always")
def _row_max_and_sum(row):
    """A row's largest value and the sum of exp(value - largest), in float64: what softmax
    and log-softmax both scale by."""
    m = -np.inf
    for i in range(row.size):
        m = max(m, np.float64(row[i]))
    s = 0.0
    for i in range(row.size):
        s += np.exp(np.float64(row[i]) - m)
    return m, s


_LN2_HI64, _LN2_LO64 = 0.693147180369123816490, 1.90821492927058770002e-10
_EXP64_FLOOR = -110.0   # exp below it: under float32's least denormal however it is divided
_ROUNDER = 6755399441055744.0   # 1.5 * 2^52: added to a float64 of magnitude < 2^51, rounds it


@njit(inline="always")
def _exp64_below_zero(v):
    """exp(v) for a float64 v <= 0 that is not NaN, in operations LLVM vectorises across a
    loop's values (libm's ``exp`` a value at a time was an attention block's softmax): v
    clamped at _EXP64_FLOOR, exp(v) = 2^k e^r, k the nearest integer to v / ln 2 (rounded by
    adding 1.5 * 2^52, whose low bits then hold it: AVX2 converts no float64 to int64) and r
    = v - k ln 2 in two parts (Cody and Waite), e^r by its Taylor polynomial of degree 10
    (relative error under 1e-12 on |r| <= ln 2 / 2: far below a float32 ulp), 2^k from its
    exponent bits (k >= -159, a normal float64; k's bits above the 12 kept leave the word)."""
    v = _EXP64_FLOOR if v < _EXP64_FLOOR else v
    big = v * 1.4426950408889634 + _ROUNDER
    kf = big - _ROUNDER
    r = v - kf * _LN2_HI64 - kf * _LN2_LO64
    q = 2.505210838544172e-08 * r + 2.755731922398589e-07
    q = q * r + 2.7557319223985893e-06
    q = q * r + 2.48015873015873e-05
    q = q * r + 1.984126984126984e-04
    q = q * r + 1.388888888888889e-03
    q = q * r + 8.333333333333333e-03
    q = q * r + 4.1666666666666664e-02
    q = q * r + 1.6666666666666666e-01
    q = q * r + 0.5
    q = (q * r + 1.0) * r + 1.0
    return q * np.int64((np.float64(big).view(np.int64) + 1023) << 52).view(np.float64)


@njit(inline="always")
def _exps_below_zero(t, e):
    """e[i] = exp(t[i]) for float64 t <= 0 (``_exp64_below_zero``); NaN stays NaN."""
    for i in range(t.size):
        v = t[i]
        e[i] = v if v != v else _exp64_below_zero(v)


@parallel(error_model="numpy", fastmath={"contract"})   # (loops vectorised, FMAs)
def softmax_rows(thread, threads, args):
    """Softmax over the last axis of a (R, N) array, in float64 and rounded once, as the
    op's semantics computes it: each exponential taken once (``_exps_below_zero``, of x less
    the row's largest), kept in the thread's row of float64 and summed in four running sums,
    then divided by the sum; within a few float32 ulps of numpy's (whose sums are pairwise).
    A row holding +inf, or only -inf, or a NaN, is NaN, as the reference's."""
    x, out = args
    rows, n = x.shape
    t = np.empty(n, np.float64)
    e = np.empty(n, np.float64)
    for r in range(*share(rows, thread, threads)):
        row = x[r]
        m = -np.inf
        for i in range(n):
            m = max(m, np.float64(row[i]))
        for i in range(n):
            t[i] = np.float64(row[i]) - m
        _exps_below_zero(t, e)
        s0 = s1 = s2 = s3 = 0.0
        i = 0
        while i + 4 <= n:
            s0 += e[i]
            s1 += e[i + 1]
            s2 += e[i + 2]
            s3 += e[i + 3]
            i += 4
        while i < n:
            s0 += e[i]
            i += 1
        s = (s0 + s1) + (s2 + s3)
        for i in range(n):
            out[r, i] = e[i] / s


@parallel
def log_softmax_rows(thread, threads, args):
    """Log-softmax over the last axis of a (R, N) array, in float64 and rounded once, as the
    op's semantics computes it: x - max - log(sum(exp(x - max)))."""
    x, out = args
    rows, n = x.shape
    for r in range(*share(rows, thread, threads)):
        m, s = _row_max_and_sum(x[r])
        lse = np.log(s)
        for i in range(n):
            out[r, i] = (np.float64(x[r, i]) - m) - lse


@parallel
def copy_rows(thread, threads, args):
    """dst[r, :] = src[r, :] for 2-D arrays of one shape (strided views allowed): rows whose
    elements are adjacent on both sides as runs of bytes (``_copy_runs``: a channel-last
    join's input, a few dozen channels a pixel, went an element at a time)."""
    src, dst = args
    rows, cols = src.shape
    size = dst.itemsize
    lo, hi = share(rows, thread, threads)
    r0, r1 = np.intp(lo), np.intp(hi)     # (signed: addresses are sums of signed numbers)
    if src.strides[1] == size and dst.strides[1] == size:
        if r1 > r0:
            _copy_runs(dst.ctypes.data + r0 * dst.strides[0],
                       src.ctypes.data + r0 * src.strides[0], cols * size, r1 - r0,
                       dst.strides[0], src.strides[0])
        return
    for r in range(r0, r1):
        for c in range(cols):
            dst[r, c] = src[r, c]


@parallel
def copy_strided(thread, threads, args):
    """dst = src for 6-D arrays of one shape, src of any strides (a transpose's or a slice's
    view), dst C-contiguous; a unit of work a row of the last axis, copied as one run of
    bytes (``llvm_loops.copy_runs_intrinsic``) where its elements are adjacent in src (an
    element at a time, its stride unknown to LLVM, a row of a slice of channels went at
    about a byte a cycle)."""
    src, dst = args
    d0, d1, d2, d3, d4, d5 = dst.shape
    s0, s1, s2, s3, s4, s5 = src.strides
    size = dst.itemsize
    run = d5 * size
    for r in range(*share(d0 * d1 * d2 * d3 * d4, thread, threads)):
        i4 = r % d4
        i3 = (r // d4) % d3
        i2 = (r // (d3 * d4)) % d2
        i1 = (r // (d2 * d3 * d4)) % d1
        i0 = r // (d1 * d2 * d3 * d4)
        if s5 == size:
            at = np.intp(r)       # (signed: addresses are sums of signed numbers)
            _copy_runs(dst.ctypes.data + at * run, src.ctypes.data + i0 * s0 + i1 * s1 +
                       i2 * s2 + i3 * s3 + i4 * s4, run, 1, run, run)
            continue
        for j in range(d5):
            dst[i0, i1, i2, i3, i4, j] = src[i0, i1, i2, i3, i4, j]


def strided_call(src, dst, rank: int = 6):
    """``copy_strided``'s kernel and its arguments for dst = src (one shape, dst C-contiguous,
    src a view of any strides), or None where more than ``rank`` axes remain: unit axes
    dropped and adjacent axes that are one run in src merged (a transpose leaves its inner
    axes in order: ShuffleNet's channel shuffle moves rows of a whole image plane, not of
    its width; a slice of channels is one run an image), a long contiguous last row cut in
    pieces (so that the threads share it), then unit axes put in front up to ``rank``."""
    shape: list[int] = []
    strides: list[int] = []
    for n, s in zip(src.shape, src.strides):
        if n == 1:
            continue
        if shape and strides[-1] == s * n:
            shape[-1], strides[-1] = shape[-1] * n, s
        else:
            shape.append(n)
            strides.append(s)
    if shape and strides[-1] == src.itemsize and shape[-1] >= 2 * PIECE:
        piece = next((p for p in range(PIECE, PIECE // 8, -1) if shape[-1] % p == 0), 0)
        if piece:
            shape[-1:], strides[-1:] = [shape[-1] // piece, piece], [piece * src.itemsize,
                                                                     src.itemsize]
    if len(shape) > rank:
        return None
    shape = [1] * (rank - len(shape)) + shape
    strides = [0] * (rank - len(strides)) + strides
    return copy_strided, (_strided_view(src, shape, strides), dst.reshape(shape))


def _strided_view(src, shape, strides):
    """A view of ``src``'s elements of those strides, whose ``base`` is the allocation
    ``src`` lies in (so that a library saved ahead of time can place it: numpy's
    ``as_strided`` leaves a base that is no array)."""
    root = src
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not root.flags.c_contiguous:
        return np.lib.stride_tricks.as_strided(src, shape, strides)
    flat = root.reshape(-1).view(np.uint8)
    return np.ndarray(shape, src.dtype, buffer=flat, offset=src.ctypes.data - root.ctypes.data,
                      strides=strides)


PIECE = 2048   # elements: a contiguous row longer than twice this is cut into rows of about it


def transpose_planes(src, dst) -> None:
    """dst[n, j, i] = src[n, i, j] for src (N, A, B), any dtype: NCHW <-> NHWC as (N, C, HW)
    <-> (N, HW, C). Planes of one row or one column are the same values in the same order
    (a classifier's (N, 1000, 1) scores): copied. Three rows (an RGB image moved
    channel-last) are interleaved (``_interleave_rows``), any other shape goes by tiles
    (``_transpose_tiles``): two kernels, each compiled where a program uses it (each parallel
    loop is a compile of its own for Numba, with an empty cache)."""
    call = transpose_call(src, dst)
    call[0](*call[1])


def transpose_call(src, dst):
    """``transpose_planes``'s kernel and its arguments: planes of one row or one column
    copied as rows (``copy_rows``; both C-contiguous), three rows interleaved, the rest by
    tiles."""
    n, a, b = src.shape
    if a == 1 or b == 1:
        return copy_rows, (src.reshape(n, a * b), dst.reshape(n, a * b))
    return (_interleave_rows if a == 3 else _transpose_tiles), (src, dst)


@njit(inline="always")
def _columns(t, spans, width, b):
    """Work item t of a transpose whose planes' b columns are cut into ``spans`` spans of
    ``width``: (plane, first column, end column)."""
    j0 = (t % spans) * width
    return t // spans, j0, min(b, j0 + width)


@parallel
def _interleave_rows(thread, threads, args):
    """``transpose_planes`` of three rows: interleaved along runs of 1024 columns with the
    stride a literal 3, which LLVM vectorises (tiles' inner loop of 3 did not)."""
    src, dst = args
    planes, _, b = src.shape
    runs = (b + 1023) // 1024
    for t in range(*share(planes * runs, thread, threads)):
        n, j0, j1 = _columns(t, runs, 1024, b)
        r0, r1, r2 = src[n, 0, j0:j1], src[n, 1, j0:j1], src[n, 2, j0:j1]
        d = dst[n].reshape(-1)[3 * j0:3 * j1]
        for j in range(j1 - j0):
            d[3 * j] = r0[j]
            d[3 * j + 1] = r1[j]
            d[3 * j + 2] = r2[j]


@parallel
def _transpose_tiles(thread, threads, args):
    """``transpose_planes`` by tiles of 32 x 32, the tiles of each plane's columns in
    parallel."""
    src, dst = args
    planes, a, b = src.shape
    tiles = (b + 31) // 32
    for t in range(*share(planes * tiles, thread, threads)):
        n, j0, j1 = _columns(t, tiles, 32, b)
        for i0 in range(0, a, 32):
            i1 = min(a, i0 + 32)
            for j in range(j0, j1):
                for i in range(i0, i1):
                    dst[n, j, i] = src[n, i, j]


@parallel
def pad_planes(thread, threads, args):
    """x: (P, H, W) planes into out: (P, H + pt + pb, W + pl + pr), the border = value."""
    x, value, pt, pl, out = args
    planes, h, w = x.shape
    _, oh, ow = out.shape
    for p in range(*share(planes, thread, threads)):
        for i in range(oh):
            for j in range(ow):
                ii = i - pt
                jj = j - pl
                if ii >= 0 and ii < h and jj >= 0 and jj < w:
                    out[p, i, j] = x[p, ii, jj]
                else:
                    out[p, i, j] = value


# ---- elementwise kernels that ops name in their registry entry (kernel_params["fn"]) --------

@parallel
def hardswish(thread, threads, args):
    """x * min(max(x + 3, 0), 6) / 6, as ONNX Runtime computes it: x * hardsigmoid(x) with
    alpha 1/6, beta 0.5."""
    x, out = args
    alpha, beta = np.float32(1.0 / 6.0), np.float32(0.5)
    for i in range(*share(x.size, thread, threads)):
        v = x[i]
        out[i] = v * min(max(alpha * v + beta, np.float32(0)), np.float32(1))


@parallel(error_model="numpy")
def silu(thread, threads, args):
    """x * sigmoid(x) in one pass over the values (EfficientNet's activation: read and
    written once, where the sigmoid and the product each read and wrote them), the sigmoid
    as ``unary``'s (``_sigmoid32``), then the product: the bits of the two kernels."""
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        v = x[i]
        out[i] = v * _sigmoid32(v)


@parallel
def hardsigmoid(thread, threads, args):
    """max(0, min(1, alpha * x + beta))."""
    x, out, alpha, beta = args
    for i in range(*share(x.size, thread, threads)):
        out[i] = min(max(alpha * x[i] + beta, np.float32(0)), np.float32(1))


@parallel
def erf(thread, threads, args):
    """The error function, in float64 then rounded (as the reference)."""
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        out[i] = math.erf(np.float64(x[i]))


@parallel
def elu(thread, threads, args):
    """gamma * (x where x >= 0, else alpha * (exp(x) - 1)): elu (gamma 1) and selu; in
    float64, then rounded (as the reference)."""
    x, out, alpha, gamma = args
    for i in range(*share(x.size, thread, threads)):
        v = np.float64(x[i])
        out[i] = gamma * (alpha * math.expm1(v) if v < 0 else v)


@parallel
def softplus(thread, threads, args):
    """log(1 + exp(x)), as x + log(1 + exp(-x)) where x > 0; in float64, then rounded."""
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        v = np.float64(x[i])
        if v > 0:
            out[i] = v + math.log1p(math.exp(-v))
        else:
            out[i] = math.log1p(math.exp(v))


@parallel
def softsign(thread, threads, args):
    """x / (1 + |x|), in float64, then rounded."""
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        v = np.float64(x[i])
        out[i] = v / (1.0 + abs(v))


@parallel
def tanh(thread, threads, args):
    """tanh(x), in float64, then rounded (a transformer's pooler)."""
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        out[i] = math.tanh(np.float64(x[i]))


@parallel(error_model="numpy")
def exp(thread, threads, args):
    """exp(x), in float64, then rounded (inf past float32's range, as numpy's)."""
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        out[i] = np.exp(np.float64(x[i]))


@parallel(error_model="numpy")
def sqrt(thread, threads, args):
    """sqrt(x): float32's own, correctly rounded (NaN below 0, as numpy's)."""
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        out[i] = np.sqrt(x[i])


# erfcx(|x| / sqrt 2) = exp(x^2 / 2) erfc(|x| / sqrt 2), GELU's smooth part, as polynomials
# fitted (least squares on 4001 Chebyshev points, to scipy's erfcx) in |x| where |x| < 1.5
# (relative error 7e-9) and, beyond, in t = 1 / (1 + |x| / 2), divided by t (4e-10)
_GELU_NEAR_END, _GELU_FAR_END = 1.5, 15.0     # (beyond 15, GELU is x or a signed 0 in float32)
_GELU_NEAR = (0.99999999643889, -0.7978840742244824, 0.49998898424111266, -0.26586405684991044,
              0.12455717910820369, -0.05201673235389057, 0.018879768755033444,
              -0.005489114424052765, 0.0010912228632828232, -0.0001065927428897727)
_GELU_FAR = (0.3989431308654705, 0.398915354183823, 0.299530983788555, 0.09819246287088781,
             -0.12753165121714408, -0.1497948289415257, -0.48317029661111965,
             1.4433543836614149, -1.2880331546917798, 0.41314248713078466)


@parallel(error_model="numpy", fastmath={"contract"})   # (loops vectorised, FMAs)
def gelu(thread, threads, args):
    """0.5 x erfc(-x / sqrt 2) (the op's semantics), or with tanh_form != 0 the tanh
    approximation 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); in float64, then rounded.
    The erfc form in one vectorised pass (libm's erf a value at a time was a quarter of
    ConvNeXt's float run): for a = |x|, E = erfc(a / sqrt 2) = exp(-a^2 / 2) erfcx(a / sqrt 2),
    erfcx by its polynomial (``_GELU_NEAR``, or ``_GELU_FAR`` in t = 1 / (1 + a / 2): lanes
    choose their coefficients by selects, no branches), the exponential softmax's
    (``_exp64_below_zero``); GELU is
    0.5 x E below 0 and x (1 - E / 2) above, so neither side cancels. Within a float32 ulp of
    the reference; beyond |x| = 15, E is 0 (x, or -0.0); NaN and -inf give NaN, +inf inf."""
    x, out, tanh_form = args
    if tanh_form != 0:
        for i in range(*share(x.size, thread, threads)):
            v = np.float64(x[i])
            out[i] = 0.5 * v * (1.0 + math.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
        return
    lo, hi = share(x.size, thread, threads)
    for i in range(lo, hi):
        v = np.float64(x[i])
        a = abs(v)
        within = a < _GELU_FAR_END
        a = a if within else _GELU_FAR_END         # (NaN too: put back below)
        near = a < _GELU_NEAR_END
        t = 1.0 / (1.0 + 0.5 * a)
        u = a if near else t
        s = _GELU_NEAR[9] if near else _GELU_FAR[9]
        s = s * u + (_GELU_NEAR[8] if near else _GELU_FAR[8])
        s = s * u + (_GELU_NEAR[7] if near else _GELU_FAR[7])
        s = s * u + (_GELU_NEAR[6] if near else _GELU_FAR[6])
        s = s * u + (_GELU_NEAR[5] if near else _GELU_FAR[5])
        s = s * u + (_GELU_NEAR[4] if near else _GELU_FAR[4])
        s = s * u + (_GELU_NEAR[3] if near else _GELU_FAR[3])
        s = s * u + (_GELU_NEAR[2] if near else _GELU_FAR[2])
        s = s * u + (_GELU_NEAR[1] if near else _GELU_FAR[1])
        s = s * u + (_GELU_NEAR[0] if near else _GELU_FAR[0])
        s = s if near else s * t
        m = -0.5 * a * a        # (>= -112.5: its clamp at -110 changes no float32 GELU)
        q = _exp64_below_zero(m)
        e = q * s
        e = e if within else 0.0
        g = v * (1.0 - 0.5 * e) if v > 0 else 0.5 * v * e
        out[i] = g if v == v else v
