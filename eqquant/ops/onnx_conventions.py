"""ONNX's conventions that several ops' ONNX forms share (``OnnxForm.convert`` / ``export``):
the error a form raises, 2-d windows (``auto_pad``, pads, kernel shapes), axes given as an
attribute or an input. Machinery only: which op reads or writes what is on each op's entry.
Nothing here imports onnx; the importer and exporter are passed in."""
from __future__ import annotations

from typing import Any, Mapping


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


def pads(attrs: Mapping[str, Any], in_hw, kernel, strides, dilations) -> list[int]:
    """[top, left, bottom, right] from ``pads`` or ``auto_pad`` (SAME_UPPER puts the odd
    pixel at the end, SAME_LOWER at the start)."""
    auto = text(attrs.get("auto_pad", "NOTSET"))
    if auto in ("NOTSET", ""):
        given = list(attrs.get("pads", [0, 0, 0, 0]))
        if len(given) != 4:
            raise OnnxFormError(f"pads {given} should have 4 values for a 2-d window")
        return given
    if auto == "VALID":
        return [0, 0, 0, 0]
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise OnnxFormError(f"auto_pad '{auto}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, "
                            "VALID")
    begin, end = [], []
    for n, k, s, d in zip(in_hw, kernel, strides, dilations):
        total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin + end


def window(im, attrs: Mapping[str, Any], x) -> dict:
    """A pool's window attributes (pool_size, strides, dilation, padding, ceil_mode)."""
    t = rank4(im, x, "pooling")
    kernel = list(attrs["kernel_shape"]) if "kernel_shape" in attrs else None
    if kernel is None or len(kernel) != 2:
        raise OnnxFormError(f"kernel_shape {kernel} should give 2 values")
    strides = list(attrs.get("strides", [1, 1]))
    dil = list(attrs.get("dilations", [1, 1]))
    return dict(pool_size=kernel, strides=strides, dilation=dil,
                padding=pads(attrs, t.shape[2:], kernel, strides, dil),
                ceil_mode=bool(attrs.get("ceil_mode", 0)))


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
