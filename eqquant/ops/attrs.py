"""Attribute kinds: how an op's attribute is checked, canonicalised and printed.

An op entry lists its attributes as data, e.g. ``Attr("padding", PADDING2D, [0, 0, 0, 0])``;
the parser calls ``kind.canonical(value)`` (raising :class:`AttrValueError` with what was
expected) and the printer calls ``kind.format(value)``. ``PADDING2D`` turns ``1`` or ``[1, 2]``
into the 4-element ``[top, left, bottom, right]`` form TVM uses, so ``padding=[1, 1]`` and
``padding=[1, 1, 1, 1]`` are the same program.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.types import DTYPES, Dim


class AttrValueError(ValueError):
    """Raised by ``canonical``; the message says what was expected."""


def format_float(v: float, suffix: str = "") -> str:
    """Shortest text that reads back to the same value: ``1e-05``, ``0.5``, ``-127f``."""
    if math.isinf(v) or math.isnan(v):
        return {math.inf: "inf", -math.inf: "-inf"}.get(v, "nan") + suffix
    if suffix == "f":
        text = np.format_float_positional(np.float32(v), unique=True, trim="-")
        if len(text) > 12:
            text = np.format_float_scientific(np.float32(v), unique=True, trim="-")
        return text + "f"
    if v == int(v) and abs(v) < 1e16:
        return f"{int(v)}.0" if not suffix else f"{int(v)}{suffix}"
    return repr(float(v)) + suffix


def format_value(v: Any) -> str:
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str):   # the escapes the parser reads back (\\, \", \n, \t)
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace(
            "\n", "\\n").replace("\t", "\\t") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, Dim):
        return str(v)
    raise TypeError(f"cannot print attribute value {v!r}")


@dataclass(frozen=True)
class AttrKind:
    name: str

    def canonical(self, v: Any) -> Any:
        raise NotImplementedError

    def format(self, v: Any) -> str:
        return format_value(v)


@dataclass(frozen=True)
class IntKind(AttrKind):
    def canonical(self, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise AttrValueError("an integer")
        return v


@dataclass(frozen=True)
class FloatKind(AttrKind):
    suffix: str = ""  # "f" prints like TVM's float32 immediates: a_min=-127f

    def canonical(self, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise AttrValueError("a number")
        if self.suffix == "f":  # a float32 attribute: keep only what float32 holds
            return float(np.float32(v))
        return float(v)

    def format(self, v: Any) -> str:
        return format_float(v, self.suffix)


@dataclass(frozen=True)
class BoolKind(AttrKind):
    def canonical(self, v: Any) -> Any:
        if isinstance(v, bool):
            return v
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        raise AttrValueError("True or False")


@dataclass(frozen=True)
class StrKind(AttrKind):
    choices: tuple[str, ...] = ()

    def canonical(self, v: Any) -> Any:
        if not isinstance(v, str):
            raise AttrValueError("a string" + (f" (one of {', '.join(self.choices)})"
                                               if self.choices else ""))
        if self.choices and v not in self.choices:
            raise AttrValueError(f"one of {', '.join(repr(c) for c in self.choices)}")
        return v


@dataclass(frozen=True)
class DTypeKind(AttrKind):
    allow_empty: bool = True  # "" means "same as the input"
    choices: tuple[str, ...] = ()   # the dtypes the attribute may take (any, if empty)

    def canonical(self, v: Any) -> Any:
        allowed = self.choices or DTYPES
        if isinstance(v, str) and (v in allowed or (self.allow_empty and v == "")):
            return v
        raise AttrValueError(f"a dtype string ({', '.join(allowed)})")


@dataclass(frozen=True)
class IntsKind(AttrKind):
    """A list of ints; ``lengths`` restricts the length; ``expand`` maps a length to the
    canonical one (e.g. padding 1 -> 4); a bare int counts as a 1-element list when
    ``scalar_ok``."""

    lengths: tuple[int, ...] = ()
    expand: str = ""  # "pad2d", "pair", or ""
    scalar_ok: bool = False

    def canonical(self, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool) and self.scalar_ok:
            v = [v]
        if not isinstance(v, (list, tuple)) or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise AttrValueError(self._expected())
        v = list(v)
        kind, n = _EXPANDS.get(self.expand, ("", 0))
        if kind == "pad":
            if len(v) == 1:
                v = v * (2 * n)
            elif len(v) == n:
                v = v + v
        elif kind == "tuple" and len(v) == 1:
            v = v * n
        if self.lengths and len(v) not in self.lengths:
            raise AttrValueError(self._expected())
        if kind == "pad" and min(v) < 0:
            raise AttrValueError("sizes of 0 or more (padding adds pixels; to crop, "
                                 "strided_slice)")
        return v

    def _expected(self) -> str:
        kind, n = _EXPANDS.get(self.expand, ("", 0))
        if kind == "pad":
            return f"an int or a list of 1, {n} or {2 * n} ints"
        if kind == "tuple":
            return f"an int or a list of {n} ints"
        if self.lengths:
            return f"a list of {' or '.join(map(str, self.lengths))} ints"
        return "a list of ints"


@dataclass(frozen=True)
class SizesKind(IntsKind):
    """A shape: a list of ints, where a size may be one known only at run time (a Dim,
    ``?n``), as Relax's ``R.shape([n, 4, s, 64])``; bound with the program's sizes
    (``passes.sizes.bind_sizes``)."""

    def canonical(self, v: Any) -> Any:
        if not isinstance(v, (list, tuple)) or not all(
                isinstance(x, Dim) or (isinstance(x, int) and not isinstance(x, bool))
                for x in v):
            raise AttrValueError("a list of ints and sizes (?n)")
        return list(v)


# IntsKind.expand: how a short list stands for the whole one over n spatial axes: a padding
# of one size for all sides, or one per axis for both ends (TVM's [before..., after...]);
# a stride or a window of one size for every axis
_EXPANDS = {"pad2d": ("pad", 2), "pad3d": ("pad", 3), "pair": ("tuple", 2),
            "triple": ("tuple", 3)}


@dataclass(frozen=True)
class NestedIntsKind(AttrKind):
    """A list of int pairs, e.g. ``pad_width=[[0, 0], [0, 0], [1, 1], [1, 1]]``."""

    def canonical(self, v: Any) -> Any:
        ok = isinstance(v, (list, tuple)) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in p) for p in v)
        if not ok:
            raise AttrValueError("a list of [before, after] int pairs")
        return [list(p) for p in v]


@dataclass(frozen=True)
class OptionalKind(AttrKind):
    inner: AttrKind = None  # type: ignore[assignment]

    def canonical(self, v: Any) -> Any:
        if v is None:
            return None
        try:
            return self.inner.canonical(v)
        except AttrValueError as e:
            raise AttrValueError(f"None or {e}") from None

    def format(self, v: Any) -> str:
        return "None" if v is None else self.inner.format(v)


INT = IntKind("int")
FLOAT = FloatKind("float")
FLOAT_F = FloatKind("float", suffix="f")
BOOL = BoolKind("bool")
STR = StrKind("string")
DTYPE = DTypeKind("dtype")
DTYPE_REQUIRED = DTypeKind("dtype", allow_empty=False)
INTS = IntsKind("ints")
SIZES = SizesKind("sizes")
PADDING2D = IntsKind("padding", lengths=(4,), expand="pad2d", scalar_ok=True)
PAIR = IntsKind("pair", lengths=(2,), expand="pair", scalar_ok=True)
PADDING3D = IntsKind("padding", lengths=(6,), expand="pad3d", scalar_ok=True)
TRIPLE = IntsKind("triple", lengths=(3,), expand="triple", scalar_ok=True)
OPT_INT = OptionalKind("int?", INT)
OPT_INTS = OptionalKind("ints?", IntsKind("ints", scalar_ok=True))
OPT_PAIR = OptionalKind("pair?", PAIR)
PAD_WIDTH = NestedIntsKind("pad_width")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # default of an attribute every call must give (always printed)


@dataclass(frozen=True)
class Attr:
    """One attribute of an op: name, kind, default (already canonical, or REQUIRED)."""

    name: str
    kind: AttrKind
    default: Any
    doc: str = ""
