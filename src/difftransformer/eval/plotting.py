"""Plotting shared by every analysis and the report: one colour per variant and one matplotlib set-up."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..model import variants


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend: the CLI and the report run without a display."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def color(result_or_attention: Any) -> str | None:
    """The variant's colour (one per variant, the same in every figure: ``model/variants.py``), from an attention
    name or a result dict (its ``model.attention``)."""
    if isinstance(result_or_attention, dict):
        return variants.colour(result_or_attention["model"].get("attention"))
    return variants.colour(result_or_attention)


def label(attention: str) -> str:
    """The variant's label in legends and titles (``attention`` itself for a name no variant has)."""
    return variants.label(attention)


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
