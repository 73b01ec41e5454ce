"""Attention maps on one needle haystack (paper Fig. 1): where each model's answering query looks.

One multi-needle haystack (``needles.py``; target needle at ``--depth``, default the middle) is built with the
tokenizer that all models share, and every model (baseline, DIFF V1, DIFF V2 given by repeated ``--run``) reads
the same tokens. For each model we take the attention row of the answering query -- the last prompt token, which
predicts the answer (``EncodedHaystack.query_pos``) -- over every key it can see, averaged over heads and, by
default, over layers (``--layer N`` picks one layer; negative counts from the last). For DIFF V1 and V2 the row is
the differential map ``A1 - lambda * A2`` that multiplies the values (it may be negative and sums to 1 - lambda);
for the baseline the softmax map, as in ``noise.py``.

The *normalised attention score* of a key is its entry divided by the row's total absolute mass, so rows of the
softmax map (sum 1) and of a differential map (sum 1 - lambda) compare on one scale; the answer score is the sum
of the normalised scores over the target needle's sentence (the shaded span of the figure). Uniform attention
over all visible keys would give the answer span its share of the keys, printed beside it.

``--out FILE.png`` writes the figure (one strip per model, target span shaded, questions greyed) and the result
as JSON beside it (``FILE.json``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..model import variants
from .loading import EvalModel, model_device
from .needles import NeedleTask, TaskChoice, build_haystack, filler_sentences
from .noise import key_masks, span_masses
from .plotting import pyplot
from .spec import AnalysisSpec

DEFAULT_DEPTH = 0.5


@dataclass(frozen=True)
class AttnmapSettings:
    layer: Optional[int] = None  # one layer (negative: from the last); None: the mean over layers
    length: Optional[int] = None  # haystack tokens; None: the shortest training length of the models
    depth: float = DEFAULT_DEPTH  # target needle depth in [0, 1]
    task: TaskChoice = field(default_factory=TaskChoice)  # resolved against the first model


QUICK = FULL = AttnmapSettings()  # one haystack either way: the report's --full changes nothing here


def check_shared_tokenizer(evs: Sequence[EvalModel]) -> None:
    """All models must read the same token ids: one haystack is encoded once for every model."""
    if not evs:
        raise ValueError("attnmap needs at least one --run")
    ref = evs[0].tokenizer.to_str()
    for ev in evs[1:]:
        if ev.tokenizer.to_str() != ref:
            raise ValueError(f"--run {ev.source} has a different tokenizer from --run {evs[0].source}; attnmap "
                             "shows all models on one haystack, so they must share one tokenizer "
                             "(train them on the same data)")


def _unique_labels(evs: Sequence[EvalModel]) -> list[str]:
    labels = [ev.label for ev in evs]
    if len(set(labels)) < len(labels):
        labels = [f"{ev.label} ({ev.source.name})" for ev in evs]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} #{i}" for i, lab in enumerate(labels)]
    return labels


def _check_layer(layer: Optional[int], evs: Sequence[EvalModel]) -> None:
    for ev in evs:
        n = ev.model.cfg.n_layers
        if layer is not None and not -n <= layer < n:
            raise ValueError(f"--layer {layer} is out of range for --run {ev.source} ({n} layers: use 0..{n - 1} "
                             "or a negative index)")


def _token_texts(tok, text: str, n: int) -> list[str]:
    """The first ``n`` tokens of ``text`` as the characters they cover (offsets: no broken UTF-8)."""
    enc = tok.encode(text)
    return [text[s:e] for s, e in enc.offsets[:n]]


@torch.no_grad()
def model_row(ev: EvalModel, ids: Sequence[int], query_pos: int) -> tuple[torch.Tensor, int]:
    """Head-averaged attention rows of ``query_pos`` over keys 0..query_pos, per layer: ((n_layers, K) float64,
    the model's greedy next token at ``query_pos``)."""
    x = torch.tensor([list(ids[:query_pos + 1])], dtype=torch.long, device=model_device(ev.model))
    out = ev.model(x, return_maps=True)
    rows = torch.stack([m.attn[0, :, query_pos, :query_pos + 1].to(torch.float64).mean(0) for m in out.maps])
    return rows.cpu(), int(out.logits[0, query_pos].argmax())


def run_attnmap(evs: Sequence[EvalModel], seed: int = 0, layer: Optional[int] = None, length: Optional[int] = None,
                *, task: Optional[NeedleTask] = None, depth: float = DEFAULT_DEPTH) -> dict[str, Any]:
    """The answering query's attention row per model on one shared haystack.

    ``layer`` None averages the head-averaged rows over all layers, an int picks one layer (negative: from the
    last). ``length`` (tokens, default the shortest training length of the models) bounds the haystack; ``task``
    defaults to the first model's (its run's retrieval mixture, else 4 needles / 2 questions / 2 digits).
    """
    evs = list(evs)
    check_shared_tokenizer(evs)
    _check_layer(layer, evs)
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"--depth must be in [0, 1], got {depth}")
    cap = min(ev.model.cfg.max_seq_len for ev in evs)
    if length is not None and not 1 <= length <= cap:
        raise ValueError(f"--length {length} must be in [1, {cap}] (the smallest max_seq_len of the models)")
    L = length or min(min(ev.train_len for ev in evs), cap)
    first = evs[0]
    task = task or NeedleTask.for_model(first)
    filler, note = filler_sentences(first)
    e = build_haystack(first, filler, task, L, depth, random.Random(f"attnmap-{seed}"))
    q = e.query_pos
    if q + 1 > cap:
        raise ValueError(f"the haystack's prompt has {q + 1} tokens, more than max_seq_len {cap}; use a shorter "
                         "--length or fewer --needles/--queries")
    K = q + 1  # keys visible to the answering query
    a_mask, n_mask = key_masks(e, K)
    t0, t1 = e.target
    tok = first.tokenizer
    maps = []
    for ev, label in zip(evs, _unique_labels(evs)):
        per_layer, pred = model_row(ev, e.ids, q)  # (n_layers, K)
        row = per_layer.mean(0) if layer is None else per_layer[layer]
        ans, noise = span_masses(row, a_mask, n_mask)
        total = float(row.abs().sum()) or 1.0
        la, _ = span_masses(per_layer, a_mask, n_mask)
        lt = per_layer.abs().sum(-1).clamp_min(torch.finfo(torch.float64).tiny)
        maps.append({
            "label": label, "attention": ev.attention,
            "map": "differential map A1 - lambda*A2" if variants.variant(ev.attention).differential else "softmax map",
            "row": row.tolist(), "normalized_row": (row / total).tolist(),
            "answer_mass": float(ans), "noise_mass": float(noise),
            "answer_score": float(ans) / total, "noise_score": float(noise) / total,
            "answer_score_per_layer": (la / lt).tolist(),
            "predicted": tok.decode([pred]), "first_answer_token_right": pred == e.ids[e.answer_start],
        })
    h = e.haystack
    return {"analysis": "attnmap", "models": [ev.describe() for ev in evs], "task": task.to_dict(),
            "held_out": note, "seed": seed, "length": L, "depth": depth,
            "layer": "mean" if layer is None else layer,
            "averaging": "mean over heads, " + ("mean over layers" if layer is None else f"layer {layer}"),
            "score": "row / sum |row| over all visible keys, summed over the target needle's sentence",
            "tokens": _token_texts(tok, h.prompt + h.answer, K), "n_keys": K, "query_pos": q,
            "target": [t0, t1], "context_end": e.context_end, "answer": h.answer,
            "target_text": h.prompt[h.target_span[0]:h.target_span[1]],
            "uniform_answer_score": (t1 - t0) / K, "maps": maps}


