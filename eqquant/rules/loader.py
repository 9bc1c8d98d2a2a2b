"""Reading ``.rules`` files: parse (``grammar/rules.lark``), resolve ops in the registry, and
check every rule when it loads, not when it matches.

Static errors, each at ``file:line:col``: syntax; unknown op, op set or attribute; wrong arity;
a bad attribute value; a variable on the right (or in a guard or ``where``) that the left does
not bind; a variable used both as a value and as an attribute; a statically visible dtype
mismatch; a left side that is not an op; ``..?rest`` misuse; duplicate rule names; unknown
``approx`` options; a missing or cyclic include.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path
from dataclasses import dataclass, replace
from typing import Any, Callable

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedInput

from ..errors import EqquantError, RuleError, SourceLoc
from ..ir.nesting import check_nesting
from ..ir.parser import (CommentSink, decode_number, _syntax_error_with, _unquote,
                         fit_literal)
from ..ops.attrs import AttrValueError
from ..ops.registry import BINARY, ELEMWISE, UNARY, all_ops, get_op, has_op
from ..resources import grammar_path, rules_dir
from .guards import KINDS, with_choices
from .ast import (TERMS, AttrLit, AttrTypeOf, AttrVar, Guard, OpRef, PCall, PLit, PMap, PProj,
                  PTuple, PVar, Pattern, Rule, RuleSet, attr_vars, op_sets, pattern_vars, tuple_rests,
                  walk)


_COMMENTS = CommentSink()


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(grammar_path("rules.lark").read_text(), parser="lalr",
                propagate_positions=True, maybe_placeholders=True,
                lexer_callbacks={"COMMENT": _COMMENTS}, cache=True)   # (see ir/parser.py)


def resolve_rules_path(name: str | Path, base: Path | None = None) -> Path:
    """A rules file by path, or by name in the shipped ``rules/`` (``bn_fold`` ->
    ``rules/bn_fold.rules``)."""
    p = Path(name)
    candidates = [p] if p.is_absolute() else [(base or Path.cwd()) / p, Path.cwd() / p]
    stem = p.name if p.suffix == ".rules" else p.name + ".rules"
    candidates.append(rules_dir() / stem)
    for c in candidates:
        if c.is_file():
            return c
    where = ", ".join(dict.fromkeys(str(c.parent) for c in candidates))
    raise RuleError(f"no rules file '{name}' (looked in {where})")


# parsed rule files without includes, by (path, text): a flow loads the same few files for
# every program it compiles
_LOADED: dict[tuple[str, str], RuleSet] = {}


def load_rules(path: str | Path, _stack: tuple[Path, ...] = ()) -> RuleSet:
    path = resolve_rules_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RuleError(f"{path}: cannot read ({e.strerror})") from None
    key = (str(path.resolve()), text)
    hit = _LOADED.get(key)
    if hit is None:
        hit = parse_rules(text, str(path), _stack + (path.resolve(),))
        if hit.includes:     # (an included file may change on its own: not kept)
            return hit
        _LOADED[key] = hit
    return replace(hit, rules=list(hit.rules))


def parse_rules(text: str, file: str = "<rules>", _stack: tuple[Path, ...] = ()) -> RuleSet:
    check_nesting(text, file, "rules")
    _COMMENTS.items = []
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error_with(_lark(), e, text, file) from None
    comments = list(_COMMENTS.items)
    return _TreeToRules(text, file, comments, _stack).ruleset(tree)


class _TreeToRules:
    def __init__(self, text: str, file: str, comments: list[Token], stack: tuple[Path, ...]):
        self.text, self.file, self.stack = text, file, stack
        self.comment_lines = {t.line: str(t)[1:].strip() for t in comments}

    def loc(self, item) -> SourceLoc:
        if isinstance(item, SourceLoc):
            return item
        if isinstance(item, Token):
            return SourceLoc(self.file, item.line, item.column, self.text)
        return SourceLoc(self.file, item.meta.line, item.meta.column, self.text)

    def error(self, message: str, item) -> RuleError:
        return RuleError(message, self.loc(item) if item is not None else None)

    # -- file level ----------------------------------------------------------------------------
    def ruleset(self, tree: Tree) -> RuleSet:
        name = Path(self.file).stem
        rules: list[Rule] = []
        includes: list[str] = []
        seen: dict[str, Rule] = {}
        declared = False
        for item in tree.children:
            if item.data == "ruleset_decl":
                if declared or rules:
                    raise self.error("a file holds one ruleset, declared before its rules",
                                     item)
                name, declared = str(item.children[0]), True
            elif item.data == "include":
                inc = self.include(item)
                includes.append(inc.file)
                for r in inc.rules:
                    self.add(r, seen, rules, item)
            else:
                self.add(self.rule(item), seen, rules, item)
        for r in rules:
            r.ruleset = name
        return RuleSet(name, rules, self.file, includes)

    def add(self, rule: Rule, seen: dict[str, Rule], rules: list[Rule], item) -> None:
        if rule.name in seen:
            raise self.error(f"rule '{rule.name}' is defined twice (first at "
                             f"{seen[rule.name].loc})", item)
        seen[rule.name] = rule
        rules.extend(dtype_variants(rule))

    def include(self, item: Tree) -> RuleSet:
        target = _unquote(str(item.children[0]))
        if not (target.endswith(".rules") or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", target)):
            # (never read another kind of file: its lines would show in the error)
            raise self.error(f"include names a .rules file or a shipped ruleset, got "
                             f"'{target[:80]}'", item)
        base = Path(self.file).parent
        try:
            path = resolve_rules_path(target, base)
        except RuleError as e:
            raise self.error(e.message, item) from None
        if path.resolve() in self.stack:
            raise self.error(f"include cycle: {target} includes itself", item)
        return load_rules(path, self.stack)

    def doc(self, line: int) -> str:
        out = []
        while line - 1 in self.comment_lines:
            line -= 1
            out.append(self.comment_lines[line])
        return "\n".join(reversed(out))

    # -- rules ---------------------------------------------------------------------------------
    def rule(self, tree: Tree) -> Rule:
        approx_tok, name_tok, opts, lhs_t, arrow, rhs_t, *clauses = tree.children
        lhs = self.pattern(lhs_t)
        rhs = self.pattern(rhs_t)
        rule = Rule(name=str(name_tok), lhs=lhs, rhs=rhs, bidirectional=str(arrow) == "<=>",
                    doc=self.doc(tree.meta.line), loc=self.loc(name_tok))
        if approx_tok is not None:
            rule.approx = {"rtol": 1e-2, "atol": 1e-3}
            for opt in (opts.children if opts is not None else []):
                key, raw = str(opt.children[0]), str(opt.children[1])
                if key == "scale" and (raw.startswith("?") or raw == TERMS):
                    rule.approx["scale"] = raw  # tolerances in units of this variable, or
                    continue                    # of each element's terms
                if key not in ("rtol", "atol") or raw.startswith("?") or raw == TERMS:
                    raise self.error(f"unknown approx option '{key}={raw}' (use rtol=, atol=, "
                                     f"scale=?var, scale={TERMS})", opt)
                try:
                    value, dtype = decode_number(raw)    # the IR's literals, one decoder
                except ValueError:
                    value, dtype = math.nan, None
                if not (math.isfinite(value) and 0 <= value <= 1e6) or \
                        (dtype or "float").startswith(("int", "uint", "bool")):
                    raise self.error(f"approx option {key} takes a non-negative number up to "
                                     f"1e6, got '{raw[:40]}'", opt)
                rule.approx[key] = float(value)
        elif opts is not None:
            raise self.error("only an approx rule takes (rtol=..., atol=...)", opts)
        for clause in clauses:
            if clause.data == "where_clause":
                for b in clause.children:
                    var, pat = str(b.children[0]), self.pattern(b.children[1])
                    if var in rule.where:
                        raise self.error(f"{var} is bound twice in where", b)
                    rule.where[var] = pat
            else:          # if ... / assuming ...: guards, each of its kind's class
                rule.guards += [self.guard(g) for g in clause.children]
        check_rule_form(rule, self)
        from .compile import compile_rule  # compiling now reports errors at load time
        try:
            for variant in dtype_variants(rule):
                compile_rule(variant, "check")
        except RuleError as e:
            e.loc = e.loc or rule.loc
            raise
        return rule

    def guard(self, g: Tree) -> Guard:
        """A guard (or an ``assuming``) by its kind's class (eqquant/rules/guards.py)."""
        return KINDS[g.data](g.children, self, self.loc(g))

    # -- patterns ------------------------------------------------------------------------------
    def pattern(self, t) -> Pattern:
        kind = t.data
        if kind == "var":
            return PVar(str(t.children[0]), self.loc(t))
        if kind == "literal":
            value, dtype = self.number(t.children[0])
            return PLit(value, dtype, self.loc(t.children[0]))
        if kind == "tuple":
            return PTuple(tuple(self.pattern(c) for c in t.children), self.loc(t))
        if kind == "tuple_rest":
            *fields, rest = t.children
            return PTuple(tuple(self.pattern(c) for c in fields), self.loc(t), str(rest))
        if kind == "tuple_map":
            body, var, source = t.children
            return PMap(self.pattern(body), str(var), str(source), self.loc(t))
        if kind == "proj":
            return PProj(self.pattern(t.children[0]), int(str(t.children[1])), self.loc(t))
        if kind == "call":
            return self.call(t)
        if kind == "named_call":
            *call, name = t.children
            return replace(self.call(Tree("call", call, t.meta)), name=str(name))
        raise self.error(f"unexpected {kind}", t)

    def opref(self, t: Tree) -> OpRef:
        if t.data == "op_name":
            tok = t.children[0]
            if not has_op(str(tok)):
                try:
                    get_op(str(tok))
                except EqquantError as e:
                    raise self.error(e.message, tok) from None
            return OpRef(str(tok), (get_op(str(tok)),))
        ops = []
        for tok in t.children:
            name = str(tok)
            if has_op(name):
                ops.append(get_op(name))
                continue
            members = [op for op in all_ops().values() if name in op.props]
            if not members:
                raise self.error(f"'{name}' is neither an op nor a property of any op", tok)
            ops += members
        label = "{" + ", ".join(str(tok) for tok in t.children) + "}"
        return OpRef(label, tuple(dict.fromkeys(ops)))

    def call(self, t: Tree) -> PCall:
        op_t, args_t = t.children
        op = self.opref(op_t)
        args: list[Pattern] = []
        attrs: dict[str, Any] = {}
        rest = None
        for a in (args_t.children if args_t is not None else []):
            if isinstance(a, Tree) and a.data == "kwarg":
                key_tok, value = a.children
                key = str(key_tok)
                for o in op.ops:
                    if key not in o.attr_map:
                        raise self.error(f"{o.name} has no attribute '{key}'", key_tok)
                if key in attrs:
                    raise self.error(f"attribute '{key}' is given twice", key_tok)
                v = self.attr_value(value)
                if isinstance(v, AttrLit):
                    for o in op.ops:
                        try:
                            v = AttrLit(o.attr_map[key].kind.canonical(v.value), v.loc)
                        except AttrValueError as e:
                            raise self.error(f"{o.name}: attribute '{key}' expects {e}", a) \
                                from None
                attrs[key] = v
            elif isinstance(a, Tree) and a.data == "rest":
                if rest is not None:
                    raise self.error("only one ..?rest per call", a)
                rest = str(a.children[0])
            else:
                if attrs or rest:
                    raise self.error("a positional argument follows an attribute", a)
                args.append(self.pattern(a))
        for o in op.ops:
            if len(args) != len(o.inputs):
                raise self.error(f"{o.name} takes {len(o.inputs)} argument"
                                 f"{'s' if len(o.inputs) != 1 else ''} "
                                 f"({', '.join(o.inputs)}), got {len(args)}", op_t)
        return PCall(op, tuple(args), tuple(attrs.items()), rest, self.loc(t))

    def number(self, tok: Token):
        """(value, dtype or None): an unsuffixed (weak) literal takes its operand's dtype
        when the rule applies, so it must fit the widest one (int64, float64) here."""
        try:
            value, dtype = decode_number(tok)
            if dtype is None:
                value = fit_literal(value, "float64" if isinstance(value, float) else "int64")
            return value, dtype
        except ValueError as e:
            raise self.error(f"bad literal: {e}", tok) from None

    def attr_value(self, t):
        kind = t.data
        if kind == "a_var":
            return AttrVar(str(t.children[0]), self.loc(t))
        if kind == "a_type_of":
            fn, var = (str(c) for c in t.children)
            if fn != "dtype":
                raise self.error(f"an attribute may be dtype(...) of a value, not {fn}(...)", t)
            return AttrTypeOf(var, self.loc(t))
        if kind == "a_number":
            value, dtype = self.number(t.children[0])
            if dtype is not None and dtype.startswith("float"):
                value = float(value)
            return AttrLit(value, self.loc(t.children[0]))
        if kind == "a_string":
            return AttrLit(_unquote(str(t.children[0])), self.loc(t))
        if kind == "a_ints":
            ints = [int(v) for v in re.findall(r"-?\d+", str(t.children[0]))]
            if any(abs(v) >= 2 ** 63 for v in ints):
                raise self.error("bad literal: a list entry does not fit int64", t)
            return AttrLit(ints, self.loc(t))
        if kind in ("a_true", "a_false", "a_none"):
            return AttrLit({"a_true": True, "a_false": False, "a_none": None}[kind],
                           self.loc(t))
        items = [self.attr_value(c) for c in t.children if c is not None]
        if any(not isinstance(i, AttrLit) for i in items):
            raise self.error("a list attribute cannot hold variables", t)
        return AttrLit([i.value for i in items], self.loc(t))


