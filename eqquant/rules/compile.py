"""Rules -> egglog rules.

    rule add_zero: add(?x, 0.0) => ?x
    ==>
    (rule ((= ?__root (@add ?x (Scalar "0.0" ?_d0))))
          ((union ?__root ?x))
          :ruleset rs.simplify :name "add_zero")

Attributes the left side does not name become fresh variables (``..?rest`` collects them and
carries them to calls of the right side, all but the kernel a call runs on: a call the right
side builds is planned anew); ``where`` bindings are substituted; a rule over an
op set (``{nn.relu, clip}``) becomes one egglog rule per op; a ``<=>`` rule adds its reverse;
guards become query facts, each by its class (``(is-const ?w)``, ``(= (dtype-of ?x)
"float32")``: eqquant/rules/guards.py). A weak literal
on the right is ``(Scalar "1e-05" "weak")``: its dtype is settled from its operand when the
program is extracted.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..egraph.encode import list_term
from ..egraph.schema import attr_sort, egg_name, egg_string, encode_attr, scalar_text
from ..ops.attrs import REQUIRED
from ..ops.registry import KERNEL, OpDef
from .ast import (AttrLit, AttrVar, PCall, PLit, PMap, PProj, PTuple, PVar, Pattern, Rule,
                  RuleSet, expansions, walk)
from ..errors import RuleError

WEAK = "weak"


def egg_ruleset(name: str) -> str:
    return f"rs.{name}"


def each_ruleset(egg_name: str) -> str:
    """The ruleset of the rules that unroll a ruleset's maps."""
    return f"{egg_name}.each"


@dataclass
class CompiledRule:
    name: str         # the egglog rule name: the rule's name, [op] per expansion, "<-" reversed
    rule: Rule
    text: str
    # a map (f(?x) for ?x in ?xs) is a constructor over lists (declared once) and two rules
    # that unroll it cell by cell, run to saturation after each iteration of the ruleset
    decls: str = ""
    helpers: str = ""


@dataclass
class CompiledRuleset:
    name: str
    egg_name: str
    rules: list[CompiledRule] = field(default_factory=list)

    @property
    def helper_ruleset(self) -> str | None:
        """The ruleset of the maps' unrolling rules, if any rule has a map."""
        return each_ruleset(self.egg_name) if any(r.helpers for r in self.rules) else None

    @property
    def text(self) -> str:
        head = f"(ruleset {self.egg_name})\n"
        if self.helper_ruleset:
            head += f"(ruleset {self.helper_ruleset})\n"
        parts = [r.decls for r in self.rules if r.decls] + [r.text for r in self.rules] + \
            [r.helpers for r in self.rules if r.helpers]
        return head + "\n".join(parts) + "\n"

    def by_name(self) -> dict[str, CompiledRule]:
        return {r.name: r for r in self.rules}


