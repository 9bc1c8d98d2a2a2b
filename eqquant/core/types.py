"""Types of the text IR: tensors (a scalar is a rank-0 tensor), tuples and functions.

    Tensor[(1, 64, 56, 56), float32]      TensorType((1, 64, 56, 56), "float32")
    float32                               TensorType((), "float32")
    (Tensor[(4), int8], float32)          TupleType(...)
    fn (Tensor[(4), int8]) -> float32     FuncType(...)
"""
from __future__ import annotations

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
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

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


def check_input(name: str, value, ty: Type) -> np.ndarray:
    """An input value for a parameter of type ``ty``: the same shape; the same dtype, or one
    that converts without changing a value (a wider float narrowed to float32, an integer
    array whose values fit). A float array for an integer input, or integers out of the
    input's range, are refused: they would be cast silently otherwise."""
    if isinstance(ty, TensorType):
        arr = np.asarray(value)
        if tuple(arr.shape) != ty.shape:
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
        return tuple(check_input(f"{name}.{i}", v, t)
                     for i, (v, t) in enumerate(zip(value, ty.fields)))
    return value
