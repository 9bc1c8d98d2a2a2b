"""A module's ``main`` as an egglog program: one ``(let $eN_ ...)`` per value, sharing kept.

    %0 = nn.relu(%x);  add(%0, %0)
    ==>
    (let $e0_ (Input "x"))
    (let $e1_ (@nn.relu $e0_))
    (let $e2_ (@add $e1_ $e1_))

Loading is one text program (fast: a 2,000-op graph loads in a fraction of a second); the
analyses then give every value its type (``analysis.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import EqquantError
from ..core.nodes import Call, Constant, Expr, Module, Scalar, Tuple, TupleGetItem, Var, post_order
from ..ir.typecheck import infer_types
from ..passes.inline import inline_calls
from .schema import egg_name, egg_string, encode_attr, scalar_text


def leaf_term(node: Expr) -> str | None:
    if isinstance(node, Var):
        return f"(Input {egg_string(node.name)})"
    if isinstance(node, Constant):
        return f"(Const {node.index})"
    if isinstance(node, Scalar):
        return f"(Scalar {egg_string(scalar_text(node.value, node.dtype))} " \
               f"{egg_string(node.dtype)})"
    return None


def list_term(items: list[str], tail: str = "(ENil)") -> str:
    """A cons list of ``items``; ``tail`` ends it (an ExprList variable: the rest of a tuple
    pattern)."""
    out = tail
    for item in reversed(items):
        out = f"(ECons {item} {out})"
    return out


@dataclass
class Encoded:
    program: str
    root: str                                   # let name of the result
    lets: dict[int, str] = field(default_factory=dict)  # id(node) -> let name
    nodes: dict[str, Expr] = field(default_factory=dict)  # let name -> node
    module: Module | None = None                # the flattened module that was encoded


def encode(mod: Module) -> Encoded:
    flat = inline_calls(mod)
    types = infer_types(flat)
    lines: list[str] = []
    enc = Encoded("", "", module=flat)
    for node in post_order(flat.main.body):
        term = leaf_term(node)
        ref = lambda e: enc.lets[id(e)]  # noqa: E731
        if term is None:
            if isinstance(node, Call):
                args = [ref(a) for a in node.args]
                values = node.attrs
                if node.op.canonicalize is not None:
                    values = node.op.canonicalize([types[id(a)] for a in node.args], values)
                attrs = [encode_attr(a, values[a.name]) for a in node.op.attrs]
                term = f"({egg_name(node.op)} {' '.join(args + attrs)})"
            elif isinstance(node, Tuple):
                term = f"(MkTuple {list_term([ref(f) for f in node.fields])})"
            elif isinstance(node, TupleGetItem):
                term = f"(GetItem {ref(node.tuple)} {node.index})"
            else:
                raise EqquantError(f"cannot load a {type(node).__name__} into the e-graph",
                                   getattr(node, "loc", None))
        name = f"$e{len(enc.lets)}_"   # (ending in "_": see engine.unambiguous_names)
        enc.lets[id(node)] = name
        enc.nodes[name] = node
        lines.append(f"(let {name} {term})")
    enc.root = enc.lets[id(flat.main.body)]
    lines.append(f"(is-root {enc.root})")
    enc.program = "\n".join(lines) + "\n"
    return enc