class _Side:
    """Compiles one left side to a query, remembering what its variables are bound to."""

    def __init__(self, rule: Rule, ops: dict[str, OpDef]):
        self.rule, self.ops = rule, ops
        self.fresh = itertools.count()
        self.attr_sorts: dict[str, str] = {}          # attribute variable -> egglog sort
        self.attr_specs: dict[str, tuple] = {}        # attribute variable -> (op, attr)
        self.rests: dict[str, dict[str, tuple[str, str]]] = {}  # ..?r -> {attr: (term, sort)}
        self.named: list[str] = []     # ``f(...) as ?r``: (= ?r (f ...)), one fact each

    def op_of(self, p: PCall) -> OpDef:
        return self.ops[p.op.label] if p.op.is_set else p.op.ops[0]

    def query(self, p: Pattern) -> str:
        if isinstance(p, PVar):
            return p.name
        if isinstance(p, PLit):
            if p.var is not None:
                raise RuleError(f"{p.var}: an attribute value cannot be matched as a value",
                                p.loc)
            text = egg_string(scalar_text(p.value, p.dtype or ("float32" if isinstance(
                p.value, float) else "int32")))
            dtype = egg_string(p.dtype) if p.dtype else f"?_d{next(self.fresh)}"
            return f"(Scalar {text} {dtype})"
        if isinstance(p, PTuple):
            return f"(MkTuple {list_term([self.query(f) for f in p.fields], _tail(p))})"
        if isinstance(p, PProj):
            return f"(GetItem {self.query(p.inner)} {p.index})"
        op = self.op_of(p)
        given = p.attr_map
        args = [self.query(a) for a in p.args]
        attrs = []
        rest: dict[str, tuple[str, str]] = {}
        for spec in op.attrs:
            sort = attr_sort(spec.kind)
            v = given.get(spec.name)
            if isinstance(v, AttrLit):
                term = encode_attr(spec, v.value)
            elif isinstance(v, AttrVar):
                if v.name in self.attr_sorts and self.attr_sorts[v.name] != sort:
                    raise RuleError(f"{v.name} binds attributes of different kinds", v.loc)
                self.attr_sorts[v.name] = sort
                self.attr_specs[v.name] = (op, spec)
                term = v.name
            else:
                term = f"?_a{next(self.fresh)}"
            if spec.name != KERNEL:      # (a rest carries what an op computes, not how it
                rest[spec.name] = (term, sort)   # runs: a call built anew is planned anew)
            attrs.append(term)
        if p.rest:
            self.rests[p.rest] = rest
        term = f"({egg_name(op)} {' '.join(args + attrs)})"
        if p.name:
            self.named.append(f"(= {p.name} {term})")
            return p.name
        return term


def _tail(p: PTuple) -> str:
    """How a tuple pattern's list ends: its ``..?rest`` (an ExprList variable), or ENil."""
    return f"?{p.rest.lstrip('?')}" if p.rest else "(ENil)"


