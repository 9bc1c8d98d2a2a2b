"""The optimizer as one call: saturate with rules, extract under a cost model, fold constants.

    result = optimize(module, params, rules=["bn_fold"], cost="cpu")
    result.module, result.params      # the new program and its weights
    print(result.explain())           # cost before/after, per-op table, rules that fired

Steps: bind the params (parameters with weights become constants), load ``main`` into an
e-graph, run the schedule (default: each ruleset once, in order), extract the cheapest program
(greedy by default, or the exact ILP), turn it back into IR, fold constant subexpressions, and
check the result's types.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .egraph.engine import EGraphSession, Limits, Phase, SaturationReport, parse_schedule
from .extract.cost import CostModel, at_sizes, cost_model
from .extract.extractors import extract
from .extract.to_ir import to_module
from .extract.view import EGraphView
from .core.types import is_static
from .core.nodes import Call, Constant, Expr, Module, Scalar, post_order
from .ir.params import bind_params, constant_params
from .ir.typecheck import check_module, infer_types
from .passes.fold import fold_constants
from .rules.ast import RuleSet
from .rules.compile import compile_ruleset
from .rules.loader import load_rules


@dataclass
class OpCosts:
    """Per op: how many calls and what they cost, for a whole program."""

    rows: dict[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(c for _, c in self.rows.values())


def program_costs(mod: Module, model: CostModel) -> OpCosts:
    """The cost of running ``mod`` as it is (constant subexpressions count as folded)."""
    types = infer_types(mod)
    const: set[int] = set()
    out = OpCosts()
    for node in post_order(mod.main.body):
        kids = node.children()
        if isinstance(node, (Constant, Scalar)) or (kids and all(id(k) in const for k in kids)):
            const.add(id(node))
            continue
        if isinstance(node, Call) and not isinstance(node.op, Expr):
            in_types = [types[id(a)] for a in node.args]
            consts = frozenset(i for i, a in enumerate(node.args) if id(a) in const)
            c = model.instance_cost(node.op, node.attrs, in_types, types[id(node)], consts)
            n, total = out.rows.get(node.op.name, (0, 0.0))
            out.rows[node.op.name] = (n + 1, total + c)
    return out


@dataclass
class OptimizeResult:
    module: Module
    params: dict[str, np.ndarray]
    report: SaturationReport
    before: OpCosts
    after: OpCosts
    model: str
    extractor: str
    rule_locations: dict[str, str]
    seconds: dict[str, float]
    enodes: int = 0
    eclasses: int = 0
    model_summary: str = ""        # where the costs came from (a measured model's counts)
    # the kernels its int8 sites were given (``runtime.lowering.plan.planned``: its decisions, and
    # the table ``explain`` prints)
    kernel_plan: list = field(default_factory=list)
    kernel_table: str = ""

    def explain(self) -> str:
        unit = "s" if self.model in ("cpu", "measured") else ""
        fmt = (lambda v: f"{v * 1e3:10.3f} ms") if unit == "s" else (lambda v: f"{v:10.0f}")
        lines = [f"cost model {self.model}, extractor {self.extractor}",
                 *([self.model_summary] if self.model_summary else []),
                 f"cost before {fmt(self.before.total).strip()}, after "
                 f"{fmt(self.after.total).strip()}"
                 + (f" ({self.before.total / self.after.total:.2f}x)" if self.after.total else ""),
                 "", f"{'op':32s} {'before':>6s} {'cost':>13s}   {'after':>6s} {'cost':>13s}"]
        for op in sorted(set(self.before.rows) | set(self.after.rows)):
            nb, cb = self.before.rows.get(op, (0, 0.0))
            na, ca = self.after.rows.get(op, (0, 0.0))
            lines.append(f"{op:32s} {nb:6d} {fmt(cb)}   {na:6d} {fmt(ca)}")
        lines += self._layout_changes()
        lines += ["", f"e-graph: {self.enodes} e-nodes in {self.eclasses} classes; "
                  + ("saturated" if self.report.saturated else
                     "LIMIT HIT: " + "; ".join(self.report.limits_hit)),
                  "rules that fired:"]
        fired = {k: v for k, v in self.report.matches().items() if v}
        for name, n in sorted(fired.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n:6d}  {name}  ({self.rule_locations.get(name, '?')})")
        if not fired:
            lines.append("  (none)")
        if self.kernel_table:
            lines += ["", self.kernel_table]
        lines.append("times: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in
                                          self.seconds.items()))
        return "\n".join(lines)


    def why(self, label: str) -> str:
        """Where the value ``label`` (``%12``) of the program came from: the rules that made
        it, the alternatives extraction rejected, its kernel (``explain.why``)."""
        from .extract.provenance import why
        return why(self.module, label, self.kernel_plan)

    def _layout_changes(self) -> list[str]:
        """Where the chosen program changes a layout (the ops with a src_layout and a
        dst_layout), each with the value it reads: empty when it changes none."""
        from .ir.printer import value_labels
        fn = self.module.main
        labels = value_labels(fn)
        out = []
        for node in post_order(fn.body):
            if isinstance(node, Call) and not isinstance(node.op, Expr) and \
                    {"src_layout", "dst_layout"} <= set(node.attrs):
                arg = node.args[0]
                what = arg.op_name if isinstance(arg, Call) else type(arg).__name__.lower()
                out.append(f"  {labels[id(node)]} = {node.op.name}({labels.get(id(arg), '?')} "
                           f"({what}), {node.attrs['src_layout']} -> "
                           f"{node.attrs['dst_layout']})")
        return ["", "layout changes in the chosen program:", *out] if out else []


def _rulesets(rules: Sequence[str | Path | RuleSet]) -> list[RuleSet]:
    """The rule sets named (or given), each rule checked before use (``rules.trust``)."""
    from .rules.trust import verify
    out = [r if isinstance(r, RuleSet) else load_rules(r) for r in rules]
    verify(out)
    return out


def optimize(module: Module, params: Mapping[str, np.ndarray] | None = None,
             rules: Sequence[str | Path | RuleSet] = ("simplify", "bn_fold"),
             schedule: str | Sequence[Phase] | None = None, cost: str | CostModel = "cpu",
             extractor: str = "greedy", limits: Limits | None = None,
             fold: bool = True, why: bool = True,
             sizes: Mapping[str, int] | None = None) -> OptimizeResult:
    """``why``: give each call of the result its ``origin`` (the rules that made it and the
    alternatives extraction rejected: ``extract.provenance``), after those it came in with.
    ``sizes``: where the program has sizes known only at run time (``?n``), the sizes its
    costs are priced at (a name not given: 1)."""
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    model = cost_model(cost)
    if not all(is_static(p.type) for p in module.main.params):
        model = at_sizes(model, sizes)
    mod = bind_params(module, params) if params else module
    rulesets = _rulesets(rules)
    seconds["rules"] = time.perf_counter() - t

    t = time.perf_counter()
    session = EGraphSession(mod, limits)
    for rs in rulesets:
        session.add_ruleset(compile_ruleset(rs))
    seconds["load"] = time.perf_counter() - t

    t = time.perf_counter()
    if schedule is None:
        phases = [Phase(rs.name) for rs in rulesets]
    elif isinstance(schedule, str):
        phases = parse_schedule(schedule)
    else:
        phases = list(schedule)
    report = session.run(phases)
    seconds["saturate"] = time.perf_counter() - t

    t = time.perf_counter()
    view = EGraphView.of(session)
    root = view.root
    ex = extract(view, root, model, extractor)
    seconds["extract"] = time.perf_counter() - t
    origins = None
    if why:
        from .extract.provenance import origins as derive
        t = time.perf_counter()
        origins = derive(view, session, ex.choice, model, ", ".join(p.ruleset for p in phases))
        seconds["why"] = time.perf_counter() - t
    out = to_module(view, ex.choice, root, session.encoded, origins)

    t = time.perf_counter()
    if fold:
        out = fold_constants(out)
    check_module(out)
    seconds["fold"] = time.perf_counter() - t
    enodes, eclasses = view.size()
    before, after = program_costs(mod, model), program_costs(out, model)
    model.flush()
    return OptimizeResult(out, constant_params(out), report, before, after, model.name,
                          ex.method, session.rule_locations(), seconds, enodes, eclasses,
                          model.summary() if model.name == "measured" else "")

