"""Image ops: image.resize2d (Relay's name; ONNX Resize), nearest and bilinear, with the
coordinate conventions PyTorch and TensorFlow export."""
from __future__ import annotations

import numpy as np

from ..core.types import TensorType
from .attrs import PAIR, REQUIRED, Attr, StrKind
from .onnx_conventions import OnnxFormError, rank4, text
from .registry import OnnxForm, OpDef, OpTypeError, register
from .typerel import tensor

METHODS = ("nearest_neighbor", "linear")
COORDINATES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
ROUNDING = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize_rel(types, attrs):
    x = tensor(types, 0, "data", rank=4)
    oh, ow = attrs["size"]
    if oh < 1 or ow < 1:
        raise OpTypeError(f"size {attrs['size']} must be positive")
    if attrs["method"] == "linear" and not x.dtype.startswith("float"):
        raise OpTypeError(f"linear resizing of {x.dtype} values (it needs floats)", arg=0)
    return TensorType(x.shape[:2] + (oh, ow), x.dtype)


def source_coordinates(out_len: int, in_len: int, mode: str) -> np.ndarray:
    """Where each output position samples the input, in float32 arithmetic as ONNX Runtime
    computes it (ONNX's coordinate_transformation_mode; scale = out / in)."""
    x = np.arange(out_len, dtype=np.float32)
    scale = np.float32(out_len) / np.float32(in_len)
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and out_len > 1):
        return (x + np.float32(0.5)) / scale - np.float32(0.5)
    if mode == "asymmetric":
        return x / scale
    if mode == "align_corners" and out_len > 1:
        return x * np.float32(in_len - 1) / np.float32(out_len - 1)
    return np.zeros(out_len, np.float32)


def _nearest(coords: np.ndarray, in_len: int, rounding: str) -> np.ndarray:
    below = np.floor(coords)
    half = coords - below == 0.5
    picked = {"floor": below, "ceil": np.ceil(coords),
              "round_prefer_floor": np.where(half, below, np.round(coords)),
              "round_prefer_ceil": np.where(half, below + 1, np.round(coords))}[rounding]
    return np.clip(picked, 0, in_len - 1).astype(np.intp)


def _linear(x: np.ndarray, axis: int, coords: np.ndarray) -> np.ndarray:
    """Interpolate ``x`` along ``axis`` at ``coords`` (clamped into the input, as ONNX Runtime
    does), in float64."""
    n = x.shape[axis]
    c = np.clip(coords.astype(np.float64), 0, n - 1)
    lo = np.floor(c).astype(np.intp)
    hi = np.minimum(lo + 1, n - 1)
    frac = (c - lo).reshape([-1 if i == axis else 1 for i in range(x.ndim)])
    return np.take(x, lo, axis=axis) * (1 - frac) + np.take(x, hi, axis=axis) * frac


def _resize(x, *, size, layout, method, coordinate_transformation_mode, rounding_method):
    (oh, ow), (h, w) = size, x.shape[2:]
    ch = source_coordinates(oh, h, coordinate_transformation_mode)
    cw = source_coordinates(ow, w, coordinate_transformation_mode)
    if method == "nearest_neighbor":
        rows = _nearest(ch, h, rounding_method)
        cols = _nearest(cw, w, rounding_method)
        return np.ascontiguousarray(x[:, :, rows][:, :, :, cols])
    y = _linear(_linear(x.astype(np.float64), 2, ch), 3, cw)
    return y.astype(x.dtype)