def format_attnmap(r: dict[str, Any]) -> str:
    t0, t1 = r["target"]
    lines = [f"attention of the answering query (position {r['query_pos']}, {r['n_keys']} keys; {r['averaging']}) "
             f"on one haystack: target {r['target_text']!r} = tokens [{t0}, {t1}), answer {r['answer']!r}",
             f"{'model':<28} {'answer':>8} {'noise':>8} {'answer mass':>12}  top keys"]
    for m in r["maps"]:
        row = m["normalized_row"]
        top = sorted(range(len(row)), key=lambda i: -row[i])[:3]
        keys = ", ".join(f"{i}:{r['tokens'][i]!r}" for i in top)
        lines.append(f"{m['label']:<28} {m['answer_score']:>8.3f} {m['noise_score']:>8.3f} "
                     f"{m['answer_mass']:>12.3f}  {keys}")
    lines.append(f"(normalised scores; uniform attention over the visible keys gives the answer "
                 f"{r['uniform_answer_score']:.3f})")
    return "\n".join(lines)


def _plain(text: str) -> str:
    """Token text safe for matplotlib labels (no mathtext, visible whitespace)."""
    return text.replace("$", r"\$").replace("\n", "\\n")


def _shares(row: Sequence[float], t0: int, t1: int, ce: int) -> tuple[float, float]:
    """The noise analysis's answer and noise shares (``noise.py``) of one row, so that "noise" on the report means
    one thing: the answer span's signed mass and the rest of the context's |mass|, each over the context's |mass|."""
    context = sum(abs(v) for v in row[:ce]) or 1.0
    return sum(row[t0:t1]) / context, (context - sum(abs(v) for v in row[t0:t1])) / context


