"""fp32 GEMMs with fused multiply-add for the float convolutions, 256-bit (AVX2 + FMA) and
512-bit (AVX-512F): LLVM IR written with llvmlite, compiled once as C functions that Numba
kernels call through an intrinsic (``llvm_loops.load_gemms``), as the int8 GEMMs are
(``avx2.py``, ``vnni.py``).

    C[p, o] = sum_k A[p, k] * B[k, o]     A, B, C float32

B is packed once as [O/block][K][block] (the last block padded with zero weights): one k gives
two vectors of ``block`` output channels together. The micro-kernel keeps ``rows`` pixels x
``block`` channels in 2 x rows accumulators; each step broadcasts one value of A per pixel and
does 2 x rows fused multiply-adds. The widths:

    path     vector      block  rows   accumulators
    fma      8 floats     16     6      12 ymm (of 16)
    avx512   16 floats    32     8      16 zmm (of 32)

A convolution gathers each work item's pixel windows from the channel-last image into rows,
multiplies them and adds the bias and activation in one parallel region, and writes channel-
last (NHWC, straight along each row) or NCHW. The sums run in another order than im2col +
BLAS does: results agree with the reference to float32 rounding (the tests' tolerance), not
bit for bit.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .fp32 import clamp
from ..codegen.llvm_loops import (cpu_has, declare, gemm_definition, gemm_intrinsic, load_gemms,
                         panel_gemm, splat)
from .gather import (chunk_bounds, copy_windows, load_entry, next_set_item, next_work,
                     own_rows, plan_chunks, release, set_major, windows)
from .fp32 import copy_strided
from ..codegen.launch import Driver, parallel, share
from ..codegen import memory

load_entry("float32")   # the gather of this module's kernels, on floats

# path -> (floats per vector, pixel rows per micro-kernel); a block is two vectors
WIDTHS = {"fma": (8, 6), "avx512": (16, 8)}
# steps of k a slice of the panels: all the pixels of a call go through one slice before the
# next (``llvm_loops.panel_gemm``): 256 x 32 floats, 32 KB of the 512-bit GEMM's panel
K_BLOCK = 256
# steps of k ahead that the loop over k asks the panel's lines of (``panel_gemm``'s prefetch):
# a layer's weights come from memory once per inference, and the first group of pixels
# through each slice waited for them; resnet18 fp32 took 0.95x the time with 8, 16 or 64
# steps ahead (Xeon, AVX-512)
PREFETCH = 16
# the finishing GEMMs' extra arguments: the bias's address, lo, hi, the valid channels
FINISH_ARGS = ("ptr", "f32", "f32", "i64")


def available(path: str = "fma") -> bool:
    """Whether the CPU runs the ``path`` GEMM: AVX2 and FMA, or AVX-512F."""
    return cpu_has("avx2") and cpu_has("fma") and (path == "fma" or cpu_has("avx512f"))


def block_of(path: str) -> int:
    """The output channels one panel of the ``path`` GEMM holds."""
    return 2 * WIDTHS[path][0]


def _define(path: str, epilogue: bool = False):
    lanes, rows = WIDTHS[path]
    name = f"eqquant_{path}_sgemm" + ("_bias_clamp" if epilogue else "")

    @gemm_definition(name, "float", FINISH_ARGS if epilogue else ())
    def define_sgemm(mod, fn, args, b):
        """``void eqquant_<path>_sgemm(A, lda, B, C, ldc, p0, p1, k, oblocks)`` (A, B, C
        float32; lda and ldc in elements); ``..._bias_clamp(..., bias, lo, hi, valid)`` adds
        the bias to each sum and clamps it to [lo, hi] before storing it, as ``_finish``
        does (the same bits), so that the sums never go through memory; it stores the
        vectors of the first ``valid`` channels only (a last block of 144 channels: one of
        its two)."""
        from llvmlite import ir
        vt = ir.VectorType(ir.FloatType(), lanes)
        fma = declare(mod, f"llvm.fma.v{lanes}f32", ir.FunctionType(vt, [vt, vt, vt]))
        a_ptr, c_ptr, ldc = args[0], args[3], args[4]

        def row_step(bc, start, k, accs, weights):
            av = splat(bc, bc.load(bc.gep(a_ptr, [bc.add(start, k)]), align=4), vt)
            return [bc.call(fma, [av, weights[j], accs[j]]) for j in range(2)]

        def finish(bc, accs, p, ob):
            """each sum plus its channel's bias, then max(., lo) and min(., hi) as
            ``kernels_fp32.clamp``, stored in C's row p + r"""
            bias, lo, hi = args[9], splat(bc, args[10], vt), splat(bc, args[11], vt)
            i64 = ir.IntType(64)
            for j in range(2):
                col = bc.add(bc.mul(ob, ir.Constant(i64, 2 * lanes)), ir.Constant(i64, lanes * j))
                inside = bc.icmp_signed("<=", bc.add(col, ir.Constant(i64, lanes)), args[12])
                with bc.if_then(inside, likely=True):
                    b_v = bc.load(bc.bitcast(bc.gep(bias, [col]), vt.as_pointer()), align=4)
                    for r, row in enumerate(accs):
                        v = bc.fadd(row[j], b_v)
                        v = bc.select(bc.fcmp_ordered(">", lo, v), lo, v)
                        v = bc.select(bc.fcmp_ordered("<", hi, v), hi, v)
                        at = bc.add(bc.mul(bc.add(p, ir.Constant(i64, r)), ldc), col)
                        bc.store(v, bc.bitcast(bc.gep(c_ptr, [at]), vt.as_pointer()), align=4)

        def columns(bc, p, ob, nrows, each):
            """``each(row, j, r, at)`` for the vectors of C's rows p..p+nrows in block ob (the
            first ``valid`` channels' only, finishing)"""
            i64 = ir.IntType(64)
            for j in range(2):
                col = bc.add(bc.mul(ob, ir.Constant(i64, 2 * lanes)), ir.Constant(i64, lanes * j))
                for r in range(nrows):
                    at = bc.bitcast(bc.gep(c_ptr, [bc.add(bc.mul(bc.add(p, ir.Constant(i64, r)),
                                                                 ldc), col)]), vt.as_pointer())
                    if epilogue:
                        inside = bc.icmp_signed("<=", bc.add(col, ir.Constant(i64, lanes)),
                                                args[12])
                        each(bc, j, r, at, inside)
                    else:
                        each(bc, j, r, at, None)

        def pause(bc, accs, p, ob):
            """a slice's sums stored in C until the next slice"""
            def put(bc, j, r, at, inside):
                if inside is None:
                    bc.store(accs[r][j], at, align=4)
                else:
                    with bc.if_then(inside, likely=True):
                        bc.store(accs[r][j], at, align=4)
            columns(bc, p, ob, len(accs), put)

        def resume(bc, p, ob, nrows):
            """the sums the slice before left in C (zero for the channels C has not)"""
            grid = [[None, None] for _ in range(nrows)]

            def get(bc, j, r, at, inside):
                if inside is None:
                    grid[r][j] = bc.load(at, align=4)
                    return
                start = bc.block
                with bc.if_then(inside, likely=True):
                    v = bc.load(at, align=4)
                    loaded = bc.block
                phi = bc.phi(vt)
                phi.add_incoming(ir.Constant(vt, None), start)
                phi.add_incoming(v, loaded)
                grid[r][j] = phi
            columns(bc, p, ob, nrows, get)
            return grid

        panel_gemm(fn, b, args, rows=rows, block=2 * lanes, panel=2 * lanes,
                   weights=(lanes, 2, vt, 4), accumulators=(2, vt), row_step=row_step,
                   finish=finish if epilogue else None, k_block=K_BLOCK, resume=resume,
                   pause=pause, prefetch=PREFETCH)
    return define_sgemm


