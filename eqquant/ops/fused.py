"""Fused ops: a heavy op and its epilogue as one registry op, so fusion is an ordinary rewrite
(``rules/fusion.rules``), the rule checker verifies it, and a cost model can price it below its
parts. Each entry also knows its unfused form (``unfuse``), used by the partition view.

    fused.conv2d(%x, %w, %b, padding=[1, 1, 1, 1], activation="relu")
      == nn.relu(add(nn.conv2d(%x, %w, padding=[1, 1, 1, 1]), %b))
"""
from __future__ import annotations

import math

import numpy as np

from ..core.nodes import Call, Expr, freeze_attrs
from ..core.types import TensorType
from . import numerics
from .attrs import FLOAT_F, Attr, StrKind
from .nn import CONV2D_ATTRS, FP32_KERNEL_ATTR, conv2d_flops, conv2d_rel, conv_channels_last, dense, dense_rel
from .onnx_conventions import conv_to_onnx
from .registry import COMPUTE, OnnxForm, OpDef, OpTypeError, get_op, register
from .typerel import broadcast_shapes, tensor

ACTIVATION = StrKind("activation", ("none", "relu", "clip"))
EPILOGUE_ATTRS = (Attr("activation", ACTIVATION, "none"), Attr("a_min", FLOAT_F, -math.inf),
                  Attr("a_max", FLOAT_F, math.inf))
FUSED = "fused"


def _epilogue_rel(out: TensorType, types, attrs) -> TensorType:
    """The bias broadcasts with the core op's result, as ``add`` does (the kernels take the
    per-channel case; the executor computes any other in two steps)."""
    b = tensor(types, 2, "bias")
    shape = broadcast_shapes(out.shape, b.shape)
    if b.dtype != out.dtype or shape is None:
        raise OpTypeError(f"bias {b} must be {out.dtype} and broadcast with {out.shape}", 2)
    return TensorType(shape, out.dtype)


def epilogue_bounds(attrs) -> tuple[float, float]:
    """A fused op's activation as the clamp it is, the one form every kernel and the
    reference apply: none is [-inf, inf], relu [0, inf], clip [a_min, a_max]."""
    activation = attrs.get("activation", "none")
    if activation == "relu":
        return 0.0, math.inf
    if activation == "clip":
        return float(attrs["a_min"]), float(attrs["a_max"])
    return -math.inf, math.inf


def epilogue_calls(attrs) -> tuple[tuple[str, dict], ...]:
    """A fused op's activation as the calls it stands for: (), nn.relu, or clip."""
    activation = attrs.get("activation", "none")
    if activation == "relu":
        return (("nn.relu", {}),)
    if activation == "clip":
        return (("clip", {"a_min": attrs["a_min"], "a_max": attrs["a_max"]}),)
    return ()


def _activate(y: np.ndarray, activation: str, a_min: float, a_max: float) -> np.ndarray:
    if activation == "none":
        return y
    lo, hi = epilogue_bounds({"activation": activation, "a_min": a_min, "a_max": a_max})
    if y.dtype.kind in "iu":     # integers: the integers inside [lo, hi], as clip takes them
        lo = math.ceil(lo) if math.isfinite(lo) else lo
        hi = math.floor(hi) if math.isfinite(hi) else hi
    return np.clip(y, lo, hi).astype(y.dtype, copy=False)


def _unfuse(core: str, core_attrs):
    def unfuse(args: tuple[Expr, ...], attrs) -> Expr:
        op = get_op(core)
        y = Call(op=op, args=args[:2], attrs=freeze_attrs(
            op.canonical_attrs({k: attrs[k] for k in core_attrs})))
        y = Call(op=get_op("add"), args=(y, args[2]))
        for name, act_attrs in epilogue_calls(attrs):
            y = Call(op=get_op(name), args=(y,), attrs=freeze_attrs(act_attrs))
        return y
    return unfuse


def _conv_semantics(x, w, b, *, activation, a_min, a_max, **conv):
    y = numerics.conv2d(x, w, **conv)
    return _activate((y + b).astype(y.dtype, copy=False), activation, a_min, a_max)


def _dense_semantics(x, w, b, *, activation, a_min, a_max, **attrs):
    y = dense(x, w, **attrs)
    return _activate((y + b).astype(y.dtype, copy=False), activation, a_min, a_max)


def write_epilogue(ex, x: str, attrs) -> str:
    """ONNX export: the activation of a fused op applied to the ONNX value ``x``, each
    activation written by its own op's ONNX form."""
    for name, act_attrs in epilogue_calls(attrs):
        op = get_op(name)
        call = Call(op=op, args=(), attrs=freeze_attrs(op.canonical_attrs(act_attrs)))
        x = op.onnx[0].write(ex, call, [x])
    return x


