"""Reference numerics of the windowed ops (conv2d and the pools) in plain numpy.

These are the semantic ground truth: clear rather than fast. Floats accumulate in float64 and
integers in int64, then the result is cast to the output dtype.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..core.types import default_compute_dtype


def out_size(size: int, k: int, stride: int, dilation: int, pad_before: int, pad_after: int,
             ceil_mode: bool = False) -> int:
    """Output length of a window sweep. With ``ceil_mode`` a partial last window counts, but
    (as PyTorch and ONNX Runtime do) never one that starts in the trailing padding."""
    span = dilation * (k - 1) + 1
    total = size + pad_before + pad_after - span
    if ceil_mode:
        out = -(-total // stride) + 1
        if (out - 1) * stride >= size + pad_before:
            out -= 1
        return out
    return total // stride + 1


def padding_only_window(size: int, k: int, stride: int, dilation: int, pad_before: int,
                        pad_after: int, ceil_mode: bool = False) -> int | None:
    """The first output position whose window reads only padding (a dilated window can
    straddle the input even when no padding is wider than half of it), or None."""
    for o in range(out_size(size, k, stride, dilation, pad_before, pad_after, ceil_mode)):
        start = o * stride - pad_before
        if not any(0 <= start + j * dilation < size for j in range(k)):
            return o
    return None


def acc_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype.kind == "f" else np.dtype(np.int64)


def windows(x: np.ndarray, kernel, strides, dilation, padding, pad_value,
            ceil_mode: bool = False, extra_value=None) -> np.ndarray:
    """(N, C, *spatial) -> (N, C, *out, *kernel) windows of the padded input, for any number
    of spatial axes; ``padding`` is every axis's padding before, then every axis's after
    ([top, left, bottom, right] in 2-d). ``extra_value`` fills what ceil_mode reads past the
    explicit padding (default: ``pad_value``)."""
    k = len(kernel)
    before, after = padding[:k], padding[k:]
    outs = [out_size(x.shape[2 + i], kernel[i], strides[i], dilation[i], before[i], after[i],
                     ceil_mode) for i in range(k)]
    # with ceil_mode the last window may run past the padding: pad further on the far side
    extra = [max(0, (o - 1) * s + d * (kk - 1) + 1 - (n + b + a))
             for o, s, d, kk, n, b, a in zip(outs, strides, dilation, kernel, x.shape[2:],
                                             before, after)]
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple(zip(before, after)), constant_values=pad_value)
    if any(extra):
        xp = np.pad(xp, ((0, 0), (0, 0)) + tuple((0, e) for e in extra),
                    constant_values=pad_value if extra_value is None else extra_value)
    win = sliding_window_view(xp, tuple(d * (kk - 1) + 1 for d, kk in zip(dilation, kernel)),
                              axis=tuple(range(2, 2 + k)))
    return win[(slice(None), slice(None))
               + tuple(slice(None, (o - 1) * s + 1, s) for o, s in zip(outs, strides))
               + tuple(slice(None, None, d) for d in dilation)]


# Layouts: NCHW data with OIHW weights, or NHWC (channels last, as TensorFlow and TFLite
# write programs) with HWIO weights. The arithmetic is done in NCHW/OIHW; these move the axes.
KERNEL_LAYOUT_OF = {"NCHW": "OIHW", "NHWC": "HWIO"}
_TO_NCHW = {"NCHW": (0, 1, 2, 3), "NHWC": (0, 3, 1, 2)}
_FROM_NCHW = {"NCHW": (0, 1, 2, 3), "NHWC": (0, 2, 3, 1)}
_TO_OIHW = {"OIHW": (0, 1, 2, 3), "HWIO": (3, 2, 0, 1)}


def _permuted(shape_or_array, perm):
    """A shape (a tuple) or an array (a view) with its axes in the order ``perm``."""
    if isinstance(shape_or_array, np.ndarray):
        return shape_or_array.transpose(perm)
    return tuple(shape_or_array[i] for i in perm)


def to_nchw(shape_or_array, layout: str):
    """An NCHW shape or array view of data in ``layout``."""
    return _permuted(shape_or_array, _TO_NCHW[layout])


def from_nchw(shape_or_array, layout: str):
    return _permuted(shape_or_array, _FROM_NCHW[layout])


def to_oihw(shape_or_array, kernel_layout: str):
    return _permuted(shape_or_array, _TO_OIHW[kernel_layout])


def conv2d(x: np.ndarray, w: np.ndarray, *, strides, padding, dilation, groups, out_dtype,
           data_layout="NCHW", kernel_layout="OIHW", **_ignored) -> np.ndarray:
    if data_layout != "NCHW" or kernel_layout != "OIHW":
        y = conv2d(to_nchw(x, data_layout), to_oihw(w, kernel_layout), strides=strides,
                   padding=padding, dilation=dilation, groups=groups, out_dtype=out_dtype)
        return np.ascontiguousarray(from_nchw(y, data_layout))
    return conv(x, w, strides=strides, padding=padding, dilation=dilation, groups=groups,
                out_dtype=out_dtype)


def conv(x: np.ndarray, w: np.ndarray, *, strides, padding, dilation, groups, out_dtype,
         **_ignored) -> np.ndarray:
    """A convolution over any number of spatial axes: (N, C, *spatial) data, (O, C/groups,
    *kernel) weight; each group's windows times its weights, as one matrix product."""
    acc = acc_dtype(np.result_type(x.dtype, w.dtype))
    n, c = x.shape[:2]
    o, cg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    k = len(kernel)
    win = windows(x.astype(acc), kernel, strides, dilation, padding, 0)
    outs = win.shape[2:2 + k]
    g = groups
    og = o // g
    # (N, G, Cg, *out, *kernel) -> (G, N*prod(out), Cg*prod(kernel))
    cols = win.reshape((n, g, cg) + outs + kernel).transpose(
        (1, 0) + tuple(range(3, 3 + k)) + (2,) + tuple(range(3 + k, 3 + 2 * k)))
    cols = cols.reshape(g, n * int(np.prod(outs)), cg * int(np.prod(kernel)))
    wmat = w.astype(acc).reshape(g, og, -1).transpose(0, 2, 1)
    out = np.matmul(cols, wmat)  # (G, N*prod(out), Og)
    out = out.reshape((g, n) + outs + (og,)).transpose(
        (1, 0, 2 + k) + tuple(range(2, 2 + k))).reshape((n, o) + outs)
    return out.astype(out_dtype or default_compute_dtype(str(x.dtype), str(w.dtype)))


