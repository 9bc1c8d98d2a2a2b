"""Module -> canonical text.

The canonical form: every value that is not an atom (parameter, constant, literal) gets one
binding ``%N = ...;`` in dependency order, numbered from 0 in each ``def`` (a named binding keeps
its name); attributes equal to their defaults are left out and the rest are printed in the op's
declaration order; ``meta[relay.Constant][i]`` always carries its ``/* ty=... */`` so the text
can be read back without the params file. ``print(parse(print(m))) == print(m)`` and
``parse(print(m)) == m``.

``show_types=True`` adds ``/* ty=... */`` after every value, as TVM's ``mod.show()`` does.
"""
from __future__ import annotations

from typing import Any

from ..ops.attrs import format_float, format_value
from ..core.nodes import (Call, Constant, Expr, Function, GlobalVar, Module, Scalar, Tuple,
                          TupleGetItem, Var, post_order, set_printer)
from ..core.types import Type


def format_scalar(value: Any, dtype: str) -> str:
    if dtype == "bool":
        return "True" if value else "False"
    if dtype == "float32":
        return format_float(float(value), "f")
    if dtype.startswith("float"):
        return format_float(float(value)) + "f" + dtype[5:]
    suffix = "" if dtype == "int32" else dtype[0] + dtype.lstrip("uint")
    return f"{int(value)}{suffix}"


class _Printer:
    def __init__(self, types: dict[int, Type] | None):
        self.types = types
        self.counter = 0

    def ann(self, node: Expr) -> str:
        if self.types is None or id(node) not in self.types:
            return ""
        return f" /* ty={self.types[id(node)]} */"

    def atom(self, node: Expr, names: dict[int, str]) -> str | None:
        if isinstance(node, Var):
            return f"%{node.name}"
        if isinstance(node, GlobalVar):
            return f"@{node.name}"
        if isinstance(node, Constant):
            return f"meta[relay.Constant][{node.index}] /* ty={node.type} */"
        if isinstance(node, Scalar):
            return format_scalar(node.value, node.dtype) + self.ann(node)
        return names.get(id(node))

    def ref(self, node: Expr, names: dict[int, str]) -> str:
        text = self.atom(node, names)
        if text is None:
            raise ValueError(f"internal: {type(node).__name__} printed before it is bound")
        return text

    def expr_text(self, node: Expr, names: dict[int, str], indent: int) -> str:
        if isinstance(node, Call):
            args = [self.ref(a, names) for a in node.args]
            if isinstance(node.op, Expr):
                return f"{self.ref(node.op, names)}({', '.join(args)})"
            args += [f"{k}={v}" for k, v in node.op.printed_attrs(node.attrs)]
            return f"{node.op.name}({', '.join(args)})"
        if isinstance(node, Tuple):
            inner = ", ".join(self.ref(f, names) for f in node.fields)
            return f"({inner},)" if len(node.fields) == 1 else f"({inner})"
        if isinstance(node, TupleGetItem):
            return f"{self.ref(node.tuple, names)}.{node.index}"
        if isinstance(node, Function):
            return self.function(node, "fn ", indent, names)
        return self.ref(node, names)

    def body(self, root: Expr, indent: int, names: dict[int, str], taken: set[str]) -> list[str]:
        pad = "  " * indent
        lines = []
        # a named result is bound too, so that its name survives: %out = ...; %out
        bind_root = bool(getattr(root, "name", None)) and self.atom(root, names) is None
        for node in post_order(root):
            if self.atom(node, names) is not None or (node is root and not bind_root):
                continue
            hint = getattr(node, "name", None)
            if hint and hint not in taken:
                label = hint
            else:
                label = str(self.counter)
                self.counter += 1
            taken.add(label)
            text = self.expr_text(node, names, indent)
            names[id(node)] = f"%{label}"
            lines.append(f"{pad}%{label} = {text}{self.ann(node)};")
        if bind_root:
            lines.append(f"{pad}{names[id(root)]}")
        else:
            lines.append(f"{pad}{self.expr_text(root, names, indent)}{self.ann(root)}")
        return lines

    def function(self, fn: Function, head: str, indent: int,
                 outer: dict[int, str] | None = None) -> str:
        params = [f"%{p.name}: {p.type}" for p in fn.params]
        params += [f"{k}={format_value(v)}" for k, v in fn.attrs.items()]
        ret = fn.ret_type
        if ret is None and self.types is not None and id(fn.body) in self.types:
            ret = self.types[id(fn.body)]
        sig = f"{head}({', '.join(params)})" + (f" -> {ret}" if ret is not None else "")
        names = dict(outer or {})
        taken = {p.name for p in fn.params} | {n[1:] for n in names.values()}
        lines = self.body(fn.body, indent + 1, names, taken)
        close = "  " * indent + "}"
        return sig + " {\n" + "\n".join(lines) + "\n" + close


def print_module(mod: Module, show_types: bool = False) -> str:
    types = None
    if show_types:
        from .typecheck import infer_types
        types = infer_types(mod)
    out = []
    if mod.version is not None:
        out.append(f'#[version = "{mod.version}"]')
    for name, fn in mod.functions.items():
        p = _Printer(types)
        out.append(p.function(fn, f"def @{name}", 0))
    return "\n".join(out) + "\n"


def print_expr(expr: Expr) -> str:
    """A single expression with its bindings (for messages and debugging)."""
    p = _Printer(None)
    return "\n".join(p.body(expr, 0, {}, set()))



def value_labels(fn: Function) -> dict[int, str]:
    """The names ``print_module`` gives ``fn``'s values (``%3``, ``%conv1``, parameters by
    name; an unnamed result is ``%result``), by node id: how calibration tables and reports
    refer to values."""
    labels: dict[int, str] = {id(p): f"%{p.name}" for p in fn.params}
    p = _Printer(None)
    names: dict[int, str] = {}
    p.body(fn.body, 1, names, {q.name for q in fn.params})
    labels.update(names)
    labels.setdefault(id(fn.body), "%result")
    return labels


set_printer(print_module)   # str(module) and module.show() print the text IR