# ---------------------------------------------------------------------------------------------
# static checks


def _weaken_attr_vars(p: Pattern, avars: set[str]) -> Pattern:
    """An attribute variable used as a value becomes a weak scalar literal."""
    if isinstance(p, PVar) and p.name in avars:
        return PLit(None, None, p.loc, var=p.name)
    if isinstance(p, PCall):
        return replace(p, args=tuple(_weaken_attr_vars(a, avars) for a in p.args))
    if isinstance(p, PTuple):
        return PTuple(tuple(_weaken_attr_vars(f, avars) for f in p.fields), p.loc, p.rest)
    if isinstance(p, PProj):
        return PProj(_weaken_attr_vars(p.inner, avars), p.index, p.loc)
    if isinstance(p, PMap):
        return PMap(_weaken_attr_vars(p.body, avars), p.var, p.source, p.loc)
    return p


def _static_dtype(p: Pattern, known: dict[str, str], b: _TreeToRules) -> str | None:
    """The dtype a pattern visibly has (None when it depends on the match); raises on a
    visible mismatch between the operands of an elementwise binary op."""
    if isinstance(p, PLit):
        return p.dtype
    if isinstance(p, PVar):
        return known.get(p.name)
    if isinstance(p, PCall):
        dts = [_static_dtype(a, known, b) for a in p.args]
        ops = p.op.ops
        if all(BINARY in o.props for o in ops):
            if dts[0] and dts[1] and dts[0] != dts[1]:
                raise b.error(f"{p.op.label}: operands are {dts[0]} and {dts[1]}; "
                              "they must have one dtype", p.loc)
            return dts[0] or dts[1]
        if all(o.name == "cast" for o in ops):
            dt = p.attr_map.get("dtype")
            return dt.value if isinstance(dt, AttrLit) else None
        if all(ELEMWISE in o.props and UNARY in o.props for o in ops) and dts:
            return dts[0]
    return None


