"""The training section of the report: summary numbers of each run's curves and their figure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..eval.loading import EvalModel
from ..eval.plotting import color, pyplot, save_figure
from ..rundir import read_metrics
from .results import RunResults

TITLE = "Training: loss, validation loss, gradient norm"


def loss_spikes(loss: Sequence[float], skip: int = 0, window: int = 10, factor: float = 1.1) -> list[int]:
    """Indices where the training loss jumps above ``factor`` x the median of the previous ``window`` losses."""
    spikes = []
    for i in range(max(skip, window), len(loss)):
        ref = statistics.median(loss[i - window:i])
        if loss[i] > factor * ref:
            spikes.append(i)
    return spikes


def training_summary(ev: EvalModel) -> dict[str, Any]:
    m: dict[str, Any] = dict(read_metrics(ev.run_dir))  # the curves, and the summary keys added below
    warmup = ev.run_config.get("train", {}).get("warmup_steps", 0)
    every = ev.run_config.get("log", {}).get("every", 1)
    skip = sum(1 for s in m["step"] if s <= warmup)
    gn = [g for g, s in zip(m["grad_norm"], m["step"]) if s > warmup and math.isfinite(g)]
    m["spikes"] = [m["step"][i] for i in loss_spikes(m["loss"], skip)]
    m["log_every"] = every
    m["grad_norm_median"] = statistics.median(gn) if gn else None
    m["grad_norm_max"] = max(gn) if gn else None
    # The peak of each tenth of training after warm-up: one seed's peaks then carry a spread (a log-scale SE).
    k = len(gn) // 10
    m["grad_norm_block_max"] = [max(gn[i * k:(i + 1) * k]) for i in range(10)] if k else []
    m["final_val_loss"] = m["val_loss"][-1] if m["val_loss"] else None
    return m


def plot_training(runs: Sequence[RunResults], path: Path) -> None:
    """Training loss (spikes marked), validation loss and gradient norm per run."""
    plt = pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.6))
    for r in runs:
        t, c = r.training, color(r.attention)
        if not t["step"]:
            continue
        ax[0].plot(t["step"], t["loss"], color=c, lw=0.8, label=r.ev.label)
        sp = set(t["spikes"])
        xs = [s for s in t["step"] if s in sp]
        ax[0].scatter(xs, [loss for s, loss in zip(t["step"], t["loss"]) if s in sp], color=c, marker="^", s=18)
        ax[1].plot(t["val_step"], t["val_loss"], color=c, marker="o", ms=3, label=r.ev.label)
        ax[2].plot(t["step"], t["grad_norm"], color=c, lw=0.8, label=r.ev.label)
    ax[0].set(title="training loss (triangles: spikes)", xlabel="step", ylabel="loss")
    ax[1].set(title="validation loss", xlabel="step")
    ax[2].set(title="gradient norm before clipping", xlabel="step", yscale="log")
    save_figure(fig, ax, path)



def training_table(runs: Sequence[RunResults]) -> list[list[Any]]:
    """Rows of the report's training table (see ``TRAINING_HEADER``)."""
    return [[r.ev.label, r.training["final_val_loss"], len(r.training["spikes"]), r.training["grad_norm_median"],
             r.training["grad_norm_max"], ", ".join(f"{v:.3f}" for v in r.training["lambda"].get("values", []))]
            for r in runs]


TRAINING_HEADER = ["run", "final val loss", "loss spikes", "grad-norm median", "grad-norm max",
                   "learned lambda (last eval)"]
