"""The tables ``eqquant run`` prints: a profile's, each op's time, its calls and share, summed
over the program (``Executor.profile_table``, ``deploy.loader.Library.profile``); and the
kernel plan's, what runs each op (``Executor.kernel_plan``, a saved library's plan)."""
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


def plan_table(rows: list[dict]) -> str:
    """The kernel plan (``Executor.kernel_plan``'s rows), a line per op in order."""
    lines = [f"{'step':>4s}  {'op':26s} {'kernel':38s} {'path':11s} {'layout':7s} "
             f"{'dtypes':18s} {'threads':>7s}"]
    for r in rows:
        lines.append(f"{r['step']:4d}  {r['op']:26s} {', '.join(r['kernels']):38s} "
                     f"{r['path'] or '-':11s} {r['layout'] or '-':7s} {r['dtypes']:18s} "
                     f"{r['threads']:7d}")
    return "\n".join(lines)
