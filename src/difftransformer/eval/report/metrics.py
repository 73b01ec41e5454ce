"""Reading a run's training curves: the one place the report reads ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional


def read_metrics(run_dir: Optional[Path]) -> dict[str, Any]:
    """Training curves of a run's ``metrics.jsonl`` (empty lists for a bare model directory)."""
    out: dict[str, Any] = {"step": [], "loss": [], "grad_norm": [], "val_step": [], "val_loss": [], "lambda": {}}
    p = run_dir / "metrics.jsonl" if run_dir is not None else None
    if p is None or not p.is_file():
        return out
    for line in p.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill: the rest of the file is still good
        if "loss" in rec:
            out["step"].append(rec["step"])
            out["loss"].append(rec["loss"])
            out["grad_norm"].append(rec.get("grad_norm", float("nan")))
        if "val_loss" in rec:
            out["val_step"].append(rec["step"])
            out["val_loss"].append(rec["val_loss"])
            for k in ("lambda_v1", "lambda_v2"):
                if k in rec:
                    out["lambda"] = {"name": k, "step": rec["step"], "values": rec[k]}
    return out
