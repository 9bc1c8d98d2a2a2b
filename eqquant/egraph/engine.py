"""Saturation: a program in an egglog e-graph, rulesets run phase by phase under limits.

    session = EGraphSession(module)
    session.add_ruleset(load_rules("bn_fold"))
    report = session.run(parse_schedule("simplify; bn_fold; simplify"))
    print(report.table())      # per-rule matches, e-graph size, why each phase stopped

A phase runs one ruleset an iteration at a time (then saturates the ``analysis`` rules that
derive constness) until it saturates or a limit stops it: its own iteration count, the e-node
limit, or the time limit. A limit that stops a phase is always in the report. For rules with
dtype/rank/shape guards, companion rules mark the classes whose types a guard needs, and the
engine writes just those types (inferred in Python from the registry) before each iteration:
writing every value's type into egglog would cost more than the whole saturation.
"""
from __future__ import annotations

import re

import json
import time
from dataclasses import dataclass, field

from egglog import bindings

from ..errors import EqquantError
from ..extract.view import EGraphView
from ..ir.nodes import Constant, Module, post_order
from ..rules.ast import RuleSet
from ..rules.compile import CompiledRuleset, compile_ruleset
from .encode import Encoded, encode, list_term, type_facts
from .schema import LEAVES, egg_name, egg_string, encode_attr, schema


LOAD_CHUNK = 200   # lines of a loaded program per egglog call (see EGraphSession._load)


@dataclass
class Limits:
    iterations: int = 30        # per phase, unless the schedule says otherwise
    nodes: int = 200_000        # e-nodes in the whole e-graph
    seconds: float = 60.0       # for the whole run


@dataclass
class Phase:
    ruleset: str
    iterations: int | None = None

    def __str__(self) -> str:
        return self.ruleset + (f"*{self.iterations}" if self.iterations else "")


def parse_schedule(text: str) -> list[Phase]:
    """``"simplify; bn_fold*10; simplify"``: phases separated by ``;``, ``,`` or newlines,
    each a ruleset name with an optional ``*N`` iteration limit; ``#`` starts a comment."""
    phases = []
    for raw in text.replace(",", ";").replace("\n", ";").split(";"):
        item = raw.split("#", 1)[0].strip()
        if not item:
            continue
        name, _, count = item.partition("*")
        name, count = name.strip(), count.strip()
        if not _RULESET_NAME.fullmatch(name) or (count and not (
                count.isdigit() and len(count) <= 9)):
            # (the item itself is not echoed: a schedule read from a file given by mistake
            # must not print that file)
            raise EqquantError(f"schedule: phase {len(phases) + 1} is not 'ruleset' or "
                               "'ruleset*N' (a ruleset name, an iteration count up to 9 digits)")
        phases.append(Phase(name, int(count) if count else None))
    return phases


_RULESET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")


@dataclass
class PhaseReport:
    ruleset: str
    iterations: int = 0
    stop: str = ""              # saturated | iteration limit | node limit | time limit
    matches: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    enodes: int = 0


