"""The rule checker: is each rule an identity? Instantiate it with random well-typed tensors
and compare both sides with the reference interpreter.

    report = check_ruleset(load_rules("bn_fold"))
    print(report.format())       # PASS/FAIL per rule, with a counterexample on failure

For each rule (each op of an op set), the checker builds the left side bottom-up: at every op it
draws shapes for the variables not yet typed and values for the attributes the rule leaves
open, keeping the first draw the op's type relation accepts (guards respected: dtype, rank and
shape guards fix what they name, attribute guards fix values). Both sides must then have the
same type and, on random inputs, the same values: within 1e-5 relative for an exact rule,
within the declared ``rtol``/``atol`` for an ``approx`` rule.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import EqquantError
from ..ir.interp import run
from ..core.nodes import Call, Expr, Function, Module, Scalar, Tuple, TupleGetItem, Var
from ..core.nodes import freeze_attrs
from ..ir.printer import print_expr
from ..ir.typecheck import Inferer
from ..core.types import TensorType
from ..ops.attrs import (AttrKind, BoolKind, DTypeKind, FloatKind, IntKind, IntsKind,
                         OptionalKind, REQUIRED, StrKind)
from ..ops.registry import KERNEL, LOGIC, QUANT, OpDef, OpTypeError, get_op
from .guards import AttrIs
from .ast import (TERMS, AttrLit, AttrVar, PCall, PLit, PMap, PProj, PTuple, PVar, Pattern, Rule,
                  RuleSet,
                  expansions, walk)

EXACT_RTOL = 1e-5
GIVE_UP = 40        # searches of a variant that found no instance at all, before it stops
DRAWS = 3000        # draws of one op's free choices (attributes, operands) before a search
SAME_REASON = 64    # stops, or fewer: this many in a row refused for one reason is a reason
                    # no draw changes (an operand fixed below the op, of a dtype it refuses)


@dataclass
class RuleCheck:
    rule: Rule
    variant: str
    ok: bool
    message: str = ""
    trials: int = 0
    max_error: float = 0.0
    kept: bool = False      # a pass kept in the cache by this eqquant, not checked again

    def format(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        head = f"{verdict}  {self.rule.name}{self.variant}  ({self.rule.loc})" + \
            ("  [kept]" if self.kept else "")
        return head + (f"\n      {self.message}" if self.message else "")


@dataclass
class CheckReport:
    results: list[RuleCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def format(self) -> str:
        lines = [r.format() for r in self.results]
        failed = sum(not r.ok for r in self.results)
        kept = sum(r.kept for r in self.results)
        lines.append(f"{len(self.results) - failed} passed, {failed} failed" + (
            f" ({kept} [kept]: passes this eqquant kept, checked before with the same "
            f"draw; --again checks them again)" if kept else ""))
        return "\n".join(lines)


# -- drawing values ---------------------------------------------------------------------------

_DIMS = (1, 2, 3, 4)
_RANKS = (0, 1, 1, 2, 3, 4, 4)
# ranks and dtypes that worked for (op, argument) before: later instances of the same rule
# try them first
_RANK_HINTS: dict[tuple[str, int], set[int]] = {}
_DTYPE_HINTS: dict[tuple[str, int], set[str]] = {}
_DTYPES = ("float32", "float32", "float32", "int8", "int32", "uint8")


def _role_dtypes(input_name: str) -> set[str] | None:
    """The dtype an input's name implies (the QNN ops' parameters): a zero point is int32, a
    scale float32; None for any other input."""
    if input_name.endswith("zero_point"):
        return {"int32"}
    if input_name.endswith("scale"):
        return {"float32"}
    return None


def _shape_pool(rng, rank: int | None, hint: set[int] | None = None) -> tuple[int, ...]:
    if rank is None:
        rank = rng.choice(sorted(hint)) if hint and rng.random() < 0.9 else rng.choice(_RANKS)
    return tuple(rng.choice(_DIMS) for _ in range(rank))


def _sample_attr(kind: AttrKind, default: Any, rng: random.Random) -> Any:
    if rng.random() < 0.5 and default is not REQUIRED:
        return default
    if isinstance(kind, OptionalKind):
        return default if rng.random() < 0.7 else _sample_attr(kind.inner, REQUIRED, rng)
    if isinstance(kind, BoolKind):
        return bool(rng.random() < 0.5)
    if isinstance(kind, IntKind):
        return rng.choice([0, 1, 2]) if default is REQUIRED else default
    if isinstance(kind, FloatKind):
        return float(np.float32(10 ** rng.uniform(-5, -1)))
    if isinstance(kind, DTypeKind):
        if kind.choices:
            return rng.choice(kind.choices)
        return default if default is not REQUIRED else "float32"
    if isinstance(kind, StrKind):
        return rng.choice(kind.choices) if kind.choices else default
    if isinstance(kind, IntsKind):
        if kind.expand == "pad2d":
            return [rng.randint(0, 1)] * 4
        if kind.expand == "pair":
            return [rng.randint(1, 2)] * 2
        if default is REQUIRED:  # a shape: one of these fits any size
            return rng.choice([[-1], [1, -1], [-1, 1], [2, -1], [-1, 2], [1, 1, -1]])
        return default
    return default


class _Instance:
    """One concrete instance of a rule: shapes and dtypes for its variables, attribute values,
    and the two sides as IR."""

    def __init__(self, rule: Rule, ops: dict[str, OpDef], rng: random.Random,
                 fixed: dict[str, Any] | None = None):
        self.rule, self.ops, self.rng = rule, ops, rng
        # the dtypes a free variable is drawn from: truth values too where an op of the
        # rule computes on them (``logic``)
        logic = any(LOGIC in self.op_of(q).props for q in walk(rule.lhs)
                    if isinstance(q, PCall))
        self.pool = _DTYPES + ("bool",) * 3 if logic else _DTYPES
        self.vars: dict[str, Var] = {}
        self.named: dict[str, Expr] = {}          # ``f(...) as ?r``: the node it built
        self.attrs: dict[str, Any] = {}          # attribute variables
        self.rests: dict[str, dict[str, Any]] = {}
        self.types = Inferer(None)
        # what the guards fix, each guard telling the sampler (its class's ``constrain``)
        self.rank: dict[str, int] = {}
        self.dtype: dict[str, str] = {}
        self.shape: dict[str, tuple] = {}
        self.attr_eq: dict[str, Any] = {}
        self.attr_ne: dict[str, Any] = {}
        self.same_shape: dict[str, str] = {}      # shape(?a) == shape(?b), both ways
        self.same_dtype: dict[str, str] = {}      # dtype(?a) == dtype(?b), both ways
        self.shape_attr: dict[str, str] = {}      # shape(?x) == ?s: attribute var -> ?x
        self.dtype_attr: dict[str, str] = {}
        self.positive: set[str] = set()           # assuming positive(?s) (names without ?)
        self.drawn_sizes: dict[str, int] = {}     # a shape pattern's ?n, as the sampler drew it
        self.sizes: dict[str, int] = {}           # ... and as the guards find it
        self.tuple_like: TensorType | None = None  # the previous field of a tuple being built
        self.tuple_rests: dict[str, list[Var]] = {}  # (?a, ..?rest): the fields ?rest drew
        # the ranks and dtypes the ops' free operands took, hints for the next instances once
        # this one is whole (an op's operands that suit it alone may suit no op above it)
        self.learned: list[tuple[tuple[str, int], TensorType]] = []
        for g in rule.guards:
            g.constrain(self)
        self.attr_eq.update(fixed or {})

    def op_of(self, p: PCall) -> OpDef:
        return self.ops[p.op.label] if p.op.is_set else p.op.ops[0]

    def type_of(self, name: str):
        """The type of a variable, or of the call a name stands for (None: not built)."""
        if name in self.vars:
            return self.vars[name].type
        node = self.named.get(name)
        return None if node is None else self.types.expr(node)

    def new_var(self, name: str, shape: tuple[int, ...], hint: set[str] | None = None,
                trial: dict[str, Var] | None = None, required: bool = False) -> Var:
        """A variable of ``shape``: its dtype the guards' (its own, or a partner's bound
        before it, in this op's ``trial`` too), else one of ``hint``'s (most often; always
        where ``required``: the only dtypes its op takes there)."""
        dtype = self.dtype.get(name)
        partner_name = self.same_dtype.get(name, "")
        partner = self.vars.get(partner_name) or (trial or {}).get(partner_name)
        if dtype is None and partner is not None:
            dtype = partner.type.dtype
        if dtype is None:
            dtype = (self.rng.choice(sorted(hint)) if hint and (required or
                                                                self.rng.random() < 0.9)
                     else self.rng.choice(self.pool))
        return Var(name=name.lstrip("?"), type=TensorType(shape, dtype))

    # the left side, bottom-up, choosing what is free
    def lhs(self, p: Pattern) -> Expr:
        if isinstance(p, PVar):
            return self.vars.get(p.name) or p  # type: ignore[return-value]
        if isinstance(p, PLit):
            dtype = p.dtype or ("float32" if isinstance(p.value, float) else "int32")
            node = Scalar(value=p.value, dtype=dtype)
            self.types.expr(node)
            return node
        if isinstance(p, PTuple):
            fields = []
            for f in p.fields:     # (a tuple's fields are often alike: concatenate's)
                self.tuple_like = self.types.types.get(id(fields[-1])) if fields else None
                fields.append(self._settle(self.lhs(f), f))
            self.tuple_like = None
            if p.rest:             # more fields, each like the last one (or like each other)
                if fields:
                    like, count = self.types.types.get(id(fields[-1])), self.rng.randint(0, 3)
                else:
                    like = self.new_var(p.rest, _shape_pool(self.rng, None), {"float32"}).type
                    count = self.rng.randint(1, 4)
                extra = []
                for i in range(count):
                    v = Var(name=f"{p.rest.lstrip('?')}_{i}", type=like)
                    self.vars[v.name] = v
                    self.types.expr(v)
                    extra.append(v)
                self.tuple_rests[p.rest] = extra
                fields += extra
            node = Tuple(fields=tuple(fields))
            self.types.expr(node)
            return node
        if isinstance(p, PProj):
            inner = self.lhs(p.inner)
            node = TupleGetItem(tuple=self._settle(inner, p.inner), index=p.index)
            self.types.expr(node)
            return node
        op = self.op_of(p)
        kids = [self.lhs(a) for a in p.args]
        # a variable met before a sibling that binds it (?x in multiply(?x, f(?x))) is that one
        kids = [self.vars.get(k.name, k) if isinstance(k, PVar) else k for k in kids]
        free = [i for i, k in enumerate(kids) if isinstance(k, PVar)]
        given = p.attr_map
        reason, streak, blamed = "", 0, 0
        for attempt in range(DRAWS):
            attrs: dict[str, Any] = {}
            for spec in op.attrs:
                v = given.get(spec.name)
                if isinstance(v, AttrLit):
                    attrs[spec.name] = v.value
                elif isinstance(v, AttrVar) and v.name in self.attrs:
                    attrs[spec.name] = self.attrs[v.name]
                elif isinstance(v, AttrVar) and v.name in self.attr_eq:
                    attrs[spec.name] = spec.kind.canonical(self.attr_eq[v.name])
                else:
                    attrs[spec.name] = _sample_attr(spec.kind, spec.default, self.rng)
            if any(isinstance(v, AttrVar) and v.name in self.attr_ne and
                   attrs[k] == self.attr_ne[v.name] for k, v in given.items()):
                continue
            args = list(kids)
            trial: dict[str, Var] = {}
            for i in free:
                name = kids[i].name
                if name in trial:
                    args[i] = trial[name]
                    continue
                neighbour = self.types.types.get(id(args[i - 1])) if i > 0 else None
                partner = self.vars.get(self.same_shape.get(name, ""))
                role = _role_dtypes(op.inputs[i])    # (a QNN parameter's: required)
                dtypes = role or _DTYPE_HINTS.get((op.name, i))
                if name in self.shape:
                    shape = self.fixed_shape(name, neighbour)
                elif partner is not None:
                    shape = partner.type.shape
                elif self.rng.random() < 0.4 and isinstance(neighbour, TensorType):
                    # like its neighbour (batch-norm statistics): shape and dtype (a
                    # QNN parameter keeps its own)
                    shape, dtypes = neighbour.shape, role or {neighbour.dtype}
                elif i == 0 and isinstance(self.tuple_like, TensorType) and \
                        self.rng.random() < 0.6:
                    shape = self.tuple_like.shape     # like the tuple's previous field
                elif _role_dtypes(op.inputs[i]) and "axis" in attrs and \
                        self.rank.get(name, 1) == 1 and \
                        isinstance(self.types.types.get(id(args[0])), TensorType) and \
                        self.types.types[id(args[0])].rank and self.rng.random() < 0.5:
                    data = self.types.types[id(args[0])]   # one value per channel on its axis
                    shape = (data.shape[attrs["axis"] % data.rank],)
                else:
                    shape = _shape_pool(self.rng, self.rank.get(name),
                                        _RANK_HINTS.get((op.name, i)))
                trial[name] = args[i] = self.new_var(name, shape, dtypes, trial,
                                                     required=role is not None)
                self.types.remember(args[i], args[i].type)
            for k, v in given.items():  # shape(?x) == ?s: the attribute is ?x's shape
                if isinstance(v, AttrVar) and v.name in self.shape_attr:
                    var = trial.get(self.shape_attr[v.name]) or self.vars.get(
                        self.shape_attr[v.name])
                    if var is not None:
                        attrs[k] = list(var.type.shape)
                if isinstance(v, AttrVar) and v.name in self.dtype_attr:  # dtype(?x) == ?d
                    var = trial.get(self.dtype_attr[v.name]) or self.vars.get(
                        self.dtype_attr[v.name])
                    if var is not None:
                        attrs[k] = var.type.dtype
            try:
                canon = op.canonical_attrs(attrs)
                node = Call(op=op, args=tuple(args), attrs=freeze_attrs(canon))
                t = self.types.node(node)  # the operands are typed already
            except (OpTypeError, EqquantError, ValueError, TypeError) as e:
                why = str(getattr(e, "message", e))
                streak, reason = (streak + 1 if why == reason else 1), why
                # (an operand built below this op refused: drawn again only with the
                # whole instance, as it is after SAME_REASON such refusals)
                arg = getattr(e, "arg", None)
                blamed += arg is not None and arg < len(kids) and arg not in free
                if streak >= SAME_REASON or blamed >= SAME_REASON:
                    break
                continue
            self.types.remember(node, t)
            self.learned += [((op.name, i), args[i].type) for i in free]
            self.vars.update(trial)
            for k, v in given.items():
                if isinstance(v, AttrVar):
                    self.attrs.setdefault(v.name, canon[k])
            if p.rest:          # (never the kernel: as the compiled rule, ``compile.py``)
                self.rests[p.rest] = {k: v for k, v in canon.items() if k != KERNEL}
            if p.name:
                self.named[p.name] = node
            return node
        raise _NoInstance(f"no well-typed instance found for {op.name} in {self.rule.name}"
                          + (f" (last refused: {reason})" if reason else ""))

    def fixed_shape(self, name: str, neighbour) -> tuple[int, ...]:
        """The shape a guard fixes for ``name``. A pattern's free sizes (``_``, ``..``) are
        drawn, most often as the operand beside it has them (broadcasting aligns from the
        right); a size variable keeps the size it was first drawn with."""
        from .guards import REST
        pattern = list(self.shape[name])
        like = neighbour.shape if isinstance(neighbour, TensorType) else ()
        if REST in pattern:
            fixed = len(pattern) - 1
            extra = max(len(like) - fixed, 0) if like and self.rng.random() < 0.8 else \
                self.rng.randint(0, 2)
            i = pattern.index(REST)
            pattern[i:i + 1] = [None] * extra
        out = []
        for i, d in enumerate(pattern):
            j = len(like) - len(pattern) + i
            near = like[j] if 0 <= j < len(like) and self.rng.random() < 0.8 else \
                self.rng.choice(_DIMS)
            if isinstance(d, str):
                out.append(self.drawn_sizes.setdefault(d, near))
            else:
                out.append(near if d is None else d)
        return tuple(out)

    def _settle(self, e, p: Pattern) -> Expr:
        if isinstance(e, PVar):
            v = self.new_var(e.name, self.fixed_shape(e.name, None) if e.name in self.shape
                             else _shape_pool(self.rng, self.rank.get(e.name)), {"float32"})
            self.vars[e.name] = v
            self.types.expr(v)
            return v
        return e

    # the right side, with everything bound
    def rhs(self, p: Pattern, where: dict[str, Pattern]) -> Expr:
        if isinstance(p, PVar):
            if p.name in where:
                return self.rhs(where[p.name], where)
            return self.named[p.name] if p.name in self.named else self.vars[p.name]
        if isinstance(p, PLit):
            if p.var is not None:
                return _Weak(self.attrs[p.var])
            return Scalar(value=p.value, dtype=p.dtype) if p.dtype else _Weak(p.value)
        if isinstance(p, PTuple):
            return Tuple(fields=tuple(self.rhs(f, where) for f in p.fields) +
                         tuple(self.tuple_rests.get(p.rest, ())))
        if isinstance(p, PMap):
            fields = []
            try:                   # (the map's variable names each field in turn)
                for v in self.tuple_rests[p.source]:
                    self.vars[p.var] = v
                    fields.append(self.rhs(p.body, where))
            finally:
                self.vars.pop(p.var, None)
            return Tuple(fields=tuple(fields))
        if isinstance(p, PProj):
            return TupleGetItem(tuple=self.rhs(p.inner, where), index=p.index)
        op = self.op_of(p)
        args = [self.rhs(a, where) for a in p.args]
        strong = next((self.types.expr(a) for a in args if not isinstance(a, _Weak)
                       and isinstance(self.types.expr(a), TensorType)), None)
        args = [Scalar(value=a.value, dtype=strong.dtype) if isinstance(a, _Weak) else a
                for a in args]
        rest = self.rests.get(p.rest, {}) if p.rest else {}
        attrs = {k: v for k, v in rest.items() if k in op.attr_map}
        for k, v in p.attrs:
            attrs[k] = self.attrs[v.name] if isinstance(v, AttrVar) else v.value
        node = Call(op=op, args=tuple(args), attrs=freeze_attrs(op.canonical_attrs(attrs)))
        self.types.expr(node)
        return node


@dataclass
class _Weak:
    value: Any


class _NoInstance(Exception):
    pass


def _zero_point_dtypes(instance: _Instance, *sides: Expr) -> dict[str, str]:
    """The quantized dtype each zero-point variable belongs to (so that it is drawn inside
    that dtype's range): a quant op's ``*_zero_point`` input belongs to the input of the same
    role (``input_`` -> data, ``lhs_``/``rhs_``, ``kernel_`` -> weight), ``output_`` to the
    op's result, a bare ``zero_point`` to the op's ``dtype`` attribute."""
    from ..core.nodes import post_order
    roles = {"input": "data", "lhs": "lhs", "rhs": "rhs", "kernel": "weight"}
    out: dict[str, str] = {}
    for side in sides:
        for node in post_order(side):
            if not (isinstance(node, Call) and isinstance(node.op, OpDef)):
                continue
            for i, (name, arg) in enumerate(zip(node.op.inputs, node.args)):
                if not (isinstance(arg, Var) and name.endswith("zero_point")):
                    continue
                role = name[:-len("zero_point")].rstrip("_")
                if role == "output":
                    dtype = getattr(instance.types.expr(node), "dtype", None)
                elif role in roles and roles[role] in node.op.inputs:
                    j = node.op.inputs.index(roles[role])
                    dtype = getattr(instance.types.expr(node.args[j]), "dtype", None)
                elif role == "":
                    dtype = node.attrs.get("dtype")
                else:
                    dtype = None
                if dtype in ("int8", "uint8"):
                    out.setdefault(arg.name, dtype)
    return out


def _inputs(instance: _Instance, rng: np.random.Generator, regime: str,
            zero_points: dict[str, str], zeros: bool = False) -> dict:
    """Random inputs. Floats: in [0.5, 2) ("positive": square roots of variances are real),
    signed ("signed"), signed and large ("wide": far outside any quantization grid, so
    that every quantization saturates), or across magnitudes ("mixed": a few magnitudes from
    1e-8 to 1e8 shared by every input, each value of either sign and off its magnitude by a
    relative 1e-7 to 1e-1, so that values of different inputs nearly cancel wherever a rule
    adds them: an order of float additions that loses them is found), except the variables
    the rule assumes positive (positive at every magnitude in "mixed"). With ``zeros``, a
    signed float's first element is 0 (a rule that divides by a value it does not assume
    positive meets 0).
    Booleans: each true or false alike. Integers: zero points inside their quantized dtype's
    range; 8-bit data over the dtype's
    whole range, its two ends included (saturation is exercised at both)."""
    from ..ops.numerics import qrange
    out = {}
    assumed = instance.positive
    pool = _magnitudes(rng)
    for v in instance.vars.values():
        t = v.type
        if t.dtype.startswith("float"):
            if regime == "positive" or v.name in assumed:
                a = rng.uniform(0.5, 2.0, t.shape)
                if regime == "mixed":
                    a = a * rng.choice(pool, t.shape)
            elif regime == "mixed":
                a = rng.choice(pool, t.shape) * rng.choice([-1.0, 1.0], t.shape) * \
                    (1.0 + 10.0 ** rng.uniform(-7, -1, t.shape) * rng.choice([-1, 1], t.shape))
            else:
                a = rng.normal(size=t.shape) * (1000.0 if regime == "wide" else 1.0)
                if zeros and regime == "signed":
                    a = np.asarray(a)
                    a.reshape(-1)[:1] = 0.0
        elif v.name in zero_points:
            lo, hi = qrange(zero_points[v.name])
            a = rng.integers(lo, hi + 1, t.shape)
        elif t.dtype == "bool":
            a = rng.random(t.shape) < 0.5
        elif t.dtype in ("int8", "uint8"):
            lo, hi = qrange(t.dtype)
            a = rng.integers(lo, hi + 1, t.shape)
            if a.size >= 2:
                a.reshape(-1)[:2] = (lo, hi)
        else:
            info = np.iinfo(t.dtype)
            span = 2000 if regime == "wide" else 100
            a = rng.integers(max(info.min, -span), min(info.max, span), t.shape)
        out[v.name] = np.asarray(a).astype(t.dtype)
    return out


def _magnitudes(rng: np.random.Generator) -> np.ndarray:
    """Three magnitudes, one each from 1e-8..1e-2, 1e-2..1e2 and 1e2..1e8."""
    return 10.0 ** np.array([rng.uniform(-8, -2), rng.uniform(-2, 2), rng.uniform(2, 8)])


def _compare(a, b, rule: Rule, unit: float = 1.0, each: bool = False
             ) -> tuple[bool, float]:
    """Whether ``a`` equals ``b`` as ``rule`` claims, and the error. An exact rule: within
    EXACT_RTOL of ``b``'s largest magnitude, or (``each``) of each element's own; an approx
    rule: its ``atol`` and ``rtol`` per element, in units of ``unit`` (a number); or, where
    ``unit`` is each element's terms (``_terms``), ``atol`` in those units and ``rtol`` of
    the element."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False, math.inf
    fin = np.isfinite(a) & np.isfinite(b)
    if not np.array_equal(np.isfinite(a), np.isfinite(b)):
        return False, math.inf
    if not fin.any():
        return True, 0.0
    diff = np.abs(a[fin] - b[fin])
    scale = float(np.max(np.abs(b[fin]))) or 1.0
    if rule.approx is None:
        if each:
            err = float((diff / np.maximum(np.abs(b[fin]), 1e-30)).max())
        else:
            err = float(diff.max()) / scale
        return err <= EXACT_RTOL, err
    if np.ndim(unit):                   # (atol in units of each element's terms)
        terms = np.broadcast_to(unit, b.shape)[fin]
        tol = terms * rule.approx["atol"] + rule.approx["rtol"] * np.abs(b[fin])
    else:
        tol = unit * (rule.approx["atol"] + rule.approx["rtol"] * np.abs(b[fin]))
    return bool(np.all(diff <= tol)), float((diff / np.maximum(tol, 1e-30)).max())


