"""Long-context NLL done right, for the claim "lower NLL deep into long context" (paper Fig. 4).

Why: the positions analysis reads contiguous slices of the held-out token stream, where ~3 short documents share a
window, so its "tail NLL" mixes the overall loss, document boundaries and RoPE extrapolation. Here (a) the texts are
genuinely long and never trained on, and (b) the measure is each model's *own* gain from context, within the
training length and beyond it separately, with an uncertainty over documents.

(a) ``long_held_out_texts``: under the training code's own rules (``corpus.truncate`` then
``corpus.split_documents``) two kinds of KJV text are never trained on: the validation paragraphs, and, when
``data.max_chars`` cut the corpus, every paragraph after the cut (whole books). Long texts are validation paragraphs
that alone reach ``min_chars``, and runs of consecutive paragraphs of the untrained remainder (natural running text,
paragraphs joined by EOS as in training). A run on the whole corpus (the demo preset) has only 2 validation
paragraphs over 2,500 characters at ``val_fraction=0.02`` (the longest 3,749): ask for more and the function
refuses, saying to train with ``data.max_chars`` below the corpus size so that the last books stay unseen.
The KJV repeats some passages (Kings/Chronicles, the Gospels): a remainder text may echo trained verses.

(b) ``context_gains``: per document, mean NLL over positions [L/2, L) minus mean over [0, L/8) ("within"), and mean
over [L, 2L) minus the same early mean ("beyond"), L the training length; negative = the model gains from context.
``compare_context_gains`` turns them into ``stats.Verdict`` s (DIFF - baseline, lower is better). A larger gain
reads "held" only where DIFF's own mean NLL over that window is not above the baseline's: a model that starts worse
(a fresh conversion whose negative branch hurts most at short contexts, say) has more to gain, and that is not the
claim's "lower NLL deep into context".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from ..data import corpus
from .stats import HELD, INCONCLUSIVE, LEVEL, Verdict, compare_seeds, t_crit


@dataclass(frozen=True)
class LongText:
    """One long held-out text: its paragraphs (join with EOS, as training joins documents), where it starts in
    the embedded corpus, its length in characters and which kind of held-out text it is."""

    paragraphs: tuple[str, ...]
    first: int
    chars: int
    source: str  # "validation paragraph" or "untrained remainder"


def long_held_out_texts(val_fraction: float = 0.02, max_chars: int = 0, min_chars: int = 4000,
                        max_texts: int = 64, sources: Sequence[str] = ("kjv",)) -> list[LongText]:
    """Up to ``max_texts`` texts of at least ``min_chars`` characters that the run never trained on (spread evenly
    over what exists). ``val_fraction``, ``max_chars`` and ``sources`` are the run's ``data`` settings."""
    if list(sources) != ["kjv"]:
        raise ValueError(f"sources must be ['kjv'] (the embedded corpus), got {list(sources)!r}")
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 0.5:
        raise ValueError(f"val_fraction must be in (0, 0.5), got {val_fraction!r}")
    for name, v, low in (("max_chars", max_chars, 0), ("min_chars", min_chars, 1), ("max_texts", max_texts, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
    docs = corpus.embedded_corpus("kjv")
    used = corpus.truncate(docs, max_chars)
    cut = len(used[-1]) < len(docs[len(used) - 1])  # the last used paragraph was cut: its start was trained
    # the training code's split rule, applied to paragraph indices so that it is the very same rule
    _, val_idx = corpus.split_documents(list(range(len(used))), val_fraction)
    out = [LongText((docs[i],), i, len(docs[i]), "validation paragraph")
           for i in val_idx if len(used[i]) >= min_chars and not (cut and i == len(used) - 1)]
    run: list[int] = []
    for i in range(len(used), len(docs)):  # after the cut (the cut paragraph itself excluded): never seen at all
        run.append(i)
        if sum(len(docs[j]) for j in run) >= min_chars:
            out.append(LongText(tuple(docs[j] for j in run), run[0], sum(len(docs[j]) for j in run),
                                "untrained remainder"))
            run = []
    if not out:
        longest = max((len(used[i]) for i in val_idx), default=0)
        fix = (f"the run trained on the whole embedded corpus and its longest validation paragraph has {longest} "
               f"characters; train with data.max_chars below {sum(map(len, docs))} so that the books after the cut "
               "stay unseen" if len(used) == len(docs) else "lower min_chars")
        raise ValueError(f"no held-out text of min_chars={min_chars} characters: {fix}")
    stride = max(1, len(out) // max_texts)
    return out[::stride][:max_texts]


def text_tokens(paragraph_ids: Sequence[Sequence[int]], eos_id: int, length: int) -> Optional[list[int]]:
    """The first ``length + 1`` tokens of a text's paragraphs joined by ``eos_id`` (inputs and targets of
    ``length`` predictions), or None when the text is shorter: such a text is dropped, not padded."""
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an integer >= 1, got {length!r}")
    ids: list[int] = []
    for k, p in enumerate(paragraph_ids):
        ids.extend(([eos_id] if k else []) + list(p))
        if len(ids) > length:
            return ids[:length + 1]
    return None


# ---------------------------------------------------------------------------------------------- summaries
def _curves(nll, train_len: int, name: str) -> np.ndarray:
    a = np.asarray(nll, dtype=float)
    if a.ndim != 2 or a.shape[0] < 1:
        raise ValueError(f"{name} must be documents x positions of NLL (2-D, >= 1 document), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must hold finite NLLs (no NaN or inf)")
    if not isinstance(train_len, int) or train_len < 8:
        raise ValueError(f"train_len must be an integer >= 8 (so that [0, L/8) holds a position), got {train_len!r}")
    if a.shape[1] < train_len:
        raise ValueError(f"{name} has {a.shape[1]} positions, fewer than train_len={train_len}")
    return a


def _per_doc(a: np.ndarray, L: int) -> tuple[np.ndarray, Optional[np.ndarray]]:
    early = a[:, :L // 8].mean(1)
    within = a[:, L // 2:L].mean(1) - early
    beyond = a[:, L:2 * L].mean(1) - early if a.shape[1] >= 2 * L else None
    return within, beyond


def context_gains(nll, train_len: int, level: float = LEVEL) -> dict:
    """One model's gains from context (see the module docstring) as {"within": (mean, low, high, n_docs),
    "beyond": ... or None when fewer than 2L positions were evaluated}; t-interval over documents."""
    a = _curves(nll, train_len, "nll")
    out: dict[str, Optional[tuple[float, float, float, int]]] = {}
    for key, g in zip(("within", "beyond"), _per_doc(a, train_len)):
        if g is None:
            out[key] = None
            continue
        h = t_crit(g.size - 1, level) * g.std(ddof=1) / math.sqrt(g.size) if g.size > 1 else math.nan
        out[key] = (float(g.mean()), float(g.mean() - h), float(g.mean() + h), int(g.size))
    return out


def compare_context_gains(base: Sequence, diff: Sequence, train_len: int, min_effect: float = 0.02,
                          level: float = LEVEL) -> dict[str, Optional[Verdict]]:
    """Verdicts "within" and "beyond" the training length on DIFF's gain - the baseline's (lower is better).

    ``base`` and ``diff``: one documents x positions array per seed, the same documents in the same order for
    every model. Several seeds: the per-seed mean gains, paired t over seeds. One seed each: the document-paired
    differences give the within-seed SE (the seed spread unknown). "beyond" is None unless 2L positions exist.
    """
    if len(base) == 0 or len(diff) == 0:
        raise ValueError("base and diff must each hold one documents x positions array per seed, got none")
    gb = [_per_doc(_curves(x, train_len, f"base[{i}]"), train_len) for i, x in enumerate(base)]
    gd = [_per_doc(_curves(x, train_len, f"diff[{i}]"), train_len) for i, x in enumerate(diff)]
    out: dict[str, Optional[Verdict]] = {}
    for k, key in enumerate(("within", "beyond")):
        pb = [x for x in (g[k] for g in gb) if x is not None]  # per seed, the per-document gains
        pd = [x for x in (g[k] for g in gd) if x is not None]
        if len(pb) < len(gb) or len(pd) < len(gd):
            out[key] = None
            continue
        se = None
        if len(pb) == 1 and len(pd) == 1:
            b, d = pb[0], pd[0]
            if b.size != d.size:
                raise ValueError(f"base and diff must be read on the same documents, got {b.size} and {d.size}")
            se = float((d - b).std(ddof=1) / math.sqrt(b.size)) if b.size > 1 else None
        v = compare_seeds([float(x.mean()) for x in pb], [float(x.mean()) for x in pd], False,
                          min_effect, len(pb) == len(pd), se, level)
        lo, hi = (train_len // 2, train_len) if key == "within" else (train_len, 2 * train_len)
        level_b, level_d = (float(np.mean([np.asarray(x, dtype=float)[:, lo:hi].mean() for x in xs]))
                            for xs in (base, diff))
        if v.verdict == HELD and level_d > level_b:
            v = replace(v, verdict=INCONCLUSIVE,
                        reason=f"{v.reason}; but DIFF's own NLL over [{lo}, {hi}) is higher than the baseline's "
                               f"(+{level_d - level_b:.3g} nats): the larger gain is a worse start, not lower NLL")
        out[key] = v
    return out
