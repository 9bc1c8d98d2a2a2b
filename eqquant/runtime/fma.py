"""An fp32 GEMM on AVX2 with FMA, for the float convolutions: LLVM IR written with llvmlite and
emitted into Numba kernels through an intrinsic, as the int8 GEMMs are (``avx2.py``).

    C[p, o] = sum_k A[p, k] * B[k, o]     A, B, C float32

B is packed once as [O/16][K][16] (the last block padded with zero weights): one k gives two
8-lane vectors of 16 output channels. The micro-kernel keeps 6 pixels x 16 channels in 12
accumulators; each step broadcasts one value of A per pixel and does 12 fused multiply-adds.
A convolution gathers each chunk of pixels' windows from the channel-last image into rows,
multiplies them and adds the bias and activation in the same parallel region. The sums run
in another order than im2col + BLAS does: results agree with the reference to float32
rounding (the tests' tolerance), not bit for bit.
"""
from __future__ import annotations


import numpy as np
from numba import njit, prange

from .llvm_loops import cpu_has, declare, gemm_definition, gemm_intrinsic, panel_gemm, splat
from .kernels_fp32 import clamp
from .vnni import _windows

BLOCK = 16
ROWS = 6


def available() -> bool:
    return cpu_has("avx2") and cpu_has("fma")


@gemm_definition("eqquant_fma_sgemm", "float")
def define_sgemm(mod, fn, args, b):
    """``void eqquant_fma_sgemm(A, lda, B, C, ldc, p0, p1, k, oblocks)`` (A, B, C float32;
    lda and ldc in elements)."""
    from llvmlite import ir
    v8 = ir.VectorType(ir.FloatType(), 8)
    fma = declare(mod, "llvm.fma.v8f32", ir.FunctionType(v8, [v8, v8, v8]))
    a_ptr = args[0]

    def row_step(bc, start, k, accs, weights):
        av = splat(bc, bc.load(bc.gep(a_ptr, [bc.add(start, k)]), align=4), v8)
        return [bc.call(fma, [av, weights[j], accs[j]]) for j in range(2)]

    panel_gemm(fn, b, args, rows=ROWS, block=BLOCK, panel=BLOCK, weights=(8, 2, v8, 4),
               accumulators=(2, v8), row_step=row_step)


def pack(w: np.ndarray) -> np.ndarray:
    """float32 weights (O, K) -> B packed [ceil(O/16)][K][16] (zero rows pad the last block)."""
    o, k = w.shape
    op = -(-o // BLOCK) * BLOCK
    padded = np.zeros((op, k), np.float32)
    padded[:o] = w
    return np.ascontiguousarray(padded.reshape(op // BLOCK, BLOCK, k).transpose(0, 2, 1))


sgemm_block = gemm_intrinsic(define_sgemm, "float")


@njit(cache=True)
def sgemm(a, packed, out):
    """out (P, O') = a (P, K) @ B, O' the padded width."""
    sgemm_block(a.ctypes.data, a.shape[1], packed.ctypes.data, out.ctypes.data, out.shape[1],
                0, a.shape[0], packed.shape[1], packed.shape[0])


@njit(parallel=True, cache=True)
def conv(hwc, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, packed, bias, lo, hi, out):
    """A float convolution of one image in one parallel region: hwc (H, W, C) float32 ->
    out (O, oh*ow): windows, GEMM, bias and activation (a clamp to [lo, hi], float32)
    a chunk of pixels at a time. A 1x1 convolution with stride 1 and no padding multiplies
    the image's own rows (no copy)."""
    p_n = oh * ow
    o_n = out.shape[0]
    oblocks, k = packed.shape[0], packed.shape[1]
    width = oblocks * BLOCK
    h, w, c = hwc.shape
    pointwise = kh == 1 and kw == 1 and sh == 1 and sw == 1 and pt == 0 and pl == 0 and \
        ow == w and c == k
    flat = hwc.reshape(h * w, c)
    for item in prange((p_n + 95) // 96):
        p0 = item * 96
        n = min(p_n, p0 + 96) - p0
        if pointwise:
            rows = flat[p0:p0 + n]
        else:
            rows = np.empty((n, k), np.float32)
            _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, np.float32(0.0), ow, p0, rows)
        acc = np.empty((n, width), np.float32)
        sgemm_block(rows.ctypes.data, k, packed.ctypes.data, acc.ctypes.data, width, 0, n, k,
                    oblocks)
        for r in range(n):      # bias and activation along each pixel's row (vectorises)
            a = acc[r]
            for o in range(o_n):
                a[o] = clamp(a[o] + bias[o], lo, hi)
        for o in range(o_n):    # then written out channel by channel (NCHW)
            dst = out[o]
            for r in range(n):
                dst[p0 + r] = acc[r, o]
