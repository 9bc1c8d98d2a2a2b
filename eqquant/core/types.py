"""Types of the text IR: tensors (a scalar is a rank-0 tensor), tuples and functions.

    Tensor[(1, 64, 56, 56), float32]      TensorType((1, 64, 56, 56), "float32")
    float32                               TensorType((), "float32")
    (Tensor[(4), int8], float32)          TupleType(...)
    fn (Tensor[(4), int8]) -> float32     FuncType(...)
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..errors import EvalError

DTYPES = (
    "float16", "float32", "float64",
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "bool",
)


def is_float(dtype: str) -> bool:
    return dtype.startswith("float")


def is_int(dtype: str) -> bool:
    return dtype.startswith("int") or dtype.startswith("uint")


class Type:
    """Base class of IR types."""


@dataclass(frozen=True)
class TensorType(Type):
    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> "int | Dim":
        return math.prod(self.shape)

    def __str__(self) -> str:
        if not self.shape:
            return self.dtype
        # TVM prints a one-dimensional shape without a trailing comma: Tensor[(64), float32]
        return f"Tensor[({', '.join(str(d) for d in self.shape)}), {self.dtype}]"


@dataclass(frozen=True)
class TupleType(Type):
    fields: tuple[Type, ...]

    def __str__(self) -> str:
        inner = ", ".join(str(f) for f in self.fields)
        return f"({inner},)" if len(self.fields) == 1 else f"({inner})"


@dataclass(frozen=True)
class FuncType(Type):
    params: tuple[Type, ...]
    ret: Type

    def __str__(self) -> str:
        return f"fn ({', '.join(str(p) for p in self.params)}) -> {self.ret}"


class Dim:
    """A size known only when the program runs, as Relay's ``Any`` and TVMScript's ``"n"``.

    Written ``?n`` (a named size: every ``?n`` of one program is the same size) or ``?`` (a
    size of its own). A relation computes with it as with an int: sums, products and exact
    quotients of sizes are kept as polynomials in the names (``?n*?s``), so a reshape of a
    ``(?n, ?s, 128)`` value to ``(-1, 128)`` gives ``(?n*?s, 128)``. A question whose answer
    depends on the size (``?n == 1``, ``?n % 4``, ``?n`` broadcast against 3) raises
    :class:`SizeUnknown`, a TypeError, which the type checker reports at the call. Each name
    stands for a size of at least 1.

    A Dim with no names is never built: arithmetic that cancels the names gives a plain int.
    """

    __slots__ = ("terms",)

    def __init__(self, terms):
        # terms: ((names, coefficient), ...), names a sorted tuple (repeats for powers), no
        # zero coefficient, sorted: one polynomial has one representation
        object.__setattr__(self, "terms", tuple(sorted(terms)))

    def __setattr__(self, *_):
        raise AttributeError("a Dim is immutable")

    @staticmethod
    def named(name: str) -> "Dim":
        return Dim(((((name,)), 1),))

    @staticmethod
    def _of(poly: dict) -> "Dim | int":
        terms = tuple((k, v) for k, v in poly.items() if v)
        if all(not k for k, _ in terms):
            return sum(v for _, v in terms)
        return Dim(terms)

    @staticmethod
    def _poly(x) -> dict:
        if isinstance(x, Dim):
            return dict(x.terms)
        if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            return {(): int(x)} if x else {}
        raise SizeUnknown(f"{x!r} is not a size")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted({n for k, _ in self.terms for n in k}))

    @property
    def name(self) -> str | None:
        """The name, where the size is one name alone (``?n``; not ``2*?n`` or ``?n*?s``)."""
        (names, coef), *rest = self.terms
        return names[0] if not rest and coef == 1 and len(names) == 1 else None

    def __add__(self, other):
        if not isinstance(other, (Dim, int, np.integer)):
            return NotImplemented
        p = self._poly(self)
        for k, v in self._poly(other).items():
            p[k] = p.get(k, 0) + v
        return self._of(p)

    __radd__ = __add__

    def __neg__(self):
        return self._of({k: -v for k, v in self.terms})

    def __sub__(self, other):
        if not isinstance(other, (Dim, int, np.integer)):
            return NotImplemented
        return self + (-other if isinstance(other, Dim) else -int(other))

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        if not isinstance(other, (Dim, int, np.integer)):
            return NotImplemented
        p: dict = {}
        for ka, va in self.terms:
            for kb, vb in self._poly(other).items():
                k = tuple(sorted(ka + kb))
                p[k] = p.get(k, 0) + va * vb
        return self._of(p)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        """An exact quotient: by an int dividing every coefficient, or by a product of names
        (with a coefficient) dividing every term. Anything else depends on the size."""
        q = _exact_quotient(self._poly(self), self._poly(other))
        if q is None:
            raise SizeUnknown(f"{self} / {other} is a whole size only for some sizes")
        return self._of(q)

    def __rfloordiv__(self, other):
        q = _exact_quotient(self._poly(other), self._poly(self))
        if q is None:
            raise SizeUnknown(f"{other} / {self} is a whole size only for some sizes")
        return self._of(q)

    __truediv__ = __floordiv__

    def __mod__(self, other):
        if _exact_quotient(self._poly(self), self._poly(other)) is not None:
            return 0
        raise SizeUnknown(f"{self} % {other} depends on the size")

    def __eq__(self, other):
        if isinstance(other, Dim):
            return self.terms == other.terms
        if isinstance(other, (int, np.integer)):
            return False      # a Dim is never a plain int (see _of); == 1 is not known
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(("Dim", self.terms))

    def __lt__(self, other):
        return _compare(self, other, "<")

    def __le__(self, other):
        return _compare(self, other, "<=")

    def __gt__(self, other):
        return _compare(self, other, ">")

    def __ge__(self, other):
        return _compare(self, other, ">=")

    def __bool__(self):
        return True

    def __index__(self):
        raise SizeUnknown(f"{self} is a size known only at run time")

    __int__ = __index__

    def __repr__(self):
        return f"Dim({self})"

    def __str__(self):
        parts = []
        for names, coef in sorted(self.terms, key=lambda t: (-len(t[0]), t[0])):
            body = "*".join(map(size_label, names))
            if not names:
                body = str(abs(coef))
            elif abs(coef) != 1:
                body = f"{abs(coef)}*{body}"
            sign = "-" if coef < 0 else "+"
            parts.append(body if not parts and coef > 0 else f"{sign}{body}")
        return "".join(parts)


def is_anonymous(name: str) -> bool:
    """Whether a size's name stands for a ``?`` (a size of its own, numbered by the reader:
    ``_1``, ``_2``)."""
    return name.startswith("_")


def size_label(name: str) -> str:
    """A size's name as the text IR writes it: ``?n``, or ``?`` for a size of its own."""
    return "?" if is_anonymous(name) else "?" + name


