"""Per-layer SQNR of a quantized model as a horizontal bar chart.

    fig = sqnr_chart(model.report(), "sqnr.png")     # .png, .svg or .pdf by the suffix
"""
from __future__ import annotations

from pathlib import Path

from ..errors import EqquantError


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")     # no screen needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise EqquantError("drawing charts needs matplotlib: pip install 'eqquant[plot]'") \
            from None
    return plt


def sqnr_chart(report, path: str | Path | None = None):
    """Bars: one per requantized value, in program order, with the output's SQNR as a line.
    Returns the figure; writes it to ``path`` (replaced only when drawing succeeds)."""
    plt = _pyplot()
    names = [n for n, _ in report.layers] or ["(none)"]
    values = [v for _, v in report.layers] or [0.0]
    out = report.output.get("sqnr", float("nan"))
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.22 * len(names)))
    colors = ["#4c72b0" if v >= out else "#dd8452" for v in values]
    ax.barh(range(len(names)), values, color=colors)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(out, color="#c44e52", linestyle="--", linewidth=1,
               label=f"output {out:.1f} dB")
    ax.set_xlabel("SQNR against fp32 (dB)")
    title = "SQNR per layer"
    if report.mode:
        title += f" ({report.mode}, {report.activations} activations)"
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    save_chart(fig, path)
    return fig


def save_chart(fig, path: str | Path | None) -> None:
    """Write ``fig`` to ``path`` (.png, .svg or .pdf by the suffix; replaced only once it is
    drawn), when a path is given."""
    if path is None:
        return
    from ..ir.params import atomic_write
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    if fmt not in ("png", "svg", "pdf"):
        raise EqquantError(f"{path}: charts are written as .png, .svg or .pdf")
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=120))