def check_rule_form(rule: Rule, b: _TreeToRules) -> None:
    """The static check of one rule as it loads (its form, variables and dtypes); the random
    test of what it claims is rules.check.check_rule_on_samples."""
    lhs = rule.lhs
    if not isinstance(lhs, (PCall, PProj)):
        raise b.error("the left side of a rule must be an op call (or a projection of one)",
                      getattr(lhs, "loc", None) or rule.loc)
    evars = set(pattern_vars(lhs))
    avars = attr_vars(lhs)
    _check_names(rule, b)
    both = evars & set(avars)
    if both:
        raise b.error(f"{sorted(both)[0]} is used both as a value and as an attribute",
                      lhs.loc)
    for q in walk(lhs):
        for _, v in (q.attrs if isinstance(q, PCall) else ()):
            if isinstance(v, AttrTypeOf):
                raise b.error(f"dtype({v.var}) as an attribute stands on the right side only "
                              "(on the left, match the dtype with a guard)", v.loc)
    sets = op_sets(lhs)
    bound = set(evars)
    tails = tuple_rests(lhs)
    clash = set(tails) & (evars | set(avars))
    if clash:
        raise b.error(f"{sorted(clash)[0]} is used both as a tuple's rest and as a variable",
                      lhs.loc)
    if any(isinstance(q, PMap) for q in walk(lhs)):
        raise b.error("a map (... for ?x in ?xs) builds a tuple: it belongs on the right",
                      lhs.loc)
    for q in walk(rule.rhs):
        if isinstance(q, PTuple) and q.rest is not None and q.rest not in tails:
            raise b.error(f"..{q.rest} is not the rest of a tuple on the left side", q.loc)
        if isinstance(q, PMap):
            if q.source not in tails:
                raise b.error(f"{q.source} is not the rest of a tuple on the left side "
                              f"(..{q.source})", q.loc)
            if q.var in evars or q.var in avars or q.var in tails:
                raise b.error(f"the map's variable {q.var} is bound by the left side already",
                              q.loc)
            if any(isinstance(r, PCall) and r.rest for r in walk(q.body)):
                raise b.error("a map's body cannot carry ..?rest attributes", q.loc)
    for var, pat in list(rule.where.items()):
        if var in bound or var in avars:
            raise b.error(f"where {var} shadows a variable of the left side", pat.loc)
        pat = _weaken_attr_vars(pat, set(avars))
        rule.where[var] = pat
        _check_uses(pat, bound, avars, sets, b)
        bound.add(var)
    rule.rhs = _weaken_attr_vars(rule.rhs, set(avars))
    _check_uses(rule.rhs, bound, avars, sets, b)
    if rule.bidirectional:
        if not isinstance(rule.rhs, (PCall, PProj)):
            raise b.error("a <=> rule needs an op call on both sides", rule.rhs.loc)
        if rule.where:
            raise b.error("a <=> rule cannot use where (the right side must be a pattern)",
                          rule.loc)
        back = set(pattern_vars(rule.rhs)) | set(attr_vars(rule.rhs))
        missing = (evars | set(avars)) - back
        if missing:
            raise b.error(f"<=>: the right side does not bind {sorted(missing)[0]}, so the rule "
                          "cannot run right to left", rule.rhs.loc)
    scale = (rule.approx or {}).get("scale")
    if scale != TERMS and scale is not None and scale not in bound:
        raise b.error(f"approx scale {scale} is not a value the left side binds", rule.loc)
    ctx = _GuardContext(bound, avars, b.error)
    rule.guards = [g.check(ctx) for g in rule.guards]
    known = dict(k for g in rule.guards if (k := g.known_dtype()) is not None)
    _static_dtype(lhs, known, b)
    for pat in rule.where.values():
        _static_dtype(pat, known, b)
    _static_dtype(rule.rhs, known, b)


