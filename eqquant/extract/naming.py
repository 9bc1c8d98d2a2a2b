"""Names of e-classes as the user's program names them, for explanations: ``%12
(model.ir:14:5)`` for a value of the loaded program, ``%conv1.weight`` for a weight bound from
its parameters, ``multiply(%conv1.weight, ..) (the rules made it)`` for a value the rules made.
"""
from __future__ import annotations

from ..core.nodes import Constant
from ..ir.printer import value_labels
from .view import EGraphView


def class_names(view: EGraphView, session,
                params: tuple = ()) -> dict[str, str]:
    """Each e-class that holds a value of the loaded program, named as the program names it:
    ``%12 (model.ir:14:5)``; a weight bound from ``params`` (the program's parameters before
    binding) by its parameter's name."""
    labels = value_labels(session.encoded.module.main)
    by_loc = {(p.loc.file, p.loc.line, p.loc.column): f"%{p.name}" for p in params
              if p.loc is not None}
    out = {}
    for cls, let in view.lets.items():
        node = session.encoded.nodes.get(let)
        loc = getattr(node, "loc", None)
        label = labels.get(id(node))
        if isinstance(node, Constant):
            label = by_loc.get((loc.file, loc.line, loc.column)) if loc else None
            label = label or f"meta[relay.Constant][{node.index}]"
        if label is None:
            continue
        out[cls] = f"{label} ({loc})" if loc is not None else label
    return out


def namer(view: EGraphView, session, params: tuple = ()):
    """``name_of(cls)``: a value of the program by its name, one the rules made by its op and
    its operands' names (``multiply(%conv1_weight, reshape(..))``)."""
    names = class_names(view, session, params)

    def short(cls: str) -> str:
        return names.get(cls, "..").split(" (")[0]

    def name_of(cls: str) -> str:
        if cls in names:
            return names[cls]
        nodes = view.classes.get(cls, ())
        node = next((n for n in nodes if n.kind == "op"), None)
        if node is None:
            leaf = next((n for n in nodes if n.kind in ("Scalar", "Const", "Input")), None)
            if leaf is None:
                return f"e-class {cls}"
            if leaf.kind == "Scalar":
                return leaf.value[0]
            return (f"meta[relay.Constant][{leaf.value}]" if leaf.kind == "Const"
                    else f"%{leaf.value}")
        return f"{node.op.name}({', '.join(short(k) for k in node.children)}) (the rules made it)"
    return name_of
