"""Where an extracted op came from: the rules that made it, in order, and what extraction
rejected for it, carried on the op itself (``Call.origin``) from phase to phase.

egglog keeps no record of which rule built which e-node, so the record is rebuilt from the
saturated e-graph, as a derivation: the e-nodes of the loaded program are given; a rule's
match whose left-side e-nodes are all derived derives the e-nodes of its right side
(``extract.matching``: the left side matched, its guards held, the right side found in the
e-graph). Rounds of that, to a fixed point, give every derivable e-node its first derivation,
the shortest; it is a derivation the rules allow, not necessarily the one egglog happened to
take. An op's steps are the steps of its left side's ops (each from the op the program came
in with: its own ``origin``, from an earlier phase), then the rule itself.

Each op also records the alternatives its e-class held at extraction, with their costs under
the phase's cost model (its own, and with its operands at their cheapest): the cost model's
answer to "why not int8 here?". ``Origin.text()`` prints both.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.nodes import Call, Module
from ..extract.cost import CostModel
from .extractors import node_costs
from .matching import Match, Matcher
from .naming import namer
from .view import EGraphView, ENode


@dataclass(frozen=True)
class Step:
    rule: str          # the rule's name (``<-`` for a ``<=>`` rule read backwards)
    loc: str           # its file:line:column
    ruleset: str


@dataclass(frozen=True)
class Alternative:
    term: str          # the e-node: its op and its operands' names
    cost: float        # its own cost
    total: float       # with each operand at its cheapest (a shared one counted per use)
    chosen: bool


@dataclass(frozen=True)
class Choice:
    """One phase's extraction at the op's e-class."""

    phase: str
    alternatives: tuple[Alternative, ...]
    unit: str = "s"


@dataclass(frozen=True)
class Origin:
    steps: tuple[Step, ...] = ()
    choices: tuple[Choice, ...] = ()

    def text(self, fmt_cost=None) -> str:
        fmt = fmt_cost or (lambda c, unit: f"{c * 1e3:.4f} ms" if unit == "s" else f"{c:.4g}")
        lines = ["rules that made it, in order:" if self.steps else
                 "no rule made it: it is as the program was given"]
        width = max((len(s.rule) for s in self.steps), default=0)
        for i, s in enumerate(self.steps, 1):
            lines.append(f"  {i:2d}. {s.rule:{width}s}  {s.loc}  (ruleset {s.ruleset})")
        for c in self.choices:
            lines.append(f"extraction in phase {c.phase}: {len(c.alternatives)} "
                         "alternative(s) at this value (cost alone / with operands at their "
                         "cheapest)")
            for a in sorted(c.alternatives, key=lambda a: (not a.chosen, a.total)):
                mark = "chosen  " if a.chosen else "rejected"
                lines.append(f"  {mark} {fmt(a.cost, c.unit):>12s} / {fmt(a.total, c.unit):>12s}"
                             f"  {a.term}")
        return "\n".join(lines)


def _merge(chains) -> tuple[Step, ...]:
    out: dict[Step, None] = {}
    for chain in chains:
        out.update(dict.fromkeys(chain))
    return tuple(out)


class Provenance:
    """The derivations of one saturated e-graph, made once; :meth:`origins` of any number of
    extractions from it."""

    def __init__(self, view: EGraphView, session, model: CostModel, phase: str):
        """``session``: the ``egraph.engine.EGraphSession`` the view was read from; ``model``
        the cost model extraction used; ``phase`` how the phase is shown (its rule sets)."""
        self.view, self.phase = view, phase
        self.unit = "s" if model.name in ("cpu", "measured") else ""
        fired = {name for name, n in session.report.matches().items() if n}
        rules = {}
        for rs in session.rulesets.values():
            for c in rs.rules:
                if c.name in fired:
                    rules.setdefault((id(c.rule), c.name.endswith("<-")), c.rule)
        matcher = Matcher(view)
        found: list[tuple[Match, tuple[str, ...]]] = []
        for (_, reverse), rule in rules.items():
            for m in matcher.matches(rule, reverse):
                built = matcher.built(m)
                if built:
                    found.append((m, built))
        self.given = _loaded_nodes(view, session)
        made: dict[str, Match | None] = dict.fromkeys(self.given)
        changed = True
        while changed:
            changed = False
            for m, built in found:
                if all(n in made for n in m.nodes) and any(b not in made for b in built):
                    for b in built:
                        made.setdefault(b, m)
                    changed = True
        self.made = made
        self._steps: dict[str, tuple[tuple[Step, ...], tuple[Step, ...]]] = {}
        self.costs = node_costs(view, model)
        self.best = _cheapest(view, self.costs)
        self.name_of = namer(view, session)

    def steps(self, nid: str) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
        """An e-node's steps: those of earlier phases (the origins its left sides' ops came
        in with), and this phase's, each in the order it was derived."""
        memo = self._steps
        if nid in memo:
            return memo[nid]
        m = self.made.get(nid)
        if m is None:
            origin = getattr(self.given.get(nid), "origin", None)
            out = (origin.steps if origin else (), ())
        else:
            memo[nid] = ((), ())      # (a guard: derivations are well founded, but cheap)
            parts = [self.steps(n) for n in m.nodes]
            out = (_merge(p[0] for p in parts),
                   _merge([*(p[1] for p in parts),
                           (Step(m.name, str(m.rule.loc), m.rule.ruleset),)]))
        memo[nid] = out
        return out

    def inherited(self, nid: str) -> tuple[Choice, ...]:
        """The earlier phases' choices of the op a derivation starts from (each left side's
        top op, back to one the program came in with)."""
        seen: set[str] = set()
        while nid not in seen:
            seen.add(nid)
            m = self.made.get(nid)
            if m is None:
                origin = getattr(self.given.get(nid), "origin", None)
                return origin.choices if origin else ()
            if not m.nodes:
                return ()
            nid = m.nodes[0]
        return ()

    def origins(self, choice: dict[str, ENode]) -> dict[str, Origin]:
        """The :class:`Origin` of each op an extraction chose, by e-class."""
        view = self.view
        out: dict[str, Origin] = {}
        for cls, node in choice.items():
            if node.kind != "op":
                continue
            alts = tuple(Alternative(
                f"{n.op.name}({', '.join(self.name_of(k).split(' (')[0] for k in n.children)})"
                if n.kind == "op" else n.kind,
                self.costs.get(n.node_id, 0.0),
                self.costs.get(n.node_id, 0.0) + sum(self.best.get(k, 0.0) for k in n.children),
                n.node_id == node.node_id)
                for n in view.classes.get(cls, ()) if n.node_id not in view.bad)
            before, here = self.steps(node.node_id)
            out[cls] = Origin(_merge([before, here]), self.inherited(node.node_id)
                              + (Choice(self.phase, alts, self.unit),))
        return out


