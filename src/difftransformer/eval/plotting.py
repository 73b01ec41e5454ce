"""Plotting shared by every analysis and the report: one colour per variant and one matplotlib set-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

# One colour per attention variant, the same in every figure of the report and of `difftransformer eval`.
COLORS = {"baseline": "#555555", "diff_v1": "#1f77b4", "diff_v2": "#d62728"}


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend: the CLI and the report run without a display."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def color(result_or_attention: Any) -> str | None:
    """The variant's colour, from an attention name or a result dict (its ``model.attention``)."""
    if isinstance(result_or_attention, dict):
        return COLORS.get(result_or_attention["model"].get("attention"))
    return COLORS.get(result_or_attention)


def save_figure(fig, axes: Sequence[Any], path: str | Path, grid: bool = True, dpi: int = 80) -> None:
    """Legends (and a light grid) on every panel, then write the PNG and free the figure."""
    plt = pyplot()
    for a in axes:
        a.legend(fontsize=7)
        if grid:
            a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
