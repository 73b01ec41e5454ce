"""Quantised attention logits (paper section 3.8, Fig. 8): loss and retrieval accuracy at 16, 8, 6 and 4 bits.

Each layer's ``attn.logits_hook`` replaces the pre-softmax logits by their symmetric uniform quantisation:
``round(x / s) * s`` with ``s = max|x| / (2^(b-1) - 1)``, one scale per sequence and head taken over the causally
visible entries. A few huge logits (the outliers of Table 5) make ``s`` coarse for all the others, which is why
the paper expects DIFF, with smaller outliers, to keep its accuracy down to 6 bits and at 4 bits to match a 6-bit
baseline. The hook forces the eager path; the rest of the model runs in float32. Each row's ``loss_increase_se`` is
the standard error over the held-out windows of the per-window (quantised - full) loss: the same windows at every
width, so the difference is paired.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..data.tokenizer import eos_id
from .loading import EvalModel, held_out_documents, model_device, text_windows
from .needles import NeedleTask, TaskChoice, answers_correct, build_haystack, filler_sentences
from .plotting import color, pyplot, save_figure
from .spec import AnalysisSpec

WIDTHS: tuple[int, ...] = (16, 8, 6, 4)


@dataclass(frozen=True)
class QuantizedSettings:
    sequences: int  # held-out windows for the loss
    samples: int  # needle haystacks for the accuracy
    widths: tuple[int, ...] = WIDTHS  # bits, each >= 2
    task: TaskChoice = field(default_factory=TaskChoice)


QUICK = QuantizedSettings(sequences=4, samples=24)
FULL = QuantizedSettings(sequences=16, samples=64)


def quantize_logits(bits: int):
    """A logits hook: (B, H, Tq, Tk) -> the same logits on a symmetric ``bits``-bit grid per (B, H)."""
    if bits < 2:
        raise ValueError(f"--bits: {bits} is too few (need >= 2 for a signed grid)")
    levels = 2 ** (bits - 1) - 1

    def hook(logits: torch.Tensor) -> torch.Tensor:
        tq, tk = logits.shape[-2:]
        visible = torch.ones(tq, tk, dtype=torch.bool, device=logits.device).tril(tk - tq)
        amax = logits.masked_fill(~visible, 0.0).abs().amax(dim=(-2, -1), keepdim=True)  # (B, H, 1, 1)
        scale = amax.clamp_min(torch.finfo(logits.dtype).tiny) / levels
        return torch.round(logits / scale) * scale

    return hook


@contextmanager
def quantized_attention(model, bits: Optional[int]):
    """Install the hook on every layer for the duration of the block (None: full precision)."""
    hook = quantize_logits(bits) if bits is not None else None
    for layer in model.layers:
        layer.attn.logits_hook = hook
    try:
        yield model
    finally:
        for layer in model.layers:
            layer.attn.logits_hook = None


@torch.no_grad()
def sequence_losses(model, windows: torch.Tensor) -> list[float]:
    """Mean next-token loss of each of ``windows`` (n, T+1), one window at a time (no padding in the scales)."""
    device = model_device(model)
    return [float(model(w[None, :-1].to(device), w[None, 1:].to(device)).loss) for w in windows]


def text_loss(model, windows: torch.Tensor) -> float:
    """Mean next-token loss over ``windows`` (n, T+1)."""
    losses = sequence_losses(model, windows)
    return sum(losses) / len(losses)


def paired_se(diffs: Sequence[float]) -> float:
    """Standard error of the mean of per-sequence differences (0.0 for fewer than two sequences)."""
    n = len(diffs)
    if n < 2:
        return 0.0
    m = sum(diffs) / n
    return (sum((d - m) ** 2 for d in diffs) / (n - 1) / n) ** 0.5


def run_quantized(ev: EvalModel, widths: Sequence[int] = WIDTHS, sequences: int = QUICK.sequences,
                  samples: int = QUICK.samples, seed: int = 0, task: Optional[NeedleTask] = None,
                  progress: bool = True) -> dict[str, Any]:
    task = task or NeedleTask.for_model(ev)
    docs, note = held_out_documents(ev)
    windows = text_windows(ev, docs, ev.train_len, sequences)
    filler, _ = filler_sentences(ev)
    rng = random.Random(f"quantized-{seed}")
    items = [build_haystack(ev, filler, task, ev.train_len, rng.random(), rng) for _ in range(samples)]
    pad = eos_id(ev.tokenizer)
    rows: list[dict[str, Any]] = []
    for bits in [None, *widths]:
        with quantized_attention(ev.model, bits):
            losses = sequence_losses(ev.model, windows)
            acc = sum(answers_correct(ev.model, items, pad, batch_size=1)) / len(items)
        rows.append({"bits": bits, "loss": sum(losses) / len(losses), "accuracy": acc, "_losses": losses})
    full = rows[0]
    full_losses = full["_losses"]
    for r in rows:
        r["loss_increase"] = r["loss"] - full["loss"]
        # SE over sequences of the per-sequence (quantised - full) loss: the same windows, so paired
        r["loss_increase_se"] = paired_se([q - f for q, f in zip(r.pop("_losses"), full_losses)])
        r["accuracy_drop"] = full["accuracy"] - r["accuracy"]
    return {"analysis": "quantized", "model": ev.describe(), "task": task.to_dict(), "held_out": note, "seed": seed,
            "sequences": int(windows.shape[0]), "length": int(windows.shape[1] - 1), "samples": samples,
            "scheme": "symmetric uniform, one absmax scale per sequence and head", "rows": rows}


def format_quantized(r: dict[str, Any]) -> str:
    t = r["task"]
    lines = [f"{r['model']['label']}: quantised attention logits ({r['scheme']}); accuracy on {r['samples']} "
             f"haystacks (chance {t['chance']:.3g}, random needle {t['random_needle']:.3g})",
             f"{'bits':>6} {'loss':>8} {'+loss':>8} {'+- SE':<9} {'accuracy':>9}"]
    for row in r["rows"]:
        b = "full" if row["bits"] is None else str(row["bits"])
        se = row.get("loss_increase_se")
        se_txt = f"+- {se:.4f}" if se is not None and row["bits"] is not None else ""
        lines.append(f"{b:>6} {row['loss']:>8.4f} {row['loss_increase']:>+8.4f} {se_txt:<9} {row['accuracy']:>9.3f}")
    return "\n".join(lines)


def plot_quantized(results: Sequence[dict[str, Any]], path) -> None:
    """Loss and retrieval accuracy vs bits, one line per model; the random-needle level dashed."""
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    for x in results:
        rows = x["rows"]
        bits = [row["bits"] or 32 for row in rows]
        ax[0].plot(bits, [row["loss"] for row in rows], marker="o", color=color(x), label=x["model"]["label"])
        ax[1].plot(bits, [row["accuracy"] for row in rows], marker="o", color=color(x), label=x["model"]["label"])
    if results:
        t = results[0]["task"]
        ax[1].axhline(t["random_needle"], ls="--", color="k", lw=0.8, label="random needle")
    ax[0].set(title="validation loss vs attention-logit bits (32 = full)", xlabel="bits", xscale="log")
    ax[1].set(title="retrieval accuracy vs bits", xlabel="bits", xscale="log", ylim=(-0.02, 1.02))
    save_figure(fig, ax, path)


def run(ev: EvalModel, settings: QuantizedSettings, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    return run_quantized(ev, settings.widths, settings.sequences, settings.samples, seed, settings.task.resolve(ev),
                         progress=progress)


SPEC = AnalysisSpec(
    name="quantized", title="Quantised attention logits", paper="Fig. 8",
    help="attention logits quantised to 16/8/6/4 bits: loss and retrieval accuracy per width (Fig. 8)", doc=__doc__,
    quick=QUICK, full=FULL, run=run, format=format_quantized, plot=plot_quantized,
    claims=("retrieval kept at 6-bit attention logits", "smaller loss increase at 4-bit attention logits"))