class SizeUnknown(TypeError):
    """A question about a Dim whose answer depends on the size."""


def _exact_quotient(a: dict, b: dict) -> dict | None:
    if len(b) != 1:
        return {(): 1} if a and a == b else None
    (kb, vb), = b.items()
    out = {}
    for k, v in a.items():
        rest = list(k)
        for n in kb:
            if n not in rest:
                return None
            rest.remove(n)
        if v % vb:
            return None
        out[tuple(rest)] = v // vb
    return out


def _compare(a, b, op: str) -> bool:
    """``a op b`` where it holds, or fails, for every size >= 1; else SizeUnknown. A
    polynomial whose non-constant coefficients are all positive is least when every name is
    1 (all negative: greatest)."""
    d = a - b
    if not isinstance(d, Dim):
        return {"<": d < 0, "<=": d <= 0, ">": d > 0, ">=": d >= 0}[op]
    rising = [v for k, v in d.terms if k]
    at_one = sum(v for _, v in d.terms)
    lo = at_one if all(v > 0 for v in rising) else None
    hi = at_one if all(v < 0 for v in rising) else None
    if op in (">", ">="):
        if lo is not None and (lo > 0 or (op == ">=" and lo >= 0)):
            return True
        if hi is not None and (hi < 0 or (op == ">" and hi <= 0)):
            return False
    else:
        if hi is not None and (hi < 0 or (op == "<=" and hi <= 0)):
            return True
        if lo is not None and (lo > 0 or (op == "<" and lo >= 0)):
            return False
    raise SizeUnknown(f"whether {a} {op} {b} depends on the size")


