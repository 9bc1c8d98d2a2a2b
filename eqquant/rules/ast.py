"""Rules as data: patterns, guards and rules, each remembering where it was written.

A pattern is a tree of :class:`PCall` (an op or a set of ops, positional sub-patterns, named
attribute patterns and an optional ``..?rest``), :class:`PVar`, :class:`PLit`, :class:`PTuple`
and :class:`PProj`. Guards are data too (one class per kind, :mod:`eqquant.rules.guards`), so
a rule prints back as written and "which rule fired" is answered by its name and its
``file:line``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Union

from ..errors import SourceLoc
from ..ops.registry import OpDef
from .guards import Guard, Positive

TERMS = "terms"     # approx (scale=terms): tolerances in units of each element's terms


@dataclass(frozen=True)
class PVar:
    name: str  # with its "?"
    loc: SourceLoc | None = None


@dataclass(frozen=True)
class PLit:
    """A scalar literal. ``dtype`` None is a *weak* literal (``1.0``, or an attribute variable
    used as a value): it takes the dtype of the operand it is combined with, like numpy's
    Python scalars."""

    value: Any
    dtype: str | None
    loc: SourceLoc | None = None
    var: str | None = None  # set when the literal is an attribute variable used as a value


@dataclass(frozen=True)
class OpRef:
    """One op, or a set of ops (``{nn.relu, clip}`` or a registry property ``{annotation}``);
    ``label`` is how it was written, so the same set on both sides is the same op."""

    label: str
    ops: tuple[OpDef, ...]

    @property
    def is_set(self) -> bool:
        return self.label.startswith("{")


@dataclass(frozen=True)
class AttrVar:
    name: str
    loc: SourceLoc | None = None


@dataclass(frozen=True)
class AttrLit:
    value: Any
    loc: SourceLoc | None = None


@dataclass(frozen=True)
class AttrTypeOf:
    """``dtype(?q)`` as an attribute on the right side: the dtype a guard fixes for ?q,
    written in when the rule splits into its dtype variants."""

    var: str
    loc: SourceLoc | None = None


AttrPat = Union[AttrVar, AttrLit, AttrTypeOf]


@dataclass(frozen=True)
class PCall:
    op: OpRef
    args: tuple["Pattern", ...]
    attrs: tuple[tuple[str, AttrPat], ...] = ()
    rest: str | None = None
    loc: SourceLoc | None = None
    name: str | None = None     # ``f(...) as ?r`` (left sides): what the call matches, named

    @property
    def attr_map(self) -> dict[str, AttrPat]:
        return dict(self.attrs)


@dataclass(frozen=True)
class PTuple:
    """``(?a, ?b)``; with ``rest`` (``(?a, ..?rest)``) the fields after the named ones."""

    fields: tuple["Pattern", ...]
    loc: SourceLoc | None = None
    rest: str | None = None


@dataclass(frozen=True)
class PProj:
    inner: "Pattern"
    index: int
    loc: SourceLoc | None = None


@dataclass(frozen=True)
class PMap:
    """``(body for ?x in ?xs)`` (right sides only): the tuple of ``body`` for each field ?x of
    the left side's tuple rest ``..?xs``."""

    body: "Pattern"
    var: str
    source: str
    loc: SourceLoc | None = None


Pattern = Union[PVar, PLit, PCall, PTuple, PProj, PMap]


@dataclass
class Rule:
    name: str
    lhs: Pattern
    rhs: Pattern
    where: dict[str, Pattern] = field(default_factory=dict)
    # the conditions after ``if`` and the invariants after ``assuming`` (eqquant/rules/guards.py)
    guards: list[Guard] = field(default_factory=list)
    bidirectional: bool = False
    # approx rules: {"rtol": r, "atol": a} and optionally "scale": "?s" (atol in units of
    # max|?s|, e.g. half a quantization step) or TERMS (atol in units of each element's terms)
    approx: dict | None = None
    doc: str = ""
    loc: SourceLoc | None = None
    ruleset: str = ""

    @property
    def needs_types(self) -> bool:
        return any(g.needs_types for g in self.guards)

    @property
    def positive(self) -> list[str]:
        """The variables the rule assumes positive (the engine does not test them; the rule
        checker draws them so)."""
        return [g.var for g in self.guards if isinstance(g, Positive)]


@dataclass
class RuleSet:
    name: str
    rules: list[Rule]
    file: str
    includes: list[str] = field(default_factory=list)

    @property
    def needs_types(self) -> bool:
        return any(r.needs_types for r in self.rules)


