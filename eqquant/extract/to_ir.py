"""An extraction (one node per class) back to an IR module.

Parameters keep their ``Var`` objects and constants their data; a class that held a named
value of the input program gives its name to the node chosen for it; weak scalars get the dtype
of the operand they are combined with.
"""
from __future__ import annotations

from ..errors import EqquantError
from ..core.nodes import (Call, Constant, Expr, Function, Module, Scalar, Tuple, TupleGetItem,
                          freeze_attrs)
from ..core.types import TensorType
from ..egraph.encode import Encoded
from ..egraph.schema import scalar_value
from .view import WEAK, EGraphView, ENode


def to_module(view: EGraphView, choice: dict[str, ENode], root: str, encoded: Encoded,
              origins: dict | None = None) -> Module:
    """The program of ``choice``; ``origins`` (``extract.provenance.origins``, by class) gives
    each call its ``origin``."""
    flat = encoded.module
    params = {p.name: p for p in flat.main.params}
    constants = {n.index: n for n in encoded.nodes.values() if isinstance(n, Constant)}
    names: dict[str, str] = {}
    used_names: set[str] = set()
    for cls, let in view.lets.items():
        node = encoded.nodes.get(let)
        name = getattr(node, "name", None)
        if name and name not in used_names:
            names[cls] = name
            used_names.add(name)
    built: dict[str, Expr] = {}

    def scalar(cls: str, dtype: str) -> Expr:
        text, _ = choice[cls].value
        return Scalar(value=scalar_value(text, dtype), dtype=dtype)

    def build(cls: str, node: ENode) -> Expr:
        if node.kind == "Input":
            return params[node.value]
        if node.kind == "Const":
            return constants[node.value]
        if node.kind == "Scalar":
            text, dtype = node.value
            if dtype == "weak":
                raise EqquantError("internal: a weak scalar with no operand to take a dtype")
            return Scalar(value=scalar_value(text, dtype), dtype=dtype)
        kids = list(node.children)
        if node.kind == "GetItem":
            return TupleGetItem(tuple=built[kids[0]], index=node.value, name=names.get(cls))
        if node.kind == "MkTuple":
            return Tuple(fields=tuple(built[k] for k in kids), name=names.get(cls))
        strong = next((view.types[k].dtype for k in kids if view.types[k] != WEAK and
                       isinstance(view.types[k], TensorType)), None)
        args = tuple(scalar(k, strong) if view.types[k] == WEAK else built[k] for k in kids)
        return Call(op=node.op, args=args, attrs=freeze_attrs(node.attrs), name=names.get(cls),
                    origin=origins.get(cls) if origins else None)

    # operands first, without recursion (graphs can be thousands of values deep)
    stack: list[tuple[str, bool]] = [(root, False)]
    while stack:
        cls, expanded = stack.pop()
        if cls in built:
            continue
        node = choice[cls]
        if expanded or not node.children:
            if view.types.get(cls) == WEAK:
                built[cls] = None  # type: ignore[assignment]  (made per use, with a dtype)
                continue
            built[cls] = build(cls, node)
            continue
        stack.append((cls, True))
        stack.extend((k, False) for k in node.children if k not in built)
    main = Function(params=flat.main.params, body=built[root], ret_type=flat.main.ret_type)
    return Module({"main": main}, version=flat.version)
