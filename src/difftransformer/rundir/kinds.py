"""What kind of directory a path is: a training run, one of our model directories, or a Hugging Face one."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from ..fileio import read_json
from ..model.pretrained import is_model_dir
from .files import CONFIG_NAME, PathLike, checkpoints_dir, run_config_path

__all__ = ["DirKind", "DIR_KINDS", "is_run_dir", "dir_kind"]

DirKind = Literal["run", "model", "hf"]
DIR_KINDS: tuple[DirKind, ...] = ("run", "model", "hf")


def is_run_dir(path: PathLike) -> bool:
    """A training run: it has its run_config.json or a checkpoints/ folder."""
    p = Path(path)
    return run_config_path(p).is_file() or checkpoints_dir(p).is_dir()


def dir_kind(path: PathLike) -> Optional[DirKind]:
    """"run", "model" (ours: config.json naming an ``attention``), "hf" (a config.json naming a
    ``model_type``), or None for anything else (missing, a file, an unrelated folder)."""
    p = Path(path)
    if not p.is_dir():
        return None
    if is_run_dir(p):
        return "run"
    if is_model_dir(p):
        return "model"
    try:
        cfg = read_json(p / CONFIG_NAME)
    except (OSError, ValueError):
        return None
    return "hf" if isinstance(cfg, dict) and "model_type" in cfg else None