sgemm256_block = gemm_intrinsic(_define("fma"), "float")
sgemm512_block = gemm_intrinsic(_define("avx512"), "float")
# the same GEMMs finishing the sums: (..., bias address, lo, hi, valid channels)
sgemm256_finish = gemm_intrinsic(_define("fma", True), "float", FINISH_ARGS)
sgemm512_finish = gemm_intrinsic(_define("avx512", True), "float", FINISH_ARGS)
for _path, _gemms in (("fma", [sgemm256_block, sgemm256_finish]),
                      ("avx512", [sgemm512_block, sgemm512_finish])):
    if available(_path):
        load_gemms(_path, [g.define for g in _gemms])


def pack(w: np.ndarray, path: str = "fma") -> np.ndarray:
    """float32 weights (O, K) -> B packed [ceil(O/block)][K][block] for the ``path`` GEMM
    (zero rows pad the last block)."""
    block = block_of(path)
    packed = memory.panels(w, block, 1, w.shape[1], np.float32)
    return packed.reshape(packed.shape[:3])


@njit(inline="always")
def _sgemm(a, lda, packed, ob0, ob1, c, ldc, n):
    """c[:n, :] = a[:n] @ the packed blocks ob0..ob1 (the GEMM of the packing's width)."""
    k, block = packed.shape[1], packed.shape[2]
    b = packed.ctypes.data + ob0 * k * block * 4
    if block == 32:
        sgemm512_block(a, lda, b, c, ldc, 0, n, k, ob1 - ob0)
    else:
        sgemm256_block(a, lda, b, c, ldc, 0, n, k, ob1 - ob0)


