"""Mixed precision: which values to quantize, chosen by extraction from one saturated e-graph.

    space = MixedSpace(marked, cost)              # cut at the marks, saturate once
    space.measure_sensitivity(fp32, samples)      # the output noise each mark causes alone
    choice = space.solve(min_sqnr=40.0)           # or budget=seconds, keep_fp32=..., int8_only
    program = space.program(choice)               # the marked program with the kept marks

The marked program (``annotate``) marks every value it quantizes; a mixed program keeps some
marks (those values are 8-bit) and drops the others (those stay float). Dropping a mark
changes what the program computes, so no e-graph may hold a program with a mark and one
without as equal: that is the approximate merge that would let an exact rule meant for one
act on the other. Instead the program is cut at its marks into regions, each computing one
marked value from the marks it reads:

    v = mark(f(mark(u), w))       region of v: f(dequantize(Q_u), mark(w))  (u kept)
                                               f(X_u, w)                    (u dropped)

Q_u (u's 8-bit code) and X_u (its float value) are fresh variables; a weight's mark is kept
with the region's data (a layer whose inputs are all kept is the one that can run in
integers). Each region, in each assignment of its inputs (its variants), with its result as a
float and as its own 8-bit code, is one root of one e-graph, saturated once with the
quantization rules. Every rule holds whatever values the variables take, so the term
extracted for a variant equals it whatever computes its inputs, and gluing the chosen
variants (each variable replaced by the term of the region that computes it) gives exactly
the marked program with the kept marks, up to the rounding bounds of the approx rules. The
choice of marks and variants is an integer program (HiGHS, via scipy): the cost of each
variant is its extracted term's, and the predicted output noise is the sum of the noise each
kept mark causes alone (``measure_sensitivity``: additive noise, the usual assumption of
mixed-precision search, checked afterwards by measuring the real program).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..core.nodes import (Call, Constant, Expr, Function, Module, Scalar, Tuple, TupleGetItem,
                          Var, post_order)
from ..core.types import TensorType
from ..errors import EqquantError
from ..extract.cost import CostModel
from ..ir.printer import value_labels
from ..ir.typecheck import infer_types
from ..passes.sizes import bind_sizes, input_sizes, is_symbolic
from .annotate import is_mark as _is_mark

MAX_INPUTS = 4     # a region reading more marks than this has two variants: all kept, or none


def _is_weight_mark(node) -> bool:
    return _is_mark(node) and isinstance(node.args[0], Constant)


def _constant_value(expr: Expr):
    """The value of an expression of constants, evaluated as constant folding does."""
    if isinstance(expr, (Constant, Scalar)):
        return expr.data
    from ..passes.fold import fold_constants
    folded = fold_constants(Module({"main": Function(params=(), body=expr)})).main.body
    if not isinstance(folded, (Constant, Scalar)):
        raise EqquantError(f"a mark's operand is not a constant: {type(expr).__name__}")
    return folded.data


@dataclass
class Region:
    """The ops computing one marked value from the marks it reads (``mark`` None: the
    program's result after its last mark)."""

    index: int
    mark: Call | None
    label: str
    inputs: list[int]                       # the activation marks it reads (region indices)
    weights: list[Call]                     # the weight marks inside it
    roots: dict[tuple[tuple[bool, ...], bool], int] = field(default_factory=dict)
    # (which inputs are kept, whether its result is its 8-bit code) -> root position
    costs: dict[tuple[tuple[bool, ...], bool], float] = field(default_factory=dict)
    terms: dict[tuple[tuple[bool, ...], bool], Expr] = field(default_factory=dict)
    noise: float = 0.0                      # output noise of its own mark alone
    weight_noise: float = 0.0               # output noise of its weights' marks alone

    def patterns(self) -> list[tuple[bool, ...]]:
        k = len(self.inputs)
        if k <= MAX_INPUTS:
            return list(itertools.product((False, True), repeat=k))
        return [(False,) * k, (True,) * k]


@dataclass
class Choice:
    """A mixed program: which marks are kept, each region's variant, and what was predicted."""

    kept: dict[str, bool]                   # value label -> its mark kept (8-bit)
    variants: dict[int, tuple[tuple[bool, ...], bool]]
    cost: float                             # predicted (the cost model's seconds)
    noise: float                            # predicted output noise (sum of squares)
    sqnr: float                             # predicted output SQNR, dB

    @property
    def floats(self) -> list[str]:
        return [k for k, v in self.kept.items() if not v]


class MixedSpace:
    """Every mixed program of one marked program, in one saturated e-graph."""

    def __init__(self, marked: Module, cost: CostModel,
                 rules: Sequence[str] = ("simplify", "quantize", "fusion"),
                 limits=None, names: Mapping[int, str] | None = None):
        """``names``: each value mark's label (by id) as the user knows it (``mark_labels``:
        the label in the program that was marked); else the marked program's labels."""
        from ..egraph.engine import EGraphSession, Phase
        from ..extract.extractors import extract
        from ..extract.provenance import Provenance
        from ..extract.to_ir import to_module
        from ..extract.view import EGraphView
        from ..optimizer import _rulesets
        from ..passes.inline import inline_calls
        from ..rules.compile import compile_ruleset
        self.marked = inline_calls(marked)
        self.cost = cost
        # what measure_sensitivity learns: the unmarked program's outputs and their power
        self.samples: list = []
        self.refs: list[np.ndarray] = []
        self.signal = 0.0
        fn = self.marked.main
        self.types = infer_types(self.marked)
        labels = value_labels(fn)
        order = [n for n in post_order(fn.body) if _is_mark(n) and not _is_weight_mark(n)]
        self.regions: list[Region] = []
        index = {id(m): i for i, m in enumerate(order)}
        self.variables: dict[tuple[int, bool], Var] = {}
        for i, m in enumerate(order):
            t = self.types[id(m.args[0])]
            code = TensorType(t.shape, m.attrs["dtype"])
            self.variables[(i, False)] = Var(name=f"mixed_x{i}", type=t)
            self.variables[(i, True)] = Var(name=f"mixed_q{i}", type=code)
        tops = list(order)
        if not _is_mark(fn.body):
            tops.append(fn.body)
        roots: list[Expr] = []
        for i, top in enumerate(tops):
            mark = top if _is_mark(top) else None
            inner = top.args[0] if mark is not None else top
            reads: list[int] = []
            weights: list[Call] = []
            self._scan(inner, index, reads, weights)
            label = (names or {}).get(id(top)) or labels.get(id(top), f"%{i}")
            region = Region(i, mark, label, reads, weights)
            for pattern in region.patterns():
                kept = dict(zip(reads, pattern))
                term = self._cut(inner, index, kept, all(pattern))
                outputs = [(False, term)]
                if mark is not None:
                    outputs.append((True, self._quantize(mark, term)))
                for as_code, expr in outputs:
                    region.roots[(pattern, as_code)] = len(roots)
                    roots.append(expr)
            self.regions.append(region)
        params = [*fn.params, *self.variables.values()]
        space = Module({"main": Function(params=params, body=Tuple(fields=tuple(roots)))},
                       version=self.marked.version)
        self.session = EGraphSession(space, limits)
        rulesets = _rulesets(rules)
        for rs in rulesets:
            self.session.add_ruleset(compile_ruleset(rs))
        self.saturations = 0
        self.report = self.session.run([Phase(rs.name) for rs in rulesets])
        self.saturations += 1
        view = EGraphView.of(self.session)
        fields = self._fields(view)
        # (each variant's ops carry their origin: the rules, and the alternatives here)
        why = Provenance(view, self.session, cost, ", ".join(rules) + " (mixed precision)")
        for region in self.regions:
            for key, at in region.roots.items():
                ex = extract(view, fields[at], cost, "best")
                region.costs[key] = ex.cost
                region.terms[key] = to_module(view, ex.choice, fields[at],
                                              self.session.encoded,
                                              why.origins(ex.choice)).main.body
        cost.flush()

    # -- cutting the marked program at its marks ----------------------------------------------

    def _scan(self, expr: Expr, index, reads: list[int], weights: list[Call]) -> None:
        seen: set[int] = set()
        stack = [expr]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if _is_weight_mark(node):
                weights.append(node)
            elif _is_mark(node):
                if index[id(node)] not in reads:
                    reads.append(index[id(node)])
            else:
                stack.extend(node.children())
        reads.sort()

    def _cut(self, expr: Expr, index, kept: Mapping[int, bool], weights_kept: bool) -> Expr:
        """``expr`` with each activation mark it reads replaced by its variable (kept: the
        dequantized code) and each weight mark kept or dropped."""
        memo: dict[int, Expr] = {}

        def visit(node: Expr) -> Expr:
            if id(node) in memo:
                return memo[id(node)]
            if _is_weight_mark(node):
                out = node if weights_kept else node.args[0]
            elif _is_mark(node):
                i = index[id(node)]
                if kept[i]:
                    dq = node.op.unfuse(list(node.args), node.attrs)   # dq(q(x, s, z), s, z)
                    out = Call(op=dq.op, args=(self.variables[(i, True)], *dq.args[1:]),
                               attrs=dq.attrs)
                else:
                    out = self.variables[(i, False)]
            elif isinstance(node, Call):
                args = tuple(visit(a) for a in node.args)
                out = node if all(a is b for a, b in zip(args, node.args)) else Call(
                    op=node.op, args=args, attrs=node.attrs, name=node.name,
                    origin=node.origin)
            elif isinstance(node, Tuple):
                out = Tuple(fields=tuple(visit(f) for f in node.fields), name=node.name)
            elif isinstance(node, TupleGetItem):
                out = TupleGetItem(tuple=visit(node.tuple), index=node.index, name=node.name)
            else:
                out = node                      # inputs, constants, scalars
            memo[id(node)] = out
            return out
        return visit(expr)

    @staticmethod
    def _quantize(mark: Call, term: Expr) -> Expr:
        """The value's 8-bit code: the quantize of the mark's meaning (dq(q(x)))."""
        return mark.op.unfuse([term, *mark.args[1:]], mark.attrs).args[0]

    def _fields(self, view) -> list[str]:
        root = view.root
        node = next(n for n in view.classes[root] if n.kind == "MkTuple")
        return list(node.children)

    # -- what each mark costs in accuracy -----------------------------------------------------

    def only(self, keep: Iterable[str] = (), weights_of: Iterable[str] = ()) -> Module:
        """The marked program with only the activation marks ``keep`` (value labels) and the
        weight marks of the regions ``weights_of``: the rest dropped."""
        return self._dropping(keep, weights_of)[0]

    def sizes_of(self, samples) -> dict[str, int]:
        """The open sizes of the marked program at the first of ``samples`` (none where its
        sizes are fixed): each mark's noise is measured at them (all samples must share
        them: the executor is made once)."""
        if not is_symbolic(self.marked) or not samples:
            return {}
        from .annotate import as_inputs
        return input_sizes(self.marked.main, as_inputs(samples[0], self.marked.main))

    def _dropping(self, keep: Iterable[str] = (), weights_of: Iterable[str] = ()
                  ) -> tuple[Module, dict[int, tuple[Expr, int]]]:
        """``only``'s program, and where each dropped mark went: by the mark's id, the node
        that reads it in the new program and the operand position (an activation mark's:
        the node it marked, position -1)."""
        keep, weights_of = set(keep), set(weights_of)
        marks = {id(r.mark): r.label in keep for r in self.regions if r.mark is not None}
        wmarks = {id(w): r.label in weights_of for r in self.regions for w in r.weights}
        from ..core.nodes import rebuild, rewrite
        where: dict[int, tuple[Expr, int]] = {}

        def dropped(node) -> bool:
            return _is_mark(node) and not (wmarks.get(id(node), False)
                                           if _is_weight_mark(node) else
                                           marks.get(id(node), False))

        def visit(node, kids):
            if dropped(node):
                if not _is_weight_mark(node):
                    where[id(node)] = (kids[0], -1)
                return kids[0]
            if isinstance(node, Call) and any(_is_weight_mark(a) and dropped(a)
                                              for a in node.args):
                new = rebuild(node, kids)
                for j, a in enumerate(node.args):
                    if _is_weight_mark(a) and dropped(a):
                        where[id(a)] = (new, j)
                return new
            return None
        fn = self.marked.main
        return Module({"main": Function(params=fn.params, body=rewrite(fn.body, visit),
                                        ret_type=fn.ret_type)},
                      version=self.marked.version), where

    def measure_sensitivity(self, samples: Sequence[Mapping[str, np.ndarray]],
                            progress=None) -> None:
        """For each mark alone (each value's, and each layer's weights'), the output noise it
        causes: the sum over ``samples`` of the squared difference between the program with
        that mark only and the program with none, run on the executor. The unmarked program
        runs once per sample, every value kept (``Executor.trace``); each mark then runs
        again only the ops downstream of it (``Executor.rerun``): the marked value is the
        mark applied to the kept one, a layer's marked weights are bound to that layer alone.
        The same kernels on the same operands: the noise of the program with the one mark,
        bit for bit."""
        from ..runtime.execution.executor import Executor
        from .flow import _flat
        program, where = self._dropping()
        samples = list(samples)
        sizes = self.sizes_of(samples)
        if sizes:       # (a program with open sizes: measured at the samples')
            moved: dict[int, Any] = {}
            program = bind_sizes(program, sizes, moved)
            where = {k: (moved.get(id(node), node), at) for k, (node, at) in where.items()}
        ex = Executor(program, refit=bool(sizes))
        operands: dict[int, list] = {}      # each mark's scale and zero point, evaluated once

        def apply(mark: Call, value):
            """The mark's fake quantization of ``value`` (its scale and zero point are
            constant expressions: folded, as a weight mark is in the program's folding)."""
            if id(mark) not in operands:
                operands[id(mark)] = [_constant_value(a) for a in mark.args[1:]]
            return np.asarray(mark.op.semantics(value, *operands[id(mark)], **mark.attrs))
        changes = []         # (region, its mark's value slot or None, its weights' steps)
        for region in self.regions:
            value = None if region.mark is None else ex.slot(where[id(region.mark)][0])
            steps, consts = {}, {}
            for w in region.weights:
                node, position = where[id(w)]
                i, step, extra = ex.with_constant(node, position, apply(w, w.args[0].data))
                steps[i] = step
                consts.update(extra)
            changes.append((region, value, steps, consts))
        self.samples = list(samples)
        self.refs = []
        for region, *_ in changes:
            region.noise = region.weight_noise = 0.0
        for n, x in enumerate(samples):
            trace = ex.trace(x)
            ref = _flat(trace[ex.out_slot])
            self.refs.append(ref)
            for region, value, steps, consts in changes:
                if value is not None:
                    out = ex.rerun(trace, {value: apply(region.mark, trace[value])})
                    region.noise += float(np.sum((_flat(out) - ref) ** 2))
                if steps:
                    out = ex.rerun(trace, consts, steps)
                    region.weight_noise += float(np.sum((_flat(out) - ref) ** 2))
                if progress is not None and n == len(samples) - 1:
                    progress(region.label)
        self.signal = float(sum(np.sum(r ** 2) for r in self.refs))

    # -- choosing -------------------------------------------------------------------------------

    def solve(self, min_sqnr: float | None = None, budget: float | None = None,
              keep_fp32: Iterable[str] = (), int8_only: bool = False,
              max_noise: float | None = None) -> Choice:
        """The cheapest mixed program whose predicted output SQNR is at least ``min_sqnr``
        (or whose predicted noise is at most ``max_noise``); with ``budget`` (seconds of the
        cost model), the least noisy one that costs at most that. ``keep_fp32``: value labels
        whose marks are dropped; ``int8_only``: every mark kept, as with no accuracy
        constraint or budget at all (the marked program as it is, apart from the pins). An
        integer program (HiGHS)."""
        try:
            from scipy.optimize import Bounds, LinearConstraint, milp
        except ImportError:
            raise EqquantError("mixed precision needs scipy's HiGHS: pip install "
                               "'eqquant[ilp]'") from None
        if (min_sqnr is not None or max_noise is not None or budget is not None) and \
                not self.refs:
            raise EqquantError("an accuracy or latency budget needs each mark's noise: "
                               "call measure_sensitivity first")
        keep_fp32 = set(keep_fp32)
        unknown = keep_fp32 - {r.label for r in self.regions if r.mark is not None}
        if unknown:
            raise EqquantError(f"--keep-fp32: no marked value {', '.join(sorted(unknown))} "
                               f"(marked: {', '.join(self.marked_values())})")
        marked = [r for r in self.regions if r.mark is not None]
        y = {r.index: n for n, r in enumerate(marked)}            # one variable per mark
        z: list[tuple[Region, tuple[tuple[bool, ...], bool]]] = []
        for r in self.regions:
            for key in r.roots:
                z.append((r, key))
        nv = len(y) + len(z)
        cost = np.zeros(nv)
        noise = np.zeros(nv)
        for r in marked:
            noise[y[r.index]] = r.noise
        for j, (r, (pattern, as_code)) in enumerate(z):
            cost[len(y) + j] = r.costs[(pattern, as_code)]
            if r.weights and all(pattern):
                noise[len(y) + j] = r.weight_noise
        rows, lo, hi = [], [], []

        def row(entries: dict[int, float], low: float, high: float) -> None:
            v = np.zeros(nv)
            for k, c in entries.items():
                v[k] += c
            rows.append(v)
            lo.append(low)
            hi.append(high)
        for r in self.regions:
            mine = [len(y) + j for j, (rr, _) in enumerate(z) if rr is r]
            row({k: 1.0 for k in mine}, 1, 1)                   # one variant
            for pos, i in enumerate(r.inputs):                  # ... agreeing with its inputs
                entries = {len(y) + j: 1.0 for j, (rr, (p, _)) in enumerate(z)
                           if rr is r and p[pos]}
                entries[y[i]] = -1.0
                row(entries, 0, 0)
            if r.mark is not None:                              # ... and with its own mark
                entries = {len(y) + j: 1.0 for j, (rr, (_, c)) in enumerate(z) if rr is r and c}
                entries[y[r.index]] = -1.0
                row(entries, 0, 0)
        lower, upper = np.zeros(nv), np.ones(nv)
        # with nothing to trade accuracy against, every mark not pinned to float is kept
        free = min_sqnr is not None or max_noise is not None or budget is not None
        for r in marked:
            if r.label in keep_fp32:
                upper[y[r.index]] = 0
            elif int8_only or not free:
                lower[y[r.index]] = 1
        if budget is not None:
            row({k: cost[k] for k in range(nv) if cost[k]}, 0, budget)
            objective = noise
        else:
            if max_noise is None and min_sqnr is not None:
                max_noise = self.signal / 10 ** (min_sqnr / 10)
            if max_noise is not None:
                row({k: noise[k] for k in range(nv) if noise[k]}, 0, max_noise)
            objective = cost + 1e-12 * noise      # (ties: the less noisy)
        res = milp(objective, integrality=np.ones(nv), bounds=Bounds(lower, upper),
                   constraints=LinearConstraint(np.array(rows), lo, hi),
                   options={"time_limit": 60})
        if res.x is None:
            what = (f"a cost of {budget * 1e3:.3f} ms" if budget is not None else
                    f"an output SQNR of {min_sqnr} dB" if min_sqnr is not None else
                    "these constraints")
            raise EqquantError(f"no mixed program meets {what} ({res.message})")
        x = np.round(res.x).astype(bool)
        kept = {r.label: bool(x[y[r.index]]) for r in marked}
        variants = {r.index: key for (r, key), on in zip(z, x[len(y):]) if on}
        total_noise = float(noise @ x)
        return Choice(kept, variants, float(cost @ x), total_noise, self.sqnr_of(total_noise))

    def sqnr_of(self, noise: float) -> float:
        return float("inf") if noise <= 0 else float(10 * np.log10(self.signal / noise))

    def marked_values(self) -> list[str]:
        return [r.label for r in self.regions if r.mark is not None]

    # -- the program ------------------------------------------------------------------------------

    def program(self, choice: Choice) -> Module:
        """The chosen variants glued together: the marked program with the kept marks, in the
        kernels extraction chose (weights left marked in float written out as their
        quantize/dequantize pair, constants folded)."""
        from ..core.nodes import rewrite
        from ..passes.fold import fold_constants
        from .flow import expand_calibration
        built: dict[tuple[int, bool], Expr] = {}
        names = {v.name: key for key, v in self.variables.items()}
        body = None
        for r in self.regions:
            pattern, as_code = choice.variants[r.index]
            term = r.terms[(pattern, as_code)]

            def visit(node, kids, _built=built):
                if isinstance(node, Var) and node.name in names:
                    return _built[names[node.name]]
                return None
            term = rewrite(term, visit)
            if r.mark is None:
                body = term
                continue
            built[(r.index, as_code)] = term
            if as_code:         # readers of a kept value read its code; the float, if asked,
                dq = r.mark.op.unfuse([term, *r.mark.args[1:]], r.mark.attrs)
                built[(r.index, False)] = Call(op=dq.op, args=(term, *dq.args[1:]),
                                               attrs=dq.attrs)
        fn = self.marked.main
        if body is None:            # the result is the last mark: its float value
            last = self.regions[-1]
            body = built[(last.index, False)]
        mod = Module({"main": Function(params=fn.params, body=body, ret_type=fn.ret_type)},
                     version=self.marked.version)
        return fold_constants(expand_calibration(mod))

    def table(self, choice: Choice) -> str:
        """Each marked value: kept (int8) or float, its noise alone, its region's cost."""
        lines = [f"{'value':10s} {'precision':>9s} {'noise alone dB':>15s} {'cost ms':>9s}"]
        for r in self.regions:
            if r.mark is None:
                continue
            key = choice.variants[r.index]
            alone = self.sqnr_of(r.noise) if self.refs else float("nan")
            lines.append(f"{r.label:10s} {'int8' if choice.kept[r.label] else 'float':>9s} "
                         f"{alone:15.1f} {r.costs[key] * 1e3:9.3f}")
        return "\n".join(lines)



@dataclass
class Round:
    """One extraction of the mixed search: what it aimed at, predicted, and measured."""

    target: str           # the constraint it was solved under
    floats: int           # marks dropped (values left in float)
    cost: float           # predicted seconds
    predicted: float      # predicted output SQNR (dB) or metric
    measured: float       # measured on the calibration samples (or the user's metric)

    def __str__(self) -> str:
        return (f"{self.target}: {self.floats} values in float, predicted cost "
                f"{self.cost * 1e3:.3f} ms, SQNR predicted {self.predicted:.1f} dB, "
                f"measured {self.measured:.1f}")


@dataclass
class MixedResult:
    space: MixedSpace
    choice: Choice
    program: Module
    rounds: list[Round]
    evaluations: int = 0          # full evaluations of a candidate program (SQNR or metric)

    def report(self) -> list[str]:
        lines = [f"mixed precision: {len(self.choice.floats)} of "
                 f"{len(self.choice.kept)} marked values left in float "
                 f"({', '.join(self.choice.floats) or 'none'}); one saturation, "
                 f"{len(self.rounds)} extraction rounds, {self.evaluations} full evaluations"]
        lines += [f"  round {i + 1}: {r}" for i, r in enumerate(self.rounds)]
        return lines


def measured_sqnr(space: MixedSpace, program: Module) -> float:
    """The output SQNR of ``program`` against the unmarked program, on the sensitivity
    samples."""
    from ..runtime.execution.sized import executor_for
    from .flow import _flat
    ex = executor_for(program)
    noise = sum(float(np.sum((_flat(ex.run(x)) - r) ** 2))
                for x, r in zip(space.samples, space.refs))
    return space.sqnr_of(noise)


def search(space: MixedSpace, min_sqnr: float | None = None, budget: float | None = None,
           keep_fp32: Iterable[str] = (), int8_only: bool = False,
           metric=None, max_drop: float | None = None, rounds: int = 6) -> MixedResult:
    """The mixed program for one query, measured and tightened where it misses.

    - ``min_sqnr``: the cheapest program whose measured output SQNR is at least that: solve
      under the predicted noise, measure, and when the measure misses, shrink the noise
      allowed by the miss and solve again (each round reported);
    - ``metric`` (a function of a program's ``run(inputs) -> output``, higher is better) and
      ``max_drop``: the cheapest program whose metric is within ``max_drop`` of the float
      program's: the SQNR floor rises 3 dB a round from the all-int8 program's until it holds;
    - ``budget`` (seconds, the cost model's): the least noisy program within it;
    - ``keep_fp32``, ``int8_only``: pins, with any of the above."""
    from ..runtime.execution.sized import executor_for
    out: list[Round] = []
    pins = dict(keep_fp32=keep_fp32, int8_only=int8_only)
    evaluations = 0
    if metric is not None:
        if max_drop is None:
            raise EqquantError("a metric needs max_drop (the largest drop allowed)")
        base = metric(executor_for(space.only()).run)
        evaluations += 1
        choice = space.solve(**pins)
        floor = choice.sqnr
        for _ in range(rounds * 3):
            program = space.program(choice)
            score = metric(executor_for(program).run)
            evaluations += 1
            out.append(Round(f"SQNR >= {floor:.1f} dB", len(choice.floats), choice.cost,
                             choice.sqnr, score))
            if base - score <= max_drop or not any(choice.kept.values()):
                break
            floor = max(floor, choice.sqnr) + 3.0
            choice = space.solve(min_sqnr=floor, **pins)
        return MixedResult(space, choice, program, out, evaluations)
    if budget is not None:
        choice = space.solve(budget=budget, **pins)
        program = space.program(choice)
        out.append(Round(f"cost <= {budget * 1e3:.3f} ms", len(choice.floats), choice.cost,
                         choice.sqnr, measured_sqnr(space, program)))
        return MixedResult(space, choice, program, out, 1)
    if min_sqnr is None:
        choice = space.solve(**pins)
        program = space.program(choice)
        out.append(Round("no accuracy constraint", len(choice.floats), choice.cost,
                         choice.sqnr, measured_sqnr(space, program)))
        return MixedResult(space, choice, program, out, 1)
    allowed = space.signal / 10 ** (min_sqnr / 10)
    for _ in range(rounds):
        choice = space.solve(max_noise=allowed, **pins)
        program = space.program(choice)
        real = measured_sqnr(space, program)
        evaluations += 1
        out.append(Round(f"noise <= {allowed:.4g} (SQNR >= {space.sqnr_of(allowed):.1f} dB)",
                         len(choice.floats), choice.cost, choice.sqnr, real))
        if real >= min_sqnr or not any(choice.kept.values()):
            break
        allowed *= 10 ** ((real - min_sqnr) / 10) * 0.9    # the miss, and a margin
    return MixedResult(space, choice, program, out, evaluations)


def pareto(space: MixedSpace, points: int = 6, top: float = 50.0) -> list[Round]:
    """Predicted latency against output SQNR: the cheapest program for ``points`` SQNR floors
    from the all-int8 program's predicted SQNR to ``top`` dB, each measured; from the one
    saturated e-graph."""
    low = space.solve(int8_only=True).sqnr
    out: list[Round] = []
    for floor in np.linspace(low, max(top, low), points):
        choice = space.solve(min_sqnr=float(floor))
        program = space.program(choice)
        out.append(Round(f"SQNR >= {floor:.1f} dB", len(choice.floats), choice.cost,
                         choice.sqnr, measured_sqnr(space, program)))
    return out