def _conv_to_onnx(ex, node, ins):
    """Conv with its bias input where the bias is a constant vector, else Conv then Add;
    then the activation."""
    w_t = ex.type(node.args[1])
    conv = conv_to_onnx(node.attrs, w_t.shape)
    bias = ex.value(node.args[2])
    if bias is not None and bias.size == w_t.shape[0]:
        y = ex.emit("Conv", [ins[0], ins[1], ex.const(bias.reshape(-1))], **conv)
    else:
        y = ex.emit("Add", [ex.emit("Conv", ins[:2], **conv), ins[2]])
    return write_epilogue(ex, y, node.attrs)


CONV_NAMES = tuple(a.name for a in CONV2D_ATTRS)
register(OpDef(
    "fused.conv2d", inputs=("data", "weight", "bias"), props=frozenset({COMPUTE, FUSED}),
    kernel="Conv2D", channels_last=conv_channels_last,
    onnx=(OnnxForm("Conv", reads=False, export=_conv_to_onnx),),
    attrs=CONV2D_ATTRS + EPILOGUE_ATTRS + (FP32_KERNEL_ATTR,),
    type_rel=lambda types, attrs: _epilogue_rel(conv2d_rel(types[:2], attrs), types, attrs),
    semantics=_conv_semantics, flops=conv2d_flops, unfuse=_unfuse("nn.conv2d", CONV_NAMES),
    doc="activation(conv2d(data, weight) + bias): a convolution with its epilogue"))
register(OpDef(
    "fused.dense", inputs=("data", "weight", "bias"), props=frozenset({COMPUTE, FUSED}),
    kernel="Dense",
    onnx=(OnnxForm("Gemm", reads=False, export=lambda ex, node, ins: write_epilogue(
        ex, ex.emit("Gemm", ins, transB=1), node.attrs)),),
    attrs=tuple(a for a in get_op("nn.dense").attrs) + EPILOGUE_ATTRS,
    type_rel=lambda types, attrs: _epilogue_rel(dense_rel(types[:2], attrs), types, attrs),
    semantics=_dense_semantics, unfuse=_unfuse("nn.dense", ("units", "out_dtype")),
    flops=lambda ins, out, a: 2.0 * out.size * ins[1].shape[1],
    doc="activation(dense(data, weight) + bias)"))


def _conv_add_rel(types, attrs):
    """fused.conv2d's type, the residual broadcasting with it as ``add`` does."""
    out = _epilogue_rel(conv2d_rel(types[:2], attrs), types, attrs)
    r = tensor(types, 3, "residual")
    shape = broadcast_shapes(out.shape, r.shape)
    if r.dtype != out.dtype or shape is None:
        raise OpTypeError(f"residual {r} must be {out.dtype} and broadcast with {out.shape}", 3)
    return TensorType(shape, out.dtype)


def _conv_add_semantics(x, w, b, r, *, activation, a_min, a_max, **conv):
    y = numerics.conv2d(x, w, **conv)
    y = ((y + b).astype(y.dtype, copy=False) + r).astype(y.dtype, copy=False)
    return _activate(y, activation, a_min, a_max)


def _unfuse_conv_add(args: tuple[Expr, ...], attrs) -> Expr:
    y = _unfuse("nn.conv2d", CONV_NAMES)(args[:3], dict(attrs, activation="none"))
    y = Call(op=get_op("add"), args=(y, args[3]))
    for name, act_attrs in epilogue_calls(attrs):
        y = Call(op=get_op(name), args=(y,), attrs=freeze_attrs(act_attrs))
    return y


def _conv_add_to_onnx(ex, node, ins):
    """The convolution with its bias (``_conv_to_onnx``), Add of the residual, then the
    activation."""
    plain = Call(op=get_op("fused.conv2d"), args=node.args[:3],
                 attrs=freeze_attrs(dict(node.attrs, activation="none")))
    y = ex.emit("Add", [_conv_to_onnx(ex, plain, ins[:3]), ins[3]])
    return write_epilogue(ex, y, node.attrs)


register(OpDef(
    "fused.conv2d_add", inputs=("data", "weight", "bias", "residual"),
    props=frozenset({COMPUTE, FUSED}),
    kernel="Conv2DAdd", channels_last=conv_channels_last,
    onnx=(OnnxForm("Conv", reads=False, export=_conv_add_to_onnx),),
    attrs=CONV2D_ATTRS + EPILOGUE_ATTRS + (FP32_KERNEL_ATTR,), type_rel=_conv_add_rel,
    semantics=_conv_add_semantics, unfuse=_unfuse_conv_add,
    flops=lambda ins, out, attrs: conv2d_flops(ins, out, attrs) + out.size,
    doc="activation(conv2d(data, weight) + bias + residual): a convolution whose epilogue "
        "adds a residual (a ResNet block's shortcut) before the activation"))
