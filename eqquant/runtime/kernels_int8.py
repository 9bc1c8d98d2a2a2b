"""Numba kernels for the integer ops of a quantized program (portable: plain loops, no
instruction-set intrinsics), compiled once and cached on disk like the fp32 kernels.

Convolutions are im2col (int8) then an int8 x int8 -> int32 GEMM, parallel over output
channels; requantization is TVM's fixed-point multiply (Q31 multiplier, shift, ties upward),
bit for bit.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def im2col_i8(x, zero, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, col):
    """x: (C, H, W) int8/uint8 -> col: (C*kh*kw, oh*ow); padding reads ``zero`` (the input's
    zero point, so that padding stands for the real value 0)."""
    c_in, h, w = x.shape
    for row in prange(c_in * kh * kw):
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


@njit(parallel=True, cache=True)
def gemm_i8(w, zw, col, zx, out):
    """out[o, p] = sum_k (w[o, k] - zw[o]) * (col[k, p] - zx), in int32."""
    rows, depth = w.shape
    cols = col.shape[1]
    for o in prange(rows):
        acc = np.zeros(cols, np.int32)
        for k in range(depth):
            a = np.int32(w[o, k]) - zw[o]
            if a == 0:
                continue
            for p in range(cols):
                acc[p] += a * (np.int32(col[k, p]) - zx)
        for p in range(cols):
            out[o, p] = acc[p]


@njit(parallel=True, cache=True)
def requantize(q, zin, multiplier, shift, zout, lo, hi, out):
    """Flat: out = clip(fixed_point_multiply(q - zin, multiplier, shift) + zout, lo, hi)."""
    left = max(shift, 0)
    total = max(-shift, 0) + 31
    half = np.int64(1) << (total - 1)
    for i in prange(q.size):
        v = (np.int64(q[i]) - zin) << left
        v = (v * multiplier + half) >> total
        v = v + zout
        out[i] = min(max(v, lo), hi)


@njit(parallel=True, cache=True)
def quantize(x, scale, zero, lo, hi, out):
    """Flat: out = clip(round_half_even(x / scale) + zero, lo, hi)."""
    for i in prange(x.size):
        v = np.int64(np.rint(np.float32(x[i]) / scale)) + zero
        out[i] = min(max(v, lo), hi)


@njit(parallel=True, cache=True)
def dequantize(q, zero, scale, out):
    for i in prange(q.size):
        out[i] = np.float32(np.int64(q[i]) - zero) * scale
