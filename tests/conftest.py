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


def seed_file(prefix: str) -> Path:
    found = sorted(SEEDS.glob(f"{prefix}_*.txt"))
    if not found:
        pytest.fail(f"seed document {prefix}_*.txt not found in {SEEDS}")
    return found[0]


# The tests never read or write the user's kernel-time cache (runtime/measured_cost.py): with
# one, the default cost model would be the measured one, and extractions would depend on
# what this machine timed before. Each pytest process (pytest-xdist's workers too) makes its
# own, and removes it at the end; a script that imports this file as a module (a test's
# subprocess) makes none.
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_TEST_CACHE: list[str] = []


def pytest_configure(config):
    _TEST_CACHE.append(tempfile.mkdtemp(prefix="eqquant-test-cache-"))
    os.environ["EQQUANT_CACHE_DIR"] = _TEST_CACHE[-1]


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
