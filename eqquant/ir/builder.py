"""Building programs from Python, checked against the registry as they are built.

    b = Builder()
    x = b.input("data", (1, 3, 32, 32))
    w = b.param("conv.weight", rng.normal(size=(8, 3, 3, 3)).astype("float32"))
    y = b.call("nn.conv2d", x, w, padding=1)      # attributes canonicalised: [1, 1, 1, 1]
    mod, params = b.finish(b.call("nn.relu", y))
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ops.registry import get_op
from ..core.nodes import (Call, Expr, Function, Module, Scalar, Tuple, TupleGetItem, Var,
                          freeze_attrs)
from .typecheck import Inferer
from ..core.types import TensorType


class Builder:
    def __init__(self) -> None:
        self.params: list[Var] = []
        self.values: dict[str, np.ndarray] = {}
        self._types = Inferer(None)  # memoised: each new node is typed once

    def input(self, name: str, shape: tuple[int, ...], dtype: str = "float32") -> Var:
        v = Var(name=name, type=TensorType(tuple(shape), dtype))
        self.params.append(v)
        return v

    def param(self, name: str, value: np.ndarray) -> Var:
        value = np.asarray(value)  # (np.ascontiguousarray would make a 0-d array 1-d)
        if not value.flags.c_contiguous:
            value = value.copy()
        v = self.input(name, value.shape, str(value.dtype))
        self.values[name] = value
        return v

    def call(self, op_name: str, *args: Expr, **attrs: Any) -> Call:
        op = get_op(op_name)
        if len(args) != len(op.inputs):
            raise TypeError(f"{op_name} takes {len(op.inputs)} arguments, got {len(args)}")
        node = Call(op=op, args=tuple(args), attrs=freeze_attrs(op.canonical_attrs(attrs)))
        self._types.expr(node)  # fail here, where the model is built, not later
        return node

    def scalar(self, value: float, dtype: str = "float32") -> Scalar:
        with np.errstate(over="ignore"):  # a float16 literal may round to inf, as written
            v = float(np.dtype(dtype).type(value)) if dtype.startswith("float") else int(value)
        return Scalar(value=v, dtype=dtype)

    def tuple(self, *fields: Expr) -> Tuple:
        return Tuple(fields=tuple(fields))

    def get(self, tup: Expr, index: int) -> TupleGetItem:
        return TupleGetItem(tuple=tup, index=index)

    def finish(self, out: Expr) -> tuple[Module, dict[str, np.ndarray]]:
        fn = Function(params=tuple(self.params), body=out)
        return Module({"main": fn}), dict(self.values)