def walk(p: Pattern):
    """Every sub-pattern of ``p``, ``p`` first, operands in order."""
    yield p
    if isinstance(p, PCall):
        for a in p.args:
            yield from walk(a)
    elif isinstance(p, PTuple):
        for f in p.fields:
            yield from walk(f)
    elif isinstance(p, PProj):
        yield from walk(p.inner)
    elif isinstance(p, PMap):
        yield from walk(p.body)


def pattern_vars(p: Pattern) -> list[str]:
    """Expression variables of a pattern, in order of first appearance (a map's own element
    variable is not one: it is bound by the map)."""
    mapped = {q.var for q in walk(p) if isinstance(q, PMap)}
    return list(dict.fromkeys(q.name for q in walk(p) if isinstance(q, (PVar, PCall))
                              and q.name and q.name not in mapped))



def tuple_rests(p: Pattern) -> list[str]:
    """The ``..?rest`` names of the tuples in a pattern, in order."""
    return list(dict.fromkeys(q.rest for q in walk(p) if isinstance(q, PTuple) and q.rest))


def attr_vars(p: Pattern) -> dict[str, tuple[OpRef, str]]:
    """Attribute variables -> (the op and attribute that bind them); ``..?rest`` included
    under its own name with attribute ".."."""
    out: dict[str, tuple[OpRef, str]] = {}
    for q in walk(p):
        if isinstance(q, PCall):
            for k, v in q.attrs:
                if isinstance(v, AttrVar):
                    out.setdefault(v.name, (q.op, k))
            if q.rest:
                out.setdefault(q.rest, (q.op, ".."))
    return out


def op_sets(p: Pattern) -> dict[str, OpRef]:
    return {q.op.label: q.op for q in walk(p) if isinstance(q, PCall) and q.op.is_set}


def expansions(rule: "Rule"):
    """(ops for each op-set label, variant suffix) for each op a rule's sets can be: a rule
    over ``{nn.relu, clip}`` is checked and compiled once per op."""
    sets = op_sets(rule.lhs)
    labels = list(sets)
    for combo in itertools.product(*[sets[label].ops for label in labels]):
        yield dict(zip(labels, combo)), ("[" + ", ".join(o.name for o in combo) + "]"
                                         if combo else "")


def format_pattern(p: Pattern) -> str:
    """A pattern in the rules' own syntax."""
    if isinstance(p, PVar):
        return p.name
    if isinstance(p, PLit):
        if p.var:
            return p.var
        from ..ir.printer import format_scalar
        return format_scalar(p.value, p.dtype) if p.dtype else repr(p.value)
    if isinstance(p, PTuple):
        parts = [format_pattern(f) for f in p.fields] + ([f"..{p.rest}"] if p.rest else [])
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 and not p.rest else "") + ")"
    if isinstance(p, PProj):
        return f"{format_pattern(p.inner)}.{p.index}"
    if isinstance(p, PMap):
        return f"({format_pattern(p.body)} for {p.var} in {p.source})"
    parts = [format_pattern(a) for a in p.args]
    for k, v in p.attrs:
        parts.append(f"{k}={format_attr(v)}")
    if p.rest:
        parts.append(f"..{p.rest}")
    return f"{p.op.label}({', '.join(parts)})" + (f" as {p.name}" if p.name else "")


def format_attr(v: AttrPat) -> str:
    from ..ops.attrs import format_value
    if isinstance(v, AttrVar):
        return v.name
    if isinstance(v, AttrTypeOf):
        return f"dtype({v.var})"
    return format_value(v.value)


def format_rule(r: Rule) -> str:
    head = ("approx " if r.approx is not None else "") + f"rule {r.name}"
    if r.approx:
        head += " (" + ", ".join(f"{k}={v}" for k, v in r.approx.items()) + ")"
    lines = [f"# {line}" for line in r.doc.splitlines()]
    lines.append(head + ":")
    lines.append(f"    {format_pattern(r.lhs)}")
    lines.append(f"    {'<=>' if r.bidirectional else '=>'} {format_pattern(r.rhs)}")
    if r.where:
        lines.append("    where " + ", ".join(f"{k} = {format_pattern(v)}"
                                             for k, v in r.where.items()))
    conditions = [str(g) for g in r.guards if g.in_if]
    if conditions:
        lines.append("    if " + ", ".join(conditions))
    assumed = [str(g) for g in r.guards if not g.in_if]
    if assumed:
        lines.append("    assuming " + ", ".join(assumed))
    return "\n".join(lines)