def is_static(t: "Type") -> bool:
    """Whether every size in ``t`` is known (no Dim)."""
    if isinstance(t, TensorType):
        return not any(isinstance(d, Dim) for d in t.shape)
    if isinstance(t, TupleType):
        return all(map(is_static, t.fields))
    if isinstance(t, FuncType):
        return all(map(is_static, t.params)) and is_static(t.ret)
    return True


def size_names(t: "Type") -> set[str]:
    """The names of the sizes ``t`` leaves open."""
    if isinstance(t, TensorType):
        return {n for d in t.shape if isinstance(d, Dim) for n in d.names}
    if isinstance(t, TupleType):
        return set().union(*map(size_names, t.fields)) if t.fields else set()
    return set()


def evaluate_dim(d, sizes: dict[str, int]) -> int:
    if not isinstance(d, Dim):
        return int(d)
    total = 0
    for names, coef in d.terms:
        v = coef
        for n in names:
            v *= sizes[n]
        total += v
    return total


def bind_type(t: "Type", sizes: dict[str, int]) -> "Type":
    """``t`` with every named size replaced by its value in ``sizes`` (each must be there)."""
    if isinstance(t, TensorType):
        if is_static(t):
            return t
        return TensorType(tuple(evaluate_dim(d, sizes) for d in t.shape), t.dtype)
    if isinstance(t, TupleType):
        return TupleType(tuple(bind_type(f, sizes) for f in t.fields))
    if isinstance(t, FuncType):
        return FuncType(tuple(bind_type(p, sizes) for p in t.params), bind_type(t.ret, sizes))
    return t


def match_shape(name: str, shape: tuple, ty: "TensorType", sizes: dict[str, int]) -> None:
    """Bind the named sizes of ``ty`` from an input of ``shape`` (adding to ``sizes``), or
    raise EvalError saying which size disagrees. A size given by an expression (``?n*?s``)
    is checked once its names are bound."""
    if len(shape) != ty.rank:
        raise EvalError(f"%{name} expects shape {_shape_text(ty.shape)}, got {tuple(shape)}")
    for axis, (want, got) in enumerate(zip(ty.shape, shape)):
        if isinstance(want, Dim) and want.name is not None:
            n = want.name
            if got < 1:
                raise EvalError(f"%{name}: axis {axis} is {_label(want)}, a size of at least "
                                f"1, got {got}")
            if sizes.setdefault(n, int(got)) != got:
                raise EvalError(f"%{name}: axis {axis} is {_label(want)}, which is "
                                f"{sizes[n]} in another input, got {got}")
    for axis, (want, got) in enumerate(zip(ty.shape, shape)):
        if not isinstance(want, Dim):
            if want != got:
                raise EvalError(f"%{name} expects shape {_shape_text(ty.shape)}, got "
                                f"{tuple(shape)}")
        elif set(want.names) <= set(sizes) and evaluate_dim(want, sizes) != got:
            raise EvalError(f"%{name}: axis {axis} is {want} = "
                            f"{evaluate_dim(want, sizes)}, got {got}")


_TERM = re.compile(r"([+-]?)(?:(\d+)\*)?((?:\?[A-Za-z_]?\w*)(?:\*\?[A-Za-z_]?\w*)*|\d+)")


def dim_of_text(text: str, fresh) -> "int | Dim":
    """A size as the text IR writes it: ``7``, ``?n``, ``?`` (``fresh()`` names it), or a sum
    of products such as ``128*?n*?s`` or ``?n+1``. ValueError where it is none of these."""
    text = text.replace(" ", "")
    if text.isdigit():
        return int(text)
    total, pos = 0, 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if not m or m.end() == pos or (pos and not m.group(1)):
            raise ValueError(f"'{text}' is not a size (an integer, ?name, or ? for a size of "
                             f"its own)")
        sign, coef, body = m.groups()
        term: "int | Dim" = int(coef or 1)
        for part in body.split("*"):
            term = term * (int(part) if part.isdigit() else
                           Dim.named(part[1:] if len(part) > 1 else fresh()))
        total = total - term if sign == "-" else total + term
        pos = m.end()
    return total