def _check_names(rule: Rule, b: _TreeToRules) -> None:
    """``f(...) as ?r``: on the left side only, each name once, and not a variable too."""
    lhs_vars = [q.name for q in walk(rule.lhs) if isinstance(q, PVar)]
    names: set[str] = set()
    for q in walk(rule.lhs):
        if isinstance(q, PCall) and q.name:
            if q.name in names or q.name in lhs_vars:
                raise b.error(f"{q.name} names two things on the left side", q.loc)
            if q is rule.lhs:
                raise b.error(f"{q.name} names the whole left side: name a call inside it",
                              q.loc)
            names.add(q.name)
    for side in [rule.rhs, *rule.where.values()]:
        for q in walk(side):
            if isinstance(q, PCall) and q.name:
                what = "the left side" if rule.bidirectional else "the right side or a where"
                raise b.error(f"'as {q.name}' names a match; it cannot stand on {what}"
                              + (" of a <=> rule" if rule.bidirectional else ""), q.loc)


def _check_uses(p: Pattern, bound: set[str], avars: dict, sets: dict[str, OpRef],
                b: _TreeToRules) -> None:
    bound = bound | {q.var for q in walk(p) if isinstance(q, PMap)}
    for q in walk(p):
        if isinstance(q, PVar) and q.name not in bound:
            raise b.error(f"{q.name} is not bound by the left side", q.loc)
        if isinstance(q, PCall):
            if q.op.is_set and q.op.label not in sets:
                raise b.error(f"the op set {q.op.label} does not appear on the left side",
                              q.loc)
            if q.rest is not None and q.rest not in avars:
                raise b.error(f"..{q.rest} is not bound by the left side", q.loc)
            for key, v in q.attrs:
                if isinstance(v, AttrVar):
                    if v.name not in avars or avars[v.name][1] == "..":
                        raise b.error(f"attribute variable {v.name} is not bound by the left "
                                      "side", v.loc)


