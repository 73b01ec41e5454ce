"""Attention noise (paper section 3.4, Table 3): where the query that must answer puts its attention.

On needle haystacks (see ``needles.py``) we read the attention row of the query position -- the last prompt token,
which predicts the answer -- from the eager path (``return_maps=True``), and sum it over two sets of keys:

* the answer span: the tokens of the target needle's sentence;
* the noise: every other token of the context (filler and the other needles), the questions excluded.

For DIFF V1 and V2 the row is the differential map ``A1 - lambda * A2`` that multiplies the values (it may be
negative and need not sum to one); for the baseline the softmax map. Masses are averaged over heads and haystacks
per layer, and over layers for the overall figure. The paper reports 0.27-0.40 (DIFF) vs 0.03-0.09 (baseline) on
the answer and 0.01-0.02 vs 0.49-0.54 on the noise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from tqdm import tqdm

from ..data.tokenizer import EOS
from .loading import EvalModel
from .needles import EncodedHaystack, NeedleTask, TaskChoice, build_haystack, filler_sentences, padded_batch
from .plotting import color, pyplot, save_figure
from .spec import AnalysisSpec

QUICK_SAMPLES, FULL_SAMPLES = 16, 48


@dataclass(frozen=True)
class NoiseSettings:
    samples: int  # needle haystacks to average over
    length: Optional[int] = None  # haystack tokens; None: the training length
    task: TaskChoice = field(default_factory=TaskChoice)


QUICK, FULL = NoiseSettings(QUICK_SAMPLES), NoiseSettings(FULL_SAMPLES)


def span_masses(rows: torch.Tensor, answer: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention mass on the answer keys and on the noise keys.

    rows (..., Tk) attention rows; answer, noise (Tk,) boolean key masks (disjoint). Returns two (...) tensors.
    """
    if answer.shape != noise.shape or answer.shape[-1] != rows.shape[-1]:
        raise ValueError(f"key masks {tuple(answer.shape)}, {tuple(noise.shape)} do not match rows {tuple(rows.shape)}")
    if bool((answer & noise).any()):
        raise ValueError("the answer and noise masks overlap")
    rows = rows.to(torch.float64)
    return (rows * answer).sum(-1), (rows * noise).sum(-1)


def key_masks(e: EncodedHaystack, tk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Tk,) masks of the answer span and of the rest of the context."""
    pos = torch.arange(tk)
    answer = (pos >= e.target[0]) & (pos < e.target[1])
    noise = (pos < e.context_end) & ~answer
    return answer, noise


@torch.no_grad()
def layer_masses(model, items: Sequence[EncodedHaystack], pad_id: int, batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Per haystack and layer, the head-averaged masses: two (n_items, n_layers) tensors."""
    ans_all, noise_all = [], []
    for i in range(0, len(items), batch_size):
        chunk = items[i:i + batch_size]
        out = model(padded_batch(chunk, pad_id), return_maps=True)
        for b, e in enumerate(chunk):
            rows = torch.stack([m.attn[b, :, e.query_pos, :] for m in out.maps])  # (L, heads, Tk)
            a_mask, n_mask = key_masks(e, rows.shape[-1])
            a, n = span_masses(rows, a_mask, n_mask)  # (L, heads)
            ans_all.append(a.mean(-1))
            noise_all.append(n.mean(-1))
    return torch.stack(ans_all), torch.stack(noise_all)


def run_noise(ev: EvalModel, samples: int = QUICK_SAMPLES, seed: int = 0, task: Optional[NeedleTask] = None,
              length: Optional[int] = None, progress: bool = True) -> dict[str, Any]:
    task = task or NeedleTask.for_model(ev)
    filler, note = filler_sentences(ev)
    L = min(length or ev.train_len, ev.model.cfg.max_seq_len)
    rng = random.Random(f"noise-{seed}")
    items = [build_haystack(ev, filler, task, L, rng.random(), rng)
             for _ in tqdm(range(samples), desc=f"noise {ev.label}", disable=not progress, leave=False)]
    ans, noise = layer_masses(ev.model, items, ev.tokenizer.token_to_id(EOS))  # (n, L)
    per_layer_a, per_layer_n = ans.mean(0), noise.mean(0)
    overall_a, overall_n = ans.mean(1), noise.mean(1)  # (n,): one number per haystack, averaged over layers
    return {"analysis": "noise", "model": ev.describe(), "task": task.to_dict(), "held_out": note, "seed": seed,
            "samples": samples, "length": L,
            "answer_per_layer": per_layer_a.tolist(), "noise_per_layer": per_layer_n.tolist(),
            "answer": float(overall_a.mean()), "noise": float(overall_n.mean()),
            "answer_sem": float(overall_a.std() / len(items) ** 0.5) if len(items) > 1 else 0.0,
            "noise_sem": float(overall_n.std() / len(items) ** 0.5) if len(items) > 1 else 0.0,
            "noise_to_answer": float(overall_n.mean() / overall_a.mean()) if float(overall_a.mean()) else None,
            "map": "differential map A1 - lambda*A2" if ev.attention != "baseline" else "softmax map",
            "uniform_answer_share": float(sum((e.target[1] - e.target[0]) / e.context_end for e in items) / len(items))}


def format_noise(r: dict[str, Any]) -> str:
    lines = [f"{r['model']['label']}: attention at the answering query ({r['map']}), {r['samples']} haystacks "
             f"of <= {r['length']} tokens",
             "layer   answer    noise"]
    for i, (a, n) in enumerate(zip(r["answer_per_layer"], r["noise_per_layer"])):
        lines.append(f"{i:>5} {a:>8.3f} {n:>8.3f}")
    lines.append(f"  all {r['answer']:>8.3f} {r['noise']:>8.3f}   (uniform attention over the context would give "
                 f"{r['uniform_answer_share']:.3f} to the answer)")
    return "\n".join(lines)


def plot_noise(results: Sequence[dict[str, Any]], path) -> None:
    """Answer and noise mass per layer, one line per model."""
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    for x in results:
        layers = range(len(x["answer_per_layer"]))
        ax[0].plot(layers, x["answer_per_layer"], marker="o", color=color(x), label=x["model"]["label"])
        ax[1].plot(layers, x["noise_per_layer"], marker="o", color=color(x), label=x["model"]["label"])
    ax[0].set(title="attention on the answer span", xlabel="layer")
    ax[1].set(title="attention on the rest of the context (noise)", xlabel="layer")
    save_figure(fig, ax, path)


def run(ev: EvalModel, settings: NoiseSettings, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    return run_noise(ev, settings.samples, seed, settings.task.resolve(ev), settings.length, progress=progress)


SPEC = AnalysisSpec(
    name="noise", title="Attention noise", paper="Table 3",
    help="attention mass on the answer span vs the rest of the context, per layer (Table 3)", doc=__doc__,
    quick=QUICK, full=FULL, run=run, format=format_noise, plot=plot_noise,
    claims=("more attention on the answer span", "less attention noise"))
