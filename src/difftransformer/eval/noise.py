"""Attention noise (paper section 3.4, Table 3): where the query that must answer puts its attention.

On needle haystacks (see ``needles.py``) we read the attention row of the query position -- the last prompt token,
which predicts the answer -- from the eager path (``return_maps=True``), and split the context (every key before the
questions) into two sets:

* the answer span: the tokens of the target needle's sentence;
* the noise: every other token of the context (filler and the other needles).

For DIFF V1 and V2 the row is the differential map ``A1 - lambda * A2`` that multiplies the values (it may be
negative); for the baseline the softmax map. A DIFF row sums to ``1 - lambda``, so its raw masses shrink by that
factor even when the model attends no differently (and V1's head-wise norm makes the row's overall scale irrelevant
to its output). The measures are therefore **scale-free shares** (``shares``):

* answer share = (signed mass on the answer span) / (sum of |row| over the context);
* noise share = (sum of |entries| on the rest of the context) / (sum of |row| over the context);

a row multiplied by any c > 0 keeps its shares. The signed raw masses (sum of the row over each set) are reported
beside them. Shares are taken per head, averaged over heads, then per layer and over layers, with standard errors
over haystacks; as in Table 3 they are also given per needle depth (haystacks cycle over ``DEPTHS``). The paper
reports 0.27-0.40 (DIFF) vs 0.03-0.09 (baseline) on the answer and 0.01-0.02 vs 0.49-0.54 on the noise.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..data.tokenizer import eos_id
from ..log import progress_bar
from ..model import variants
from .attention_mass import attention_shares
from .loading import EvalModel, model_device
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
DEPTHS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # target needle depths, haystack i at DEPTHS[i % 5]
MEASURES = ("answer_share", "noise_share", "answer_signed", "noise_signed")


def shares(rows: torch.Tensor, answer_mask: torch.Tensor,
           context_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale-free answer and noise shares of attention rows.

    rows (..., Tk); answer_mask, context_mask (Tk,) boolean, the answer span inside the context. Returns two (...)
    tensors: (sum of rows on the answer span) / (sum of |rows| over the context) and (sum of |rows| on the context
    outside the answer span) / (the same denominator). A row that is zero over the whole context gets 0 and 0.
    Multiplying a row by c > 0 leaves both unchanged.
    """
    if answer_mask.shape != context_mask.shape or answer_mask.shape[-1] != rows.shape[-1]:
        raise ValueError(f"key masks {tuple(answer_mask.shape)}, {tuple(context_mask.shape)} do not match rows "
                         f"{tuple(rows.shape)}")
    # One definition of the measure for the whole package (the retrieval benchmark uses it too); it leaves a row
    # with nothing on the context undefined (NaN), which counts as 0 here so means over haystacks stay defined.
    s = attention_shares(rows, answer_mask, context_mask)
    return s["answer_share"].nan_to_num(0.0), s["noise_share"].nan_to_num(0.0)


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


