"""What both studies write for the report: the protocol's deviations (carried in every results file, so the page
says what changed after results were seen) and the plots' set-up (the package's one matplotlib configuration)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..eval.plotting import pyplot


def __getattr__(name: str) -> Any:
    """``plt``: matplotlib.pyplot with the package's one set-up (Agg), imported on first use only (matplotlib is
    the optional ``[report]`` extra: the lean install imports this module without it)."""
    if name == "plt":
        return pyplot()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def protocol_deviations(path: Path) -> list[str]:
    """The "Deviations" section of a study's PROTOCOL.md at ``path``, one string per bullet (dated, with the
    reason)."""
    if not path.is_file():
        return [f"{path.name} is missing beside the study: its deviations cannot be listed"]
    text = path.read_text().split("## Deviations", 1)[-1]
    bullets = [b.strip() for b in ("\n" + text).split("\n- ")[1:]]
    return [" ".join(b.replace("**", "").split()) for b in bullets]


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    """Lay out, write the PNG and free the figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return Path(path)
