from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# the seed documents the tests read, copied here so that the tests stand alone;
# tests/test_seed_listings.py keeps them identical to ../shared/seeds/ when that exists
SEEDS = REPO / "tests" / "data" / "seeds"
SHARED_SEEDS = REPO.parent / "shared" / "seeds"


def cli_exit(argv) -> int:
    """Run the eqquant command line in-process; its exit status."""
    from eqquant.cli.main import main
    try:
        main(argv)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def bert_sample(rng, seq: int = 8) -> dict:
    """An input of the zoo's bert_tiny: token IDs, and a mask whose tail is padding."""
    import numpy as np
    mask = np.ones((1, seq), np.int64)
    mask[:, rng.integers(3, seq + 1):] = 0
    return {"input_ids": rng.integers(0, 1000, (1, seq)).astype(np.int64),
            "attention_mask": mask}


def seed_file(prefix: str) -> Path:
    found = sorted(SEEDS.glob(f"{prefix}_*.txt"))
    if not found:
        pytest.fail(f"seed document {prefix}_*.txt not found in {SEEDS}")
    return found[0]


# The tests never read or write the user's kernel-time cache
# (runtime/execution/measured_cost.py): with one, the default cost model would be the measured
# one, and extractions would depend on what this machine timed before. Each pytest process
# (pytest-xdist's workers too) makes its own, and removes it at the end; a script that imports
# this file as a module (a test's subprocess) makes none.
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_TEST_CACHE: list[str] = []


# Every rule is checked before use (rules/trust.py), each verdict kept in the cache. The
# shipped rules are checked once, by the first pytest process (pytest-xdist's controller
# before its workers start), into a folder of the checkout that later runs on the same
# source reuse (a verdict's key holds eqquant's source digest and the rule's text: a stale
# one is never found); each process's cache starts with a copy of those verdicts.
KEPT = REPO / ".eqquant-test-cache"


def _checked() -> Path:
    """The verdicts' folder for this source (one per source digest; the others removed)."""
    from eqquant.resources import source_digest
    return KEPT / source_digest()[:16]


def _shipped_rules_checked() -> None:
    from eqquant.resources import rules_dir
    from eqquant.rules.loader import load_rules
    from eqquant.rules.trust import verify
    here = _checked()
    if KEPT.is_dir():
        for old in KEPT.iterdir():
            if old != here:
                shutil.rmtree(old, ignore_errors=True)
    mine = os.environ["EQQUANT_CACHE_DIR"]
    os.environ["EQQUANT_CACHE_DIR"] = str(here)
    try:
        verify([load_rules(p) for p in sorted(rules_dir().glob("*.rules"))])
    finally:
        os.environ["EQQUANT_CACHE_DIR"] = mine


def seeded_cache(path: str | os.PathLike) -> str:
    """``path`` made a cache holding the shipped rules' verdicts (a test's own cache would
    otherwise check them all again); ``str(path)``."""
    if (_checked() / "checked").is_dir() and not (Path(path) / "checked").exists():
        Path(path).mkdir(mode=0o700, parents=True, exist_ok=True)   # (as eqquant makes it)
        shutil.copytree(_checked() / "checked", Path(path) / "checked")
    return str(path)


def own_cache(monkeypatch, path: str | os.PathLike) -> None:
    """The test's own EQQUANT_CACHE_DIR, ``path``, holding the shipped rules' verdicts."""
    monkeypatch.setenv("EQQUANT_CACHE_DIR", seeded_cache(path))


def pytest_configure(config):
    _TEST_CACHE.append(tempfile.mkdtemp(prefix="eqquant-test-cache-"))
    os.environ["EQQUANT_CACHE_DIR"] = _TEST_CACHE[-1]
    if not hasattr(config, "workerinput"):          # (the controller, or a lone process)
        _shipped_rules_checked()
    seeded_cache(_TEST_CACHE[-1])


def pytest_unconfigure(config):
    while _TEST_CACHE:
        shutil.rmtree(_TEST_CACHE.pop(), ignore_errors=True)


# CI runs a fixed sequence of examples (a red build means a change broke something); a
# developer's run explores new ones each time.

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


settings.register_profile("long", max_examples=20_000, deadline=None)
settings.register_profile("medium", max_examples=5_000, deadline=None)


def pytest_terminal_summary(terminalreporter):
    """How many inputs each fuzzer ran (tests/test_fuzz.py)."""
    from fuzzing import RAN
    if RAN:
        terminalreporter.write_line("fuzz inputs: " + ", ".join(
            f"{name} {n}" for name, n in sorted(RAN.items())))