def key_masks(e: EncodedHaystack, tk: int, device: Optional[torch.device] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(Tk,) masks of the answer span and of the rest of the context, on ``device`` (default the CPU)."""
    pos = torch.arange(tk, device=device)
    answer = (pos >= e.target[0]) & (pos < e.target[1])
    noise = (pos < e.context_end) & ~answer
    return answer, noise


@torch.no_grad()
def layer_measures(model, items: Sequence[EncodedHaystack], pad_id: int,
                   batch_size: int = 8) -> dict[str, torch.Tensor]:
    """Per haystack and layer, the head-averaged ``MEASURES``: {name: (n_items, n_layers) tensor}."""
    out_all: dict[str, list[torch.Tensor]] = {k: [] for k in MEASURES}
    for i in range(0, len(items), batch_size):
        chunk = items[i:i + batch_size]
        out = model(padded_batch(chunk, pad_id, model_device(model)), return_maps=True)
        for b, e in enumerate(chunk):
            rows = torch.stack([m.attn[b, :, e.query_pos, :] for m in out.maps])  # (L, heads, Tk)
            a_mask, n_mask = key_masks(e, rows.shape[-1], rows.device)
            a, n = span_masses(rows, a_mask, n_mask)  # (L, heads)
            sa, sn = shares(rows, a_mask, a_mask | n_mask)
            for k, v in zip(MEASURES, (sa, sn, a, n)):
                out_all[k].append(v.mean(-1))
    return {k: torch.stack(v) for k, v in out_all.items()}


def _sem(x: torch.Tensor) -> float:
    return float(x.std() / len(x) ** 0.5) if len(x) > 1 else 0.0


def summarise(m: dict[str, torch.Tensor], depths: Sequence[float]) -> dict[str, Any]:
    """The result's measures from ``layer_measures``' tensors and each haystack's needle depth."""
    out: dict[str, Any] = {}
    for k, v in m.items():
        overall = v.mean(1)  # (n,): one number per haystack, averaged over layers
        out[k], out[f"{k}_sem"] = float(overall.mean()), _sem(overall)
    n_layers = next(iter(m.values())).shape[1]
    out["per_layer"] = [{key: (float(v[:, i].mean()) if j == 0 else _sem(v[:, i]))
                         for k, v in m.items() for j, key in enumerate((k, f"{k}_sem"))} for i in range(n_layers)]
    d = torch.tensor(list(depths), dtype=torch.float64, device=next(iter(m.values())).device)
    out["per_depth"] = [{"depth": float(depth), "samples": int((d == depth).sum()),
                         "answer_share": float(m["answer_share"][d == depth].mean(1).mean()),
                         "noise_share": float(m["noise_share"][d == depth].mean(1).mean())}
                        for depth in sorted(set(depths))]
    return out


def run_noise(ev: EvalModel, samples: int = QUICK_SAMPLES, seed: int = 0, task: Optional[NeedleTask] = None,
              length: Optional[int] = None, progress: bool = True) -> dict[str, Any]:
    task = task or NeedleTask.for_model(ev)
    filler, note = filler_sentences(ev)
    L = min(length or ev.train_len, ev.model.cfg.max_seq_len)
    rng = random.Random(f"noise-{seed}")
    depths = [DEPTHS[i % len(DEPTHS)] for i in range(samples)]
    items = [build_haystack(ev, filler, task, L, depths[i], rng)
             for i in progress_bar(range(samples), desc=f"noise {ev.label}", disable=not progress, leave=False)]
    s = summarise(layer_measures(ev.model, items, eos_id(ev.tokenizer)), depths)
    a, n = s["answer_share"], s["noise_share"]
    return {"analysis": "noise", "model": ev.describe(), "task": task.to_dict(), "held_out": note, "seed": seed,
            "samples": samples, "length": L, **s,
            "measure": "scale-free shares: answer = signed answer mass / sum|row| over the context, noise = "
                       "sum|row| on the rest of the context / the same; signed raw masses beside them",
            # the old keys, now the scale-free shares
            "answer_per_layer": [x["answer_share"] for x in s["per_layer"]],
            "noise_per_layer": [x["noise_share"] for x in s["per_layer"]],
            "answer": a, "noise": n, "answer_sem": s["answer_share_sem"], "noise_sem": s["noise_share_sem"],
            "noise_to_answer": n / a if a else None,
            "map": "differential map A1 - lambda*A2" if variants.variant(ev.attention).differential else "softmax map",
            "uniform_answer_share": float(sum((e.target[1] - e.target[0]) / e.context_end for e in items) / len(items))}


def format_noise(r: dict[str, Any]) -> str:
    lines = [f"{r['model']['label']}: attention at the answering query ({r['map']}), {r['samples']} haystacks "
             f"of <= {r['length']} tokens",
             "shares are scale-free (answer: signed answer mass / sum|row| over the context; noise: sum|row| on the "
             "rest / the same); signed: the raw masses",
             f"{'layer':>5} {'answer share':>13} {'noise share':>12} {'answer signed':>14} {'noise signed':>13}"]
    for i, x in enumerate(r["per_layer"]):
        lines.append(f"{i:>5} {x['answer_share']:>13.3f} {x['noise_share']:>12.3f} {x['answer_signed']:>14.3f} "
                     f"{x['noise_signed']:>13.3f}")
    lines.append(f"{'all':>5} {r['answer_share']:>13.3f} {r['noise_share']:>12.3f} {r['answer_signed']:>14.3f} "
                 f"{r['noise_signed']:>13.3f}")
    lines.append(f"{'+-SE':>5} {r['answer_share_sem']:>13.3f} {r['noise_share_sem']:>12.3f} "
                 f"{r['answer_signed_sem']:>14.3f} {r['noise_signed_sem']:>13.3f}")
    lines.append(f"(uniform attention over the context would give an answer share of {r['uniform_answer_share']:.3f})")
    lines.append("by needle depth: " + ", ".join(f"{d['depth']:.2f}: answer {d['answer_share']:.3f} / noise "
                                                 f"{d['noise_share']:.3f}" for d in r["per_depth"]))
    return "\n".join(lines)


def plot_noise(results: Sequence[dict[str, Any]], path) -> None:
    """Scale-free answer and noise shares per layer, one line per model (the signed masses are in the text)."""
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    for x in results:
        layers = range(len(x["per_layer"]))
        ax[0].plot(layers, [p["answer_share"] for p in x["per_layer"]], marker="o", color=color(x),
                   label=x["model"]["label"])
        ax[1].plot(layers, [p["noise_share"] for p in x["per_layer"]], marker="o", color=color(x),
                   label=x["model"]["label"])
    if results:
        u = sum(x["uniform_answer_share"] for x in results) / len(results)
        ax[0].axhline(u, ls="--", color="k", lw=0.8, label=f"uniform attention {u:.2f}")
    low = min([0.0] + [p["answer_share"] for x in results for p in x["per_layer"]])
    ax[0].set(title="answer share of |attention| (scale-free)", xlabel="layer", ylim=(low - 0.02, 1.02))
    ax[1].set(title="noise share of |attention| (scale-free)", xlabel="layer", ylim=(-0.02, 1.02))
    from matplotlib.ticker import MaxNLocator

    for a in ax:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    save_figure(fig, ax, path)


def run(ev: EvalModel, settings: NoiseSettings, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    return run_noise(ev, settings.samples, seed, settings.task.resolve(ev), settings.length, progress=progress)


SPEC = AnalysisSpec(
    name="noise", title="Attention noise", paper="Table 3",
    help="scale-free attention shares on the answer span vs the rest of the context, per layer and needle depth "
         "(Table 3)", doc=__doc__,
    quick=QUICK, full=FULL, run=run, format=format_noise, plot=plot_noise,
    claims=("more attention on the answer span", "less attention noise"))
