"""An int8 GEMM on AVX2 (``vpmaddwd``), for CPUs without VNNI: LLVM IR written with llvmlite
and emitted into Numba-compiled kernels through an intrinsic, like ``vnni.py``, whose interface
it shares (pixel rows as unsigned bytes, packed weights, the same epilogue).

    C[p, o] = sum_k A[p, k] * B[k, o]     A uint8 (P x K), B int8, C int32

``vpmaddwd`` multiplies 16 pairs of int16 and adds each pair into one int32 lane: exact for
uint8 x int8 (|a * b + a' * b'| <= 65,280). (``vpmaddubsw`` would take the bytes directly but
adds its pairs in int16 with saturation: not exact, the known saturation of 8-bit dot products
on CPUs without VNNI.) B is packed once as int16 [O/16][K/2][16][2]: one 32-byte load gives
2 k-values for 8 output channels. The micro-kernel keeps 6 pixels x 16 channels in 12
accumulators; the pixel rows (the uint8 rows the VNNI kernel reads) are widened to int16 a
chunk at a time, so that each pixel's pair (a_k, a_k+1) is one broadcast 32-bit load. The
convolution driver requantizes the sums in registers and stores 8-bit values, as the VNNI
kernels do (``vnni.requantize_finish``): finished through an int32 tile in memory, MobileNet-
v2's int8 convolutions took 1.7x as long on an AMD EPYC with AVX2 (its 1x1 layers of few
input channels 2.5-3x: the epilogue, not the products, was their cost).
"""
from __future__ import annotations


import numpy as np
from numba import njit, prange

from .llvm_loops import cpu_has, declare, gemm_definition, gemm_intrinsic, panel_gemm, splat
# the gather, set-up and epilogue it shares with the VNNI kernel (windows: re-exported)
from .gather import (SMALL, _chunk_windows, _rows, block_shares, share_item,
                     shared_windows, work_split)
from .gather import windows, work_item  # noqa: F401
# requantize_params: re-exported, the bindings derive each layer's epilogue table with it
from .vnni import requantize_params  # noqa: F401
from .kernels_int8 import add_residual
from .vnni import _finish, pack_panels, requantize_finish

BLOCK = 16   # output channels per register block (2 x 8 lanes)
ROWS = 6     # pixels per micro-kernel step: 6 x 2 accumulators + 2 weight vectors in ymm
PANEL = 64   # bytes of packed weights per k-pair and block (16 channels x 2 k x int16)


def available() -> bool:
    return cpu_has("avx2")


EPILOGUE = ("ptr", "i64", "i64", "i64", "i64")   # params, stride, lo, hi, valid


def _define(epilogue: bool = False):
    """Define (once per LLVM module) ``void eqquant_avx2_gemm(A, lda, B, C, ldc, p0, p1,
    kpairs, oblocks)`` (A int16 rows of lda elements): for each block of 16 output channels,
    pixels p0..p1, ROWS at a time (then one at a time), over all k-pairs. With ``epilogue``,
    ``eqquant_avx2_gemm_requantize(..., params, stride, lo, hi, valid)`` finishes each sum in
    registers and stores 8-bit values (``vnni.requantize_finish``), as the VNNI GEMMs do."""
    @gemm_definition("eqquant_avx2_gemm" + ("_requantize" if epilogue else ""), "i8",
                     EPILOGUE if epilogue else ())
    def define_gemm(mod, fn, args, b):
        from llvmlite import ir
        i16, i32, i64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
        v8 = ir.VectorType(i32, 8)
        v16 = ir.VectorType(i16, 16)
        madd = declare(mod, "llvm.x86.avx2.pmadd.wd", ir.FunctionType(v8, [v16, v16]))
        a_ptr = args[0]
        c64 = lambda v: ir.Constant(i64, v)  # noqa: E731

        def row_step(bc, start, k, accs, weights):
            """the int16 pair (a_k, a_k+1) of this pixel's row, broadcast to every lane"""
            a_off = bc.mul(bc.add(start, bc.mul(k, c64(2))), c64(2))
            lane = bc.load(bc.bitcast(bc.gep(a_ptr, [a_off]), i32.as_pointer()), align=2)
            av = bc.bitcast(splat(bc, lane, v8), v16)
            return [bc.add(accs[j], bc.call(madd, [av, weights[j]])) for j in range(2)]

        panel_gemm(fn, b, args, rows=ROWS, block=BLOCK, panel=PANEL, weights=(32, 2, v16, 1),
                   accumulators=(2, v8), row_step=row_step, out_lane=i32,
                   finish=requantize_finish(args, BLOCK) if epilogue else None)
    return define_gemm


