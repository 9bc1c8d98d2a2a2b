"""The table a profile prints: each op's time, its calls and share, summed over the program
(``Executor.profile_table``, ``deploy.loader.Library.profile``)."""
from __future__ import annotations

from typing import Mapping


def time_table(rows: Mapping[str, list[float]]) -> str:
    """``rows``: op -> the seconds of each of its steps; the slowest op first."""
    total = sum(sum(v) for v in rows.values())
    lines = [f"{'op':36s} {'calls':>5s} {'ms':>9s} {'share':>6s}"]
    for op, times in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
        t = sum(times)
        lines.append(f"{op:36s} {len(times):5d} {t * 1e3:9.3f} "
                     f"{100 * t / (total or 1.0):5.1f}%")
    lines.append(f"{'total':36s} {'':5s} {total * 1e3:9.3f}")
    return "\n".join(lines)
