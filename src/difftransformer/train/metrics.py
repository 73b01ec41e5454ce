"""Metrics to ``RUN_DIR/metrics.jsonl`` (``rundir.MetricsRecord`` lines) and TensorBoard, plus the lambda probe:
each DIFF layer's lambda summary (V1: the learned lambda of eq. 2; V2: the mean sigmoid(lambda)), under the key
its attention variant names (``rundir.LAMBDA_KEYS``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch

from .. import rundir
from ..extras import require_all
from ..model.transformer import Block


def require_tensorboard(quiet: bool = False) -> None:
    """``log.tensorboard = true`` needs the tensorboard package (the ``tensorboard`` extra): one line if missing."""
    require_all(["tensorboard"], "tensorboard", "log.tensorboard", "or set --log.tensorboard false", quiet=quiet)


class MetricsLogger:
    """Appends records to metrics.jsonl and mirrors scalars (and lists, one tag per layer) to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool, resume_step: Optional[int] = None) -> None:
        self.run_dir = Path(run_dir)
        if resume_step is not None:
            # A resumed run drops what a killed run logged after its checkpoint (and a line the kill cut), so
            # the file reads as one run.
            rundir.truncate_metrics_after(self.run_dir, resume_step)
        self.tb = None
        if tensorboard:
            require_tensorboard()
            from torch.utils.tensorboard import SummaryWriter  # imported lazily: slow, and optional

            self.tb = SummaryWriter(str(rundir.tensorboard_dir(self.run_dir)), purge_step=resume_step)

    def log(self, record: rundir.MetricsRecord) -> None:
        rundir.append_metrics(self.run_dir, record)
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
    """Records each DIFF layer's ``attn.lambda_summary(x)`` during one forward (e.g. the first eval batch).

    The summary is computed from the attention input (V2: one small d_model -> H projection per layer), so the
    probe costs almost nothing. Reading it inside the forward (a pre-hook) also works under FSDP2, whose
    parameters are only whole while their block runs.
    """

    def __init__(self, layers: Sequence[Block]) -> None:
        self.values: dict[str, dict[int, float]] = {}
        self.handles = [layer.attn.register_forward_pre_hook(self._hook(i)) for i, layer in enumerate(layers)
                        if layer.attn.lambda_summary_name is not None]

    def _hook(self, i: int):
        def hook(module, args):
            with torch.no_grad():
                v = module.lambda_summary(args[0])
            if v is not None:
                self.values.setdefault(module.lambda_summary_name, {})[i] = v
        return hook

    def result(self) -> dict[str, list[float]]:
        return {name: [per_layer[i] for i in sorted(per_layer)] for name, per_layer in self.values.items()}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
