"""The left operand of the convolution GEMMs (int8 and fp32 alike): each output pixel's
window of a channel-last image gathered into one row (taps in (tap, channel) order), and how
a convolution's work is shared out: chunks of CHUNK pixels, and on an image of few chunks
also groups of output-channel blocks (``work_split``); the images of a batch are the work
items of one parallel region. The SIMD drivers (``vnni.py``,
``avxvnni.py``, ``avx2.py``, ``fma.py``) call these from their parallel regions."""
from __future__ import annotations

import numpy as np
from numba import njit, prange


SMALL = 192   # images with fewer pixels are split by channel blocks instead of by pixels
CHUNK = 96    # pixels per work item


@njit(cache=True)
def _rows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, n, kp):
    """Pixel rows p0..p0+n of the GEMM's left operand (uint8, (n, kp)): the image's own rows
    when the convolution is 1x1 with stride 1 and no padding and its channels fill kp (a
    view, no copy), else the windows gathered (``_windows``)."""
    h, w, c = hwc.shape
    if kh == 1 and kw == 1 and sh == 1 and sw == 1 and pt == 0 and pl == 0 and c == kp and \
            ow == w:
        return hwc.reshape(h * w, c)[p0:p0 + n]
    rows = np.empty((n, kp), np.uint8)
    _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, rows)
    return rows


ITEMS = 8     # work items wanted: an image of fewer chunks is split by channel blocks too


@njit(cache=True)
def work_split(images, p_n, oblocks):
    """(chunks of CHUNK pixels per image, groups of channel blocks, blocks per group) for a
    batch of ``images`` images of ``p_n`` output pixels: every chunk split into as many groups
    (a power of two, at most the blocks) as make ITEMS work items, so that a 14 x 14 image's 3
    chunks do not leave one worker the work of two. Work item i is image i // (chunks *
    groups), its chunk (i % (chunks * groups)) // groups and its group i % groups."""
    chunks = (p_n + CHUNK - 1) // CHUNK
    groups = 1
    while images * chunks * groups < ITEMS and groups * 2 <= oblocks:
        groups *= 2
    return chunks, groups, (oblocks + groups - 1) // groups


@njit(cache=True)
def _chunk_windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, item, kp):
    """Work item ``item``'s pixels (CHUNK of them from item * CHUNK): (first pixel, their
    rows, ``_rows``)."""
    p0 = item * CHUNK
    return p0, _rows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0,
                     min(p_n, p0 + CHUNK) - p0, kp)


@njit(cache=True)
def _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, rows):
    """Pixel rows p0.. of the image's windows (taps in (tap, channel) order, ``pad`` outside
    the image, zeros in the padding of K) into ``rows`` (n, Kp)."""
    h, w, c_in = hwc.shape
    n, kp = rows.shape
    k = kh * kw * c_in
    span = kw * c_in
    flat = hwc.reshape(h, w * c_in)      # one image row: its pixels' channels, contiguous
    for r in range(n):
        y = (p0 + r) // ow
        xo = (p0 + r) - y * ow
        for i in range(kh):
            iy = y * sh - pt + i * dh
            ix0 = xo * sw - pl
            if dw == 1 and iy >= 0 and iy < h and ix0 >= 0 and ix0 + kw <= w:
                # the kernel row lies inside the image: one contiguous copy of kw pixels
                src = flat[iy, ix0 * c_in:ix0 * c_in + span]
                dst = rows[r, i * span:(i + 1) * span]
                for t in range(span):
                    dst[t] = src[t]
                continue
            for j in range(kw):
                ix = xo * sw - pl + j * dw
                base = (i * kw + j) * c_in
                if iy >= 0 and iy < h and ix >= 0 and ix < w:
                    for c in range(c_in):
                        rows[r, base + c] = hwc[iy, ix, c]
                else:
                    for c in range(c_in):
                        rows[r, base + c] = pad
        for c in range(k, kp):
            rows[r, c] = 0


@njit(parallel=True, cache=True)
def windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, rows):
    """All pixel rows of an image's windows (``_windows``), chunks of CHUNK rows in
    parallel."""
    n = rows.shape[0]
    for t in prange((n + CHUNK - 1) // CHUNK):
        p0 = t * CHUNK
        _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0,
                 rows[p0:min(n, p0 + CHUNK)])
