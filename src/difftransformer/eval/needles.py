"""Multi-needle retrieval (paper section 3.4, Table 2, Fig. 5): accuracy over context length x needle depth.

Each haystack is held-out filler with N "pass number" needles (``data/synthetic.py``), R-1 answered questions about
the other needles, then the open question about the target needle. The answer is scored exactly: the model's
greedy continuation must reproduce every token of the number, which teacher forcing measures in one forward pass
(all answer tokens are the argmax given the right prefix <=> greedy decoding emits them). Two reference levels
are printed beside every accuracy: chance (a random d-digit number, 10^-d) and the "random needle" level 1/N of a
model that copies some needle's number without finding the right one.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..data.corpus import sentences
from ..data.synthetic import Haystack, needle_haystack, short_sentences
from ..data.tokenizer import eos_id
from ..log import progress_bar
from .loading import EvalModel, held_out_documents, model_device
from .plotting import pyplot
from .spec import AnalysisSpec


@dataclass
class NeedleTask:
    """The document shape: the run's training mixture when it had one (``data.retrieval_*``), else 4/2/2."""

    n_needles: int = 4
    n_queries: int = 2
    digits: int = 2

    @classmethod
    def for_model(cls, ev: EvalModel, **overrides: Optional[int]) -> NeedleTask:
        data = ev.run_config.get("data", {})
        task = cls()
        if data.get("retrieval_share", 0) > 0:
            task = cls(data["retrieval_n_needles"], data["retrieval_n_queries"], data["retrieval_digits"])
        for k, v in overrides.items():
            if v is not None:
                setattr(task, k, v)
        if task.n_needles < 1 or task.n_queries < 1 or task.digits < 1:
            raise ValueError("--needles, --queries and --digits must be >= 1")
        return task

    @property
    def chance(self) -> float:
        return 10.0 ** -self.digits

    @property
    def random_needle(self) -> float:
        return 1.0 / self.n_needles

    def to_dict(self) -> dict[str, Any]:
        return {"n_needles": self.n_needles, "n_queries": self.n_queries, "digits": self.digits,
                "chance": self.chance, "random_needle": self.random_needle}


@dataclass(frozen=True)
class TaskChoice:
    """The haystack shape asked for (None: the run's own, see ``NeedleTask.for_model``)."""

    n_needles: Optional[int] = None
    n_queries: Optional[int] = None
    digits: Optional[int] = None

    def resolve(self, ev: EvalModel) -> NeedleTask:
        return NeedleTask.for_model(ev, n_needles=self.n_needles, n_queries=self.n_queries, digits=self.digits)


@dataclass(frozen=True)
class NeedlesSettings:
    lengths: tuple[float, ...]  # fractions of the training length
    depths: tuple[float, ...]  # target needle depths in [0, 1]
    samples: int  # haystacks per grid cell
    task: TaskChoice = field(default_factory=TaskChoice)


QUICK = NeedlesSettings(lengths=(0.25, 0.5, 1.0), depths=(0.0, 0.5, 1.0), samples=16)
FULL = NeedlesSettings(lengths=(0.25, 0.5, 0.75, 1.0), depths=(0.0, 0.25, 0.5, 0.75, 1.0), samples=40)


@dataclass
class EncodedHaystack:
    """A haystack as token ids (prompt + answer) and the token positions the analyses need."""

    haystack: Haystack
    ids: list[int]
    answer_start: int  # first answer token; the query position (predicting it) is answer_start - 1
    target: tuple[int, int]  # token span [start, end) of the target needle sentence
    context_end: int  # tokens [0, context_end) are the context (filler + needles), before the questions
    needle_first: list[int]  # first token of each needle's answer (`` <digits>``), the target's first
    last_answer_first: Optional[int] = None  # first token of the last answered question's number, if any

    @property
    def query_pos(self) -> int:
        return self.answer_start - 1


def encode_haystack(tok, h: Haystack) -> EncodedHaystack:
    enc = tok.encode(h.prompt + h.answer)
    cut = len(h.prompt)
    offsets = enc.offsets
    answer_start = next(i for i, (s, e) in enumerate(offsets) if e > cut)  # a token reaching into the answer
    t0, t1 = h.target_span
    covering = [i for i, (s, e) in enumerate(offsets) if s < t1 and e > t0]
    context_end = next((i for i, (s, e) in enumerate(offsets) if s >= h.context_end), answer_start)
    firsts = [tok.encode(f" {n.number}").ids[0] for n in [h.target] + [n for n in h.needles if n is not h.target]]
    last = tok.encode(f" {h.answered[-1].number}").ids[0] if h.answered else None
    return EncodedHaystack(h, enc.ids, answer_start, (covering[0], covering[-1] + 1), context_end, firsts, last)


