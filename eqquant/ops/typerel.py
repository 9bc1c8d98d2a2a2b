"""Shared pieces of type relations. A relation takes the input types and the canonical attributes
and returns the output type, or raises :class:`OpTypeError` naming the offending input."""
from __future__ import annotations

from typing import Any, Mapping, Sequence


from ..core.types import (Dim, SizeUnknown, TensorType, TupleType, Type, default_compute_dtype,
                          is_float, is_int)
from .registry import OpTypeError


def tensor(types: Sequence[Type], i: int, name: str = "", rank: int | None = None) -> TensorType:
    t = types[i]
    label = f"argument {i + 1}" + (f" ('{name}')" if name else "")
    if not isinstance(t, TensorType):
        raise OpTypeError(f"{label} must be a tensor, got {t}", arg=i)
    if rank is not None and t.rank != rank:
        raise OpTypeError(f"{label} must have rank {rank}, got {t}", arg=i)
    return t


def same_as_input(types: Sequence[Type], attrs: Mapping[str, Any]) -> Type:
    return tensor(types, 0, "data")


def numeric_input(types: Sequence[Type], attrs: Mapping[str, Any]) -> Type:
    """The input's type, which must hold numbers (not bool: arithmetic on truth values is a
    type error, as numpy's negative of a bool is)."""
    t = tensor(types, 0, "data")
    if t.dtype == "bool":
        raise OpTypeError("argument 1 ('data') must hold numbers, got bool", arg=0)
    return t


def float_input(types: Sequence[Type], attrs: Mapping[str, Any]) -> Type:
    t = tensor(types, 0, "data")
    if not is_float(t.dtype):
        raise OpTypeError(f"argument 1 ('data') must be a float tensor, got {t.dtype}", arg=0)
    return t


def broadcast_shapes(a: tuple, b: tuple) -> tuple | None:
    """numpy's broadcast of two shapes, or None where they do not broadcast. A size known only
    at run time (a Dim) broadcasts with itself and with 1; against another size, whether the
    shapes broadcast depends on it (SizeUnknown)."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif isinstance(x, Dim) or isinstance(y, Dim):
            raise SizeUnknown(f"{x} against {y} broadcast only where they are equal or one "
                              f"is 1")
        else:
            return None
    return tuple(int(d) if not isinstance(d, Dim) else d for d in reversed(out))


def broadcast(types: Sequence[Type], attrs: Mapping[str, Any], numbers: bool = True) -> Type:
    """Two operands of one dtype (numbers unless ``numbers`` is off) broadcast together."""
    a, b = tensor(types, 0, "lhs"), tensor(types, 1, "rhs")
    if a.dtype != b.dtype:
        raise OpTypeError(f"operands have different dtypes: {a.dtype} and {b.dtype}", arg=1)
    if numbers and a.dtype == "bool":
        raise OpTypeError("operands must hold numbers, got bool", arg=0)
    shape = broadcast_shapes(a.shape, b.shape)
    if shape is None:
        raise OpTypeError(f"shapes {a.shape} and {b.shape} do not broadcast", arg=1)
    return TensorType(shape, a.dtype)


def out_dtype(attrs: Mapping[str, Any], default: str) -> str:
    return attrs.get("out_dtype") or default


def compute_dtypes(types: Sequence[Type], attrs: Mapping[str, Any], a: TensorType,
                   b: TensorType) -> str:
    """Input dtypes of conv2d/dense: equal floats, or integers with an out_dtype."""
    if is_float(a.dtype) or is_float(b.dtype):
        if a.dtype != b.dtype:
            raise OpTypeError(f"data is {a.dtype} but weight is {b.dtype}", arg=1)
        return out_dtype(attrs, a.dtype)
    if not (is_int(a.dtype) and is_int(b.dtype)):
        raise OpTypeError(f"unsupported dtypes {a.dtype} and {b.dtype}", arg=1)
    return out_dtype(attrs, default_compute_dtype(a.dtype, b.dtype))


def norm_axis(axis: int, rank: int, arg: int = 0) -> int:
    """``axis`` in [0, rank): a scalar (rank 0) has no axis to name."""
    if not -rank <= axis < rank:
        raise OpTypeError(f"axis {axis} is out of range for rank {rank}"
                          + (" (a scalar has no axes)" if rank == 0 else ""), arg=arg)
    return axis % rank


def tuple_of(*fields: Type) -> TupleType:
    return TupleType(tuple(fields))
