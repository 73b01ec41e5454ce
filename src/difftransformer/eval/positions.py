"""NLL by position (paper Fig. 4): does the loss keep falling deep into a long context, within and beyond the
training length?

The texts are genuinely long and never trained on (``long_context.long_held_out_texts`` under the run's own data
settings: validation paragraphs that alone are long enough, and runs of consecutive paragraphs after the
``data.max_chars`` cut, joined by EOS as in training). Each of up to ``sequences`` texts is read from its start in
one forward pass of up to ``factor`` x the training length L (clipped to ``max_seq_len``); a text too short for
that is dropped, not padded, so every model of one tokenizer and data setting reads the same documents (``--seed``
does not change them: seeds of one variant pair document by document too).

The claim is judged per model against its *own* early loss (``long_context.context_gains``): mean NLL over
positions [L/2, L) minus the mean over [0, L/8) ("within"), and over [L, 2L) minus the same early mean ("beyond":
RoPE positions never trained), with t-intervals over documents; negative = the model gains from its context. The
result keeps the per-document per-position NLL (``nll_docs``) so that the report can pair models document by
document. The per-position mean, its cumulative average (the curve Fig. 4 plots) and the old tail NLL (last
quarter of the positions, ``tail_nll``) are reported too.

A run trained on the whole embedded corpus (the demo preset) has no untrained long text: the result then holds
``nll_docs: []`` and a ``note`` saying why, and the claim is inconclusive. Positions past the model's
``max_seq_len`` do not exist: the default length is clipped with a note, an explicit ``--length`` beyond it is
refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ..data.tokenizer import eos_id
from ..log import progress_bar
from .loading import DEFAULT_VAL_FRACTION, EvalModel, model_device
from .long_context import context_gains, long_held_out_texts, text_tokens
from .plotting import color, pyplot
from .spec import AnalysisSpec


@dataclass(frozen=True)
class PositionsSettings:
    factor: float  # evaluate up to this multiple of the training length (clipped to max_seq_len)
    sequences: int  # long held-out documents to average over (fewer when fewer exist)
    length: Optional[int] = None  # positions in tokens; overrides factor


QUICK = PositionsSettings(factor=2.0, sequences=8)
FULL = PositionsSettings(factor=2.0, sequences=32)
MIN_DOCS = 2  # an interval over documents needs two of them
TAIL_FRACTION = 0.25  # tail_nll: the last quarter of the positions evaluated


def eval_length(ev: EvalModel, factor: float = 2.0, length: Optional[int] = None) -> tuple[int, Optional[str]]:
    """Positions to evaluate (tokens predicted per window) and a note when the request was clipped.

    ``length`` (tokens) is strict: beyond ``max_seq_len`` it is refused. ``factor`` x the training length is
    clipped to ``max_seq_len`` (the model has no positions past it), with a note saying so.
    """
    cap = ev.model.cfg.max_seq_len
    if length is not None:
        if not 2 <= length <= cap:
            raise ValueError(f"--length {length} must be in [2, {cap}]: the model's max_seq_len is {cap} and it "
                             "refuses RoPE positions past it")
        return int(length), None
    if not factor > 0 or not math.isfinite(factor):
        raise ValueError(f"--factor must be a positive number, got {factor}")
    want = max(2, round(factor * ev.train_len))
    if want > cap:
        return cap, (f"{factor:g} x the training length ({want} tokens) clipped to the model's max_seq_len {cap}: "
                     "the model has no positions past it")
    return want, None


@torch.no_grad()
def token_nll(model, windows: torch.Tensor, batch_size: int = 8, progress: bool = False,
              desc: str = "positions") -> torch.Tensor:
    """Next-token NLL (nats) of every position of every window: (n, T) float64 on the CPU for windows (n, T + 1)
    (one copy from the model's device: the per-position numbers are read one by one)."""
    out = []
    device = model_device(model)
    for i in progress_bar(range(0, len(windows), batch_size), desc=desc, disable=not progress, leave=False):
        w = windows[i:i + batch_size].to(device)
        logits = model(w[:, :-1]).logits.to(torch.float64)
        out.append(F.cross_entropy(logits.transpose(1, 2), w[:, 1:], reduction="none"))
    return torch.cat(out).cpu()


def chars_per_token(ev: EvalModel, sample: Sequence[str]) -> float:
    """Characters per token of the run's tokenizer on ``sample`` (to ask for texts long enough in tokens)."""
    text = "\n".join(sample)
    return max(1.0, len(text) / max(1, len(ev.tokenizer.encode(text).ids)))


def long_documents(ev: EvalModel, length: int, count: int) -> tuple[torch.Tensor, str]:
    """(n, length + 1) token ids: the first ``length + 1`` tokens of up to ``count`` long held-out texts, and a
    note of what they are. ValueError (from ``long_held_out_texts``) when the run has no such text."""
    data = ev.run_config.get("data", {})
    texts_args = dict(val_fraction=data.get("val_fraction", DEFAULT_VAL_FRACTION),
                      max_chars=int(data.get("max_chars", 0) or 0), sources=tuple(data.get("sources", ("kjv",))))
    # ask for texts of ~1.25x the characters that length + 1 tokens take, plenty of them; short ones drop below
    probe = long_held_out_texts(**texts_args, min_chars=200, max_texts=16)
    min_chars = int(1.25 * (length + 1) * chars_per_token(ev, [p for t in probe for p in t.paragraphs]))
    texts = long_held_out_texts(**texts_args, min_chars=min_chars, max_texts=max(2 * count, count + 8))
    eos = eos_id(ev.tokenizer)
    rows: list[list[int]] = []
    kinds: dict[str, int] = {}
    for t in texts:
        ids = text_tokens([e.ids for e in ev.tokenizer.encode_batch(list(t.paragraphs))], eos, length)
        if ids is None:
            continue
        rows.append(ids)
        kinds[t.source] = kinds.get(t.source, 0) + 1
        if len(rows) == count:
            break
    if len(rows) < MIN_DOCS:
        raise ValueError(f"{len(rows)} held-out text(s) reach {length + 1} tokens (asked for >= {min_chars} "
                         f"characters), fewer than the {MIN_DOCS} an interval over documents needs; use a shorter "
                         "--length or --factor, or train with data.max_chars below the corpus size so that the "
                         "books after the cut stay unseen")
    note = (f"{len(rows)} long held-out texts never trained on (" + ", ".join(f"{n} {k}" for k, n in kinds.items())
            + f"), each read from its start for {length} predictions")
    return torch.tensor(rows, dtype=torch.long, device="cpu"), note  # to the model's device in token_nll


def _gains(nll: Sequence[Sequence[float]], train_len: int) -> tuple[Optional[dict], Optional[dict], Optional[str]]:
    """context_gains as {"mean", "low", "high", "n_docs"} dicts (None where not computable) and why not."""
    try:
        g = context_gains(nll, train_len)
    except ValueError as e:
        return None, None, f"no context gain: {e}"
    as_dict = lambda x: None if x is None else dict(zip(("mean", "low", "high", "n_docs"), x))  # noqa: E731
    return as_dict(g["within"]), as_dict(g["beyond"]), None


def run_positions(ev: EvalModel, factor: float = QUICK.factor, sequences: int = QUICK.sequences,
                  seed: int = 0, length: Optional[int] = None, progress: bool = True) -> dict[str, Any]:
    """Per-document per-position NLL over long held-out texts of up to ``factor`` x the training length, and each
    model's gain from context within and beyond the training length. ``seed`` is recorded only: the documents
    are the same for every seed (so that models pair document by document)."""
    if sequences < MIN_DOCS:
        raise ValueError(f"--sequences must be >= {MIN_DOCS} (the interval is over documents), got {sequences}")
    T, clip_note = eval_length(ev, factor, length)
    base = {"analysis": "positions", "model": ev.describe(), "seed": seed, "length": T, "train_len": ev.train_len,
            "max_seq_len": ev.model.cfg.max_seq_len, "factor": factor if length is None else None,
            "measure": "per model: mean NLL over [L/2, L) and over [L, 2L) minus its own mean over [0, L/8), "
                       "L the training length; t-intervals over documents"}
    try:
        docs, held_out = long_documents(ev, T, sequences)
    except ValueError as e:
        return {**base, "held_out": None, "sequences": 0, "nll_docs": [], "within": None, "beyond": None,
                "note": f"no long held-out text, nothing measured: {e}" + (f"; {clip_note}" if clip_note else "")}
    nll = token_nll(ev.model, docs, progress=progress, desc=f"positions {ev.label}")  # (n, T)
    nll_docs = [[round(float(v), 4) for v in row] for row in nll]
    within, beyond, gain_note = _gains(nll_docs, ev.train_len)  # from the stored values: recomputable from them
    per_pos = nll.mean(0)  # (T,)
    cumulative = per_pos.cumsum(0) / torch.arange(1, T + 1, dtype=torch.float64, device=per_pos.device)
    tail_start = T - max(1, round(TAIL_FRACTION * T))  # 0-based index of the first tail position
    per_doc_tail = nll[:, tail_start:].mean(1)  # (n,)
    n = nll.shape[0]
    train = min(ev.train_len, T)
    tail = float(per_doc_tail.mean())
    few = (f"only {n} of the {sequences} requested held-out texts reach {T + 1} tokens (a run on the whole corpus "
           "keeps few long texts unseen; train with data.max_chars below the corpus size for more)"
           if n < sequences else None)
    notes = [x for x in (clip_note, few, gain_note) if x]
    return {**base, "held_out": held_out, "sequences": n, "note": "; ".join(notes) or None,
            "nll_docs": nll_docs,
            "within": within, "beyond": beyond,
            "positions": list(range(1, T + 1)),  # the t-th predicted token, 1-based
            "nll": per_pos.tolist(), "cumulative_nll": cumulative.tolist(),
            "early_nll": float(per_pos[:max(1, ev.train_len // 8)].mean()),
            "within_train_nll": float(per_pos[:train].mean()),
            "beyond_train_nll": float(per_pos[train:].mean()) if T > train else None,
            "tail_start": tail_start + 1, "tail_nll": tail,
            "tail_nll_se": float(per_doc_tail.std() / math.sqrt(n)) if n > 1 else 0.0, "tail_mean_nll": tail}


def _gain_text(g: Optional[dict]) -> str:
    return "n/a" if g is None else f"{g['mean']:+.4f} [{g['low']:+.4f}, {g['high']:+.4f}] over {g['n_docs']} documents"


def format_positions(r: dict[str, Any]) -> str:
    T, L = r["length"], r["train_len"]
    head = f"{r['model']['label']}: NLL by position (training length {L}, max_seq_len {r['max_seq_len']})"
    if not r["nll_docs"]:
        return f"{head}\nnote: {r['note']}"
    lines = [head, f"{r['held_out']}"]
    if r.get("note"):
        lines.append(f"note: {r['note']}")
    marks = sorted({p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, L, T) if p <= T})
    lines.append(f"{'position':>9} {'NLL':>8} {'cum. NLL':>9}")
    for p in marks:
        tag = "  <- training length" if p == L else ""
        lines.append(f"{p:>9} {r['nll'][p - 1]:>8.4f} {r['cumulative_nll'][p - 1]:>9.4f}{tag}")
    lines.append("gain from context (NLL minus the model's own over the first L/8 positions; negative = gains):")
    lines.append(f"  within the training length [L/2, L): {_gain_text(r['within'])}")
    lines.append(f"  beyond it [L, 2L):                   {_gain_text(r['beyond'])}")
    lines.append(f"tail (positions {r['tail_start']}-{T}): mean NLL {r['tail_nll']:.4f} +- {r['tail_nll_se']:.4f}")
    return "\n".join(lines)


def smooth(x: Sequence[float], width: int) -> list[float]:
    """Centred moving average over ``width`` positions (shorter at the ends)."""
    t = torch.tensor(list(x), dtype=torch.float64, device="cpu")  # a list in, a list out: the host's work
    c = torch.cat((torch.zeros(1, dtype=torch.float64, device="cpu"), t.cumsum(0)))
    h = max(0, width // 2)
    lo = torch.clamp(torch.arange(len(t), device="cpu") - h, min=0)
    hi = torch.clamp(torch.arange(len(t), device="cpu") + h + 1, max=len(t))
    return ((c[hi] - c[lo]) / (hi - lo)).tolist()


def plot_positions(results: Sequence[dict[str, Any]], path) -> None:
    """Per-position NLL minus each model's own early loss (mean over the first L/8 positions), smoothed, one line
    per model; dotted vertical lines at the training lengths. Results without long documents are named only."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    missing = []
    for r in results:
        if not r["nll_docs"]:
            missing.append(r["model"]["label"])
            continue
        rel = [v - r["early_nll"] for v in r["nll"]]
        ax.plot(r["positions"], smooth(rel, max(1, r["train_len"] // 16)), lw=1.2, color=color(r),
                label=r["model"]["label"])
    for L in sorted({r["train_len"] for r in results}):
        ax.axvline(L, ls=":", color="k", lw=0.9)
        ax.text(L, 1.0, f" training length {L}", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
    ax.axhline(0.0, color="k", lw=0.6)
    if missing:
        ax.text(0.5, 0.5, "no untrained long text:\n" + ", ".join(missing), transform=ax.transAxes, ha="center",
                va="center", fontsize=9)
    ax.set(xlabel="position (tokens)", ylabel="NLL - own early NLL (nats)",
           title="NLL by position vs each model's first L/8 (Fig. 4)")
    ax.grid(alpha=0.3)
    if len(missing) < len(results):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(ev: EvalModel, settings: PositionsSettings, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    return run_positions(ev, settings.factor, settings.sequences, seed, settings.length, progress=progress)


SPEC = AnalysisSpec(
    name="positions", title="NLL by position", paper="Fig. 4",
    help="NLL by position on long untrained texts up to 2x the training length: each model's gain from context "
         "within and beyond it (Fig. 4)", doc=__doc__,
    quick=QUICK, full=FULL, run=run, format=format_positions, plot=plot_positions,
    claims=("lower NLL within the training length", "lower NLL beyond the training length"))