# Degenerate ranges. A value that was always 0 (a relu that never fired) gets the scale 1.0,
# as TVM gives it: any scale represents 0 exactly, and a large one keeps the biases of the
# layers that read it representable in int32. A range narrower than 255 * MIN_SCALE but not
# empty (denormal values) gets MIN_SCALE: a smaller scale would not be a normal float32, and
# its inverse would overflow.
MIN_SCALE = 1e-12


def range_params(lo: float, hi: float, symmetric: bool) -> tuple[float, int]:
    """(scale, zero point) of the finite range [lo, hi]: symmetric int8 (max |x| / 127, zero
    point 0), or asymmetric uint8 covering zero ((hi - lo) / 255, the zero point rounding
    -lo / scale half to even); the scale is a float32 value, computed in float64 and rounded
    once. Calibration's parameters (``quant.annotate.qparams``) and dynamic quantization's,
    computed at run time from ``qnn.dynamic_range`` (``qnn.dynamic_scale``; its kernel
    compiles this function), are this one function."""
    if symmetric:
        m = max(abs(lo), abs(hi))
        if m == 0.0:
            return 1.0, 0
        return max(float(np.float32(m / 127.0)), MIN_SCALE), 0
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi == lo:
        return 1.0, 0
    scale = max(float(np.float32((hi - lo) / 255.0)), MIN_SCALE)
    return scale, int(min(max(np.rint(-lo / scale), 0.0), 255.0))


def qrange(dtype) -> tuple[int, int]:
    """The integers a quantized ``dtype`` saturates to: int8 is symmetric, [-127, 127], as
    TVM's realize clips it (so -q is always representable and a symmetric scale max|x| / 127
    maps both ends exactly); uint8 is [0, 255]; wider integers their whole range."""
    dtype = np.dtype(dtype)
    if dtype == np.int8:
        return -127, 127
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _channels_last(pool):
    """A pool over NCHW, run on NHWC data (``layout="NHWC"``) between two transposes."""
    def run(x, *, layout="NCHW", **attrs):
        if layout == "NCHW":
            return pool(x, **attrs)
        return np.ascontiguousarray(from_nchw(pool(to_nchw(x, layout), **attrs), layout))
    run.__doc__ = pool.__doc__
    return run


def max_pool(x: np.ndarray, *, pool_size, strides, dilation, padding, ceil_mode,
             **_ignored) -> np.ndarray:
    """Each window's maximum, its taps taken in order (the first axis slowest) from the
    dtype's least value: a tap replaces the maximum so far where it is larger, or NaN. So
    NaN wins, and of equal values the first stays: -0.0 before 0.0 gives -0.0, 0.0 before
    -0.0 gives 0.0. (numpy's ``max`` over the window axes picked among signed zeros by its
    own order of reduction: the kernels' bits could not be its bits.) Any number of spatial
    axes."""
    k = len(pool_size)
    win = windows(x, tuple(pool_size), strides, dilation, padding, _lowest(x.dtype), ceil_mode)
    acc = np.full(win.shape[:2 + k], _lowest(x.dtype), x.dtype)
    for tap_at in np.ndindex(*win.shape[2 + k:]):
        tap = win[(Ellipsis,) + tap_at]
        acc = np.where(tap > acc, tap, acc)
        if x.dtype.kind == "f":
            acc = np.where(tap != tap, tap, acc)
    return acc


