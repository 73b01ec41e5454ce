"""Synthetic multi-needle retrieval documents (paper section 3.4, Table 2), mixed into training data so that
small models can learn to retrieve, and reused by the evaluation to build its haystacks.

A document is filler text with N "needles" -- ``The pass number of <city> is <digits>.`` -- followed by R
questions, each ``Q: What is the pass number of <city>? A: <digits>.``. Cities are drawn without repetition
inside a document; asked cities are drawn with replacement from the needles, so "rule out what was already
answered" is no shortcut.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

CITIES: tuple[str, ...] = (
    "Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Warsaw", "Lisbon", "Dublin", "Oslo",
    "Athens", "Cairo", "Lagos", "Nairobi", "Tokyo", "Seoul", "Delhi", "Lima", "Quito", "Bogota", "Havana",
    "Ottawa", "Boston", "Denver", "Austin", "Dallas", "Miami", "Sydney", "Perth", "Manila", "Hanoi",
)


@dataclass
class Needle:
    city: str
    number: str


def needle_sentence(n: Needle) -> str:
    return f"The pass number of {n.city} is {n.number}."


def question(n: Needle, with_answer: bool) -> str:
    q = f"Q: What is the pass number of {n.city}? A:"
    return f"{q} {n.number}." if with_answer else q


def retrieval_document(rng: random.Random, filler: Sequence[str], *, n_needles: int = 4, n_queries: int = 2,
                       n_filler: int = 8, digits: int = 3, with_answers: bool = True) -> tuple[str, list[Needle]]:
    """One document: filler sentences with needles inserted at random places, then the questions.

    Returns the text and the needles asked, in order. With ``with_answers=False`` the text ends after the last
    question's ``A:`` and only that last question is unanswered.
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
