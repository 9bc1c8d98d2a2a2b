"""ONNX's conventions that several ops' ONNX forms share (``OnnxForm.convert`` / ``export``):
the error a form raises, windows over 1 to 3 axes (``auto_pad``, pads, kernel shapes, 1-d
windows as 2-d ones a row high), axes given as an attribute or an input. Machinery only: which op reads or writes what is on each op's entry.
Nothing here imports onnx; the importer and exporter are passed in."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np


class OnnxFormError(Exception):
    """An ONNX node an op's form cannot express; the importer adds the file and the node."""


def text(value: Any) -> Any:
    """An ONNX string attribute as ``str`` (onnx gives bytes; bytes that are not UTF-8 are
    a damaged model, said as such)."""
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise OnnxFormError(f"a string attribute is not UTF-8 text: {value[:40]!r}") from None


def rank4(im, x, what: str):
    """The type of ``x``, which must be an NCHW tensor (2-d ``what``)."""
    t = im.type(x)
    if t.rank != 4:
        raise OnnxFormError(f"only 2-d {what} on NCHW tensors is supported; the input has "
                            f"rank {t.rank}")
    return t


def pads(attrs: Mapping[str, Any], in_sizes, kernel, strides, dilations) -> list[int]:
    """Every spatial axis's padding before, then every axis's after ([top, left, bottom,
    right] in 2-d), from ``pads`` or ``auto_pad`` (SAME_UPPER puts the odd pixel at the end,
    SAME_LOWER at the start)."""
    n = len(in_sizes)
    auto = text(attrs.get("auto_pad", "NOTSET"))
    if auto in ("NOTSET", ""):
        given = list(attrs.get("pads", [0] * (2 * n)))
        if len(given) != 2 * n:
            raise OnnxFormError(f"pads {given} should have {2 * n} values for a {n}-d window")
        return given
    if auto == "VALID":
        return [0] * (2 * n)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise OnnxFormError(f"auto_pad '{auto}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, "
                            "VALID")
    begin, end = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin + end


def spatial_axes(im, x, what: str, dims=(2,)) -> int:
    """How many spatial axes ``x`` (N, C, *spatial) has: one of ``dims``, or a located
    refusal saying which ``what`` eqquant takes."""
    t = im.type(x)
    if t.rank - 2 not in dims:
        said = " and ".join(f"{d}-d" for d in dims)
        raise OnnxFormError(f"only {said} {what} on channel-first tensors are supported; the "
                            f"input has rank {t.rank}")
    return t.rank - 2


def window(im, attrs: Mapping[str, Any], x, dims=(2,)) -> dict:
    """A pool's window attributes (pool_size, strides, dilation, padding, ceil_mode) over
    the spatial axes of ``x``."""
    n = spatial_axes(im, x, "pooling", dims)
    kernel = list(attrs["kernel_shape"]) if "kernel_shape" in attrs else None
    if kernel is None or len(kernel) != n:
        raise OnnxFormError(f"kernel_shape {kernel} should give {n} values")
    strides = list(attrs.get("strides", [1] * n))
    dil = list(attrs.get("dilations", [1] * n))
    if len(strides) != n or len(dil) != n:
        raise OnnxFormError(f"strides {strides} and dilations {dil} should give {n} values")
    return dict(pool_size=kernel, strides=strides, dilation=dil,
                padding=pads(attrs, im.type(x).shape[2:], kernel, strides, dil),
                ceil_mode=bool(attrs.get("ceil_mode", 0)))


def unit_row(attrs: Mapping[str, Any]) -> dict:
    """A 1-d window's ONNX attributes as those of a 2-d window one row high."""
    out = dict(attrs)
    for key, row in (("kernel_shape", 1), ("strides", 1), ("dilations", 1),
                     ("output_padding", 0)):
        if key in attrs:
            if len(attrs[key]) != 1:
                raise OnnxFormError(f"{key} {list(attrs[key])} should give 1 value")
            out[key] = [row, *attrs[key]]
    if "pads" in attrs:
        if len(attrs["pads"]) != 2:
            raise OnnxFormError(f"pads {list(attrs['pads'])} should have 2 values for a 1-d "
                                "window")
        out["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
    if "output_shape" in attrs:
        out["output_shape"] = [1, *attrs["output_shape"]]
    return out


def one_d_as_rows(convert, lifted: int = 1):
    """A 2-d form's ``convert`` that also reads the 1-d op: a (N, C, L) input (and, for a
    convolution, its (O, C, K) weight: ``lifted=2``) is the 2-d op's on (N, C, 1, L) (and
    (O, C, 1, K)) with a window one row high, its result's unit row squeezed away. The
    kernels of 2-d convolutions and pools then run it."""
    def convert_rows(im, attrs, ins):
        if not ins or im.type(im.value(ins[0])).rank != 3:
            return convert(im, attrs, ins)
        names = list(ins)
        for i in range(min(lifted, len(ins))):
            if not ins[i]:
                continue
            alias = f"{ins[i]}_row"
            while alias in im.values or alias in im.consts:
                alias += "_"
            if ins[i] in im.consts and ins[i] not in im.values:
                im.consts[alias] = np.expand_dims(im.consts[ins[i]], 2)
            else:
                im.values[alias] = im.call("expand_dims", im.value(ins[i]), axis=2)
            names[i] = alias
        out = convert(im, unit_row(attrs), names)
        if isinstance(out, list):
            return [im.call("squeeze", out[0], axis=[2]), *out[1:]]
        return im.call("squeeze", out, axis=[2])
    convert_rows.__doc__ = convert.__doc__
    return convert_rows


def window_to_onnx(a: Mapping[str, Any]) -> dict:
    """A pool's window attributes in ONNX's names."""
    return dict(kernel_shape=list(a["pool_size"]), strides=list(a["strides"]),
                pads=list(a["padding"]), ceil_mode=int(a["ceil_mode"]))


def conv_to_onnx(a: Mapping[str, Any], weight_shape) -> dict:
    """A convolution's attributes in ONNX's names."""
    return dict(strides=list(a["strides"]), pads=list(a["padding"]),
                dilations=list(a["dilation"]), group=a["groups"],
                kernel_shape=list(weight_shape[2:]))


def axes(im, attrs: Mapping[str, Any], ins, what: str) -> list[int] | None:
    """Axes given as the second input (opset >= 13) or as the ``axes`` attribute."""
    if len(ins) > 1 and ins[1]:
        return im.const_ints(ins[1], f"{what}'s axes")
    return list(attrs["axes"]) if "axes" in attrs else None
