"""The run's configuration file (``run_config.json``, the full ``TrainConfig``): read back as a plain dict, written
atomically."""

from __future__ import annotations

from typing import Optional

from ..fileio import atomic_write, read_json
from .files import PathLike, run_config_path

__all__ = ["read_run_config", "write_run_config"]


def read_run_config(run_dir: Optional[PathLike]) -> dict:
    """The run's configuration as saved (a plain dict), or {} when there is none (a bare model directory)."""
    if run_dir is None:
        return {}
    p = run_config_path(run_dir)
    if not p.is_file():
        return {}
    cfg = read_json(p)
    if not isinstance(cfg, dict):
        raise ValueError(f"{p} must hold a JSON object")
    return cfg


def write_run_config(run_dir: PathLike, config_json: str) -> None:
    """Save the run's configuration (``TrainConfig.to_json()``), atomically."""
    atomic_write(run_config_path(run_dir), config_json.rstrip("\n") + "\n")
