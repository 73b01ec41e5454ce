"""Synthetic multi-needle retrieval documents (paper section 3.4, Table 2), mixed into training data so that
small models can learn to retrieve, and reused by the evaluation to build its haystacks.

A document is filler text with N needles -- ``Pass number: <city> <digits>.`` -- followed by R questions, each
``Q: What is the pass number of <city>? A: <city> <digits>.``. Cities are drawn without repetition inside a
document; asked cities are drawn with replacement from the needles, so "rule out what was already answered" is
no shortcut.

The answer repeats the city right before the number, as the needle has it. A large model answers ``A: <digits>``
directly (the paper's Table 2 prompts), a two-hop lookup; a model of a few million parameters trained for
minutes does not learn that (a calibration pilot stayed at chance), but it can learn to copy the token that
followed the same token earlier (an induction head, Olsson et al. 2022), which still has to pick the right needle
out of N among the filler -- the part DIFF claims to improve.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

CITIES: tuple[str, ...] = (
    "Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Warsaw", "Lisbon", "Dublin", "Oslo",
    "Athens", "Cairo", "Lagos", "Nairobi", "Tokyo", "Seoul", "Delhi", "Lima", "Quito", "Bogota", "Havana",
    "Ottawa", "Boston", "Denver", "Austin", "Dallas", "Miami", "Sydney", "Perth", "Manila", "Hanoi",
)


FILLER_MAX_CHARS = 150  # filler sentences of retrieval documents and haystacks: short ones keep documents short
RETRIEVAL_MARKER = "Pass number:"  # every retrieval document holds it: how evaluation tells them from prose


def short_sentences(sentences: Sequence[str]) -> list[str]:
    """The sentences short enough to be filler (at most ``FILLER_MAX_CHARS``), for training and evaluation alike."""
    return [s for s in sentences if len(s) <= FILLER_MAX_CHARS]


@dataclass
class Needle:
    city: str
    number: str


def needle_sentence(n: Needle) -> str:
    return f"{RETRIEVAL_MARKER} {n.city} {n.number}."


def question(n: Needle, with_answer: bool) -> str:
    """The question and the answer's lead-in (the city); with ``with_answer`` also the number and the full stop."""
    q = f"Q: What is the pass number of {n.city}? A: {n.city}"
    return f"{q} {n.number}." if with_answer else q


def retrieval_document(rng: random.Random, filler: Sequence[str], *, n_needles: int = 4, n_queries: int = 2,
                       n_filler: int = 8, digits: int = 3, with_answers: bool = True) -> tuple[str, list[Needle]]:
    """One document: filler sentences with needles inserted at random places, then the questions.

    Returns the text and the needles asked, in order. With ``with_answers=False`` the text ends just before the
    last question's number (``... A: <city>``) and only that last question is unanswered.
    """
    if n_needles > len(CITIES):
        raise ValueError(f"n_needles={n_needles} exceeds the {len(CITIES)} cities available")
    if n_needles < 1 or n_queries < 1:
        raise ValueError("n_needles and n_queries must be >= 1")
    needles = [Needle(c, "".join(rng.choice("0123456789") for _ in range(digits)))
               for c in rng.sample(CITIES, n_needles)]
    parts = [rng.choice(filler) for _ in range(n_filler)] if filler else []
    for nd in needles:
        parts.insert(rng.randint(0, len(parts)), needle_sentence(nd))
    asked = [rng.choice(needles) for _ in range(n_queries)]
    qs = [question(a, with_answer=with_answers or i < n_queries - 1) for i, a in enumerate(asked)]
    return " ".join(parts) + "\n" + " ".join(qs), asked


def retrieval_documents(num_docs: int, filler: Sequence[str], *, seed: int = 0, **kwargs) -> list[str]:
    """``num_docs`` answered documents for training, deterministic in ``seed``."""
    rng = random.Random(seed)
    return [retrieval_document(rng, filler, **kwargs)[0] for _ in range(num_docs)]


@dataclass
class Haystack:
    """One evaluation prompt: filler with needles, answered questions, then the target question left open.

    ``prompt`` ends with ``... A: <city>`` and ``answer`` is `` <digits>`` (with its space), so
    ``prompt + answer`` is the text a perfect model continues with. Character spans index into ``prompt``.
    """

    prompt: str
    answer: str
    target: Needle
    needles: list[Needle]
    target_span: tuple[int, int]  # the target needle's sentence
    context_end: int  # where the questions begin: the context is prompt[:context_end]
    depth: float  # requested position of the target needle in the context, 0 = start, 1 = end
    answered: list[Needle] = field(default_factory=list)  # the needles of the answered questions, in order


def needle_haystack(rng: random.Random, filler: Sequence[str], *, n_filler: int, depth: float, n_needles: int = 4,
                    n_queries: int = 2, digits: int = 2) -> Haystack:
    """A multi-needle haystack (paper Table 2): ``n_filler`` filler sentences, the target needle at ``depth``.

    The other ``n_needles - 1`` needles go to random places; ``n_queries - 1`` answered questions about the
    other needles (drawn with replacement) come before the final, open question about the target.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth} must be in [0, 1]")
    if n_needles < 1 or n_queries < 1 or n_needles > len(CITIES):
        raise ValueError(f"need 1 <= n_needles <= {len(CITIES)} and n_queries >= 1")
    needles = [Needle(c, "".join(rng.choice("0123456789") for _ in range(digits)))
               for c in rng.sample(CITIES, n_needles)]
    target = needles[0]
    parts: list[Needle | str] = [rng.choice(filler) for _ in range(n_filler)] if filler else []
    parts.insert(round(depth * len(parts)), target)
    for nd in needles[1:]:  # at depth 0 (1) the target stays the first (last) needle
        at = parts.index(target)
        lo, hi = (at + 1, len(parts)) if depth == 0.0 else (0, at) if depth == 1.0 else (0, len(parts))
        parts.insert(rng.randint(lo, hi), nd)
    texts, pos, span = [], 0, (0, 0)
    for p in parts:
        t = needle_sentence(p) if isinstance(p, Needle) else p
        if p is target:
            span = (pos, pos + len(t))
        texts.append(t)
        pos += len(t) + 1
    context = " ".join(texts)
    # Answered questions never ask about the target: its number must come from the context, not the questions.
    others = needles[1:] or needles
    asked = [rng.choice(others) for _ in range(n_queries - 1)]
    qs = [question(a, with_answer=True) for a in asked] + [question(target, with_answer=False)]
    prompt = context + "\n" + " ".join(qs)
    return Haystack(prompt, f" {target.number}", target, needles, span, len(context), depth, asked)