class _RightSide:
    """Compiles a right side (or a where binding) to an egglog term."""

    def __init__(self, side: _Side, where: dict[str, Pattern], name: str = "", ruleset: str = ""):
        self.side, self.where = side, where
        self.name, self.ruleset = name, ruleset
        self.decls: list[str] = []
        self.helpers: list[str] = []

    def map(self, p: PMap) -> str:
        """``(body for ?x in ?xs)``: a constructor ``map.N`` over the list ?xs and the body's
        other variables, and two rules that unroll it: on a cell, the body of its head and the
        map of its tail; on the end, the end."""
        i = len(self.decls)
        ctor = "map." + "".join(c if c.isalnum() else "_" for c in self.name) + f".{i}"
        captured = [v for v in self.free_vars(p.body) if v != p.var]
        attrs = list(dict.fromkeys(
            [v.name for q in walk(p.body) if isinstance(q, PCall) for _, v in q.attrs
             if isinstance(v, AttrVar)] +
            [q.var for q in walk(p.body) if isinstance(q, PLit) and q.var]))
        sorts = ["Expr"] * len(captured) + [self.side.attr_sorts[a] for a in attrs]
        args = " ".join(captured + attrs)
        self.decls.append(f"(constructor {ctor} (ExprList {' '.join(sorts)}) ExprList)")
        head, tail = p.var, "?__tail"
        body = self.term(p.body)
        helper = each_ruleset(self.ruleset)
        self.helpers.append(
            f"(rule ((= ?__m ({ctor} (ECons {head} {tail}) {args})))\n"
            f"      ((union ?__m (ECons {body} ({ctor} {tail} {args}))))\n"
            f"      :ruleset {helper} :name {egg_string(self.name + '/each')})\n"
            f"(rule ((= ?__m ({ctor} (ENil) {args})))\n"
            f"      ((union ?__m (ENil)))\n"
            f"      :ruleset {helper} :name {egg_string(self.name + '/end')})")
        return f"(MkTuple ({ctor} ?{p.source.lstrip('?')} {args}))"

    def free_vars(self, p: Pattern) -> list[str]:
        """The left side's variables ``p`` reads, through the where bindings it uses."""
        out: list[str] = []
        for q in walk(p):
            if isinstance(q, PVar):
                out += self.free_vars(self.where[q.name]) if q.name in self.where else [q.name]
        return list(dict.fromkeys(out))

    def term(self, p: Pattern) -> str:
        if isinstance(p, PVar):
            if p.name in self.where:
                return self.term(self.where[p.name])
            return p.name
        if isinstance(p, PLit):
            if p.var is not None:
                sort = self.side.attr_sorts.get(p.var)
                op, spec = self.side.attr_specs[p.var]
                if sort != "String" or not spec.kind.name.startswith("float"):
                    raise RuleError(f"{p.var} is {op.name}'s '{spec.name}' ({spec.kind.name}); "
                                    "only float attributes can be used as values", p.loc)
                return f"(Scalar {p.var} \"{WEAK}\")"
            dtype = p.dtype or WEAK
            text = scalar_text(p.value, p.dtype or ("float32" if isinstance(p.value, float)
                                                    else "int32"))
            return f"(Scalar {egg_string(text)} {egg_string(dtype)})"
        if isinstance(p, PTuple):
            return f"(MkTuple {list_term([self.term(f) for f in p.fields], _tail(p))})"
        if isinstance(p, PMap):
            return self.map(p)
        if isinstance(p, PProj):
            return f"(GetItem {self.term(p.inner)} {p.index})"
        op = self.side.op_of(p)
        given = p.attr_map
        rest = self.side.rests.get(p.rest, {}) if p.rest else {}
        args = [self.term(a) for a in p.args]
        attrs = []
        for spec in op.attrs:
            sort = attr_sort(spec.kind)
            v = given.get(spec.name)
            if isinstance(v, AttrLit):
                attrs.append(encode_attr(spec, v.value))
            elif isinstance(v, AttrVar):
                if self.side.attr_sorts.get(v.name) != sort:
                    raise RuleError(f"{v.name} cannot fill {op.name}'s '{spec.name}': the "
                                    "kinds differ", v.loc)
                attrs.append(v.name)
            elif spec.name in rest and rest[spec.name][1] == sort:
                attrs.append(rest[spec.name][0])
            elif spec.default is REQUIRED:
                raise RuleError(f"{op.name} needs the attribute '{spec.name}'", p.loc)
            else:
                attrs.append(encode_attr(spec, spec.default))
        return f"({egg_name(op)} {' '.join(args + attrs)})"



def _compile_one(rule: Rule, lhs: Pattern, rhs: Pattern, where: dict[str, Pattern],
                 ops: dict[str, OpDef], name: str, ruleset: str) -> CompiledRule:
    side = _Side(rule, ops)
    facts = [f"(= ?__root {side.query(lhs)})"]
    facts += side.named
    for g in rule.guards:
        facts += g.compile(side)
    right = _RightSide(side, where, name, ruleset)
    term = right.term(rhs)
    text = (f"(rule ({' '.join(facts)})\n      ((union ?__root {term}))\n"
            f"      :ruleset {ruleset} :name {egg_string(name)})")
    return CompiledRule(name, rule, text, "\n".join(right.decls), "\n".join(right.helpers))


def compile_rule(rule: Rule, ruleset: str) -> list[CompiledRule]:
    out = []
    for ops, suffix in expansions(rule):
        out.append(_compile_one(rule, rule.lhs, rule.rhs, rule.where, ops, rule.name + suffix,
                                ruleset))
        if rule.bidirectional:
            out.append(_compile_one(rule, rule.rhs, rule.lhs, {}, ops,
                                    rule.name + suffix + "<-", ruleset))
    return out


def compile_ruleset(rs: RuleSet) -> CompiledRuleset:
    out = CompiledRuleset(rs.name, egg_ruleset(rs.name))
    for rule in rs.rules:
        out.rules.extend(compile_rule(rule, out.egg_name))
    return out