def _label(d: Dim) -> str:
    return "a size of its own (?)" if str(d) == "?" else str(d)


def _shape_text(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def type_of_array(a: np.ndarray) -> TensorType:
    return TensorType(tuple(int(d) for d in a.shape), str(a.dtype))


def default_compute_dtype(a: str, b: str) -> str:
    """The result dtype of a conv2d/dense without out_dtype: the inputs' dtype, or int32 for
    two different integer dtypes (uint8 x int8). The type relation and the reference
    semantics both use it, so they cannot disagree."""
    return "int32" if a != b and is_int(a) and is_int(b) else a


# The largest tensor a program may hold: 2**32 elements (16 GiB of float32), far beyond any
# model eqquant runs on a CPU, and far below what would overflow a 64-bit size computation.
MAX_ELEMENTS = 2 ** 32
MAX_RANK = 32           # (numpy's arrays take 64 axes; no model has a tenth of that)


def size_problem(t: "Type") -> str | None:
    """Why a type cannot be a real tensor (a negative or enormous dimension), or None."""
    if isinstance(t, TupleType):
        return next((p for p in map(size_problem, t.fields) if p), None)
    if not isinstance(t, TensorType):
        return None
    if len(t.shape) > MAX_RANK:
        return f"a tensor of rank {len(t.shape)} has more axes than eqquant handles ({MAX_RANK})"
    total = 1
    for d in t.shape:
        if isinstance(d, Dim):
            continue            # a size known at run time, checked as the input enters
        if not isinstance(d, (int, np.integer)) or d < 0:
            return f"a tensor of shape {t.shape} has a dimension that is not a size"
        total *= int(d)
    if total > MAX_ELEMENTS:
        return (f"a tensor of shape {t.shape} has {total:.3g} elements, more than eqquant "
                f"handles ({MAX_ELEMENTS:.3g})")
    return None


def check_bounds(name: str, arr: np.ndarray, bounds: tuple[int, int, str]) -> None:
    """An integer input's values against the bounds a kernel needs (``bounds``: lowest,
    highest, why: indices into a table of so many rows), checked as the input enters, since
    a kernel cannot raise: EvalError naming the first value outside them."""
    lo, hi, why = bounds
    bad = (arr < lo) | (arr > hi)
    if np.any(bad):
        raise EvalError(f"%{name}: {int(arr[bad].reshape(-1)[0])} is outside [{lo}, {hi}] "
                        f"({why})")


def check_input(name: str, value, ty: Type, sizes: dict[str, int] | None = None
                ) -> np.ndarray:
    """An input value for a parameter of type ``ty``: the same shape; the same dtype, or one
    that converts without changing a value (a wider float narrowed to float32, an integer
    array whose values fit). A float array for an integer input, or integers out of the
    input's range, are refused: they would be cast silently otherwise. Sizes known only at
    run time take the input's (``sizes`` collects them, and holds every input to them)."""
    if isinstance(ty, TensorType):
        arr = np.asarray(value)
        if not is_static(ty):
            match_shape(name, tuple(arr.shape), ty, {} if sizes is None else sizes)
        elif tuple(arr.shape) != ty.shape:
            raise EvalError(f"%{name} expects shape {ty.shape}, got {tuple(arr.shape)}")
        if str(arr.dtype) != ty.dtype:
            want = np.dtype(ty.dtype)
            if want.kind == "f" and arr.dtype.kind in "fiub":
                return arr.astype(want)
            if want.kind in "iu" and arr.dtype.kind in "iub":
                info = np.iinfo(want)
                if arr.size == 0 or (int(arr.min()) >= info.min and int(arr.max()) <= info.max):
                    return arr.astype(want)
                raise EvalError(f"%{name} expects {ty.dtype}: values in [{info.min}, "
                                f"{info.max}], got {arr.dtype} values in "
                                f"[{arr.min()}, {arr.max()}]")
            if want.kind == "b" and arr.dtype.kind == "b":
                return arr
            raise EvalError(f"%{name} expects {ty.dtype}, got {arr.dtype}")
        return arr
    if isinstance(ty, TupleType):
        return tuple(check_input(f"{name}.{i}", v, t, sizes)
                     for i, (v, t) in enumerate(zip(value, ty.fields)))
    return value