def _dtype_attr_vars(p: Pattern, ops: dict[str, OpDef], out: dict[str, tuple[str, ...]]
                     ) -> dict[str, tuple[str, ...]]:
    """Attribute variables of the left side whose attribute is a dtype with a fixed set of
    choices (``dtype=?d`` of a quantization): the checker makes one variant per choice."""
    if isinstance(p, PCall):
        op = ops[p.op.label] if p.op.is_set else p.op.ops[0]
        for name, v in p.attrs:
            spec = op.attr_map.get(name)
            if isinstance(v, AttrVar) and spec is not None and \
                    isinstance(spec.kind, DTypeKind) and spec.kind.choices:
                out.setdefault(v.name, spec.kind.choices)
        for a in p.args:
            _dtype_attr_vars(a, ops, out)
    elif isinstance(p, PProj):
        _dtype_attr_vars(p.inner, ops, out)
    elif isinstance(p, PTuple):
        for f in p.fields:
            _dtype_attr_vars(f, ops, out)
    return out


def check_rule_on_samples(rule: Rule, trials: int = 5, seed: int = 0) -> list[RuleCheck]:
    """One result per variant: per op of each op set, and per dtype a free dtype attribute
    can take (``quantize_calibrated[uint8]``); a dtype the rule's ops reject is no variant."""
    import itertools
    _RANK_HINTS.clear()         # (a verdict is the rule's own: not led by the rules checked
    _DTYPE_HINTS.clear()        # before it)
    results = []
    for ops, variant in expansions(rule):
        free = {k: v for k, v in _dtype_attr_vars(rule.lhs, ops, {}).items()
                if k not in {g.var for g in rule.guards if isinstance(g, AttrIs)}}
        if not free:
            results.append(_check_variant(rule, ops, variant, trials, seed))
            continue
        names = sorted(free)
        found = []
        for combo in itertools.product(*[free[n] for n in names]):
            suffix = ", ".join(combo)
            suffix = variant[:-1] + ", " + suffix + "]" if variant else f"[{suffix}]"
            r = _check_variant(rule, ops, suffix, trials, seed, dict(zip(names, combo)))
            if r.trials or not r.ok and "no well-typed instance" not in r.message:
                found.append(r)
        results += found or [RuleCheck(rule, variant, False, "no dtype the rule's ops take "
                                       "gives a well-typed instance")]
    return results