PADS = True   # any number of output channels: the last block is padded with zero weights


def pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """int8 weights (O, K) -> [ceil(O/16)][Kp/2][16][2] int16 panels (``vnni.pack_panels``):
    one 32-byte load gives 2 k-values for 8 output channels."""
    return pack_panels(w, BLOCK, 2, np.int16)


# gemm_block(A address, lda, B address, C address, ldc, p0, p1, kpairs, oblocks).
gemm_block = gemm_intrinsic(_define(), "i8")
# gemm_requantize(..., params address, params stride, lo, hi, valid): requantized to 8 bits
gemm_requantize = gemm_intrinsic(_define(True), "i8", EPILOGUE)


@njit(cache=True)
def _widen(rows_u8, rows16):
    """uint8 pixel rows -> the int16 rows the GEMM reads: one loop over both when they are
    contiguous (a pointwise convolution's rows of 16 channels, taken row by row, ran at a
    quarter of the speed: a short loop's set-up for every 16 bytes)."""
    n, kp = rows_u8.shape
    if rows_u8.flags.c_contiguous and rows16.flags.c_contiguous:
        flat, flat16 = rows_u8.reshape(n * kp), rows16.reshape(n * kp)
        for i in range(n * kp):
            flat16[i] = flat[i]
        return
    for r in range(n):
        for c in range(kp):
            rows16[r, c] = rows_u8[r, c]


@njit(cache=True)
def gemm(a_u8, packed, out):
    """out = a_u8 @ B (a_u8: (P, Kp) uint8, out: (P, O') int32, O' the padded width)."""
    a16 = np.empty(a_u8.shape, np.int16)
    _widen(a_u8, a16)
    gemm_block(a16.ctypes.data, a16.shape[1], packed.ctypes.data, out.ctypes.data,
               out.shape[1], 0, a16.shape[0], packed.shape[1], packed.shape[0])


