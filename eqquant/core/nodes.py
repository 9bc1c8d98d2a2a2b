"""The IR data model: immutable expression nodes forming a DAG, functions and modules.

Sharing is kept by identity: a value used twice is one node object, so

    %0 = nn.relu(%x);
    add(%0, %0)

parses to ``Call(add, (r, r))`` with the *same* ``r`` twice. Nodes hash and compare by identity
(fast dictionary keys for passes); :func:`structural_equal` compares two programs as graphs,
sharing included, and ``Module.__eq__`` uses it.

Value names: parameters keep their names; a binding with a non-numeric name (``%conv1 = ...``)
keeps it as ``name``; numeric bindings (``%0``) are renumbered by the printer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import numpy as np

from ..errors import SourceLoc
from .types import TensorType, Type

if TYPE_CHECKING:
    from ..ops.registry import OpDef


@dataclass(frozen=True, eq=False, slots=True)
class Expr:
    """Base class. Every node has ``loc``: where it was written, when it was parsed."""

    def children(self) -> tuple["Expr", ...]:
        return ()


_NODE = dict(frozen=True, eq=False, slots=True, kw_only=True)


@dataclass(**_NODE)
class Var(Expr):
    """A function parameter: ``%data: Tensor[(1, 3, 224, 224), float32]``."""

    name: str
    type: Type
    loc: SourceLoc | None = None


@dataclass(**_NODE)
class GlobalVar(Expr):
    """A reference to another function of the module: ``@helper``."""

    name: str
    loc: SourceLoc | None = None


@dataclass(**_NODE)
class Constant(Expr):
    """``meta[relay.Constant][index]``: a tensor constant whose value lives in the params file.

    ``data`` is None until params are attached (``fmt`` and ``check`` need only the type).
    """

    index: int
    type: TensorType
    data: np.ndarray | None = None
    loc: SourceLoc | None = None


@dataclass(**_NODE)
class Scalar(Expr):
    """An inline scalar literal: ``1f``, ``-127f``, ``3i64``, ``True``."""

    value: float | int | bool
    dtype: str
    loc: SourceLoc | None = None

    @property
    def type(self) -> TensorType:
        return TensorType((), self.dtype)

    @property
    def data(self) -> np.ndarray:
        return np.asarray(self.value, dtype=self.dtype)


@dataclass(**_NODE)
class Call(Expr):
    """A call of a registry op (``op`` is an OpDef) or of a function value (``op`` is an Expr).

    ``attrs`` holds every attribute of the op, canonical and with defaults filled in.
    """

    op: "OpDef | Expr"
    args: tuple[Expr, ...]
    attrs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    name: str | None = None
    loc: SourceLoc | None = None
    # how the optimizer made this call (``extract.provenance.Origin``: the rules, in order,
    # and what extraction rejected for it); None for a call written by the user
    origin: Any = None

    def children(self) -> tuple[Expr, ...]:
        if isinstance(self.op, Expr):  # the callee last: a composite prints next to its call
            return (*self.args, self.op)
        return self.args

    @property
    def op_name(self) -> str | None:
        return None if isinstance(self.op, Expr) else self.op.name


@dataclass(**_NODE)
class Tuple(Expr):
    fields: tuple[Expr, ...]
    name: str | None = None
    loc: SourceLoc | None = None

    def children(self) -> tuple[Expr, ...]:
        return self.fields


@dataclass(**_NODE)
class TupleGetItem(Expr):
    """Projection ``%1.0``."""

    tuple: Expr
    index: int
    name: str | None = None
    loc: SourceLoc | None = None

    def children(self) -> tuple[Expr, ...]:
        return (self.tuple,)


@dataclass(**_NODE)
class Function(Expr):
    """``def @main(...) { ... }`` or an inline ``fn (...) { ... }`` with optional attributes
    such as ``Composite="ccompiler.conv_add_relu"``. The body is its own scope: a Function is a
    leaf of the graph it appears in."""

    params: tuple[Var, ...]
    body: Expr
    ret_type: Type | None = None
    attrs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    name: str | None = None
    loc: SourceLoc | None = None


@dataclass(eq=False)
class Module:
    """The functions of a program, in order; ``main`` is the entry point.

    ``annotations`` holds the ``/* ty=... */`` comments read with the program, as
    ``(node, type, loc)``; the type checker checks each against the inferred type.
    """

    functions: dict[str, Function]
    version: str | None = "0.0.5"
    annotations: list[tuple[Expr, Type, SourceLoc]] = field(default_factory=list)

    @property
    def main(self) -> Function:
        return self.functions["main"]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Module):
            return NotImplemented
        return structural_equal(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        return _PRINTER[0](self) if _PRINTER else object.__repr__(self)

    def show(self) -> None:
        """Print with every value's inferred type, as TVM's ``mod.show()`` does."""
        print(_PRINTER[0](self, show_types=True) if _PRINTER else object.__repr__(self))


# The text form of a module, set by ``ir.printer`` when it loads (``eqquant.ir`` loads it):
# this package sits below the text IR and does not import it.
_PRINTER: list[Callable[..., str]] = []


def set_printer(print_module: Callable[..., str]) -> None:
    _PRINTER[:] = [print_module]


def freeze_attrs(attrs: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(attrs))


def post_order(root: Expr, done: Any = ()) -> list[Expr]:
    """All nodes reachable from ``root`` (not entering Function bodies), children first, each
    once. Iterative, so arbitrarily deep graphs are fine. Nodes whose id is in ``done`` are
    neither listed nor entered (a caller that has seen them already walks only what is new)."""
    order: list[Expr] = []
    seen: set[int] = set()
    if id(root) in done:
        return order
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for child in reversed(node.children()):
            if id(child) not in seen and id(child) not in done:
                stack.append((child, False))
    return order


def iter_functions(expr: Expr) -> Iterator[Function]:
    """Inline functions reachable from ``expr``, innermost first."""
    for node in post_order(expr):
        if isinstance(node, Function):
            yield from iter_functions(node.body)
            yield node


def rebuild(node: Expr, children: tuple[Expr, ...]) -> Expr:
    """A copy of ``node`` with new children (same order as ``node.children()``)."""
    if isinstance(node, Call):
        if isinstance(node.op, Expr):
            return Call(op=children[-1], args=children[:-1], attrs=node.attrs, name=node.name,
                        loc=node.loc, origin=node.origin)
        return Call(op=node.op, args=children, attrs=node.attrs, name=node.name, loc=node.loc,
                    origin=node.origin)
    if isinstance(node, Tuple):
        return Tuple(fields=children, name=node.name, loc=node.loc)
    if isinstance(node, TupleGetItem):
        return TupleGetItem(tuple=children[0], index=node.index, name=node.name, loc=node.loc)
    return node


# ---------------------------------------------------------------------------------------------
# Structural equality (graph isomorphism that respects order, names and sharing)


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and (
            a == b or (a != a and b != b))
    return type(a) is type(b) and a == b


def _attrs_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.keys() == b.keys() and all(_values_equal(a[k], b[k]) for k in a)


class _Matcher:
    def __init__(self, names: bool = True) -> None:
        self.names = names
        self.fwd: dict[int, Expr] = {}
        self.bwd: dict[int, Expr] = {}

    def bind(self, a: Expr, b: Expr) -> bool:
        fa, fb = self.fwd.get(id(a)), self.bwd.get(id(b))
        if fa is not None or fb is not None:
            return fa is b and fb is a
        self.fwd[id(a)] = b
        self.bwd[id(b)] = a
        return True

    def expr(self, a: Expr, b: Expr) -> bool:
        stack = [(a, b)]
        while stack:
            x, y = stack.pop()
            if id(x) in self.fwd or id(y) in self.bwd:
                if not self.bind(x, y):
                    return False
                continue
            if not self.shallow(x, y):
                return False
            self.bind(x, y)
            cx, cy = x.children(), y.children()
            if len(cx) != len(cy):
                return False
            stack.extend(zip(cx, cy))
        return True

    def shallow(self, x: Expr, y: Expr) -> bool:
        if type(x) is not type(y):
            return False
        if isinstance(x, Var):
            return False  # free variables match only through a binding made by their function
        if isinstance(x, GlobalVar):
            return x.name == y.name
        if isinstance(x, Constant):
            return x.index == y.index and x.type == y.type
        if isinstance(x, Scalar):
            return x.dtype == y.dtype and _values_equal(x.value, y.value)
        same_name = not self.names or getattr(x, "name", None) == getattr(y, "name", None)
        if isinstance(x, Call):
            if isinstance(x.op, Expr) != isinstance(y.op, Expr):
                return False
            if not isinstance(x.op, Expr) and x.op is not y.op:
                return False
            return same_name and _attrs_equal(x.attrs, y.attrs)
        if isinstance(x, Tuple):
            return same_name
        if isinstance(x, TupleGetItem):
            return x.index == y.index and same_name
        if isinstance(x, Function):
            return self.function(x, y)
        return False

    def function(self, f: Function, g: Function) -> bool:
        if len(f.params) != len(g.params) or (self.names and f.name != g.name):
            return False
        if f.ret_type != g.ret_type or not _attrs_equal(f.attrs, g.attrs):
            return False
        for p, q in zip(f.params, g.params):
            if (self.names and p.name != q.name) or p.type != q.type or not self.bind(p, q):
                return False
        return self.expr(f.body, g.body)


def structural_equal(a: Module | Expr, b: Module | Expr, names: bool = True) -> bool:
    """True when the two programs are the same graph: same ops, attributes, names, types and
    the same sharing. Constants compare by index and type (their data lives in params).
    ``names=False`` ignores the names of values (as TVM's structural_equal does)."""
    m = _Matcher(names)
    if isinstance(a, Module) and isinstance(b, Module):
        if list(a.functions) != list(b.functions) or a.version != b.version:
            return False
        return all(m.function(a.functions[k], b.functions[k]) for k in a.functions)
    if isinstance(a, Module) or isinstance(b, Module):
        return False
    return m.expr(a, b)


def rewrite(root: Expr, visit, new: dict[int, Expr] | None = None) -> Expr:
    """Rebuild ``root`` bottom-up, inner function bodies included. ``visit(node,
    new_children)`` returns the replacement of ``node`` or None to keep it (rebuilt only if a
    child changed). Sharing is kept. ``new``, where given, receives each node's id -> the
    node that stands for it in the result."""
    new = {} if new is None else new
    for node in post_order(root):
        children = tuple(new[id(c)] for c in node.children())
        if isinstance(node, Function):
            body = rewrite(node.body, visit)
            if body is not node.body:
                node = Function(params=node.params, body=body, ret_type=node.ret_type,
                                attrs=node.attrs, name=node.name, loc=node.loc)
        out = visit(node, children)
        if out is None:
            changed = any(a is not b for a, b in zip(children, node.children()))
            out = rebuild(node, children) if changed else node
        new[id(node)] = out
    return new[id(root)]
