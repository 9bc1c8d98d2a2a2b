"""No rule in a program that the checker has not passed: every rule ``opt``, ``extract`` and
``quantize`` load is checked with ``rules check``'s sampler before the e-graph sees it.

    verify([load_rules("bn_fold")])     # RuleError at the first rule the checker rejects
    with unchecked():                   # (--unchecked-rules) used as they are, and said so
        ...

A verdict is kept in the cache (``checked/``), under a digest of the rule's canonical text
(``ast.format_rule``: its patterns, guards, options and comment) and of eqquant's source (the
checker, the interpreter and every op's semantics are part of the verdict), so the shipped
rules are checked once per installed version, and a rule a user edits is checked again. Only
a pass is kept; an entry that is not one this module wrote is checked again, never trusted.
Rules still unchecked are checked on several processes where the machine has them.
"""
from __future__ import annotations

import contextvars
import hashlib
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from ..errors import RuleError
from ..resources import cache_dir, cache_write, source_digest
from .ast import Rule, RuleSet, format_rule

PASSED = "eqquant rule check: passed\n"
_UNCHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("unchecked", default=False)
_USED_UNCHECKED: contextvars.ContextVar[tuple] = contextvars.ContextVar("used", default=())


@contextmanager
def unchecked():
    """Rules used inside the block are not checked (``--unchecked-rules``); the names of
    those that had no verdict are collected (``used_unchecked``) for the output to carry."""
    flag = _UNCHECKED.set(True)
    used = _USED_UNCHECKED.set(())
    try:
        yield
    finally:
        _UNCHECKED.reset(flag)
        _USED_UNCHECKED.reset(used)


def used_unchecked() -> tuple[str, ...]:
    """The rules used inside ``unchecked()`` that the checker has not passed (file:line)."""
    return _USED_UNCHECKED.get()


def _entry(rule: Rule, source: str) -> Path:
    """Where the verdict on ``rule`` is kept, by this eqquant (``source``: its digest)."""
    text = f"{source}\n{format_rule(rule)}\n".encode()
    return cache_dir() / "checked" / hashlib.sha256(text).hexdigest()[:40]


def _passed(entry: Path) -> bool:
    return kept_variants(entry) is not None


def kept_variants(entry: Path) -> list[str] | None:
    """The variants of the rule whose pass ``entry`` keeps (an empty list: a pass kept
    without them); None where it keeps no pass this module wrote."""
    try:
        if entry.is_symlink():
            return None
        head, _, rest = entry.read_text().partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    if head + "\n" != PASSED:
        return None
    if not rest:
        return []
    try:
        variants = json.loads(rest)
    except ValueError:
        return None
    ok = isinstance(variants, list) and all(isinstance(v, str) for v in variants)
    return variants if ok else None


def _keep_pass(entry: Path, results: list) -> None:
    """Keep the pass of a rule whose ``results`` (``_check_one``'s) all passed."""
    cache_write(entry, PASSED + json.dumps([v for v, _, _ in results]) + "\n")
    # (unwritable: checked every time)


TRIALS, SEED = 5, 0     # the checker's draw for a rule before use; a kept pass is of it


def checked(rules: list[Rule], trials: int = TRIALS, seed: int = SEED,
            again: bool = False) -> list[tuple[list, bool]]:
    """(``_check_one``'s results, whether they are a kept pass) for each of ``rules``, as
    ``rules check`` reports them: at the draw a rule is checked with before use, a pass
    this eqquant kept with its variants is reported as it was found (the checker draws the
    same instances for the same rule text and source), unless ``again``; the others are
    checked, and their passes kept."""
    source = source_digest()
    entries = [_entry(r, source) for r in rules]
    usual = (trials, seed) == (TRIALS, SEED) and not again
    kept = [kept_variants(e) if usual else None for e in entries]
    todo = [r for r, k in zip(rules, kept) if not k]
    fresh = iter(check_rules(todo, trials, seed))
    out = []
    for rule, entry, k in zip(rules, entries, kept):
        if k:
            out.append(([(v, True, "") for v in k], True))
            continue
        results = next(fresh)
        if (trials, seed) == (TRIALS, SEED) and all(ok for _, ok, _ in results):
            _keep_pass(entry, results)
        out.append((results, False))
    return out