def _check_variant(rule: Rule, ops: dict[str, OpDef], variant: str, trials: int,
                   seed: int, fixed: dict[str, Any] | None = None) -> RuleCheck:
    rng = random.Random(seed)
    data_rng = np.random.default_rng(seed)
    done, worst, separated, refused = 0, 0.0, False, ""
    for t in range(trials * 20):
        if done >= trials and separated:
            break
        inst = _Instance(rule, ops, rng, fixed)
        try:
            lhs = inst.lhs(rule.lhs)
            if isinstance(lhs, PVar):
                raise _NoInstance("the left side is a variable")
            if not _guards_hold(inst, rule):
                raise _NoInstance("a guard does not hold")
            rhs = inst.rhs(rule.rhs, rule.where)
            for at, drawn in inst.learned:
                _RANK_HINTS.setdefault(at, set()).add(drawn.rank)
                _DTYPE_HINTS.setdefault(at, set()).add(drawn.dtype)
        except _NoInstance as e:
            refused = str(e)
            if done == 0 and t + 1 >= GIVE_UP:
                break               # (no instance in GIVE_UP searches: none is likely)
            continue
        except (OpTypeError, EqquantError) as e:
            return RuleCheck(rule, variant, False, f"the right side does not type-check: "
                             f"{getattr(e, 'message', e)}\n{_describe(inst)}", done)
        separates = _separates_axes(inst, lhs)
        if done >= trials and not separates:
            continue                # (enough instances: one that separates is wanted)
        separated |= separates
        lt, rt = inst.types.expr(lhs), inst.types.expr(rhs)
        if lt != rt:
            return RuleCheck(rule, variant, False, f"the sides have different types: {lt} "
                             f"=> {rt}\n{_describe(inst)}", done)
        params = tuple(inst.vars.values())
        zero_points = _zero_point_dtypes(inst, lhs, rhs)
        quantized = any(isinstance(n, Call) and isinstance(n.op, OpDef) and QUANT in n.op.props
                        for side in (lhs, rhs) for n in _calls(side))
        floats = any(v.type.dtype.startswith("float") for v in params)
        regimes = ("positive", "signed", "wide") if quantized else ("positive", "signed")
        regimes += ("mixed",) if floats and not quantized else ()
        for regime in regimes:
            inputs = _inputs(inst, data_rng, regime, zero_points, zeros=done % 2 == 1)
            try:
                a = run(Module({"main": Function(params=params, body=lhs)}), inputs)
                b = run(Module({"main": Function(params=params, body=rhs)}), inputs)
            except EqquantError as e:
                return RuleCheck(rule, variant, False, f"evaluating the instance failed: "
                                 f"{e.message}\n{_describe(inst, inputs)}", done)
            if isinstance(a, tuple):
                a, b = a[0], b[0]
            unit = 1.0
            scale = (rule.approx or {}).get("scale")
            if scale == TERMS:
                unit = _terms(lhs, params, inputs)
            elif scale:
                unit = float(np.max(np.abs(inputs[scale.lstrip("?")])))
            ok, err = _compare(b, a, rule, unit, each=regime == "mixed")
            worst = max(worst, err)
            if not ok:
                tol = ("rtol 1e-5" if rule.approx is None else
                       f"rtol {rule.approx['rtol']}, atol {rule.approx['atol']}")
                return RuleCheck(rule, variant, False,
                                 f"counterexample ({'exceeds ' + tol}; error {err:.3g}; "
                                 f"{regime} inputs):\n"
                                 f"{_describe(inst, inputs)}\n      left:  "
                                 f"{_short(print_expr(lhs))}\n      right: "
                                 f"{_short(print_expr(rhs))}", done + 1, err)
        done += 1
    if done == 0:
        return RuleCheck(rule, variant, False, "no well-typed instance of the left side was "
                         f"found (are its guards satisfiable?); the last search: {refused}")
    return RuleCheck(rule, variant, True, "", done, worst)


