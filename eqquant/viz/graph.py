"""A program as a Graphviz graph: one box per op with its result type, integer results shaded
blue, quantize/dequantize orange, float grey; constants are left out (each box says how many
constant operands it reads).

    dot = to_dot(module)                  # DOT text
    write_graph(dot, "model.svg")         # rendered by Graphviz's dot, or model.dot without it
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..errors import EqquantError
from ..core.nodes import Call, Constant, Expr, Module, Scalar, Tuple, TupleGetItem, Var, post_order
from ..ir.printer import value_labels
from ..ir.typecheck import infer_types
from ..core.types import TensorType, is_int
from ..ops.registry import QUANT
from ..passes.inline import inline_calls

FILL = {"int": "#c6dbef", "quant": "#fdd0a2", "float": "#eeeeee", "input": "#d9f0d3"}


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(mod: Module, name: str = "program") -> str:
    flat = inline_calls(mod)
    types = infer_types(flat)
    labels = value_labels(flat.main)
    ids: dict[int, str] = {}
    lines = [f"digraph {_quote(name)} {{", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];']
    for node in post_order(flat.main.body):
        if isinstance(node, (Constant, Scalar)) or (
                isinstance(node, Call) and isinstance(node.op, Expr)):
            continue
        nid = f"n{len(ids)}"
        ids[id(node)] = nid
        t = types.get(id(node))
        ty = f"{t.shape} {t.dtype}" if isinstance(t, TensorType) else ""
        if isinstance(node, Var):
            text, fill = f"{labels.get(id(node), node.name)}\n{ty}", FILL["input"]
        elif isinstance(node, Call):
            consts = sum(isinstance(a, (Constant, Scalar)) for a in node.args)
            text = f"{node.op.name}\n{ty}" + (f"\n+{consts} const" if consts else "")
            fill = (FILL["quant"] if _crosses(node, t, types)
                    else FILL["int"] if isinstance(t, TensorType) and is_int(t.dtype)
                    else FILL["float"])
        elif isinstance(node, Tuple):
            text, fill = "tuple", FILL["float"]
        elif isinstance(node, TupleGetItem):
            text, fill = f".{node.index}", FILL["float"]
        else:
            continue
        tip = labels.get(id(node), "")
        lines.append(f"  {nid} [label={_quote(text)}, fillcolor={_quote(fill)}"
                     + (f", tooltip={_quote(tip)}" if tip else "") + "];")
        for arg in node.children():
            if id(arg) in ids:
                lines.append(f"  {ids[id(arg)]} -> {nid};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_graph(dot: str, path: str | Path) -> Path:
    """Write ``dot`` rendered to ``path``'s format, or as ``.dot`` text (beside ``path``, with
    its suffix changed) when Graphviz is not installed. Returns the path written."""
    from ..ir.params import atomic_write
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt in ("dot", "gv", ""):
        target = path if fmt else path.with_suffix(".dot")
        atomic_write(target, lambda tmp: Path(tmp).write_text(dot, encoding="utf-8"))
        return target
    exe = shutil.which("dot")
    if exe is None:
        target = path.with_suffix(".dot")
        atomic_write(target, lambda tmp: Path(tmp).write_text(dot, encoding="utf-8"))
        return target

    def render(tmp):
        r = subprocess.run([exe, f"-T{fmt}", "-o", str(tmp)], input=dot, text=True,
                           capture_output=True)
        if r.returncode != 0:
            raise EqquantError(f"{path}: Graphviz could not render the graph: "
                               f"{r.stderr.strip()}")
    atomic_write(path, render)
    return path


def _crosses(node: Call, t, types) -> bool:
    """A quantization op between float and integers (a quantize or a dequantize)."""
    if QUANT not in getattr(node.op, "props", ()) or not node.args:
        return False
    src = types.get(id(node.args[0]))
    return isinstance(t, TensorType) and isinstance(src, TensorType) and \
        is_int(t.dtype) != is_int(src.dtype)