def avg_pool(x: np.ndarray, *, pool_size, strides, dilation, padding, ceil_mode,
             count_include_pad, **_ignored) -> np.ndarray:
    """Each window's mean over its real elements, and its explicit padding if
    ``count_include_pad`` (never what ceil_mode reads past it); integers round toward 0.
    Any number of spatial axes."""
    k = len(pool_size)
    acc = acc_dtype(x.dtype)
    args = (tuple(pool_size), strides, dilation, padding)
    taps = tuple(range(2 + k, 2 + 2 * k))
    sums = windows(x.astype(acc), *args, 0, ceil_mode).sum(axis=taps)
    # how many elements each window averages: real ones, plus explicit padding if asked
    ones = np.ones((1, 1) + x.shape[2:], dtype=acc)
    counts = windows(ones, *args, 1 if count_include_pad else 0, ceil_mode,
                     extra_value=0).sum(axis=taps)
    if x.dtype.kind == "f":
        return (sums / counts).astype(x.dtype)
    return np.trunc(sums / counts).astype(x.dtype)


max_pool2d = _channels_last(max_pool)
avg_pool2d = _channels_last(avg_pool)


def trunc_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division rounding toward zero (TVM's ``divide`` on integers)."""
    q = np.abs(a) // np.abs(b)
    return (np.sign(a) * np.sign(b) * q).astype(np.result_type(a, b))


def fixed_point_multiply(x: np.ndarray, multiplier: int, shift: int,
                         rounding: str = "UPWARD") -> np.ndarray:
    """TVM's ``fixed_point_multiply``: round(x * multiplier * 2**(shift - 31)) in int64.

    ``x`` is shifted left by ``max(shift, 0)``, multiplied by the Q31 ``multiplier``, and
    shifted right by ``31 + max(-shift, 0)`` after adding half (UPWARD: ties go up) or, with
    TONEAREST, half minus one for negative products (ties go away from zero). The result is cast
    back to the input dtype, as TVM does.
    """
    left, right = max(shift, 0), max(-shift, 0)
    total = right + 31
    if total >= 63:         # (|x * multiplier| < 2**62 rounds to 0; int64 shifts stop at 63)
        return np.zeros_like(x)
    v = x.astype(np.int64) << np.int64(left)
    v = v * np.int64(multiplier)
    half = np.int64(1) << np.int64(total - 1)
    if rounding == "TONEAREST":
        v = v + np.where(v >= 0, half, half - 1)
    else:
        v = v + half
    return (v >> np.int64(total)).astype(x.dtype)


def conv2d_transpose(x: np.ndarray, w: np.ndarray, *, strides, padding, dilation, groups,
                     output_padding, out_dtype, **_ignored) -> np.ndarray:
    """The gradient of conv2d with respect to its input (ONNX's ConvTranspose): every input
    pixel adds its weight window, scaled, to the output. Computed as the stride-1 convolution
    of the input spread out by the stride (zeros between pixels), padded by the kernel's span
    less ``padding`` (cropped where that is negative), with each group's weight transposed
    (IOHW -> OIHW) and flipped."""
    n, c, h, wd = x.shape
    ci, og, kh, kw = w.shape
    g, ig = groups, c // groups
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    oph, opw = output_padding
    acc = acc_dtype(np.result_type(x.dtype, w.dtype))
    spread = np.zeros((n, c, (h - 1) * sh + 1, (wd - 1) * sw + 1), acc)
    spread[:, :, ::sh, ::sw] = x
    before = (dh * (kh - 1) - pt, dw * (kw - 1) - pl)
    after = (dh * (kh - 1) - pb + oph, dw * (kw - 1) - pr + opw)
    spread = np.pad(spread, ((0, 0), (0, 0), (max(before[0], 0), max(after[0], 0)),
                             (max(before[1], 0), max(after[1], 0))))
    spread = spread[:, :, max(-before[0], 0):spread.shape[2] - max(-after[0], 0),
                    max(-before[1], 0):spread.shape[3] - max(-after[1], 0)]
    flipped = w.astype(acc).reshape(g, ig, og, kh, kw).transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1]
    return conv2d(spread, np.ascontiguousarray(flipped.reshape(g * og, ig, kh, kw)),
                  strides=[1, 1], padding=[0, 0, 0, 0], dilation=[dh, dw], groups=g,
                  out_dtype=out_dtype or default_compute_dtype(str(x.dtype), str(w.dtype)))