MAX_VARIANTS = 64


@dataclass(frozen=True)
class _GuardContext:
    """What a guard's load-time check sees: the values and attribute variables the left
    side binds, and how to raise a located error."""

    bound: set
    avars: dict
    error: Callable[..., RuleError]


def dtype_variants(rule: Rule) -> list[Rule]:
    """A rule with ``dtype(?x) in {int8, uint8}`` guards as one rule per choice, named
    ``rule[int8]``, ``rule[uint8]`` (each an ordinary rule with a ``==`` guard)."""
    from dataclasses import replace
    choices = [g for g in rule.guards if g.variants() != [g]]
    if not choices:
        return [_dtypes_written_in(rule)]
    count = math.prod(len(g.variants()) for g in choices)
    if count > MAX_VARIANTS:
        raise RuleError(f"rule {rule.name}: its dtype(...) in {{...}} guards make {count} "
                        f"variants, more than {MAX_VARIANTS}; split the rule", rule.loc)
    out = []
    for guards in with_choices(rule.guards):
        picked = [str(g.value) for g, orig in zip(guards, rule.guards) if g is not orig]
        out.append(_dtypes_written_in(replace(rule, name=f"{rule.name}[{', '.join(picked)}]",
                                              guards=guards)))
    return out


def _dtypes_written_in(rule: Rule) -> Rule:
    """The rule with each ``dtype(?x)`` attribute of its right side replaced by the dtype its
    guards fix for ?x (``qnn.codes(dtype=dtype(?q))`` under ``dtype(?q) == int8``)."""
    known = dict(k for g in rule.guards if (k := g.known_dtype()) is not None)

    def write(p: Pattern) -> Pattern:
        if isinstance(p, PCall):
            attrs = []
            for key, v in p.attrs:
                if isinstance(v, AttrTypeOf):
                    if v.var not in known:
                        raise RuleError(f"dtype({v.var}): no guard fixes {v.var}'s dtype "
                                        f"(dtype({v.var}) == ... or in {{...}})", v.loc)
                    v = AttrLit(known[v.var], v.loc)
                attrs.append((key, v))
            return replace(p, args=tuple(write(a) for a in p.args), attrs=tuple(attrs))
        if isinstance(p, PTuple):
            return replace(p, fields=tuple(write(f) for f in p.fields))
        if isinstance(p, PProj):
            return replace(p, inner=write(p.inner))
        if isinstance(p, PMap):
            return replace(p, body=write(p.body))
        return p
    if not any(isinstance(v, AttrTypeOf) for side in [rule.rhs, *rule.where.values()]
               for q in walk(side) if isinstance(q, PCall) for _, v in q.attrs):
        return rule
    return replace(rule, rhs=write(rule.rhs),
                   where={k: write(v) for k, v in rule.where.items()})
