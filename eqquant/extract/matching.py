"""A rule's left side matched in Python on the saturated e-graph, with the reason of every
near miss, and its right side looked up there.

egglog answers *how often* a rule matched. This answers *where* (the e-classes a left side
matches, guards included), *why not there* (for each e-class whose value is the pattern's head
op, the first part that failed: an operand that is another op, an attribute of another value,
a variable bound to two values, a guard; the deepest failure is reported), and *what a match
built* (the e-nodes of its right side, found in the e-graph: ``extract.provenance`` reads
them). It reads the same patterns egglog runs (``rules.ast``), so the two cannot disagree on
what a rule says; it is used only to explain, never to rewrite.

    m = Matcher(view, name_of=lambda cls: f"e-class {cls}")
    for hit in m.matches(rule):            # Match: the root class and every binding
        ...
    hits, misses = m.explain(rule)          # and Miss(root, depth, reason, at) per near miss
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from ..core.types import TensorType
from ..egraph.schema import encode_attr, scalar_text
from ..ops.attrs import REQUIRED, format_value
from ..ops.registry import OpDef
from ..rules.ast import (AttrLit, AttrTypeOf, AttrVar, PCall, PLit, PMap, PProj, PTuple, PVar,
                         Pattern, Rule, format_pattern)
from ..rules.compile import WEAK       # (the dtype text of a weak scalar)
from .view import EGraphView, ENode


@dataclass(frozen=True)
class Match:
    """One match of a left side: where, and what each variable is bound to."""

    rule: Rule
    reverse: bool                     # a ``<=>`` rule read right to left
    root: str                         # the e-class the left side matched
    classes: dict[str, str]           # ?x -> e-class
    attrs: dict[str, Any]             # ?a -> attribute value
    rests: dict[str, tuple[OpDef, dict]]   # ..?r of a call -> (its op, its attributes)
    lists: dict[str, tuple[str, ...]]      # ..?r of a tuple -> the e-classes of the fields
    opsets: dict[str, OpDef]          # {set} label -> the op it was here
    nodes: tuple[str, ...]            # e-node ids of the left side's calls, top first
    sizes: dict[str, int] = field(default_factory=dict)   # shape patterns' ?n

    @property
    def name(self) -> str:
        return self.rule.name + ("<-" if self.reverse else "")


@dataclass(frozen=True)
class Miss:
    """Why a left side did not match at ``root``: the first part that failed (``depth``: how
    many of the pattern's parts had matched before it)."""

    root: str
    depth: int
    reason: str
    at: str                           # the e-class where it failed


@dataclass(frozen=True)
class _State:
    classes: dict
    attrs: dict
    rests: dict
    lists: dict
    opsets: dict
    nodes: tuple
    depth: int


class _Facts:
    """What a guard asks of a match (``rules.guards.Guard.failure``)."""

    def __init__(self, matcher: "Matcher", st: _State):
        self.m, self.st, self.sizes = matcher, st, {}

    def type(self, var):
        t = self.m.view.types.get(self.st.classes.get(var))
        return t if isinstance(t, TensorType) else None

    def is_const(self, var) -> bool:
        return self.st.classes.get(var) in self.m.view.const

    def attr(self, var):
        return self.st.attrs.get(var)

    def where(self, var) -> str:
        cls = self.st.classes.get(var)
        return self.m.name_of(cls) if cls is not None else var


def _head_depth(p: Pattern) -> int:
    """How many parts match before the head op has (its projection, then the op)."""
    if isinstance(p, PProj):
        return 1 + _head_depth(p.inner)
    return 1


def _head_ops(p: Pattern) -> tuple[OpDef, ...]:
    while isinstance(p, PProj):
        p = p.inner
    return p.op.ops if isinstance(p, PCall) else ()


def _attr_key(spec, value) -> str:
    return encode_attr(spec, value)


class Matcher:
    def __init__(self, view: EGraphView, name_of: Callable[[str], str] | None = None):
        self.view = view
        self.name_of = name_of or (lambda cls: f"e-class {cls}")
        self.by_op: dict[str, list[str]] = {}       # op name -> classes holding it
        self._calls: dict[tuple, tuple[str, str]] = {}    # (op, kids, attrs) -> (class, node)
        self._other: dict[tuple, tuple[str, str]] = {}    # tuples, projections, scalars
        for cls, nodes in view.classes.items():
            for n in nodes:
                if n.kind == "op":
                    self.by_op.setdefault(n.op.name, []).append(cls)
                    key = (n.op.name, n.children,
                           tuple(_attr_key(s, n.attrs[s.name]) for s in n.op.attrs))
                    self._calls.setdefault(key, (cls, n.node_id))
                elif n.kind == "MkTuple":
                    self._other.setdefault(("tuple", n.children), (cls, n.node_id))
                elif n.kind == "GetItem":
                    self._other.setdefault(("item", n.children[0], n.value), (cls, n.node_id))
                elif n.kind == "Scalar":
                    self._other.setdefault(("scalar",) + _scalar_key(*n.value), (cls, n.node_id))
        self._misses: list[Miss] = []

    # -- left sides ---------------------------------------------------------------------------
    def matches(self, rule: Rule, reverse: bool = False) -> list[Match]:
        """Every match of ``rule``'s left side (its right side, ``reverse``) that its guards
        admit, at every e-class."""
        hits, _ = self.explain(rule, reverse, misses=False)
        return hits

    def explain(self, rule: Rule, reverse: bool = False, misses: bool = True
                ) -> tuple[list[Match], list[Miss]]:
        """The matches of the left side, and a :class:`Miss` for each e-class where its head
        op matched and something below it (or a guard) did not."""
        lhs = rule.rhs if reverse else rule.lhs
        guards = [] if reverse else rule.guards
        roots = self._roots(lhs)
        hits: list[Match] = []
        out: list[Miss] = []
        head = _head_depth(lhs)
        for root in roots:
            self._misses = []
            found = False
            for st in self._match(lhs, root, _State({}, {}, {}, {}, {}, (), 0)):
                facts = _Facts(self, st)
                failed = next((r for r in (g.failure(facts) for g in guards) if r), None)
                if failed is not None:
                    self._miss(st, failed, root, extra=1)
                    continue
                found = True
                hits.append(Match(rule, reverse, root, st.classes, st.attrs, st.rests,
                                  st.lists, st.opsets, st.nodes, facts.sizes))
            if not found and misses and self._misses:
                deepest = max(self._misses, key=lambda m: m.depth)
                if deepest.depth >= head:
                    out.append(replace(deepest, root=root))
        return hits, out

    def _roots(self, p: Pattern) -> list[str]:
        ops = _head_ops(p)
        classes = dict.fromkeys(c for o in ops for c in self.by_op.get(o.name, ()))
        if isinstance(p, PProj):    # the classes of projections of those values
            return [cls for cls, nodes in self.view.classes.items()
                    if any(n.kind == "GetItem" and n.children[0] in classes for n in nodes)]
        return list(classes)

    def _miss(self, st: _State, reason: str, at: str, extra: int = 0) -> None:
        self._misses.append(Miss("", st.depth + extra, reason, at))

    def _match(self, p: Pattern, cls: str, st: _State) -> Iterator[_State]:
        nodes = self.view.classes.get(cls, [])
        if isinstance(p, PVar):
            bound = st.classes.get(p.name)
            if bound is None:
                yield replace(st, classes={**st.classes, p.name: cls}, depth=st.depth + 1)
            elif bound == cls:
                yield replace(st, depth=st.depth + 1)
            else:
                self._miss(st, f"{p.name} is {self.name_of(bound)} in one place and "
                               f"{self.name_of(cls)} in another", cls)
            return
        if isinstance(p, PLit):
            text = scalar_text(p.value, p.dtype or ("float32" if isinstance(p.value, float)
                                                    else "int32"))
            if any(n.kind == "Scalar" and n.value[0] == text and
                   (p.dtype is None or n.value[1] == p.dtype) for n in nodes):
                yield replace(st, depth=st.depth + 1)
            else:
                self._miss(st, f"{self.name_of(cls)} is not the literal "
                               f"{format_pattern(p)}", cls)
            return
        if isinstance(p, PProj):
            items = [n for n in nodes if n.kind == "GetItem" and n.value == p.index]
            if not items:
                self._miss(st, f"{self.name_of(cls)} is not item {p.index} of a tuple", cls)
            for n in items:
                yield from self._match(p.inner, n.children[0], replace(st, depth=st.depth + 1))
            return
        if isinstance(p, PTuple):
            tuples = [n for n in nodes if n.kind == "MkTuple" and (
                len(n.children) >= len(p.fields) if p.rest else
                len(n.children) == len(p.fields))]
            if not tuples:
                self._miss(st, f"{self.name_of(cls)} is not a tuple of {len(p.fields)}"
                               + (" or more" if p.rest else ""), cls)
            for n in tuples:
                s = replace(st, depth=st.depth + 1, nodes=st.nodes + (n.node_id,))
                if p.rest:
                    tail = n.children[len(p.fields):]
                    if p.rest in s.lists and s.lists[p.rest] != tail:
                        continue
                    s = replace(s, lists={**s.lists, p.rest: tail})
                yield from self._each(list(p.fields), list(n.children[:len(p.fields)]), s)
            return
        if isinstance(p, PMap):          # (right sides only)
            return
        ops = (st.opsets[p.op.label],) if p.op.label in st.opsets else p.op.ops
        calls = [n for n in nodes if n.kind == "op" and n.op in ops]
        if not calls:
            held = sorted({n.label for n in nodes if n.kind in ("op", "Input", "Const")})
            self._miss(st, f"{self.name_of(cls)} is not {p.op.label}: it is "
                           f"{', '.join(held) or 'something else'}", cls)
        if p.name:                     # (``f(...) as ?r``: ?r is this class)
            bound = st.classes.get(p.name)
            if bound is not None and bound != cls:
                self._miss(st, f"{p.name} is {self.name_of(bound)} in one place and "
                               f"{self.name_of(cls)} in another", cls)
                return
            st = replace(st, classes={**st.classes, p.name: cls})
        for n in calls:
            s = self._attrs(p, n, cls, replace(
                st, depth=st.depth + 1, nodes=st.nodes + (n.node_id,),
                opsets={**st.opsets, p.op.label: n.op} if p.op.is_set else st.opsets))
            if s is not None:
                yield from self._each(list(p.args), list(n.children), s)

    def _attrs(self, p: PCall, n: ENode, cls: str, st: _State) -> _State | None:
        attrs = st.attrs
        for k, v in p.attrs:
            spec = n.op.attr_map[k]
            got = n.attrs[k]
            if isinstance(v, AttrLit):
                if _attr_key(spec, spec.kind.canonical(v.value)) != _attr_key(spec, got):
                    self._miss(st, f"{n.op.name} at {self.name_of(cls)} has {k}="
                                   f"{format_value(got)}; the rule wants {format_value(v.value)}",
                               cls)
                    return None
            elif isinstance(v, AttrVar):
                if v.name in attrs and format_value(attrs[v.name]) != format_value(got):
                    self._miss(st, f"{v.name} is {format_value(attrs[v.name])} in one place "
                                   f"and {format_value(got)} ({n.op.name}'s {k} at "
                                   f"{self.name_of(cls)}) in another", cls)
                    return None
                attrs = {**attrs, v.name: got}
            st = replace(st, depth=st.depth + 1)
        if p.rest:
            st = replace(st, rests={**st.rests, p.rest: (n.op, dict(n.attrs))})
        return replace(st, attrs=attrs)

    def _each(self, pats: list[Pattern], classes: list[str], st: _State) -> Iterator[_State]:
        if not pats:
            yield st
            return
        for s in self._match(pats[0], classes[0], st):
            yield from self._each(pats[1:], classes[1:], s)

    # -- right sides --------------------------------------------------------------------------
    def built(self, m: Match) -> tuple[str, ...] | None:
        """The e-nodes of ``m``'s right side, found in the e-graph (None where a part is not
        there: a map, or a term extraction never needed and the e-graph does not hold)."""
        rhs = m.rule.lhs if m.reverse else m.rule.rhs
        where = {} if m.reverse else m.rule.where
        out: list[str] = []
        return tuple(out) if self._build(rhs, m, where, out) is not None else None

    def _build(self, p: Pattern, m: Match, where: dict, out: list[str]) -> str | None:
        if isinstance(p, PVar):
            if p.name in where:
                return self._build(where[p.name], m, where, out)
            return m.classes.get(p.name)
        if isinstance(p, PLit):
            if p.var is not None:
                key = _scalar_key(repr(float(m.attrs.get(p.var, 0.0))), WEAK)
            else:
                key = _scalar_key(scalar_text(p.value, p.dtype or (
                    "float32" if isinstance(p.value, float) else "int32")), p.dtype or WEAK)
            hit = self._other.get(("scalar",) + key)
            return hit[0] if hit else None
        if isinstance(p, PMap):
            return None
        if isinstance(p, PProj):
            inner = self._build(p.inner, m, where, out)
            hit = inner and self._other.get(("item", inner, p.index))
            return self._found(hit, out)
        if isinstance(p, PTuple):
            fields = [self._build(f, m, where, out) for f in p.fields]
            if any(f is None for f in fields):
                return None
            tail = m.lists.get(p.rest, ()) if p.rest else ()
            return self._found(self._other.get(("tuple", tuple(fields) + tuple(tail))), out)
        op = m.opsets.get(p.op.label) if p.op.is_set else p.op.ops[0]
        if op is None:
            return None
        kids = [self._build(a, m, where, out) for a in p.args]
        if any(k is None for k in kids):
            return None
        given = p.attr_map
        rest = m.rests.get(p.rest, (None, {}))[1] if p.rest else {}
        keys = []
        for spec in op.attrs:
            v = given.get(spec.name)
            if isinstance(v, AttrLit):
                value = spec.kind.canonical(v.value)
            elif isinstance(v, AttrVar):
                value = m.attrs.get(v.name)
            elif isinstance(v, AttrTypeOf):
                t = self.view.types.get(m.classes.get(v.var))
                value = getattr(t, "dtype", None)
            elif spec.name in rest:
                value = rest[spec.name]
            elif spec.default is REQUIRED:
                return None
            else:
                value = spec.default
            if value is None and spec.default is not None:
                return None
            try:
                keys.append(_attr_key(spec, value))
            except Exception:          # (a value of another kind: not this e-graph's term)
                return None
        return self._found(self._calls.get((op.name, tuple(kids), tuple(keys))), out)

    @staticmethod
    def _found(hit, out: list[str]) -> str | None:
        if not hit:
            return None
        out.append(hit[1])
        return hit[0]


def _scalar_key(text: str, dtype: str) -> tuple:
    try:
        return (dtype, float(text))
    except ValueError:
        return (dtype, text)
