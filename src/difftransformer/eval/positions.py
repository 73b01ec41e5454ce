"""NLL by position (paper Fig. 4): how the loss falls (or rises) along a long held-out context.

Windows of held-out text (the run's validation split, retrieval documents dropped; see ``loading.py``) are read in
one forward pass each, up to ``factor`` x the training length. For every position t (1-based: the t-th predicted
token) we average the next-token NLL over the windows, and report the *cumulative average NLL*
``mean(nll[1..t])`` that Fig. 4 plots: a model that keeps using its context keeps it falling; past the training
length, where its RoPE positions were never trained, a model that does not extrapolate turns upwards.

Positions past the model's ``max_seq_len`` do not exist (the model refuses them): the default length is clipped to
``max_seq_len`` with a note in the result, and an explicit ``--length`` beyond it is refused. The claim the report
checks is the mean NLL over the last quarter of the positions evaluated (``tail_nll``, with its standard error over
windows): the paper's DIFF reaches a lower NLL deep into the context than the baseline.

The windows are contiguous slices of the held-out token stream (documents joined by the EOS token, as in
training), so a window may span several documents; the same windows are read by every model of one tokenizer.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .loading import EvalModel, held_out_documents, held_out_tokens
from .plotting import color, pyplot
from .spec import AnalysisSpec


@dataclass(frozen=True)
class PositionsSettings:
    factor: float  # evaluate up to this multiple of the training length (clipped to max_seq_len)
    sequences: int  # held-out windows to average over
    length: Optional[int] = None  # positions in tokens; overrides factor


QUICK = PositionsSettings(factor=2.0, sequences=8)
FULL = PositionsSettings(factor=2.0, sequences=32)
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
    want = max(2, int(round(factor * ev.train_len)))
    if want > cap:
        return cap, (f"{factor:g} x the training length ({want} tokens) clipped to the model's max_seq_len {cap}: "
                     "the model has no positions past it")
    return want, None


def select_windows(stream: torch.Tensor, length: int, count: int, seed: int) -> torch.Tensor:
    """``count`` non-overlapping windows of ``length + 1`` tokens of ``stream``, chosen by ``seed``: (n, length+1)."""
    n_avail = stream.numel() // (length + 1)
    if n_avail < 1:
        raise ValueError(f"held-out text has {stream.numel()} tokens, fewer than one window of {length + 1}; "
                         "use a shorter --length")
    picks = sorted(random.Random(f"positions-{seed}").sample(range(n_avail), min(count, n_avail)))
    return torch.stack([stream[i * (length + 1):(i + 1) * (length + 1)] for i in picks])


@torch.no_grad()
def token_nll(model, windows: torch.Tensor, batch_size: int = 8, progress: bool = False,
              desc: str = "positions") -> torch.Tensor:
    """Next-token NLL (nats) of every position of every window: (n, T) float64 for windows (n, T + 1)."""
    out = []
    for i in tqdm(range(0, len(windows), batch_size), desc=desc, disable=not progress, leave=False):
        w = windows[i:i + batch_size]
        logits = model(w[:, :-1]).logits.to(torch.float64)
        out.append(F.cross_entropy(logits.transpose(1, 2), w[:, 1:], reduction="none"))
    return torch.cat(out)


def run_positions(ev: EvalModel, factor: float = QUICK.factor, sequences: int = QUICK.sequences,
                  seed: int = 0, length: Optional[int] = None, progress: bool = True) -> dict[str, Any]:
    """Per-position and cumulative mean NLL over held-out windows of ``factor`` x the training length."""
    if sequences < 1:
        raise ValueError(f"--sequences must be >= 1, got {sequences}")
    T, clip_note = eval_length(ev, factor, length)
    docs, note = held_out_documents(ev)
    windows = select_windows(held_out_tokens(ev, docs), T, sequences, seed)
    nll = token_nll(ev.model, windows, progress=progress, desc=f"positions {ev.label}")  # (n, T)
    per_pos = nll.mean(0)  # (T,)
    cumulative = per_pos.cumsum(0) / torch.arange(1, T + 1, dtype=torch.float64)
    tail_start = T - max(1, int(round(TAIL_FRACTION * T)))  # 0-based index of the first tail position
    per_window_tail = nll[:, tail_start:].mean(1)  # (n,)
    n = nll.shape[0]
    tail_se = float(per_window_tail.std() / math.sqrt(n)) if n > 1 else 0.0
    train = min(ev.train_len, T)
    tail = float(per_window_tail.mean())
    return {"analysis": "positions", "model": ev.describe(), "held_out": note, "seed": seed,
            "sequences": n, "length": T, "train_len": ev.train_len, "max_seq_len": ev.model.cfg.max_seq_len,
            "factor": factor if length is None else None, "note": clip_note,
            "windows": "contiguous slices of the held-out token stream (documents joined by EOS)",
            "positions": list(range(1, T + 1)),  # the t-th predicted token, 1-based
            "nll": per_pos.tolist(), "cumulative_nll": cumulative.tolist(),
            "within_train_nll": float(per_pos[:train].mean()),
            "beyond_train_nll": float(per_pos[train:].mean()) if T > train else None,
            "tail_start": tail_start + 1, "tail_nll": tail, "tail_nll_se": tail_se,
            "tail_mean_nll": tail}


def format_positions(r: dict[str, Any]) -> str:
    T, L = r["length"], r["train_len"]
    lines = [f"{r['model']['label']}: NLL by position over {r['sequences']} held-out windows of {T} tokens "
             f"(training length {L}, max_seq_len {r['max_seq_len']})"]
    if r.get("note"):
        lines.append(f"note: {r['note']}")
    marks = sorted({p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, L, T) if p <= T})
    lines.append(f"{'position':>9} {'NLL':>8} {'cum. NLL':>9}")
    for p in marks:
        tag = "  <- training length" if p == L else ""
        lines.append(f"{p:>9} {r['nll'][p - 1]:>8.4f} {r['cumulative_nll'][p - 1]:>9.4f}{tag}")
    beyond = r.get("beyond_train_nll")
    lines.append(f"mean NLL within the training length {r['within_train_nll']:.4f}"
                 + (f", beyond it {beyond:.4f}" if beyond is not None else ", nothing evaluated beyond it"))
    lines.append(f"tail (positions {r['tail_start']}-{T}): mean NLL {r['tail_nll']:.4f} +- {r['tail_nll_se']:.4f}")
    return "\n".join(lines)


def plot_positions(results: Sequence[dict[str, Any]], path) -> None:
    """Cumulative average NLL vs position, one line per model; dotted vertical lines at the training lengths."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for r in results:
        ax.plot(r["positions"], r["cumulative_nll"], lw=1.2, color=color(r),
                label=r["model"]["label"])
    for L in sorted({r["train_len"] for r in results}):
        ax.axvline(L, ls=":", color="k", lw=0.9)
        ax.text(L, 1.0, f" training length {L}", transform=ax.get_xaxis_transform(), va="top", fontsize=7)
    ax.set(xlabel="position (tokens)", ylabel="cumulative average NLL (nats)", title="NLL by position (Fig. 4)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(ev: EvalModel, settings: PositionsSettings, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    return run_positions(ev, settings.factor, settings.sequences, seed, settings.length, progress=progress)


SPEC = AnalysisSpec(
    name="positions", title="NLL by position", paper="Fig. 4",
    help="cumulative average NLL along held-out text up to 2x the training length (Fig. 4)", doc=__doc__,
    quick=QUICK, full=FULL, run=run, format=format_positions, plot=plot_positions,
    claims=("lower NLL within the training length", "lower NLL beyond the training length"))
