"""Latency against accuracy for a range of mixed-precision budgets (``eqquant quantize
--pareto`` writes the points).

    fig = pareto_chart(points, "pareto.png")    # points: dicts with cost_ms, sqnr, floats
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from ..errors import EqquantError
from .sqnr import _pyplot, save_chart


def pareto_chart(points: Sequence[Mapping], path: str | Path | None = None):
    """One marker per budget: predicted latency (ms) against measured output SQNR (dB),
    labelled with the number of values left in float. Returns the figure; writes it to
    ``path`` (replaced only when drawing succeeds)."""
    plt = _pyplot()
    if not points:
        raise EqquantError("no points to draw")
    xs = [float(p["sqnr"]) for p in points]
    ys = [float(p["cost_ms"]) for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, ys, marker="o", color="#4c72b0")
    for x, y, p in zip(xs, ys, points):
        ax.annotate(f"{p['floats']} float", (x, y), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel("output SQNR against fp32 (dB, measured)")
    ax.set_ylabel("latency (ms, cost model)")
    ax.set_title("mixed precision: latency against accuracy", fontsize=9)
    fig.tight_layout()
    save_chart(fig, path)
    return fig
