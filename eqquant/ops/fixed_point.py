"""Requantization in integers, as TVM does it: a real scale becomes a Q31 multiplier and a
power-of-two shift, and ``fixed_point_multiply`` applies them.

    m, s = quantize_multiplier(0.0123)      # 0.0123 == m * 2**(s - 31), m in [2**30, 2**31)
    y = fixed_point_multiply(x, m, s)        # round(x * 0.0123), ties upward

The arithmetic lives in ``eqquant.ops.numerics.fixed_point_multiply`` (the reference semantics
of the registry op); this module adds the scale decomposition.
"""
from __future__ import annotations

import math

from .numerics import fixed_point_multiply

__all__ = ["quantize_multiplier", "fixed_point_multiply"]


def quantize_multiplier(scale: float) -> tuple[int, int]:
    """(multiplier, shift) with scale == multiplier * 2**(shift - 31), from frexp: the
    significand in [0.5, 1) rounded to Q31 (TVM's GetFixedPointMultiplierShift); (0, 0)
    for a scale below 2**-32, by which every int32 rounds to 0."""
    if not math.isfinite(scale) or scale < 0:
        raise ValueError(f"scale must be finite and positive, got {scale}")
    if scale < 2.0 ** -32:      # (any int32 times it rounds to 0: the product is 0, whose
        return 0, 0             # shift no int64 would take)
    significand, exponent = math.frexp(scale)
    q = round(significand * (1 << 31))
    if q == 1 << 31:  # the significand rounded up to 1.0
        q //= 2
        exponent += 1
    return int(q), int(exponent)
