from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SEEDS = REPO.parent / "shared" / "seeds"


def seed_file(prefix: str) -> Path:
    found = sorted(SEEDS.glob(f"{prefix}_*.txt"))
    if not found:
        pytest.fail(f"seed document {prefix}_*.txt not found in {SEEDS}")
    return found[0]
