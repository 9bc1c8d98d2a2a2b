"""The e-graph schema, generated from the op registry: nothing here names an op.

Every value of a program is an ``Expr``. An op becomes one constructor named ``@`` + its name,
whose arguments are its inputs then its attributes in declaration order::

    (@nn.conv2d Expr Expr String String String i64 String String String String String String)
                data weight strides padding dilation groups channels ...

Attribute values are encoded by kind: ints as ``i64``, everything else (booleans too)
as a ``String`` holding its canonical text (``"[1, 1, 1, 1]"``, ``"1e-05"``, ``"OIHW"``), so
values compare exactly and print back unchanged. Leaves: ``(Input "data")`` for a parameter of
``main``, ``(Const 3)`` for ``meta[relay.Constant][3]``, ``(Scalar "1.0" "float32")`` for a
literal; ``(MkTuple (ECons a (ECons b (ENil))))`` and ``(GetItem t 0)`` for tuples. Names of
values are never part of a node, so equal computations share one e-node.

The analyses kept beside the nodes (types and constness) are declared in ``analysis.py``.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..ops.attrs import (Attr, AttrKind, DTypeKind, FloatKind, IntKind, SizesKind, StrKind,
                         format_value)
from ..ops.registry import OpDef, all_ops

OP_PREFIX = "@"
LEAVES = ("Input", "Const", "Scalar", "MkTuple", "GetItem")


def egg_name(op: OpDef | str) -> str:
    return OP_PREFIX + (op if isinstance(op, str) else op.name)


def attr_sort(kind: AttrKind) -> str:
    if isinstance(kind, IntKind):
        return "i64"
    return "String"   # booleans too ("True"/"False"): every attribute is an i64 or a String


def egg_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def attr_text(kind: AttrKind, value: Any) -> str:
    """The canonical text of an attribute value inside a String (for String-sorted kinds)."""
    if isinstance(kind, (StrKind, DTypeKind)):
        return value
    if isinstance(kind, FloatKind):
        return repr(float(value))
    return format_value(value)


def encode_attr(attr: Attr, value: Any) -> str:
    """An attribute value as an egglog literal."""
    sort = attr_sort(attr.kind)
    if sort == "i64":
        return str(int(value))
    return egg_string(attr_text(attr.kind, value))


def decode_attr(attr: Attr, literal: Any) -> Any:
    """The inverse of :func:`encode_attr`, from a serialized primitive (already unquoted)."""
    kind = attr.kind
    sort = attr_sort(kind)
    if sort == "i64":
        return int(literal)
    if isinstance(kind, (StrKind, DTypeKind)):
        return literal
    if isinstance(kind, FloatKind):
        return float(literal)
    if isinstance(kind, SizesKind):
        return kind.canonical(_sizes(literal))
    return kind.canonical(_literal(literal))


def _sizes(text: str) -> list:
    """A shape's text (``[?n, 4, -1]``) read back: ints and sizes known at run time."""
    from ..core.types import dim_of_text
    inner = text.strip()[1:-1].strip()
    return [int(p) if p.strip().lstrip("-").isdigit() else
            dim_of_text(p.strip(), lambda: "_")
            for p in inner.split(",")] if inner else []


def _literal(text: str) -> Any:
    return None if text == "None" else ast.literal_eval(text)


def scalar_text(value: Any, dtype: str) -> str:
    if dtype == "bool":
        return "True" if value else "False"
    if dtype.startswith("float"):
        return repr(float(value))
    return str(int(value))


def scalar_value(text: str, dtype: str) -> Any:
    if dtype == "bool":
        return text == "True"
    if dtype.startswith("float"):
        return float(text)
    return int(text)


@dataclass(frozen=True)
class Schema:
    """The egglog declarations of all registered ops, and how to read their nodes back."""

    ops: dict[str, OpDef]  # egglog constructor name -> op

    def declarations(self) -> str:
        ctors = ["(Input String)", "(Const i64)", "(Scalar String String)",
                 "(MkTuple ExprList)", "(GetItem Expr i64)"]
        for name, op in self.ops.items():
            sorts = ["Expr"] * len(op.inputs) + [attr_sort(a.kind) for a in op.attrs]
            ctors.append(f"({name} {' '.join(sorts)})")
        lines = [
            "(datatype*",
            "  (Expr " + "\n        ".join(ctors) + ")",
            "  (ExprList (ENil) (ECons Expr ExprList)))",
        ]
        return "\n".join(lines) + "\n"

    def op(self, ctor: str) -> OpDef | None:
        return self.ops.get(ctor)


def schema() -> Schema:
    """The schema of the ops registered now (an op registered later gets a new schema)."""
    return _schema(tuple(all_ops()))


@lru_cache(maxsize=4)
def _schema(names: tuple[str, ...]) -> Schema:
    ops = all_ops()
    return Schema({egg_name(ops[n]): ops[n] for n in names})
