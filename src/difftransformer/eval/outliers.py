"""Activation outliers (paper section 3.8, Table 5): the largest |attention logits| and |hidden states|.

On held-out text windows of the training length we collect, over all layers, heads and positions:

* attention logits: the pre-softmax scaled logits ``q k^T / sqrt(d)`` of every softmax map (for DIFF both maps of
  each pair), masked (-inf) entries ignored;
* hidden states: the residual stream after each block (``return_hidden=True``, the embeddings excluded).

and report the k-th largest absolute value for k in 1, 2, 3, 10, 100 and the median, as Table 5 does (paper:
top-1 attention logit 38.8 DIFF vs 318.0 baseline; hidden state 1688 vs 3609 at 3B scale). ``per_sequence``
holds each window's own top-1 of both kinds, for an uncertainty over sequences (``stats.log_mean_se``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .loading import EvalModel, held_out_documents, model_device, text_windows
from .plotting import color, pyplot, save_figure
from .spec import AnalysisSpec

RANKS = (1, 2, 3, 10, 100)
QUICK_SEQS, FULL_SEQS = 4, 16


@dataclass(frozen=True)
class OutliersSettings:
    sequences: int  # held-out windows of the training length


QUICK, FULL = OutliersSettings(QUICK_SEQS), OutliersSettings(FULL_SEQS)


class TopAbs:
    """Streaming k-th largest |x| (k <= max(RANKS)) and an exact median over everything seen, on the device of the
    values it is given (issue 48: a running top made on the CPU met a GPU model's values in ``torch.cat``)."""

    def __init__(self) -> None:
        self.top: Optional[torch.Tensor] = None  # float64, on the values' device; None before the first values
        self.values: list[torch.Tensor] = []

    def add(self, x: torch.Tensor) -> None:
        v = x.detach().abs().flatten().to(torch.float64)
        v = v[torch.isfinite(v)]  # the causal mask's -inf entries are not logits
        if v.numel() == 0:
            return
        best = v.topk(min(max(RANKS), v.numel())).values
        both = best if self.top is None else torch.cat((self.top, best))
        self.top = both.topk(min(max(RANKS), both.numel())).values
        self.values.append(v.to(torch.float32))

    def result(self) -> dict[str, float]:
        if not self.values or self.top is None:
            raise ValueError("no finite values to rank")
        out = {f"top{k}": float(self.top[k - 1]) for k in RANKS if k <= self.top.numel()}
        out["median"] = float(torch.cat(self.values).median())
        return out


def collect(model, windows: torch.Tensor) -> tuple[dict[str, float], dict[str, float], list[float],
                                                 dict[str, list[float]]]:
    """(logit stats, hidden-state stats, top-1 |logit| per layer, top-1 per sequence) over ``windows`` (n, T).

    The last: {"attention_logits": [...], "hidden_states": [...]}, each window's own largest |value| (one number
    per window), so that a spread over sequences -- e.g. the SE of the log maximum -- exists for one seed.
    """
    logits, hidden = TopAbs(), TopAbs()
    per_layer = [0.0] * model.cfg.n_layers
    per_seq: dict[str, list[float]] = {"attention_logits": [], "hidden_states": []}
    device = model_device(model)
    with torch.no_grad():
        for w in windows:
            out = model(w[None].to(device), return_maps=True, return_hidden=True)
            seq_logit = 0.0
            for i, m in enumerate(out.maps):
                logits.add(m.logits)
                finite = m.logits[torch.isfinite(m.logits)]
                top = float(finite.abs().max())
                per_layer[i] = max(per_layer[i], top)
                seq_logit = max(seq_logit, top)
            seq_hidden = 0.0
            for h in out.hidden_states[1:]:
                hidden.add(h)
                seq_hidden = max(seq_hidden, float(h.detach().abs().max()))
            per_seq["attention_logits"].append(seq_logit)
            per_seq["hidden_states"].append(seq_hidden)
    return logits.result(), hidden.result(), per_layer, per_seq


def run_outliers(ev: EvalModel, n_seqs: int = QUICK_SEQS, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    docs, note = held_out_documents(ev)
    windows = text_windows(ev, docs, ev.train_len, n_seqs)[:, :-1]  # (n, T)
    logit_stats, hidden_stats, per_layer, per_seq = collect(ev.model, windows)
    return {"analysis": "outliers", "model": ev.describe(), "held_out": note, "seed": seed,
            "sequences": int(windows.shape[0]), "length": int(windows.shape[1]),
            "attention_logits": logit_stats, "hidden_states": hidden_stats, "top1_logit_per_layer": per_layer,
            "per_sequence": per_seq}


def format_outliers(r: dict[str, Any]) -> str:
    keys = [f"top{k}" for k in RANKS] + ["median"]
    lines = [f"{r['model']['label']}: |activations| over {r['sequences']} windows of {r['length']} tokens",
             f"{'':<18}" + "".join(f"{k:>10}" for k in keys)]
    for name in ("attention_logits", "hidden_states"):
        lines.append(f"{name:<18}" + "".join(f"{r[name].get(k, float('nan')):>10.3f}" for k in keys))
    return "\n".join(lines)


def plot_outliers(results: Sequence[dict[str, Any]], path) -> None:
    """Top-1, top-10 and median |attention logit| and |hidden state|, one bar per model (log scale)."""
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    keys = ["top1", "top10", "median"]
    w = 0.8 / max(1, len(results))
    for i, x in enumerate(results):
        for a, kind in zip(ax, ("attention_logits", "hidden_states")):
            vals = [x[kind].get(k, float("nan")) for k in keys]
            a.bar([j + i * w for j in range(len(keys))], vals, w, color=color(x), label=x["model"]["label"])
    for a, title in zip(ax, ("|attention logits|", "|hidden states|")):
        a.set_xticks([j + 0.4 - w / 2 for j in range(len(keys))], keys)
        a.set(title=title, yscale="log")
    save_figure(fig, ax, path, grid=False)


def run(ev: EvalModel, settings: OutliersSettings, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    return run_outliers(ev, settings.sequences, seed, progress=progress)


SPEC = AnalysisSpec(
    name="outliers", title="Activation outliers", paper="Table 5",
    help="top-1/top-10/median of |attention logits| and |hidden states| (Table 5)", doc=__doc__,
    quick=QUICK, full=FULL, run=run, format=format_outliers, plot=plot_outliers,
    claims=("smaller attention-logit outliers", "smaller hidden-state outliers"))
