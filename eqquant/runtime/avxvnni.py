"""An int8 GEMM on 256-bit VNNI (``vpdpbusd`` on ymm registers: AVX-VNNI, or AVX512-VNNI with
AVX512-VL): LLVM IR written with llvmlite, compiled once as C functions that Numba-compiled
kernels call through an intrinsic (``llvm_loops.load_gemms``), like ``vnni.py``, whose
interface it shares (pixel rows as unsigned bytes, packed weights, the same epilogue).

    C[p, o] = sum_k A[p, k] * B[k, o]     A uint8 (P x K), B int8, C int32

The instruction is the 512-bit kernel's on half the lanes: 4 unsigned bytes of A times 4
signed bytes of B summed into one int32 lane, exact. Blocks are 16 output channels (two
vectors of 8 lanes), so it serves CPUs with AVX-VNNI and no AVX-512 (16 vector registers:
6 pixels x 2 accumulators + 2 weight vectors + the broadcast pixel), and, on a CPU with
AVX512-VNNI, the layers whose width fills no 64-channel block of ``vnni.py`` (MobileNet's 24,
96, 144 channels: padded to 16, not to 64). B is packed once as [O/16][K/4][16][4], O padded
with zero weights to a multiple of 16; an int8 activation x is fed as the byte x + 128 and
the product corrected by 128 * sum_k B[k, o] (see ``pack``). The drivers below repeat the
512-bit kernel's: each calls its own GEMM, through its own intrinsic.
"""
from __future__ import annotations


import numpy as np
from numba import njit, prange

from .llvm_loops import cpu_has, gemm_intrinsic, load_gemms
# the gather, set-up and epilogue it shares with the 512-bit kernel (windows: re-exported)
from .gather import (CHUNK, SMALL, _chunk_windows, _rows, block_shares, item_runs, next_work,
                     share_item, shared_windows, work_split)
from .gather import windows  # noqa: F401
# requantize_params: re-exported, the bindings derive each layer's epilogue table with it
from .vnni import requantize_params  # noqa: F401
from .kernels_int8 import add_residual
from .vnni import _finish, define_vpdpbusd, pack_panels

BLOCK = 16   # output channels per register block (2 x 8 lanes)
ROWS = 6     # pixels per micro-kernel step
PANEL = 64   # bytes of packed weights per k-quad and block (16 channels x 4 k)
PADS = True  # any number of output channels: the last block is padded with zero weights


def available() -> bool:
    return cpu_has("avxvnni") or (cpu_has("avx512vnni") and cpu_has("avx512vl"))


def _define(epilogue: bool = False):
    """The 256-bit GEMM: blocks of 16 channels (2 x 8 lanes), ROWS at a time
    (``vnni.define_vpdpbusd``)."""
    return define_vpdpbusd("eqquant_vnni256_gemm", 8, 2, ROWS, epilogue)


def pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """int8 weights (O, K) -> [ceil(O/16)][Kp/4][16][4] int8 panels (``vnni.pack_panels``)."""
    return pack_panels(w, BLOCK, 4, np.int8)


def conv_kernel(w: np.ndarray, kp: int) -> tuple:
    """(the fused convolution, its arguments besides ``pack``'s): ``conv_requantize``, which
    needs none (the interface of every SIMD path; ``avx2.conv_kernel`` chooses)."""
    return conv_requantize, ()


# gemm_block(A address, lda, B address, C address, ldc, p0, p1, kq, oblocks).
gemm_block = gemm_intrinsic(_define(), "i8")
# gemm_requantize(..., params address, params stride, lo, hi): requantized to 8 bits
gemm_requantize = gemm_intrinsic(_define(True), "i8",
                                 ("ptr", "i64", "i64", "i64", "i64"))
if available():
    load_gemms("avxvnni", [gemm_block, gemm_requantize])


@njit(cache=True)
def _gemm_requantize(rows, kp, packed, ob0, ob1, out, n, params, lo, hi):
    """out[:n, ob0 * 16:ob1 * 16] (those of its columns out has) = the rows times the
    packed blocks ob0..ob1, requantized in registers (out (P, O) 8-bit, channel-last)."""
    kq = packed.shape[1]
    gemm_requantize(rows.ctypes.data, kp, packed.ctypes.data + ob0 * kq * PANEL,
                    out.ctypes.data + ob0 * BLOCK, out.shape[1], 0, n, kq, ob1 - ob0,
                    params.ctypes.data + ob0 * BLOCK * 8, params.shape[1], lo, hi,
                    out.shape[1] - ob0 * BLOCK)


