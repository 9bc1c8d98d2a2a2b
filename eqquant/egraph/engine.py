"""Saturation: a program in an egglog e-graph, rulesets run phase by phase under limits.

    session = EGraphSession(module)
    session.add_ruleset(compile_ruleset(load_rules("bn_fold")))
    report = session.run(parse_schedule("simplify; bn_fold; simplify"))
    print(report.table())      # per-rule matches, e-graph size, why each phase stopped

A phase runs one ruleset an iteration at a time (then saturates the ``analysis`` rules that
give each new e-node its type and constness, see ``analysis.py``) until it saturates or a
limit stops it: its own iteration count, the e-node limit, or the time limit. A limit that
stops a phase is always in the report. A rewrite that makes two values of different types
equal stops the run with an :class:`~eqquant.errors.IllTypedRewrite` naming the rule.
"""
from __future__ import annotations

import re

import json
import time
from dataclasses import dataclass, field

from egglog import bindings

from ..errors import EqquantError, IllTypedRewrite
from ..core.nodes import Constant, Module, post_order
from . import analysis
from .encode import Encoded, encode
from .schema import LEAVES, schema


# egglog 13 names the temporaries it makes for a rule's or a let's terms by their variable's
# name and a count (egglog issue #1006, fixed after 13.2): "e6" counted to 3 and "e63" counted
# to nothing both give "e63", and a term is then built on the wrong operand (a program whose
# %6 was read three times got %63 for one of them). Names that end in "_" cannot collide that
# way (a name that is another's plus digits would end in a digit), so every variable and
# global egglog is given ends in one.
# (a string literal is passed over whole: a type text holds sizes such as ?n)
_NAME = re.compile(r'("(?:[^"\\]|\\.)*")|(?<![A-Za-z0-9_])([?$][A-Za-z_][A-Za-z0-9_]*)')


