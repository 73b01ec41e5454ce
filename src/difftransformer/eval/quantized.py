"""Quantised attention logits (paper section 3.8, Fig. 8): loss and retrieval accuracy at 16, 8, 6 and 4 bits.

Each layer's ``attn.logits_hook`` replaces the pre-softmax logits by their symmetric uniform quantisation:
``round(x / s) * s`` with ``s = max|x| / (2^(b-1) - 1)``, one scale per sequence and head taken over the causally
visible entries. A few huge logits (the outliers of Table 5) make ``s`` coarse for all the others, which is why
the paper expects DIFF, with smaller outliers, to keep its accuracy down to 6 bits and at 4 bits to match a 6-bit
baseline. The hook forces the eager path; the rest of the model runs in float32.
"""

from __future__ import annotations

import argparse
import random
from contextlib import contextmanager
from typing import Any, Optional, Sequence

import torch

from ..data.tokenizer import EOS
from .loading import EvalModel, held_out_documents, load_for_eval, text_windows, write_json
from .needles import NeedleTask, add_task_args, answers_correct, build_haystack, filler_sentences, task_from_args

WIDTHS: tuple[int, ...] = (16, 8, 6, 4)
QUICK = dict(sequences=4, samples=24)
FULL = dict(sequences=16, samples=64)


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
def text_loss(model, windows: torch.Tensor) -> float:
    """Mean next-token loss over ``windows`` (n, T+1), one window at a time (no padding in the scales)."""
    return sum(float(model(w[None, :-1], w[None, 1:]).loss) for w in windows) / len(windows)


def run_quantized(ev: EvalModel, widths: Sequence[int] = WIDTHS, sequences: int = QUICK["sequences"],
                  samples: int = QUICK["samples"], seed: int = 0, task: Optional[NeedleTask] = None,
                  progress: bool = True) -> dict[str, Any]:
    task = task or NeedleTask.for_model(ev)
    docs, note = held_out_documents(ev)
    windows = text_windows(ev, docs, ev.train_len, sequences)
    filler, _ = filler_sentences(ev)
    rng = random.Random(f"quantized-{seed}")
    items = [build_haystack(ev, filler, task, ev.train_len, rng.random(), rng) for _ in range(samples)]
    pad = ev.tokenizer.token_to_id(EOS)
    rows = []
    for bits in [None, *widths]:
        with quantized_attention(ev.model, bits):
            loss = text_loss(ev.model, windows)
            acc = sum(answers_correct(ev.model, items, pad, batch_size=1)) / len(items)
        rows.append({"bits": bits, "loss": loss, "accuracy": acc})
    full = rows[0]
    for r in rows:
        r["loss_increase"] = r["loss"] - full["loss"]
        r["accuracy_drop"] = full["accuracy"] - r["accuracy"]
    return {"analysis": "quantized", "model": ev.describe(), "task": task.to_dict(), "held_out": note, "seed": seed,
            "sequences": int(windows.shape[0]), "length": int(windows.shape[1] - 1), "samples": samples,
            "scheme": "symmetric uniform, one absmax scale per sequence and head", "rows": rows}


def format_quantized(r: dict[str, Any]) -> str:
    t = r["task"]
    lines = [f"{r['model']['label']}: quantised attention logits ({r['scheme']}); accuracy on {r['samples']} "
             f"haystacks (chance {t['chance']:.3g}, random needle {t['random_needle']:.3g})",
             f"{'bits':>6} {'loss':>8} {'+loss':>8} {'accuracy':>9}"]
    for row in r["rows"]:
        b = "full" if row["bits"] is None else str(row["bits"])
        lines.append(f"{b:>6} {row['loss']:>8.4f} {row['loss_increase']:>+8.4f} {row['accuracy']:>9.3f}")
    return "\n".join(lines)


HELP = "attention logits quantised to 16/8/6/4 bits: loss and retrieval accuracy per width (Fig. 8)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bits", default=",".join(map(str, WIDTHS)), help="comma-separated widths in bits")
    p.add_argument("--sequences", type=int, default=QUICK["sequences"], help="held-out windows for the loss")
    p.add_argument("--samples", type=int, default=QUICK["samples"], help="needle haystacks for the accuracy")
    add_task_args(p)


def run_cli(args) -> int:
    try:
        widths = [int(b) for b in args.bits.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--bits must be comma-separated integers, got {args.bits!r}") from None
    for b in widths:
        quantize_logits(b)  # validates
    if args.sequences < 1 or args.samples < 1:
        raise ValueError("--sequences and --samples must be >= 1")
    ev = load_for_eval(args.run)
    r = run_quantized(ev, widths, args.sequences, args.samples, args.seed, task_from_args(ev, args))
    print(format_quantized(r))
    if args.out:
        write_json(r, args.out)
    return 0