def filler_sentences(ev: EvalModel) -> tuple[list[str], str]:
    docs, note = held_out_documents(ev)
    fill = short_sentences(sentences(docs))
    if len(fill) < 8:
        raise ValueError(f"held-out text ({note}) gives only {len(fill)} filler sentences; need at least 8")
    return fill, note


@functools.lru_cache(maxsize=64)
def _sizes(tok, n_needles: int, n_queries: int, digits: int, sample: tuple[str, ...]) -> tuple[int, float]:
    """(tokens of a haystack without filler, mean tokens per filler sentence), cached per tokenizer and task."""
    bare = needle_haystack(random.Random(0), [], n_filler=0, depth=0.0, n_needles=n_needles, n_queries=n_queries,
                           digits=digits)
    per_sentence = sum(len(tok.encode(" " + s).ids) for s in sample) / max(1, len(sample))
    return len(encode_haystack(tok, bare).ids), per_sentence


def min_length(ev: EvalModel, task: NeedleTask) -> int:
    """Tokens of a haystack without filler: the shortest context length the task fits in."""
    return _sizes(ev.tokenizer, task.n_needles, task.n_queries, task.digits, ())[0]


def build_haystack(ev: EvalModel, filler: Sequence[str], task: NeedleTask, length: int, depth: float,
                   rng: random.Random) -> EncodedHaystack:
    """A haystack of at most ``length`` tokens (prompt + answer), as long as the filler allows."""
    need, per_sentence = _sizes(ev.tokenizer, task.n_needles, task.n_queries, task.digits, tuple(filler[:64]))
    if need > length:
        raise ValueError(f"{length} tokens cannot hold {task.n_needles} needles and {task.n_queries} "
                         f"questions ({need} tokens without filler); use fewer --needles/--queries or longer contexts")
    n = max(0, int((length - need) / per_sentence) + 2)
    state = rng.getstate()
    while True:
        rng.setstate(state)
        e = encode_haystack(ev.tokenizer, needle_haystack(rng, filler, n_filler=n, depth=depth,
                                                          n_needles=task.n_needles, n_queries=task.n_queries,
                                                          digits=task.digits))
        if len(e.ids) <= length or n == 0:
            return e
        n -= 1


def padded_batch(items: Sequence[EncodedHaystack], pad_id: int,
                 device: Optional[torch.device] = None) -> torch.Tensor:
    """(B, T) ids on ``device`` (default the CPU), right-padded: a causal model's logits before the padding do not
    see it."""
    T = max(len(e.ids) for e in items)
    return torch.tensor([e.ids + [pad_id] * (T - len(e.ids)) for e in items], dtype=torch.long, device=device)


@torch.no_grad()
def score_answers(model, items: Sequence[EncodedHaystack], pad_id: int, batch_size: int = 16) -> list[tuple[bool, int]]:
    """Per haystack: (exact match of the greedy answer, by teacher forcing -- see the module docstring; the
    predicted first answer token)."""
    out: list[tuple[bool, int]] = []
    for i in range(0, len(items), batch_size):
        chunk = items[i:i + batch_size]
        pred = model(padded_batch(chunk, pad_id, model_device(model))).logits.argmax(-1)  # (B, T)
        for b, e in enumerate(chunk):
            gold = torch.tensor(e.ids[e.answer_start:], device=pred.device)
            got = pred[b, e.answer_start - 1:len(e.ids) - 1]
            out.append((bool((got == gold).all()), int(got[0])))
    return out


def answers_correct(model, items: Sequence[EncodedHaystack], pad_id: int, batch_size: int = 16) -> list[bool]:
    """Exact match of the greedy answer per haystack."""
    return [ok for ok, _ in score_answers(model, items, pad_id, batch_size)]


def grid_lengths(ev: EvalModel, fractions: Sequence[float], task: NeedleTask) -> list[int]:
    """Token lengths for fractions of the training length, raised to the shortest that holds the task."""
    lo = min_length(ev, task) + 8
    hi = ev.model.cfg.max_seq_len
    if lo > hi:
        raise ValueError(f"the model's max_seq_len {hi} cannot hold {task.n_needles} needles and {task.n_queries} "
                         f"questions ({lo - 8} tokens without filler); use fewer --needles/--queries")
    return sorted({min(max(lo, round(f * ev.train_len)), hi) for f in fractions})


