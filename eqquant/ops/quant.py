"""Quantization ops as TVM's Relay quantizer uses them."""
from __future__ import annotations

import numpy as np

from ..core.types import is_int
from . import numerics
from .attrs import BOOL, INT, REQUIRED, Attr, StrKind
from .registry import ELEMWISE, QUANT, UNARY, OpDef, OpTypeError, register
from .typerel import float_input, tensor, broadcast_shapes


def _simq_rel(types, attrs):
    x = float_input(types, attrs)
    for i, name in enumerate(("dom_scale", "clip_min", "clip_max"), start=1):
        t = tensor(types, i, name)
        if t.dtype != x.dtype or broadcast_shapes(x.shape, t.shape) != x.shape:
            raise OpTypeError(f"argument {i + 1} ('{name}') must be a {x.dtype} scalar or "
                              f"broadcast to {x.shape}, got {t}", arg=i)
    return x


def _simulated_quantize(x, scale, lo, hi, *, kind, sign, rounding):
    """clip(round(x / scale), lo, hi) * scale: the fake-quantized value (kind 0: identity)."""
    if kind == 0:
        return x
    q = x / scale
    q = np.clip(q, lo, hi)
    q = np.floor(q + 0.5) if rounding == "floor" else np.round(q)
    return (q * scale).astype(x.dtype)


register(OpDef(
    "relay.op.annotation.simulated_quantize",
    inputs=("data", "dom_scale", "clip_min", "clip_max"), props=frozenset({QUANT}),
    attrs=(Attr("kind", INT, 0, "0 identity, 1 input, 2 weight, 3 activation"),
           Attr("sign", BOOL, True), Attr("rounding", StrKind("rounding", ("round", "floor")),
                                          "round")),
    type_rel=_simq_rel, semantics=_simulated_quantize,
    doc="fake quantization: clip(round(x / dom_scale), clip_min, clip_max) * dom_scale"))


def _fpm_rel(types, attrs):
    x = tensor(types, 0, "data")
    if not is_int(x.dtype):
        raise OpTypeError(f"fixed_point_multiply takes an integer tensor, got {x.dtype}", 0)
    if not 0 <= attrs["multiplier"] < 2 ** 31:
        raise OpTypeError("multiplier must be a Q31 value in [0, 2**31)")
    if not -63 < attrs["shift"] < 32:
        raise OpTypeError("shift must be in (-63, 32)")
    return x


register(OpDef(
    "fixed_point_multiply", inputs=("data",), props=frozenset({ELEMWISE, UNARY, QUANT}),
    attrs=(Attr("multiplier", INT, REQUIRED), Attr("shift", INT, REQUIRED)),
    type_rel=_fpm_rel,
    semantics=lambda x, *, multiplier, shift: numerics.fixed_point_multiply(x, multiplier, shift),
    doc="round(x * multiplier * 2**(shift - 31)), ties upward, in int64 (TVM's semantics)"))