@njit(inline="always")
def _sgemm_finish(a, lda, packed, ob0, ob1, c, ldc, n, bias, lo, hi):
    """c[:n, :] = clamp(a[:n] @ the packed blocks ob0..ob1 + bias[ob0 * block:], lo, hi),
    finished in registers, for the ldc - ob0 * block columns c has from the first block's
    (c: that column's address)."""
    k, block = packed.shape[1], packed.shape[2]
    b = packed.ctypes.data + ob0 * k * block * 4
    bias_at = bias.ctypes.data + ob0 * block * 4
    valid = ldc - ob0 * block
    if block == 32:
        sgemm512_finish(a, lda, b, c, ldc, 0, n, k, ob1 - ob0, bias_at, lo, hi, valid)
    else:
        sgemm256_finish(a, lda, b, c, ldc, 0, n, k, ob1 - ob0, bias_at, lo, hi, valid)


@njit(cache=True)
def sgemm(a, packed, out):
    """out (P, O') = a (P, K) @ B, O' the padded width."""
    _sgemm(a.ctypes.data, a.shape[1], packed, np.intp(0), packed.shape[0], out.ctypes.data,
           out.shape[1], a.shape[0])


@njit(inline="always")
def _finish(acc, bias, lo, hi, o0, cols, p0, out):
    """acc (n, >= cols): channels o0..o0+cols of pixels p0.. plus the bias, clamped to
    [lo, hi], into out (P, O) channel-last, along each row. Every loop indexes slices from 0
    by its counter (Numba then knows no index is negative, and the loops vectorise: an
    offset index kept them scalar, a third of a 1x1 convolution's time)."""
    b = bias[o0:o0 + cols]
    for r in range(acc.shape[0]):
        a = acc[r]
        dst = out[p0 + r, o0:o0 + cols]
        for o in range(cols):
            dst[o] = clamp(a[o] + b[o], lo, hi)


@njit(inline="always")
def _add_tile(out, res, p0, n, c0, c1, lo, hi):
    """out[p0:p0 + n, c0:c1] = clamp(out + res, lo, hi) on the same tile of ``res``: a
    residual summed into a finished tile while it is in cache (fused.conv2d_add: the sum,
    then the activation). A tile of whole rows is summed as one run of n * O values, as
    ``kernels_int8.add_tile`` sums its own."""
    w = c1 - c0
    if w == out.shape[1]:
        o = out.reshape(out.size)[p0 * w:(p0 + n) * w]
        q = res.reshape(res.size)[p0 * w:(p0 + n) * w]
        for j in range(n * w):
            o[j] = clamp(o[j] + q[j], lo, hi)
        return
    for r in range(n):
        o = out[p0 + r, c0:c1]
        q = res[p0 + r, c0:c1]
        for j in range(w):
            o[j] = clamp(o[j] + q[j], lo, hi)


