"""Why a rule fired, and why it did not: a rule file's rules matched on a program's saturated
e-graph (``eqquant rules explain FILE --on MODEL``).

    report = explain_rules(module, "my.rules", rule="fuse_dense_relu")
    print(report.text())

The program is loaded into an e-graph and saturated with the float pipeline's rule sets
(``quant.flow.FP32_SCHEDULE``, or the ``schedule`` given), then with FILE's own rule set; then
each of FILE's rules is matched in Python on the result (``extract.matching``): where its left
side matches (guards included: those are the values it rewrote), and, for each value whose op
is the left side's head op, the first part that failed: an operand that is another op, an
attribute of another value, a guard (``guard dtype(?w) == int8 failed: ?w is float32 at
%3``). Every place is named as the program names it (``%12``) with its line:column in MODEL,
and every rule by its file:line:column.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from .core.nodes import Module
from .egraph.engine import EGraphSession, Limits, parse_schedule
from .errors import EqquantError
from .extract.matching import Match, Matcher, Miss
from .extract.naming import namer
from .extract.view import EGraphView
from .ir.params import bind_params
from .rules.ast import Rule, RuleSet
from .rules.compile import compile_ruleset
from .rules.loader import load_rules


@dataclass
class RuleAnswer:
    """One rule (or one direction of a ``<=>`` rule) on the program."""

    name: str
    rule: Rule
    egglog_matches: int             # what egglog counted over the saturation
    hits: list[Match] = field(default_factory=list)
    misses: list[Miss] = field(default_factory=list)


@dataclass
class RulesExplanation:
    file: str
    schedule: str
    answers: list[RuleAnswer]
    name_of: object
    limits_hit: list[str] = field(default_factory=list)

    def text(self, limit: int = 5) -> str:
        lines = [f"rules of {self.file}, on the e-graph saturated with: {self.schedule}"]
        if self.limits_hit:
            lines.append("LIMIT HIT (fewer rewrites than saturation would give): "
                         + "; ".join(self.limits_hit))
        for a in self.answers:
            lines += ["", f"rule {a.name} ({a.rule.loc}): matched {len(a.hits)} value(s) "
                      f"(egglog counted {a.egglog_matches} match(es)); "
                      f"{len(a.misses)} near miss(es)"]
            for h in a.hits[:limit]:
                lines.append(f"  matched at {self.name_of(h.root)}")
            if len(a.hits) > limit:
                lines.append(f"  ... and {len(a.hits) - limit} more")
            for m in a.misses[:limit]:
                lines.append(f"  near miss at {self.name_of(m.root)}: {m.reason}")
            if len(a.misses) > limit:
                lines.append(f"  ... and {len(a.misses) - limit} more near misses")
            if not a.hits and not a.misses:
                lines.append("  the program has no value whose op is the left side's head op")
        return "\n".join(lines)


def explain_rules(module: Module, file: str | Path | RuleSet,
                  params: Mapping[str, np.ndarray] | None = None, rule: str | None = None,
                  schedule: str | None = None, limits: Limits | None = None
                  ) -> RulesExplanation:
    """Where each rule of ``file`` (or only ``rule``) matches on ``module``'s saturated
    e-graph, and why it misses where its head op is. ``schedule`` (default: the float
    pipeline's, then ``file``'s rule set) names the shipped rule sets to saturate with
    first; ``file``'s rule set is always run last."""
    from .quant.flow import FP32_SCHEDULE
    own = file if isinstance(file, RuleSet) else load_rules(file)
    chosen = [r for r in own.rules if rule is None or r.name == rule]
    if not chosen:
        raise EqquantError(f"{own.file} has no rule named '{rule}' (its rules: "
                           f"{', '.join(r.name for r in own.rules)})")
    phases = [p for p in parse_schedule(schedule or FP32_SCHEDULE) if p.ruleset != own.name]
    mod = bind_params(module, params) if params else module
    session = EGraphSession(mod, limits)
    for name in dict.fromkeys(p.ruleset for p in phases):
        session.add_ruleset(compile_ruleset(load_rules(name)))
    compiled = session.add_ruleset(compile_ruleset(own))     # (its rules' egglog names)
    phases += parse_schedule(own.name)
    report = session.run(phases)
    view = EGraphView.of(session)
    name_of = namer(view, session, tuple(module.main.params))
    matcher = Matcher(view, name_of)
    counts = report.matches()
    answers = []
    for r in chosen:
        for reverse in (False, True) if r.bidirectional else (False,):
            hits, misses = matcher.explain(r, reverse)
            name = r.name + ("<-" if reverse else "")
            egg = sum(counts.get(c.name, 0) for c in compiled.rules
                      if c.rule is r and c.name.endswith("<-") == reverse)
            answers.append(RuleAnswer(name, r, egg, hits, misses))
    return RulesExplanation(str(own.file), "; ".join(str(p) for p in phases), answers, name_of,
                            report.limits_hit)

