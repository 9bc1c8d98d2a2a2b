"""The e-graph schema, generated from the op registry: nothing here names an op.

Every value of a program is an ``Expr``. An op becomes one constructor named ``@`` + its name,
whose arguments are its inputs then its attributes in declaration order::

    (@nn.conv2d Expr Expr String String String i64 String String String String String String)
                data weight strides padding dilation groups channels ...

Attribute values are encoded by kind: ints as ``i64``, booleans as ``bool``, everything else
as a ``String`` holding its canonical text (``"[1, 1, 1, 1]"``, ``"1e-05"``, ``"OIHW"``), so
values compare exactly and print back unchanged. Leaves: ``(Input "data")`` for a parameter of
``main``, ``(Const 3)`` for ``meta[relay.Constant][3]``, ``(Scalar "1.0" "float32")`` for a
literal; ``(MkTuple (ECons a (ECons b (ENil))))`` and ``(GetItem t 0)`` for tuples. Names of
values are never part of a node, so equal computations share one e-node.

Analyses kept beside the nodes: ``type-of`` / ``dtype-of`` / ``shape-of`` / ``rank-of``
(written from Python for the classes a guard asks about, the ``need-types`` relation; see
``engine.py``) and ``is-const`` (derived in egglog by rules made here from the registry).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..ops.attrs import (Attr, AttrKind, BoolKind, DTypeKind, FloatKind, IntKind, StrKind,
                         format_value)
from ..ops.registry import OpDef, all_ops

OP_PREFIX = "@"
LEAVES = ("Input", "Const", "Scalar", "MkTuple", "GetItem")


def egg_name(op: OpDef | str) -> str:
    return OP_PREFIX + (op if isinstance(op, str) else op.name)


def attr_sort(kind: AttrKind) -> str:
    if isinstance(kind, IntKind):
        return "i64"
    if isinstance(kind, BoolKind):
        return "bool"
    return "String"


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
    if sort == "bool":
        return "true" if value else "false"
    return egg_string(attr_text(attr.kind, value))


def decode_attr(attr: Attr, literal: Any) -> Any:
    """The inverse of :func:`encode_attr`, from a serialized primitive (already unquoted)."""
    kind = attr.kind
    sort = attr_sort(kind)
    if sort == "i64":
        return int(literal)
    if sort == "bool":
        return literal in (True, "true")
    if isinstance(kind, (StrKind, DTypeKind)):
        return literal
    if isinstance(kind, FloatKind):
        return float(literal)
    return kind.canonical(_literal(literal))


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
            # analyses: types are written from Python; all merges keep the first value, since
            # equal values have equal types
            "(function type-of (Expr) String :merge old)",
            "(function dtype-of (Expr) String :merge old)",
            "(function shape-of (Expr) String :merge old)",
            "(function rank-of (Expr) i64 :merge old)",
            "(relation is-const (Expr))",
            "(relation need-types (Expr))",  # classes a guard wants the types of
            "(relation is-root (Expr))",     # the program's result
            "(relation list-const (ExprList))",
            "(ruleset analysis)",
            "(rule ((= ?e (Const ?i))) ((is-const ?e)) :ruleset analysis :name \"const:Const\")",
            "(rule ((= ?e (Scalar ?v ?d))) ((is-const ?e)) :ruleset analysis "
            ":name \"const:Scalar\")",
            "(rule ((= ?l (ENil))) ((list-const ?l)) :ruleset analysis :name \"const:ENil\")",
            "(rule ((= ?l (ECons ?h ?t)) (is-const ?h) (list-const ?t)) ((list-const ?l)) "
            ":ruleset analysis :name \"const:ECons\")",
            "(rule ((= ?e (MkTuple ?l)) (list-const ?l)) ((is-const ?e)) :ruleset analysis "
            ":name \"const:MkTuple\")",
            "(rule ((= ?e (GetItem ?t ?i)) (is-const ?t)) ((is-const ?e)) :ruleset analysis "
            ":name \"const:GetItem\")",
        ]
        for name, op in self.ops.items():
            args = [f"?a{i}" for i in range(len(op.inputs))]
            attrs = [f"?t{i}" for i in range(len(op.attrs))]
            query = [f"(= ?e ({name} {' '.join(args + attrs)}))"]
            query += [f"(is-const {a})" for a in args]
            lines.append(f"(rule ({' '.join(query)}) ((is-const ?e)) :ruleset analysis "
                         f":name \"const:{name}\")")
        return "\n".join(lines) + "\n"

    def op(self, ctor: str) -> OpDef | None:
        return self.ops.get(ctor)


@lru_cache(maxsize=1)
def schema() -> Schema:
    return Schema({egg_name(op): op for op in all_ops().values()})