@njit(inline="always")
def _gemm_finished(a, k, packed, ob0, ob1, out, p0, n, bias, lo, hi):
    """out[p0:p0 + n] (P, O) at the channels of blocks ob0..ob1 = clamp(a[:n] @ those blocks
    + bias, lo, hi), a's rows K apart: the blocks finished in registers straight into out
    (all of them when the channels fill whole vectors), the last one through a tile
    (``_finish``) where they do not. (``a`` is the array, its address taken at each use: a
    rows buffer whose last use is its address is freed before the GEMM reads it.)"""
    o_n, block = out.shape[1], packed.shape[2]
    whole = ob1 if o_n % (block // 2) == 0 else min(ob1, o_n // block)
    if whole > ob0:
        _sgemm_finish(a.ctypes.data, k, packed, ob0, whole,
                      out[p0:].ctypes.data + ob0 * block * 4, o_n, n, bias, lo, hi)
    rest = max(ob0, whole)      # the blocks finished through memory
    if rest < ob1:
        width = (ob1 - rest) * block
        acc = np.empty((n, width), np.float32)
        _sgemm(a.ctypes.data, k, packed, rest, ob1, acc.ctypes.data, width, n)
        o0 = rest * block
        _finish(acc, bias, lo, hi, o0, min(width, o_n - o0), p0, out)


def _conv_plan(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, packed, bias, lo, hi, out,
               threads, res):
    """``conv``'s plan (``launch.Driver``): a float convolution of a batch in one launch of
    its work items (``_conv_items``): nhwc (N, H, W, C) float32 -> out (N, oh*ow, O),
    channel-last (an NCHW call site moves it). Work items are chunks of one image's pixels,
    and of output blocks where the batch gives few chunks (``gather.plan_chunks``); each
    gathers its pixels' windows into rows (a 1x1 convolution with stride 1 and no padding
    multiplies the image's own rows; a lone image split by channel groups has them gathered
    once, by a launch before the items), multiplies them and finishes them (bias, clamp to
    [lo, hi], write). With a residual ``res`` (shaped as out; (0, 0, 0): none) the finished
    tile (its bias added) is summed with the residual's, then clamped (``_add_tile``)."""
    split, shared, counters, fill = plan_chunks(nhwc, kh, kw, sh, sw, pt, pl, dh, dw,
                                                np.float32(0.0), ow, oh * ow, packed.shape[0],
                                                threads, packed.shape[1])
    items = (_conv_items, (nhwc, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, packed, bias, lo, hi,
                           out, res, split, shared, counters), threads)
    return [items] if fill is None else [(*fill, None), items]


@parallel
def _conv_items(thread, threads, args):
    """The work items of ``conv`` one thread takes (``gather.next_work``)."""
    (nhwc, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, packed, bias, lo, hi, out, res, split,
     shared, counters) = args
    chunks, groups, per_group = split
    p_n = oh * ow
    o_n = out.shape[2]
    oblocks, k, block = packed.shape[0], packed.shape[1], packed.shape[2]
    h, w, c = nhwc.shape[1], nhwc.shape[2], nhwc.shape[3]
    pointwise = own_rows(kh, kw, sh, sw, pt, pl, c, k, ow, w)
    residual = res.shape[0] > 0
    # the activation after the residual's sum: none in the GEMM's epilogue then
    f_lo = np.float32(-np.inf) if residual else lo
    f_hi = np.float32(np.inf) if residual else hi
    while True:
        b, chunk, ob0, ob1 = next_work(counters, thread, chunks, groups, per_group, oblocks)
        if b < 0:
            break
        p0, p1 = chunk_bounds(p_n, chunks, chunk)
        n = p1 - p0
        hwc = nhwc[b]
        if pointwise:
            rows = hwc.reshape(h * w, c)[p0:p0 + n]
        elif shared.shape[0]:
            rows = shared[p0:p0 + n]
        else:
            rows = np.empty((n, k), np.float32)
            copy_windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, np.float32(0.0), ow, p0, rows)
        _gemm_finished(rows, k, packed, ob0, ob1, out[b], p0, n, bias, f_lo, f_hi)
        if residual:
            _add_tile(out[b], res[b], p0, n, ob0 * block, min(ob1 * block, o_n), lo, hi)
    release(counters)


conv = Driver(_conv_plan, (windows, _conv_items))


# -- products of two computed operands (attention's, in float) --------------------------------

STACK_ROWS = 48     # rows of a a work item of ``stack_items``: 8 of the GEMM's 6-row steps


@parallel
def pack_stack(thread, threads, args):
    """b's matrices as the GEMM's panels, at run time: b (B, N, K) where ``dot`` (a @ b^T), else
    (B, K, N); panels (B, ceil(N / block), K, block), the columns past N zero. A work item
    is one block of one matrix."""
    b, dot, panels = args
    nb, blocks, depth, block = panels.shape
    n = b.shape[1] if dot else b.shape[2]
    for item in range(*share(nb * blocks, thread, threads)):
        bt, ob = item // blocks, item % blocks
        o0 = ob * block
        width = min(block, n - o0)
        dst = panels[bt, ob]
        for kk in range(depth):
            row = dst[kk]
            if dot:
                for j in range(width):
                    row[j] = b[bt, o0 + j, kk]
            else:
                src = b[bt, kk, o0:o0 + width]
                for j in range(width):
                    row[j] = src[j]
            for j in range(width, block):
                row[j] = np.float32(0.0)