def _terms(lhs: Expr, params: tuple, inputs: dict) -> np.ndarray:
    """The magnitude of each element's terms: ``lhs`` evaluated on the inputs' magnitudes,
    each input an op subtracts (``OpDef.subtracts``) negated, so that every term adds. A
    rounding error of the computation, in any order, is a few float32 steps of it."""
    from ..core.nodes import rewrite

    def counted(node, children):
        if isinstance(node, Call) and isinstance(node.op, OpDef) and node.op.subtracts:
            negate = get_op("negative")
            args = tuple(Call(op=negate, args=(a,)) if name in node.op.subtracts else a
                         for name, a in zip(node.op.inputs, children))
            return Call(op=node.op, args=args, attrs=node.attrs)
        return None
    magnitudes = {k: (np.abs(v) if v.dtype.kind == "f" else v) for k, v in inputs.items()}
    out = run(Module({"main": Function(params=params, body=rewrite(lhs, counted))}),
              magnitudes)
    out = out[0] if isinstance(out, tuple) else out
    return np.abs(np.asarray(out, np.float64))


def _separates_axes(inst: _Instance, lhs: Expr) -> bool:
    """Whether every per-channel parameter of ``lhs`` (a scale or zero point of rank 1) has
    more than one value, along an axis whose length no other axis of its data has: an
    instance where a rule that mistakes the axis differs. A variant is checked on one such
    instance at least, where its guards allow one."""
    for node in _calls(lhs):
        if not isinstance(node.op, OpDef) or "axis" not in node.attrs or not node.args:
            continue
        data = inst.types.expr(node.args[0])
        for name, arg in zip(node.op.inputs[1:], node.args[1:]):
            t = inst.types.expr(arg)
            if _role_dtypes(name) and isinstance(t, TensorType) and t.rank == 1 and \
                    isinstance(data, TensorType) and \
                    (t.shape[0] == 1 or data.shape.count(t.shape[0]) != 1):
                return False
    return True


def _calls(e: Expr):
    from ..core.nodes import post_order
    return [n for n in post_order(e) if isinstance(n, Call)]


def _guards_hold(inst: _Instance, rule: Rule) -> bool:
    """Every guard, on the instance (the search only aims at them; this decides)."""
    inst.sizes = {}
    return all(g.holds(inst) for g in rule.guards)


def _short(text: str, n: int = 400) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[:n] + " ..."


def _describe(inst: _Instance, inputs: dict | None = None) -> str:
    parts = [f"%{v.name}: {v.type}" for v in inst.vars.values()]
    parts += [f"{k} = {v}" for k, v in inst.attrs.items()]
    text = "      " + ", ".join(parts)
    if inputs:
        for k, v in list(inputs.items())[:4]:
            text += f"\n      %{k} = {np.array2string(v.reshape(-1)[:6], precision=4)}" \
                    f"{' ...' if v.size > 6 else ''}"
    return text


def check_ruleset(rs: RuleSet, trials: int = 5, seed: int = 0) -> CheckReport:
    report = CheckReport()
    for rule in rs.rules:
        report.results += check_rule_on_samples(rule, trials, seed)
    return report