@njit(parallel=True, cache=True)
def gemm_parallel(a_u8, packed, out):
    """``gemm`` over the cores: by chunks of pixels when there are many, by blocks of output
    channels when the image is small."""
    p, oblocks, kq = a_u8.shape[0], packed.shape[0], packed.shape[1]
    kp = a_u8.shape[1]
    if p >= 192 or oblocks == 1:
        for t in prange((p + 95) // 96):
            p0, p1 = t * 96, min(p, t * 96 + 96)
            a16 = np.empty((p1 - p0, kp), np.int16)
            _widen(a_u8[p0:p1], a16)
            gemm_block(a16.ctypes.data, kp, packed.ctypes.data, out.ctypes.data + p0 *
                       out.shape[1] * 4, out.shape[1], 0, p1 - p0, kq, oblocks)
    else:
        a16 = np.empty((p, kp), np.int16)
        _widen(a_u8, a16)
        for ob in prange(oblocks):
            gemm_block(a16.ctypes.data, kp, packed.ctypes.data + ob * kq * PANEL,
                       out.ctypes.data + ob * BLOCK * 4, out.shape[1], 0, p, kq, 1)


@njit(cache=True)
def _gemm_requantize(rows16, packed, ob0, ob1, out, n, params, lo, hi):
    """out[:n, ob0 * 16:ob1 * 16] (those of its columns out has) = the int16 rows times the
    packed blocks ob0..ob1, requantized in registers (out (P, O) 8-bit, channel-last)."""
    kq = packed.shape[1]
    gemm_requantize(rows16.ctypes.data, rows16.shape[1], packed.ctypes.data + ob0 * kq * PANEL,
                    out.ctypes.data + ob0 * BLOCK, out.shape[1], 0, n, kq, ob1 - ob0,
                    params.ctypes.data + ob0 * BLOCK * 8, params.shape[1], lo, hi,
                    out.shape[1] - ob0 * BLOCK)


@njit(cache=True)
def _tile(rows16, packed, ob0, ob1, o_n, params, lo, hi, p0, out):
    """out[p0:p0 + n, channels of blocks ob0..ob1] = the rows (n, kp) int16 times those
    blocks, requantized: in registers where whole vectors of 8 channels are stored, the
    blocks of a last partial vector through an int32 tile (``_finish``)."""
    n, kq = rows16.shape[0], packed.shape[1]
    whole = ob1 if o_n % 8 == 0 else min(ob1, o_n // BLOCK)
    if whole > ob0:
        _gemm_requantize(rows16, packed, ob0, whole, out[p0:], n, params, lo, hi)
    rest = max(ob0, whole)
    if rest < ob1:
        cols = (ob1 - rest) * BLOCK
        acc = np.empty((n, cols), np.int32)
        gemm_block(rows16.ctypes.data, rows16.shape[1], packed.ctypes.data + rest * kq * PANEL,
                   acc.ctypes.data, cols, 0, n, kq, ob1 - rest)
        _finish(acc, min(cols, o_n - rest * BLOCK), params, lo, hi, rest * BLOCK, p0, out)


@njit(parallel=True, cache=True)
def conv_requantize(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, params, lo, hi,
                    out, threads, res, add):
    """A whole fused int8 convolution of a batch in one parallel region (as
    ``vnni.conv_requantize``: out (N, oh*ow, O), channel-last; a residual ``res`` summed
    with each item's tile): gather a chunk of pixels' windows, widen them, multiply and
    requantize in registers (``_tile``)."""
    images, p_n = nhwc.shape[0], oh * ow
    o_n = out.shape[2]
    oblocks, kq = packed.shape[0], packed.shape[1]
    kp = kq * 2
    if images > 1 or p_n >= SMALL or oblocks == 1:
        chunks, groups, per_group = work_split(images, p_n, oblocks, threads)
        shared = shared_windows(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, groups, kp)
        for item in prange(images * chunks * groups):
            b, chunk, g = work_item(item, chunks, groups)
            ob0 = g * per_group
            ob1 = min(oblocks, ob0 + per_group)
            if ob0 >= ob1:
                continue
            p0, rows = _chunk_windows(nhwc[b], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n,
                                      chunk, chunks, kp, shared)
            n = rows.shape[0]
            rows16 = np.empty((n, kp), np.int16)
            _widen(rows, rows16)
            _tile(rows16, packed, ob0, ob1, o_n, params, lo, hi, p0, out[b])
            add_residual(out, res, b, p0, n, ob0 * BLOCK, min(ob1 * BLOCK, o_n), add, lo, hi)
    else:
        rows = _rows(nhwc[0], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, 0, p_n, kp)
        rows16 = np.empty((p_n, kp), np.int16)
        _widen(rows, rows16)
        shares = block_shares(p_n, oblocks, threads)
        for item in prange(oblocks * shares):
            ob, q0, q1 = share_item(item, shares, p_n)
            _tile(rows16[q0:q1], packed, ob, ob + 1, o_n, params, lo, hi, q0, out[0])
            add_residual(out, res, 0, q0, q1 - q0, ob * BLOCK, min((ob + 1) * BLOCK, o_n), add,
                         lo, hi)