def verify(rulesets: list[RuleSet]) -> None:
    """Check every rule of ``rulesets`` that has no verdict; RuleError (its location and the
    checker's counterexample) at the first the checker rejects. Inside ``unchecked()``:
    nothing is checked, and the rules without a verdict are noted."""
    source = source_digest()
    entries = {id(r): _entry(r, source) for rs in rulesets for r in rs.rules}
    todo = [r for rs in rulesets for r in rs.rules if not _passed(entries[id(r)])]
    if _UNCHECKED.get():
        _USED_UNCHECKED.set(_USED_UNCHECKED.get() + tuple(
            f"{r.name} ({r.loc})" for r in todo))
        return
    rejected = []
    for rule, results in zip(todo, check_rules(todo)):
        failed = [(variant, message) for variant, ok, message in results if not ok]
        if failed:
            rejected.append((rule, *failed[0]))
        else:
            _keep_pass(entries[id(rule)], results)
    if rejected:
        rule, variant, message = rejected[0]
        more = f" ({len(rejected) - 1} more rejected)" if len(rejected) > 1 else ""
        raise RuleError(f"rule {rule.name}{variant} is not what it claims, so it is not used"
                        f"{more} (eqquant rules check shows every case; --unchecked-rules "
                        f"uses it anyway and marks the output):\n      {message}", rule.loc)


def _check_one(rule: Rule, trials: int = TRIALS, seed: int = SEED) -> list[tuple[str, bool, str]]:
    """(variant, passed, the checker's message) of each of ``rule``'s variants."""
    from .check import check_rule_on_samples
    return [(c.variant, c.ok, c.message) for c in check_rule_on_samples(rule, trials, seed)]


def _check_in_file(where: list) -> list | None:
    """``_check_one`` of the rule named ``where[1]`` in the rules file ``where[0]`` (with
    ``where[3:]``'s trials and seed), if it is still the rule whose canonical text is
    ``where[2]``, else None (a helper's work: a rule holds the registry's ops, which do not
    cross processes)."""
    from .loader import load_rules
    path, name, text, trials, seed = where
    found = [r for r in load_rules(path).rules if r.name == name]
    if len(found) != 1 or format_rule(found[0]) != text:
        return None
    return _check_one(found[0], trials, seed)


def check_rules(rules: list[Rule], trials: int = TRIALS, seed: int = SEED) -> list[list]:
    """``_check_one`` of each rule, shared among helper processes where there are several
    CPUs and rules enough (the checker is pure Python: one process checks one rule at a
    time). A helper is a new interpreter running this module (``python -m``), never a copy
    of the caller's: a user's script is not run again. A rule not read from a file, no
    longer as it is there, or whose helper failed, is checked in this process."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    shared = [r for r in rules if r.loc is not None and Path(str(r.loc.file)).is_file()]
    results: dict[int, list] = {}
    if cpus >= 2 and len(shared) >= 4:
        helpers = min(cpus, len(shared))
        parts = [shared[k::helpers] for k in range(helpers)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[2]),
                        os.environ.get("PYTHONPATH", "")) if p)}
        running = []
        for part in parts:
            try:
                child = subprocess.Popen([sys.executable, "-m", "eqquant.rules.trust"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True, env=env)
            except OSError:
                continue                    # (no helper here: checked in this process)
            running.append((part, child, json.dumps(
                [[str(r.loc.file), r.name, format_rule(r), trials, seed] for r in part])))

        def answer(job) -> list:
            part, child, asked = job
            try:
                out, _ = child.communicate(asked)
                return json.loads(out) if child.returncode == 0 else []
            except (OSError, ValueError):
                return []
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(len(running) or 1) as talk:    # (all at once: each waits
            answers = list(talk.map(answer, running))           # on its own pipe)
        for (part, _, _), found in zip(running, answers):
            for r, res in zip(part, found):
                if res is not None:
                    results[id(r)] = [(str(v), bool(ok), str(m)) for v, ok, m in res]
    return [results.get(id(r)) or _check_one(r, trials, seed) for r in rules]


def _helper() -> None:
    """A helper process: the rules named on stdin (a JSON list of [file, name, text, trials,
    seed]), their results on stdout."""
    asked = json.loads(sys.stdin.read())
    print(json.dumps([_check_in_file(where) for where in asked]))


if __name__ == "__main__":
    _helper()