def origins(view: EGraphView, session, choice: dict[str, ENode], model: CostModel,
            phase: str) -> dict[str, Origin]:
    """The :class:`Origin` of each op of one extraction (:class:`Provenance`)."""
    return Provenance(view, session, model, phase).origins(choice)


_KINDS = {"Var": "Input", "Constant": "Const", "Scalar": "Scalar", "Tuple": "MkTuple",
          "TupleGetItem": "GetItem"}     # IR node class -> the e-node kind it loads as


def _loaded_nodes(view: EGraphView, session) -> dict[str, object]:
    """The e-nodes of the program as it was loaded, with the IR node each one is."""
    enc = session.encoded
    cls_of = view.let_classes
    out: dict[str, object] = {}
    for let, node in enc.nodes.items():
        cls = cls_of.get(let)
        if cls is None:
            continue
        if isinstance(node, Call):
            kids = tuple(cls_of.get(enc.lets.get(id(a))) for a in node.args)
            hit = next((n for n in view.classes.get(cls, ()) if n.kind == "op" and
                        n.op is node.op and n.children == kids), None)
        else:
            kind = _KINDS.get(type(node).__name__)
            hit = next((n for n in view.classes.get(cls, ()) if n.kind == kind), None)
        if hit is not None:
            out[hit.node_id] = node
    return out


def _cheapest(view: EGraphView, costs: dict[str, float]) -> dict[str, float]:
    """Each e-class's cheapest tree cost (shared operands counted per use), to a fixed
    point over the operands-first order."""
    best: dict[str, float] = {}
    for _ in range(3):
        changed = False
        for cls in view.order:
            for n in view.classes.get(cls, ()):
                if n.node_id in view.bad or any(k not in best for k in n.children):
                    continue
                c = costs.get(n.node_id, 0.0) + sum(best[k] for k in n.children)
                if c < best.get(cls, float("inf")):
                    best[cls] = c
                    changed = True
        if not changed:
            break
    return best


def why(module: Module, label: str, decisions=()) -> str:
    """Where the value ``label`` (``%12``, as the printed program names it) of an optimized
    program came from: its op, the rules that made it in order (each with its file:line:col),
    the alternatives each extraction rejected there with their costs, and (``decisions``,
    ``runtime.lowering.plan.Decision`` of the kernel plan) the kernel chosen for it and why."""
    from ..core.nodes import post_order
    from ..errors import EqquantError
    from ..ir.printer import value_labels
    labels = value_labels(module.main)
    wanted = label if label.startswith("%") else f"%{label}"
    node = next((n for n in post_order(module.main.body) if labels.get(id(n)) == wanted), None)
    if node is None:
        params = {id(p) for p in module.main.params}
        known = list(dict.fromkeys(v for k, v in labels.items() if k not in params))
        listed = ", ".join(known) if len(known) <= 6 else \
            f"{', '.join(known[:3])} .. {', '.join(known[-3:])}"
        raise EqquantError(f"the program has no value {wanted} (its values: {listed}; the "
                           "result, when the program does not name it, is %result)")
    if not isinstance(node, Call) or node.op_name is None:
        return f"{wanted} is not an op call: it is a {type(node).__name__}"
    lines = [f"{wanted} = {node.op_name}"]
    if node.origin is None:
        lines.append("no record of how it was made: it is as the program was given, or it "
                     "was made outside the optimizer")
    else:
        lines.append(node.origin.text())
    for d in decisions:          # (runtime.lowering.plan.Decision: the kernel plan's)
        if d.label == wanted:
            lines += ["its kernel:", *d.lines()]
    return "\n".join(lines)
