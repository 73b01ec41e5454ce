"""Command-line helpers both studies use: comma-separated lists of flags, and the rounding check's file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from ..rundir.files import ROUNDING_NAME


def floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated numbers, got {text!r}") from None
    if not vals:
        raise ValueError(f"{flag} must list at least one number")
    return vals


def ints(text: str, flag: str, n: Optional[int] = None) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not vals or (n is not None and len(vals) != n):
        raise ValueError(f"{flag} must list {n or 'at least one'} integer(s), got {text!r}")
    return vals


def write_rounding(out: str | Path, check: dict[str, Any], text: str) -> Path:
    """The rounding check's result: OUT/rounding.json written atomically, its text and the file's name printed."""
    from ..fileio import atomic_write
    path = Path(out) / ROUNDING_NAME
    atomic_write(path, json.dumps(check, indent=1) + "\n")
    print(text)
    print(f"wrote {path}")
    return path