@parallel
def stack_items(thread, threads, args):
    """out[i] = a[i] @ b[i] for each matrix of the stacks, b's as ``pack_stack``'s panels:
    a (B, M, K) C-contiguous, out (B, M, N); zeros: a zero bias of the panels' width. A work
    item is STACK_ROWS rows of one matrix (``_gemm_finished``: no bias, no clamp)."""
    a, panels, zeros, out = args
    nb, m, depth = a.shape
    chunks = (m + STACK_ROWS - 1) // STACK_ROWS
    lo, hi = np.float32(-np.inf), np.float32(np.inf)
    for item in range(*share(nb * chunks, thread, threads)):
        bt = item // chunks
        p0 = (item % chunks) * STACK_ROWS
        _gemm_finished(a[bt, p0:], depth, panels[bt], 0, panels.shape[1],
                       out[bt], p0, min(STACK_ROWS, m - p0), zeros, lo, hi)


# -- grouped convolutions: each set of groups one block-diagonal GEMM (as the int8 ones) -------

def grouped_conv_plan(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, packed, sets, span_o,
                      bias, lo, hi, out, threads, res):
    """``grouped``'s plan: a float convolution of ``sets`` sets of groups
    (``vnni.group_span`` on this GEMM's blocks), nhwc (N, H, W, C) float32 -> out (N, oh*ow,
    O), in two launches, as the int8 grouped driver (``vnni.grouped_requantize``): the
    batch moved set-major (``gather.set_major``), then the work items (image, set, chunk of
    pixels: ``_grouped_items``), each a gather of the set's windows and the set's GEMM on
    its panels (``packed``: the sets' blocks one after another, ``bias`` likewise, ``span_o``
    outputs a set) finished in registers at the set's channels; a residual ``res`` (shaped
    as out) summed into the finished tile before the clamp to [lo, hi]."""
    by_set, move, chunks, counters = set_major(nhwc, sets, oh * ow, threads)
    return [move, (_grouped_items, (by_set, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, packed,
                                    span_o, bias, lo, hi, out, res, chunks, counters),
                   threads)]


@parallel
def _grouped_items(thread, threads, args):
    """The work items of ``grouped`` one thread takes (``gather.next_set_item``)."""
    (by_set, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, packed, span_o, bias, lo, hi, out, res,
     chunks, counters) = args
    sets = by_set.shape[1]
    per_set, k, block = packed.shape[0] // sets, packed.shape[1], packed.shape[2]
    o_n = out.shape[2]
    residual = res.shape[0] > 0
    f_lo = np.float32(-np.inf) if residual else lo     # (the clamp after the residual's sum)
    f_hi = np.float32(np.inf) if residual else hi
    while True:
        b, s, p0, p1 = next_set_item(counters, thread, sets, chunks, oh * ow)
        if b < 0:
            break
        n = p1 - p0
        rows = np.empty((n, k), np.float32)
        copy_windows(by_set[b, s], kh, kw, sh, sw, pt, pl, dh, dw, np.float32(0.0), ow, p0,
                     rows)
        at = packed.ctypes.data + s * per_set * k * block * 4
        c = out[b, p0:].ctypes.data + s * span_o * 4
        bias_at = bias.ctypes.data + s * per_set * block * 4
        if block == 32:
            sgemm512_finish(rows.ctypes.data, k, at, c, o_n, 0, n, k, per_set, bias_at, f_lo,
                            f_hi, span_o)
        else:
            sgemm256_finish(rows.ctypes.data, k, at, c, o_n, 0, n, k, per_set, bias_at, f_lo,
                            f_hi, span_o)
        if residual:
            _add_tile(out[b], res[b], p0, n, s * span_o, (s + 1) * span_o, lo, hi)
    release(counters)


grouped = Driver(grouped_conv_plan, (copy_strided, _grouped_items))


def stores_set(span_o: int, path: str) -> bool:
    """Whether the ``path`` GEMM stores a set of ``span_o`` outputs from registers: in whole
    vectors (no mask)."""
    return span_o % WIDTHS[path][0] == 0
