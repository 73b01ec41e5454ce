"""Metrics to ``RUN_DIR/metrics.jsonl`` (one JSON object per line) and TensorBoard (``RUN_DIR/tb``), plus the
lambda probes: DIFF V1's learned lambda per layer (eq. 2) and DIFF V2's mean sigmoid(lambda) per layer."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import torch
from torch import nn

METRICS_NAME = "metrics.jsonl"


class MetricsLogger:
    """Appends records to metrics.jsonl and mirrors scalars (and lists, one tag per layer) to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool, resume_step: Optional[int] = None) -> None:
        self.path = Path(run_dir) / METRICS_NAME
        if resume_step is not None:
            self._truncate_after(resume_step)
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imported lazily: slow, and optional

            self.tb = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=resume_step)

    def _truncate_after(self, step: int) -> None:
        """A resumed run drops what a killed run logged after its checkpoint, so the file reads as one run."""
        if not self.path.is_file():
            return
        keep = [l for l in self.path.read_text().splitlines() if l.strip() and json.loads(l).get("step", 0) <= step]
        self.path.write_text("".join(l + "\n" for l in keep))

    def log(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is None:
            return
        step = record["step"]
        for key, v in record.items():
            if key == "step":
                continue
            if isinstance(v, list):
                for i, x in enumerate(v):
                    self.tb.add_scalar(f"{key}/layer_{i}", x, step)
            elif isinstance(v, (int, float)) and math.isfinite(v):
                self.tb.add_scalar(key, v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


class LambdaProbe:
    """Records each DIFF layer's lambda during one forward (e.g. the first eval batch).

    V1: the learned scalar lambda of eq. (2) (what ``model.lambdas()`` returns). V2: the mean over batch, heads and
    tokens of sigmoid(lambda), recomputed by ``attn.lambda_values(x)`` from the attention input: one small
    (d_model -> H) projection per layer, so the probe costs almost nothing. Reading them inside the forward
    (a pre-hook) also works under FSDP2, whose parameters are only whole while their block runs.
    """

    def __init__(self, layers: nn.ModuleList) -> None:
        self.v1: dict[int, float] = {}
        self.v2: dict[int, float] = {}
        self.handles = [layer.attn.register_forward_pre_hook(self._hook(i)) for i, layer in enumerate(layers)
                        if hasattr(layer.attn, "lambda_full") or hasattr(layer.attn, "lambda_values")]

    def _hook(self, i: int):
        def hook(module, args):
            with torch.no_grad():
                if hasattr(module, "lambda_full"):
                    self.v1[i] = float(module.lambda_full())
                else:
                    lam = module.lambda_values(args[0])
                    if lam is not None:
                        self.v2[i] = float(lam.float().mean())
        return hook

    def result(self) -> dict[str, list[float]]:
        out = {}
        if self.v1:
            out["lambda_v1"] = [self.v1[i] for i in sorted(self.v1)]
        if self.v2:
            out["lambda_v2_mean_sigmoid"] = [self.v2[i] for i in sorted(self.v2)]
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
