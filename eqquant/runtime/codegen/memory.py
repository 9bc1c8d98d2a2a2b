"""Arrays on 64-byte boundaries (a cache line, one AVX-512 vector): the executor's
activation buffers, the GEMMs' packed weight panels (``panels``) and the depthwise taps.

NumPy aligns an allocation to 16 bytes only. A 64-byte load from an address 16 bytes past a
line touches two lines: the depthwise sweep ran about 1.6 times as long an output vector
on such arrays as on aligned ones, and the float GEMM a few percent faster on aligned
panels.

    >>> a = empty((3, 5), np.float32)
    >>> a.ctypes.data % ALIGN, a.shape, a.flags.c_contiguous
    (0, (3, 5), True)
"""
from __future__ import annotations

import numpy as np

ALIGN = 64


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose first element is ALIGN-byte aligned."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def aligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, ALIGN-byte aligned copy of ``a`` (``a`` itself when it is both)."""
    if a.flags.c_contiguous and a.ctypes.data % ALIGN == 0:
        return a
    out = empty(a.shape, a.dtype)
    out[...] = a
    return out


def panels(w: np.ndarray, block: int, group: int, kp: int, dtype) -> np.ndarray:
    """Weights (O, K) -> [ceil(O / block)][kp / group][block][group] as ``dtype``, aligned:
    each block of output channels one contiguous panel, ``group`` k-values of one channel
    side by side (one lane's operands), the channels past O and the k-values past K zero.
    The SIMD GEMMs' shared layout (int8: ``vnni.pack_panels``; float: ``fma.pack``, group
    1). Each panel is one transposing copy (padding, transposing and aligning the whole in
    three copies was a large share of a first run), of whole groups taken as one number
    where a group is 1, 2, 4 or 8 bytes (a copy of 2- and 4-byte groups as elements of 1 or
    2 bytes took about 4x as long)."""
    o, k = w.shape
    out = empty((-(-o // block), kp // group, block, group), dtype)
    word = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}.get(
        np.dtype(dtype).itemsize * group)
    for ob in range(out.shape[0]):
        rows = w[ob * block:(ob + 1) * block]
        if rows.shape != (block, kp) or (word is not None and rows.dtype != dtype):
            padded = np.zeros((block, kp), dtype)   # a panel padded with zeros (or cast)
            padded[:rows.shape[0], :k] = rows
            rows = padded
        if word is None:
            out[ob] = rows.reshape(block, kp // group, group).transpose(1, 0, 2)
        else:
            words = np.ascontiguousarray(rows).view(word).reshape(block, kp // group)
            out[ob].view(word).reshape(kp // group, block)[:] = words.T
    return out