def unambiguous_names(text: str) -> str:
    """``text`` with every ``?variable`` and ``$global`` name ending in "_" (string literals
    as they are)."""
    return _NAME.sub(lambda m: m.group(1) or (m.group(2) if m.group(2).endswith("_")
                                              else m.group(2) + "_"), text)


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
        self.rulesets: dict = {}    # name -> rules.compile.CompiledRuleset
        self.report = SaturationReport()
        t0 = time.perf_counter()
        self.module = module
        self.encoded: Encoded = encode(module)
        flat = self.encoded.module
        self.input_types = {p.name: p.type for p in flat.main.params}
        self.constants = {n.index: n for n in post_order(flat.main.body)
                          if isinstance(n, Constant)}
        self.typer = analysis.Typer(self.input_types,
                                    {i: c.type for i, c in self.constants.items()})
        self._egglog(schema().declarations())
        self._egglog(analysis.declarations())
        self._ops_ruled: set[str] = set()   # ops whose analysis rules the e-graph has
        self._pairs_seen: set[tuple[str, str]] = set()   # type-conflict rows looked at
        self._parts_written: set[str] = set()     # type texts whose parts the e-graph has
        self._load(self.encoded.program)
        self._analyse()
        self._check_types(None)
        self.report.load_seconds = time.perf_counter() - t0
        self.report.enodes_loaded = self.enodes()
        self.history: list[str] = []   # the ruleset of each iteration run so far

    def _load(self, program: str, chunk: int = LOAD_CHUNK) -> None:
        """Run a long program of top-level commands a chunk of lines at a time: egglog's
        memory and time for one call grow faster than linearly with its length (a
        program of thousands of ops in one call took gigabytes; in chunks, a few hundred
        MB)."""
        lines = program.splitlines()
        for i in range(0, len(lines), chunk):
            self._run("\n".join(lines[i:i + chunk]))

    def _run(self, text: str):
        """Run egglog ``text``, the analysis rules of each op it calls declared first."""
        new = set(analysis.OP_CALLED.findall(text)) - self._ops_ruled
        if new:
            self._ops_ruled |= new
            self._egglog(analysis.op_declarations(new))
        return self._egglog(text)

    def _egglog(self, text: str):
        analysis.ACTIVE.append(self.typer)   # (the typer egglog's type rules call)
        try:
            return self.eg.run_program(*self.eg.parse_program(unambiguous_names(text)))
        except bindings.EggSmolError as e:  # a bug of ours, not the user's: say so plainly
            raise EqquantError(f"egglog rejected a generated program: {e}") from None
        finally:
            analysis.ACTIVE.pop()

    def add_ruleset(self, compiled):
        """Add a compiled ruleset (``rules.compile.compile_ruleset``: its egglog text, its
        rules with their names and source locations); the e-graph knows nothing of the
        rules language."""
        if compiled.name in self.rulesets:
            return self.rulesets[compiled.name]
        self._run(compiled.text)
        self.rulesets[compiled.name] = compiled
        return compiled

    def rule_locations(self) -> dict[str, str]:
        return {r.name: str(r.rule.loc) for c in self.rulesets.values() for r in c.rules}

    def sizes(self) -> dict[str, int]:
        out = self._run("(print-size)")
        return dict(out[0].sizes if hasattr(out[0], "sizes") else out[0][0])

    def enodes(self) -> int:
        return sum(n for name, n in self.sizes().items()
                   if name.startswith("@") or name in LEAVES)

    def serialized(self) -> dict:
        """The e-graph as egglog serializes it (read by ``extract.view.EGraphView``)."""
        return json.loads(self.eg.serialize([]).to_json())

    def _analyse(self) -> None:
        """Saturate the analyses; whenever the typer met types not seen before, give the
        e-graph their parts (dtype, shape, rank) and saturate again."""
        while True:
            self._run("(run-schedule (saturate (run analysis)))")
            # (the types this e-graph's typer produced: analysis.TYPES holds every type the
            # process has met, thousands in a long session)
            new = [t for t in dict.fromkeys(self.typer.memo.values())
                   if t not in self._parts_written]
            if not new:
                return
            self._parts_written.update(new)
            facts = analysis.parts_facts(new)
            if facts:
                self._run(facts)

    def _new_conflicts(self) -> list[tuple[str, str]]:
        """Pairs of different types found in one class since the last look (``type-conflict``
        rows; a weak scalar beside a rank-0 tensor of its class is not one)."""
        if self.sizes().get("type-conflict", 0) <= len(self._pairs_seen):
            return []
        data = self.serialized()["nodes"]
        out = []
        for n in data.values():
            if n["op"] == "type-conflict":
                a, b = (json.loads(data[k]["op"]) for k in n["children"])
                if (a, b) not in self._pairs_seen:
                    self._pairs_seen.add((a, b))
                    if not analysis.agree(a, b):
                        out.append((a, b))
        return out

    def _check_types(self, ruleset: str | None) -> None:
        """Raise IllTypedRewrite if a merge since the last check joined different types."""
        conflicts = self._new_conflicts()
        if not conflicts:
            return
        (a, b), more = conflicts[0], len({frozenset(p) for p in conflicts}) - 1
        culprit = _culprit(self, ruleset) if ruleset is not None else None
        where = (f"rule '{culprit.name}' ({culprit.rule.loc})" if culprit is not None else
                 f"ruleset '{ruleset}'" if ruleset is not None else "the loaded program")
        raise IllTypedRewrite(
            f"{where} made a value of type {a} equal to one of type {b}"
            + (f" ({more} more such merge(s))" if more else ""),
            None if culprit is None else culprit.rule.loc)

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
                if rs.helper_ruleset:     # maps the rules built unroll to their last cell
                    self._run(f"(run-schedule (saturate (run {rs.helper_ruleset})))")
                rep.iterations += 1
                run_report = out[-1].report
                for name, n in run_report.num_matches_per_rule.items():
                    rep.matches[name] = rep.matches.get(name, 0) + n
                self._analyse()
                self._check_types(phase.ruleset)
                self.history.append(phase.ruleset)
                rep.enodes = self.enodes()
                growth = rep.enodes / max(before, 1)
                before, last = rep.enodes, self.clock() - t_iter
                if not run_report.updated:
                    rep.stop = "saturated"
                    break
                if rep.enodes > self.limits.nodes:
                    rep.stop = "node limit"
                    break
            rep.seconds = self.clock() - t0
            rep.enodes = rep.enodes or self.enodes()
            self.report.phases.append(rep)
        return self.report




def _culprit(session: EGraphSession, ruleset: str):
    """The rule whose union joined two types, found by replaying the session's history up
    to the failing iteration in a fresh e-graph and running that iteration's rules one at a
    time (only ever done on the way to an error)."""
    replay = EGraphSession(session.module, Limits(10 ** 9, 10 ** 9, float("inf")))
    for rs in session.rulesets.values():
        replay.add_ruleset(rs)
    for name in session.history:
        replay._run(f"(run {replay.rulesets[name].egg_name} 1)")
        replay._analyse()
    replay._new_conflicts()
    for i, compiled in enumerate(replay.rulesets[ruleset].rules):
        single = f"{replay.rulesets[ruleset].egg_name}.only{i}"
        text = compiled.text.replace(f":ruleset {replay.rulesets[ruleset].egg_name} ",
                                     f":ruleset {single} ")
        replay._run(f"(ruleset {single})\n{text}\n(run {single} 1)")
        replay._analyse()
        if replay._new_conflicts():
            return compiled
    return None