def plot_attnmap(result: dict[str, Any], path) -> None:
    """One strip per model: the normalised attention score of every key, target span shaded, questions greyed."""
    plt = pyplot()
    maps, K = result["maps"], result["n_keys"]
    t0, t1 = result["target"]
    ce = result["context_end"]
    # 0.12 in per key where each key's token is written under it; a long context has no token labels and fits the
    # report's column (10 in at 110 dpi), so its labels are not shrunk when the page shows it
    width = min(24.0, max(8.0, 0.12 * K)) if K <= 200 else 10.0
    fig, axes = plt.subplots(len(maps), 1, figsize=(width, 2.0 * len(maps) + 1.2),
                             sharex=True, squeeze=False, layout="constrained")
    lo = min(0.0, min(min(m["normalized_row"]) for m in maps))
    hi = max(max(m["normalized_row"]) for m in maps)
    for ax, m in zip(axes[:, 0], maps):
        row = m["normalized_row"]
        ax.bar(range(K), row, width=1.0, zorder=2, color=["tab:red" if v < 0 else "tab:blue" for v in row])
        ax.axvspan(t0 - 0.5, t1 - 0.5, color="tab:orange", alpha=0.3, label="target needle", zorder=0)
        if ce < K:
            ax.axvspan(ce - 0.5, K - 0.5, color="0.6", alpha=0.25, label="questions", zorder=0)
        ax.axhline(0.0, color="k", lw=0.5)
        ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.1 * (hi - lo))
        ax.set_xlim(-0.5, K - 0.5)
        ax.set_ylabel("score", fontsize=10)
        ax.tick_params(axis="y", labelsize=9)
        # short titles: the page shows the figure scaled down; the map and the averaging are in the text output
        answer, noise = _shares(row, t0, t1, ce)
        ax.set_title(_plain(f"{m['label']}: answer share {answer:.2f}, noise share {noise:.2f}"),
                     fontsize=12, loc="left")
    axes[0, 0].legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=9, frameon=False)
    bottom = axes[-1, 0]
    if K <= 200:
        bottom.set_xticks(range(K), [_plain(t) for t in result["tokens"]], rotation=90, fontsize=7)
    bottom.set_xlabel("key (token)", fontsize=10)
    fig.suptitle(_plain(f"answering query's attention (answer {result['answer'].strip()!r}; uniform attention's "
                        f"answer share {(t1 - t0) / ce:.2f})"), fontsize=13)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(evs: Sequence[EvalModel], settings: AttnmapSettings, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """The spec's run: ``evs`` are several models (attnmap is multi-run); ``progress`` is unused (one pass each)."""
    evs = list(evs)
    check_shared_tokenizer(evs)
    return run_attnmap(evs, seed, settings.layer, settings.length, task=settings.task.resolve(evs[0]),
                       depth=settings.depth)


SPEC = AnalysisSpec(
    name="attnmap", title="Attention maps on one needle example", paper="Fig. 1",
    help="attention of the answering query on one haystack, baseline vs DIFF (Fig. 1); --run repeated", doc=__doc__,
    quick=QUICK, full=FULL, run=run, format=format_attnmap, plot=plot_attnmap, multi_run=True)