@dataclass
class SaturationReport:
    phases: list[PhaseReport] = field(default_factory=list)
    load_seconds: float = 0.0
    enodes_loaded: int = 0

    @property
    def saturated(self) -> bool:
        return all(p.stop == "saturated" for p in self.phases)

    @property
    def limits_hit(self) -> list[str]:
        return [f"{p.ruleset}: {p.stop}" for p in self.phases if p.stop != "saturated"]

    def matches(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.phases:
            for k, v in p.matches.items():
                out[k] = out.get(k, 0) + v
        return out

    def table(self, where: dict[str, str] | None = None) -> str:
        lines = [f"loaded {self.enodes_loaded} e-nodes in {1e3 * self.load_seconds:.1f} ms"]
        for p in self.phases:
            lines.append(f"phase {p.ruleset}: {p.iterations} iteration(s), {p.stop}, "
                         f"{p.enodes} e-nodes, {1e3 * p.seconds:.1f} ms")
            for name, n in sorted(p.matches.items(), key=lambda kv: -kv[1]):
                src = f"  ({where[name]})" if where and name in where else ""
                lines.append(f"  {n:6d} matches  {name}{src}")
        if not self.saturated:
            lines.append("LIMIT HIT: " + "; ".join(self.limits_hit))
        return "\n".join(lines)


class EGraphSession:
    def __init__(self, module: Module, limits: Limits | None = None, clock=time.perf_counter):
        self.limits = limits or Limits()
        self.clock = clock          # what the time limit is measured with
        self.eg = bindings.EGraph()
        self.rulesets: dict[str, CompiledRuleset] = {}
        self.report = SaturationReport()
        t0 = time.perf_counter()
        self._run(schema().declarations())
        self.encoded: Encoded = encode(module)
        self._load(self.encoded.program)
        self._run("(run-schedule (saturate (run analysis)))")
        self.report.load_seconds = time.perf_counter() - t0
        self.report.enodes_loaded = self.enodes()
        flat = self.encoded.module
        self.input_types = {p.name: p.type for p in flat.main.params}
        self.constants = {n.index: n for n in post_order(flat.main.body)
                          if isinstance(n, Constant)}
        self._lets = 0
        self._demanded = 0

    def _load(self, program: str, chunk: int = LOAD_CHUNK) -> None:
        """Run a long program of top-level commands a chunk of lines at a time: egglog's
        memory and time for one call grow faster than linearly with its length (a 2,000-op
        program in one call took 7.8 GB and 33 s; in chunks of 200 lines it takes a few
        hundred MB)."""
        lines = program.splitlines()
        for i in range(0, len(lines), chunk):
            self._run("\n".join(lines[i:i + chunk]))

    def _run(self, text: str):
        try:
            return self.eg.run_program(*self.eg.parse_program(text))
        except bindings.EggSmolError as e:  # a bug of ours, not the user's: say so plainly
            raise EqquantError(f"egglog rejected a generated program: {e}") from None

    def add_ruleset(self, rs: RuleSet) -> CompiledRuleset:
        if rs.name in self.rulesets:
            return self.rulesets[rs.name]
        compiled = compile_ruleset(rs)
        self._run(compiled.text)
        self.rulesets[rs.name] = compiled
        return compiled

    def rule_locations(self) -> dict[str, str]:
        return {r.name: str(r.rule.loc) for c in self.rulesets.values() for r in c.rules}

    def sizes(self) -> dict[str, int]:
        out = self._run("(print-size)")
        return dict(out[0].sizes if hasattr(out[0], "sizes") else out[0][0])

    def enodes(self) -> int:
        return sum(n for name, n in self.sizes().items()
                   if name.startswith("@") or name in LEAVES)

    def view(self) -> EGraphView:
        data = json.loads(self.eg.serialize([]).to_json())
        const_types = {i: c.type for i, c in self.constants.items()}
        return EGraphView(data, self.input_types, const_types)

    def write_types(self) -> int:
        """Write the type facts of the classes guards asked about (``need-types``)."""
        demanded = self.sizes().get("need-types", 0)
        if demanded == self._demanded:
            return 0  # nothing new was asked for
        self._demanded = demanded
        v = self.view()
        wanted = [c for c in v.demanded if c not in v.has_types and c in v.types]
        if not wanted:
            return 0
        names = dict(v.lets)
        lines: list[str] = []
        for c in wanted:
            stack = [c]
            while stack:  # name the class (and, first, its unnamed operands) with lets
                top = stack[-1]
                if top in names:
                    stack.pop()
                    continue
                node = next((n for n in v.classes[top] if n.node_id not in v.bad), None)
                if node is None:
                    break
                missing = [k for k in node.children if k not in names]
                if missing:
                    stack.extend(missing)
                    continue
                self._lets += 1
                names[top] = f"$t{self._lets}"
                lines.append(f"(let {names[top]} {_term(node, names)})")
                stack.pop()
            if c in names:
                lines += type_facts(names[c], v.types[c])
        if lines:
            self._load("\n".join(lines))
        return len(lines)

    def run(self, phases: list[Phase]) -> SaturationReport:
        unknown = [p.ruleset for p in phases if p.ruleset not in self.rulesets]
        if unknown:
            raise EqquantError(f"the schedule names ruleset(s) not loaded: {', '.join(unknown)} "
                               f"(loaded: {', '.join(self.rulesets) or 'none'})")
        start = self.clock()
        for phase in phases:
            rs = self.rulesets[phase.ruleset]
            rep = PhaseReport(phase.ruleset, matches={r.name: 0 for r in rs.rules})
            t0 = self.clock()
            limit = phase.iterations or self.limits.iterations
            rep.stop = "iteration limit"
            if rs.needs_types:
                self._run(f"(run-schedule (saturate (run {rs.demand_ruleset})))")
                self.write_types()
            before, growth, last = self.enodes(), 1.0, 0.0
            while rep.iterations < limit:
                # egglog cannot be stopped inside an iteration, so an iteration is not begun
                # when the last one's growth says it would end past a limit: both limits
                # then hold to within what one iteration's growth can be predicted
                elapsed = self.clock() - start
                if elapsed > self.limits.seconds or \
                        elapsed + last * max(growth, 1.0) > self.limits.seconds:
                    rep.stop = "time limit"
                    break
                if rep.iterations and before * growth > self.limits.nodes:
                    rep.stop = "node limit"
                    break
                t_iter = self.clock()
                out = self._run(f"(run {rs.egg_name} 1)")
                rep.iterations += 1
                run_report = out[-1].report
                for name, n in run_report.num_matches_per_rule.items():
                    rep.matches[name] = rep.matches.get(name, 0) + n
                self._run("(run-schedule (saturate (run analysis)))")
                new_facts = 0
                if rs.needs_types:
                    self._run(f"(run-schedule (saturate (run {rs.demand_ruleset})))")
                    new_facts = self.write_types()
                rep.enodes = self.enodes()
                growth = rep.enodes / max(before, 1)
                before, last = rep.enodes, self.clock() - t_iter
                if not run_report.updated and not new_facts:
                    rep.stop = "saturated"
                    break
                if rep.enodes > self.limits.nodes:
                    rep.stop = "node limit"
                    break
            rep.seconds = self.clock() - t0
            rep.enodes = rep.enodes or self.enodes()
            self.report.phases.append(rep)
        return self.report


def _term(node, names: dict[str, str]) -> str | None:
    """An egglog term for a serialized node whose children are named."""
    if node.kind == "Input":
        return f"(Input {egg_string(node.value)})"
    if node.kind == "Const":
        return f"(Const {node.value})"
    if node.kind == "Scalar":
        return f"(Scalar {egg_string(node.value[0])} {egg_string(node.value[1])})"
    kids = [names[c] for c in node.children]
    if node.kind == "GetItem":
        return f"(GetItem {kids[0]} {node.value})"
    if node.kind == "MkTuple":
        return f"(MkTuple {list_term(kids)})"
    attrs = [encode_attr(a, node.attrs[a.name]) for a in node.op.attrs]
    return f"({egg_name(node.op)} {' '.join(kids + attrs)})"