@njit(cache=True)
def gemm(a_u8, packed, out):
    """out = a_u8 @ B (a_u8: (P, Kp) uint8, out: (P, O') int32, O' the padded width)."""
    gemm_block(a_u8.ctypes.data, a_u8.shape[1], packed.ctypes.data, out.ctypes.data,
               out.shape[1], 0, a_u8.shape[0], packed.shape[1], packed.shape[0])


@njit(parallel=True, cache=True)
def gemm_parallel(a_u8, packed, out):
    """``gemm`` over the cores: by chunks of pixels when there are many, by blocks of output
    channels when the image is small."""
    p, oblocks, kq = a_u8.shape[0], packed.shape[0], packed.shape[1]
    if p >= SMALL or oblocks == 1:
        for t in prange((p + CHUNK - 1) // CHUNK):
            gemm_block(a_u8.ctypes.data, a_u8.shape[1], packed.ctypes.data, out.ctypes.data,
                       out.shape[1], t * CHUNK, min(p, t * CHUNK + CHUNK), kq, oblocks)
    else:
        for ob in prange(oblocks):
            gemm_block(a_u8.ctypes.data, a_u8.shape[1], packed.ctypes.data + ob * kq * PANEL,
                       out.ctypes.data + ob * BLOCK * 4, out.shape[1], 0, p, kq, 1)


@njit(parallel=True, cache=True)
def conv_requantize(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, params, lo, hi,
                    out, threads, res, add):
    """A whole fused int8 convolution of a batch in one parallel region (as
    ``vnni.conv_requantize``: out (N, oh*ow, O), channel-last; a residual ``res`` summed
    with each item's tile)."""
    images, p_n = nhwc.shape[0], oh * ow
    o_n = out.shape[2]
    oblocks, kq = packed.shape[0], packed.shape[1]
    kp = kq * 4
    if images > 1 or p_n >= SMALL or oblocks == 1:
        chunks, groups, per_group = work_split(images, p_n, oblocks, threads)
        shared = shared_windows(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, groups, kp)
        counters = item_runs(images * chunks * groups, threads)
        for thread in prange(threads):
            while True:
                b, chunk, ob0, ob1 = next_work(counters, thread, chunks, groups, per_group,
                                               oblocks)
                if b < 0:
                    break
                p0, rows = _chunk_windows(nhwc[b], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n,
                                          chunk, chunks, kp, shared)
                n = rows.shape[0]
                # blocks requantized in registers, straight into out (all of them when the
                # channels fill whole vectors)
                whole = ob1 if o_n % 8 == 0 else min(ob1, o_n // BLOCK)
                if whole > ob0:
                    _gemm_requantize(rows, kp, packed, ob0, whole, out[b, p0:], n, params, lo,
                                     hi)
                rest = max(ob0, whole)      # the blocks finished through memory
                if rest < ob1:
                    cols = (ob1 - rest) * BLOCK
                    acc = np.empty((n, cols), np.int32)
                    gemm_block(rows.ctypes.data, kp, packed.ctypes.data + rest * kq * PANEL,
                               acc.ctypes.data, cols, 0, n, kq, ob1 - rest)
                    _finish(acc, min(cols, o_n - rest * BLOCK), params, lo, hi, rest * BLOCK, p0,
                            out[b])
                add_residual(out, res, b, p0, n, ob0 * BLOCK, min(ob1 * BLOCK, o_n), add, lo, hi)
    else:
        # the first image (its index and first pixel): a literal 0 passed on would have
        # Numba compile each callee a second time, for Literal[int](0)
        first = np.intp(0)
        rows = _rows(nhwc[0], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, first, p_n, kp)
        shares = block_shares(p_n, oblocks, threads)
        for item in prange(oblocks * shares):
            ob, q0, q1 = share_item(item, shares, p_n)
            if (ob + 1) * BLOCK <= o_n or o_n % 8 == 0:
                _gemm_requantize(rows[q0:], kp, packed, ob, ob + 1, out[0, q0:], q1 - q0,
                                 params, lo, hi)
            else:
                acc = np.empty((q1 - q0, BLOCK), np.int32)
                gemm_block(rows[q0:].ctypes.data, kp, packed.ctypes.data + ob * kq * PANEL,
                           acc.ctypes.data, BLOCK, 0, q1 - q0, kq, 1)
                _finish(acc, min(BLOCK, o_n - ob * BLOCK), params, lo, hi, ob * BLOCK, q0,
                        out[0])
            add_residual(out, res, first, q0, q1 - q0, ob * BLOCK, min((ob + 1) * BLOCK, o_n),
                         add, lo, hi)
