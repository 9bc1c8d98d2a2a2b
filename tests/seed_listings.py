"""Reading the IR listings out of the seed documents (``tests/data/seeds/*.txt``, copies of
``../shared/seeds/``).

A listing starts at a line beginning ``def @`` and ends at the first line that is a lone ``}``
(inner ``fn`` bodies close with ``} /* ty=... */;``, never a lone brace).
"""
from __future__ import annotations

from pathlib import Path


def listings(path: str | Path) -> list[tuple[int, str]]:
    """(first line number, text) of each ``def @main`` listing in a seed document."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("def @"):
            start = i
            while i < len(lines) and lines[i].strip() != "}":
                i += 1
            out.append((start + 1, "\n".join(lines[start:i + 1]) + "\n"))
        i += 1
    return out
