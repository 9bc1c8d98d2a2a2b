"""Types of the text IR: tensors (a scalar is a rank-0 tensor), tuples and functions.

    Tensor[(1, 64, 56, 56), float32]      TensorType((1, 64, 56, 56), "float32")
    float32                               TensorType((), "float32")
    (Tensor[(4), int8], float32)          TupleType(...)
    fn (Tensor[(4), int8]) -> float32     FuncType(...)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


def np_dtype(dtype: str) -> np.dtype:
    return np.dtype(dtype)


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
