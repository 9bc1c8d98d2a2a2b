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
from .nn import CONV2D_ATTRS, conv2d_flops, conv2d_rel, dense, dense_rel
from .registry import COMPUTE, OpDef, OpTypeError, get_op, register
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


def _activate(y: np.ndarray, activation: str, a_min: float, a_max: float) -> np.ndarray:
    if activation == "relu":
        return np.maximum(y, 0).astype(y.dtype, copy=False)
    if activation == "clip":
        return np.clip(y, a_min, a_max).astype(y.dtype, copy=False)
    return y


def _unfuse(core: str, core_attrs):
    def unfuse(args: tuple[Expr, ...], attrs) -> Expr:
        op = get_op(core)
        y = Call(op=op, args=args[:2], attrs=freeze_attrs(
            op.canonical_attrs({k: attrs[k] for k in core_attrs})))
        y = Call(op=get_op("add"), args=(y, args[2]))
        if attrs["activation"] == "relu":
            y = Call(op=get_op("nn.relu"), args=(y,))
        elif attrs["activation"] == "clip":
            y = Call(op=get_op("clip"), args=(y,), attrs=freeze_attrs(
                {"a_min": attrs["a_min"], "a_max": attrs["a_max"]}))
        return y
    return unfuse


def _conv_semantics(x, w, b, *, activation, a_min, a_max, **conv):
    y = numerics.conv2d(x, w, **conv)
    return _activate((y + b).astype(y.dtype, copy=False), activation, a_min, a_max)


def _dense_semantics(x, w, b, *, activation, a_min, a_max, **attrs):
    y = dense(x, w, **attrs)
    return _activate((y + b).astype(y.dtype, copy=False), activation, a_min, a_max)


CONV_NAMES = tuple(a.name for a in CONV2D_ATTRS)
register(OpDef(
    "fused.conv2d", inputs=("data", "weight", "bias"), props=frozenset({COMPUTE, FUSED}),
    kernel="eqquant.runtime.bindings:Conv2D",
    attrs=CONV2D_ATTRS + EPILOGUE_ATTRS,
    type_rel=lambda types, attrs: _epilogue_rel(conv2d_rel(types[:2], attrs), types, attrs),
    semantics=_conv_semantics, flops=conv2d_flops, unfuse=_unfuse("nn.conv2d", CONV_NAMES),
    doc="activation(conv2d(data, weight) + bias): a convolution with its epilogue"))
register(OpDef(
    "fused.dense", inputs=("data", "weight", "bias"), props=frozenset({COMPUTE, FUSED}),
    kernel="eqquant.runtime.bindings:Dense",
    attrs=tuple(a for a in get_op("nn.dense").attrs) + EPILOGUE_ATTRS,
    type_rel=lambda types, attrs: _epilogue_rel(dense_rel(types[:2], attrs), types, attrs),
    semantics=_dense_semantics, unfuse=_unfuse("nn.dense", ("units", "out_dtype")),
    flops=lambda ins, out, a: 2.0 * out.size * ins[1].shape[1],
    doc="activation(dense(data, weight) + bias)"))
