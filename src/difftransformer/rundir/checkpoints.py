"""A run's checkpoints: listing them, finding the newest complete one (its manifest verifies), and the model
directory to read for a path that is a run or a model directory."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from ..model.pretrained import temp_prefix, verify_manifest
from .files import CHECKPOINTS_DIR, STEP_PREFIX, WEIGHTS_NAME, PathLike, checkpoints_dir

__all__ = ["list_checkpoints", "leftover_temp_checkpoints", "newest_complete_checkpoint", "resolve_checkpoint",
           "run_of_checkpoint"]


def list_checkpoints(run_dir: PathLike) -> list[Path]:
    """Checkpoint directories of a run, oldest first (by step number in the name)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    n = len(STEP_PREFIX)
    steps = [(int(p.name[n:]), p) for p in root.iterdir()
             if p.is_dir() and p.name.startswith(STEP_PREFIX) and p.name[n:].isdigit()]
    return [p for _, p in sorted(steps)]


def leftover_temp_checkpoints(run_dir: PathLike) -> list[Path]:
    """Half-written checkpoint directories a killed run left behind (``model.pretrained.atomic_directory``)."""
    root = checkpoints_dir(run_dir)
    return sorted(root.glob(temp_prefix(f"{STEP_PREFIX}*") + "*")) if root.is_dir() else []


def newest_complete_checkpoint(run_dir: PathLike, check_hashes: bool = True, warn=None) -> Path:
    """The newest checkpoint whose manifest verifies; ``warn(line)`` hears of each newer broken one."""
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise FileNotFoundError(f"{run_dir} holds no checkpoint under {CHECKPOINTS_DIR}/")
    problems = []
    for c in reversed(ckpts):
        why = verify_manifest(c, check_hashes)
        if why is None:
            return c
        problems.append(why)
        if warn is not None:
            warn(f"skipping checkpoint {c.name}: {why}")
    raise FileNotFoundError(f"no complete checkpoint in {checkpoints_dir(run_dir)}: " + "; ".join(problems))


logger = logging.getLogger(__name__)


def _stderr(line: str) -> None:
    logger.warning(line)


def resolve_checkpoint(path: PathLike, check_hashes: bool = True,
                       warn: Optional[Callable[[str], None]] = _stderr) -> Path:
    """A model directory for ``path``: itself if it holds weights, else the newest complete checkpoint of a run.

    A run's broken newer checkpoints are skipped; ``warn`` (stderr by default) hears one line naming them and
    the checkpoint used instead. A model directory given directly is checked when its weights are read."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist")
    if not p.is_dir():
        raise NotADirectoryError(f"{p} is not a directory (expected a run or model directory)")
    if (p / WEIGHTS_NAME).is_file():
        return p
    if not list_checkpoints(p):
        raise FileNotFoundError(f"{p} holds neither {WEIGHTS_NAME} nor any checkpoint under {CHECKPOINTS_DIR}/")
    skipped: list[str] = []
    found = newest_complete_checkpoint(p, check_hashes, warn=skipped.append)
    if skipped and warn is not None:
        warn(f"{'; '.join(skipped)}; using {found} instead")
    return found


def run_of_checkpoint(checkpoint: PathLike) -> Optional[Path]:
    """The run directory holding ``checkpoint`` (``RUN/checkpoints/step_*``), or None for a bare model directory."""
    c = Path(checkpoint)
    if c.parent.name == CHECKPOINTS_DIR and c.name.startswith(STEP_PREFIX):
        return c.parent.parent
    return None