def run_needles(ev: EvalModel, lengths: Sequence[float] = QUICK.lengths, depths: Sequence[float] = QUICK.depths,
                samples: int = QUICK.samples, seed: int = 0, task: Optional[NeedleTask] = None,
                progress: bool = True) -> dict[str, Any]:
    """Accuracy per (context length, needle depth) cell; lengths are fractions of the training length."""
    task = task or NeedleTask.for_model(ev)
    filler, note = filler_sentences(ev)
    toks = grid_lengths(ev, lengths, task)
    pad = eos_id(ev.tokenizer)
    acc = [[0.0] * len(depths) for _ in toks]
    first_ok = first_any = first_last = 0
    actual = [[0.0] * len(depths) for _ in toks]
    bar = progress_bar(total=len(toks) * len(depths), desc=f"needles {ev.label}", disable=not progress, leave=False)
    for i, L in enumerate(toks):
        for j, d in enumerate(depths):
            rng = random.Random(f"{seed}-{L}-{d}")  # the same haystacks for every model with this tokenizer
            items = [build_haystack(ev, filler, task, L, d, rng) for _ in range(samples)]
            scored = score_answers(ev.model, items, pad)
            acc[i][j] = sum(ok for ok, _ in scored) / len(scored)
            first_ok += sum(first == e.needle_first[0] for (_, first), e in zip(scored, items))
            first_any += sum(first in e.needle_first for (_, first), e in zip(scored, items))
            first_last += sum(first == e.last_answer_first for (_, first), e in zip(scored, items))
            actual[i][j] = sum(len(e.ids) for e in items) / len(items)
            bar.update()
    bar.close()
    flat = [a for row in acc for a in row]
    return {"analysis": "needles", "model": ev.describe(), "task": task.to_dict(), "held_out": note,
            "seed": seed, "samples_per_cell": samples, "lengths": toks, "mean_tokens": actual,
            "depths": list(depths), "accuracy": acc, "mean_accuracy": sum(flat) / len(flat),
            # diagnostics: the first answer token right, and equal to the first token of some needle's number
            "first_token_accuracy": first_ok / (len(flat) * samples),
            "any_needle_first_token": first_any / (len(flat) * samples),
            # a recency shortcut: the number of the question just answered (never the target's, by construction)
            "last_answer_first_token": first_last / (len(flat) * samples),
            "scoring": "exact match of the greedy answer (all tokens of the number)"}


def format_needles(r: dict[str, Any]) -> str:
    t = r["task"]
    ref = f"(chance {t['chance']:.3g}, random needle {t['random_needle']:.3g})"
    lines = [f"{r['model']['label']}: multi-needle retrieval, N={t['n_needles']} R={t['n_queries']} "
             f"digits={t['digits']}, {r['samples_per_cell']} haystacks per cell {ref}",
             "length\\depth " + " ".join(f"{d:>6.2f}" for d in r["depths"])]
    for L, row in zip(r["lengths"], r["accuracy"]):
        lines.append(f"{L:>12} " + " ".join(f"{a:>6.2f}" for a in row))
    lines.append(f"mean accuracy {r['mean_accuracy']:.3f} {ref}; first answer token right "
                 f"{r['first_token_accuracy']:.3f}, equal to some needle's {r['any_needle_first_token']:.3f}, "
                 f"to the last answered question's {r['last_answer_first_token']:.3f}")
    return "\n".join(lines)


def plot_heatmaps(results: Sequence[dict[str, Any]], path) -> None:
    """One accuracy heatmap per model (paper Fig. 5), chance levels in the titles."""
    plt = pyplot()
    # constrained layout and 4.4 inches per panel: each panel's y label keeps clear of the previous panel
    fig, axes = plt.subplots(1, len(results), figsize=(4.4 * len(results) + 1.0, 3.6), squeeze=False,
                             layout="constrained")
    for ax, r in zip(axes[0], results):
        im = ax.imshow(r["accuracy"], vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(r["depths"])), [f"{d:.2f}" for d in r["depths"]])
        ax.set_yticks(range(len(r["lengths"])), [str(L) for L in r["lengths"]])
        for i, row in enumerate(r["accuracy"]):
            for j, a in enumerate(row):
                ax.text(j, i, f"{a:.2f}", ha="center", va="center", color="w" if a < 0.6 else "k", fontsize=9)
        ax.set_xlabel("needle depth", fontsize=10)
        ax.set_ylabel("context (tokens)", fontsize=10)
        t = r["task"]
        ax.set_title(f"{r['model']['label']}\nchance {t['chance']:.2g}, random needle {t['random_needle']:.2g}",
                     fontsize=10)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="accuracy")
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def run(ev: EvalModel, settings: NeedlesSettings, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    return run_needles(ev, settings.lengths, settings.depths, settings.samples, seed, settings.task.resolve(ev),
                       progress=progress)


SPEC = AnalysisSpec(
    name="needles", title="Multi-needle retrieval", paper="Table 2, Fig. 5",
    help="multi-needle retrieval grid: context length x needle depth (Table 2, Fig. 5)", doc=__doc__,
    quick=QUICK, full=FULL, run=run, format=format_needles, plot=plot_heatmaps,
    claims=("better multi-needle retrieval",))