def _resize_from_onnx(im, attrs, ins):
    """Resize (opset 10: X, scales; 11+: X, roi, scales, sizes) over H and W only."""
    x = im.value(ins[0])
    shape = rank4(im, x, "resizing").shape
    mode = text(attrs.get("mode", "nearest"))
    if mode not in ("nearest", "linear"):
        raise OnnxFormError(f"Resize mode '{mode}' is not supported (nearest, linear)")
    default_ctm = "asymmetric" if im.opset < 11 else "half_pixel"
    ctm = text(attrs.get("coordinate_transformation_mode", default_ctm))
    if ctm not in COORDINATES:
        raise OnnxFormError(f"Resize coordinate_transformation_mode '{ctm}' is not supported "
                            f"({', '.join(COORDINATES)})")
    nearest = text(attrs.get("nearest_mode", "round_prefer_floor"))
    if nearest not in ROUNDING:
        raise OnnxFormError(f"Resize nearest_mode '{nearest}' is not supported")
    for name, neutral in (("exclude_outside", 0), ("antialias", 0)):
        if attrs.get(name, neutral) != neutral:
            raise OnnxFormError(f"Resize {name}={attrs[name]} is not supported")
    if attrs.get("axes") is not None or \
            text(attrs.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        raise OnnxFormError("Resize with axes or a keep_aspect_ratio_policy is not supported")
    scales_in, sizes_in = (ins[1], None) if im.opset < 11 else \
        (ins[2] if len(ins) > 2 else "", ins[3] if len(ins) > 3 else "")
    scales = np.asarray(im.const(scales_in, "Resize's scales"), np.float32).reshape(-1) \
        if scales_in else np.zeros(0, np.float32)      # (an empty tensor stands for none)
    if sizes_in:
        sizes = im.const_ints(sizes_in, "Resize's sizes")
    elif scales.size:
        if scales.shape != (4,):
            raise OnnxFormError(f"Resize's scales {scales.tolist()} should give 4 values")
        sizes = [int(np.floor(d * s)) for d, s in zip(shape, scales)]
        if any(np.float32(o) / np.float32(d) != s for o, d, s in zip(sizes, shape, scales)):
            raise OnnxFormError(f"Resize's scales {scales.tolist()} do not give whole sizes "
                                f"of {list(shape)}: give sizes instead")
    else:
        raise OnnxFormError("Resize needs constant scales or sizes")
    if len(sizes) != 4 or list(sizes[:2]) != list(shape[:2]):
        raise OnnxFormError(f"Resize to {list(sizes)} from {list(shape)}: only H and W may "
                            f"change")
    return im.call("image.resize2d", x, size=list(sizes[2:]),
                   method="nearest_neighbor" if mode == "nearest" else "linear",
                   coordinate_transformation_mode=ctm, rounding_method=nearest)


def _upsample_from_onnx(im, attrs, ins):
    """Upsample (opsets 7 to 9, before Resize): scales as an attribute (7, 8) or a constant
    input (9), nearest or linear, sampling at asymmetric coordinates (out / scale), nearest
    rounding down, as ONNX Runtime computes it."""
    x = im.value(ins[0])
    shape = rank4(im, x, "upsampling").shape
    mode = text(attrs.get("mode", "nearest"))
    if mode not in ("nearest", "linear", "bilinear"):
        raise OnnxFormError(f"Upsample mode '{mode}' is not supported (nearest, linear)")
    if "scales" in attrs:
        scales = np.asarray(attrs["scales"], np.float32)
    elif len(ins) > 1 and ins[1]:
        scales = np.asarray(im.const(ins[1], "Upsample's scales"), np.float32).reshape(-1)
    else:
        raise OnnxFormError("Upsample needs scales")
    if scales.shape != (4,) or list(scales[:2]) != [1, 1] or (scales < 1).any():
        raise OnnxFormError(f"Upsample's scales {scales.tolist()}: only H and W may grow")
    sizes = [int(np.floor(d * sc)) for d, sc in zip(shape[2:], scales[2:])]
    return im.call("image.resize2d", x, size=sizes,
                   method="nearest_neighbor" if mode == "nearest" else "linear",
                   coordinate_transformation_mode="asymmetric", rounding_method="floor")


def _resize_to_onnx(ex, node, ins):
    a = node.attrs
    n, c = ex.type(node.args[0]).shape[:2]
    sizes = ex.const(np.asarray([n, c, *a["size"]], np.int64))
    return ex.emit("Resize", [ins[0], "", "", sizes],
                   mode="nearest" if a["method"] == "nearest_neighbor" else "linear",
                   coordinate_transformation_mode=a["coordinate_transformation_mode"],
                   nearest_mode=a["rounding_method"])


def _resize_qdq(w, node):
    """ONNX's QDQ form of a nearest resize of an 8-bit value: it picks elements, so it runs on
    the 8-bit tensor itself, keeping its scale and zero point."""
    q = w.params(node.args[0])
    if q is None or node.attrs["method"] != "nearest_neighbor":
        raise w.unsupported(node)
    return w.keep(node, q, w.ex.call_on(node, w.ex.name_of(node.args[0])))


register(OpDef(
    "image.resize2d", inputs=("data",),
    attrs=(Attr("size", PAIR, REQUIRED),
           Attr("layout", StrKind("layout", choices=("NCHW",)), "NCHW"),
           Attr("method", StrKind("method", choices=METHODS), "linear"),
           Attr("coordinate_transformation_mode", StrKind("mode", choices=COORDINATES),
                "half_pixel"),
           Attr("rounding_method", StrKind("rounding", choices=ROUNDING),
                "round_prefer_floor")),
    onnx=(OnnxForm("Resize", convert=_resize_from_onnx, export=_resize_to_onnx,
                   qdq=_resize_qdq),
          OnnxForm("Upsample", convert=_upsample_from_onnx)),
    type_rel=_resize_rel, semantics=_resize,
    flops=lambda ins, out, a: float(out.size * (4 if a["method"] == "linear" else 1)),
    doc="resize H and W to size: nearest (a gather: any dtype) or bilinear (floats), "
        "sampling where coordinate_transformation_mode says"))
