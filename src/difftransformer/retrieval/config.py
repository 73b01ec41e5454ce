"""Typed configuration of the token-level key-value retrieval benchmark (paper Fig. 1, Table 2, Fig. 5, Table 3).

Each context holds ``n_pairs`` *fact* tokens -- ONE token each, encoding a key and a value -- scattered among
``filler`` random filler tokens. Then every key is asked once (``queries`` of them) by a query token, answered by
its value token. The loss is on the answer tokens only: the filler and the facts are unpredictable by design, and a
loss on them would only add noise to the gradient of the lookup we want to measure.

Harder test conditions are made by the same generator's knobs: more pairs (more distractor facts), more filler
(more attention noise), both, and a context longer than any seen in training. The primary endpoint is fixed here,
before any run: accuracy at ``primary`` (default 2x pairs and 4x filler).

Vocabulary layout (token ids, contiguous ranges, see ``Layout``)::

    [0]                      BOS
    [1, 1+K)                 query tokens, one per key
    [1+K, 1+K+V)             value (answer) tokens
    [1+K+V, 1+K+V+F)         filler tokens
    [1+K+V+F, ... + K*V)     fact tokens: fact(k, v) = base + k*V + v

"near" distractors: keys are grouped (``key_group`` consecutive keys per group) and in a "near" context every fact's
key comes from ONE group, so each asked key sits among its own group's near-duplicates. With one learned embedding
per token the nearness is only structural (no shared sub-token); say so beside any "near" result.

The defaults were chosen by measurement (README, "The retrieval benchmark": what was tried and what it gave).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

DISTRACTOR_KINDS = ("random", "near")
VARIANTS = ("baseline", "diff_v1", "diff_v2")


@dataclass(frozen=True)
class Condition:
    """A test condition as multipliers of the training condition (pairs x, filler x), plus a name."""

    name: str
    pairs_mult: int = 1
    filler_mult: int = 1
    distractors: str = "random"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def default_conditions() -> tuple[Condition, ...]:
    # The grid of Fig. 5 style (pairs x filler) plus "near" distractors; the 4x/8x corner is longer than trained.
    out = []
    for p in (1, 2, 4):
        for f in (1, 2, 4, 8):
            out.append(Condition(f"p{p}f{f}", p, f))
    out.append(Condition("near_p1f1", 1, 1, "near"))
    return tuple(out)


@dataclass
class Layout:
    """Token id ranges of the vocabulary (see the module docstring)."""

    n_keys: int
    n_values: int
    n_filler: int

    @property
    def bos(self) -> int:
        return 0

    def query(self, k):
        return 1 + k

    def value(self, v):
        return 1 + self.n_keys + v

    def filler_base(self) -> int:
        return 1 + self.n_keys + self.n_values

    def fact(self, k, v):
        return self.filler_base() + self.n_filler + k * self.n_values + v

    @property
    def vocab_size(self) -> int:
        return 1 + self.n_keys + self.n_values + self.n_filler + self.n_keys * self.n_values


def _pos_int(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"RetrievalConfig.{name} must be a positive integer, got {v!r}")


@dataclass
class RetrievalConfig:
    # --- task ---
    n_pairs: int = 8  # facts per training context
    filler: int = 32  # filler tokens per training context
    distractors: str = "random"  # training distractor kind: "random" | "near"
    queries: int = 0  # queries per context; 0 = every key once
    n_keys: int = 32  # key vocabulary (>= the most pairs of any condition)
    n_values: int = 16  # value vocabulary: chance is 1 / n_values
    n_filler: int = 64  # filler vocabulary
    key_group: int = 16  # keys per near-duplicate group
    # --- model (ModelConfig fields; the library parameter-matches the variants) ---
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    # --- training ---
    steps: int = 600
    batch: int = 32
    lr_grid: tuple[float, ...] = (1.5e-3, 3e-3)
    warmup: int = 50
    weight_decay: float = 0.0
    seeds: int = 3  # seeds 0 .. seeds-1 per variant
    lr_search_seed: int = 0  # the lr grid runs on this seed only; the others reuse the chosen lr
    variants: tuple[str, ...] = VARIANTS
    # --- evaluation ---
    eval_contexts: int = 64  # contexts per condition (queries = pairs each)
    val_contexts: int = 64  # held-out generator seed for the lr choice (training condition)
    conditions: tuple[Condition, ...] = field(default_factory=default_conditions)
    primary: str = "p2f4"  # the primary endpoint, fixed in advance: accuracy at 2x pairs and 4x filler
    # Fig. 8's widths, plus 3 and 2: at this scale the top |logit| is ~8-12 (measured), so 4 bits barely hurt
    quant_bits: tuple[int, ...] = (16, 8, 6, 4, 3, 2)
    quant_conditions: tuple[str, ...] = ("p1f1", "p2f4")
    data_seed: int = 1234  # training stream; validation uses data_seed + 1, test data_seed + 2

    def __post_init__(self) -> None:
        self.lr_grid = tuple(float(x) for x in self.lr_grid)
        self.variants = tuple(self.variants)
        self.conditions = tuple(c if isinstance(c, Condition) else Condition(**c) for c in self.conditions)
        self.quant_bits = tuple(self.quant_bits)
        self.quant_conditions = tuple(self.quant_conditions)
        self.validate()

    def validate(self) -> None:
        for n in ("n_pairs", "filler", "n_keys", "n_values", "n_filler", "key_group", "d_model", "n_layers",
                  "n_heads", "steps", "batch", "seeds", "eval_contexts", "val_contexts"):
            _pos_int(n, getattr(self, n))
        if isinstance(self.queries, bool) or not isinstance(self.queries, int) or self.queries < 0:
            raise ValueError(f"RetrievalConfig.queries must be an integer >= 0 (0: every key), got {self.queries!r}")
        if self.queries > self.n_pairs:
            raise ValueError(f"RetrievalConfig.queries={self.queries} exceeds n_pairs={self.n_pairs}")
        for n in ("warmup", "lr_search_seed"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"RetrievalConfig.{n} must be an integer >= 0, got {v!r}")
        if self.lr_search_seed >= self.seeds:
            raise ValueError(f"RetrievalConfig.lr_search_seed={self.lr_search_seed} must be < seeds={self.seeds}")
        if self.distractors not in DISTRACTOR_KINDS:
            raise ValueError(f"RetrievalConfig.distractors={self.distractors!r} is not allowed; choose one of "
                             f"{', '.join(DISTRACTOR_KINDS)}")
        if not self.lr_grid or any(not 0 < x < 1 for x in self.lr_grid):
            raise ValueError(f"RetrievalConfig.lr_grid={self.lr_grid} must be non-empty, values in (0, 1)")
        if (not self.variants or any(v not in VARIANTS for v in self.variants)
                or len(set(self.variants)) != len(self.variants)):
            raise ValueError(f"RetrievalConfig.variants={self.variants} is not allowed; choose distinct ones of "
                             f"{', '.join(VARIANTS)}")
        if self.weight_decay < 0:
            raise ValueError(f"RetrievalConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if self.n_heads % 2:
            raise ValueError(f"RetrievalConfig.n_heads={self.n_heads} must be even (DIFF V1 uses n_heads/2 heads)")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"RetrievalConfig.d_model={self.d_model} must give an even head width with "
                             f"n_heads={self.n_heads}")
        names = [c.name for c in self.conditions]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"RetrievalConfig.conditions: names must be distinct and non-empty, got {names}")
        for c in self.conditions:
            _pos_int("conditions.pairs_mult", c.pairs_mult)
            _pos_int("conditions.filler_mult", c.filler_mult)
            if c.distractors not in DISTRACTOR_KINDS:
                raise ValueError(f"RetrievalConfig.conditions[{c.name}].distractors={c.distractors!r} is not "
                                 f"allowed; choose one of {', '.join(DISTRACTOR_KINDS)}")
            if self.n_pairs * c.pairs_mult > self.n_keys:
                raise ValueError(f"RetrievalConfig.n_keys={self.n_keys} is fewer than the "
                                 f"{self.n_pairs * c.pairs_mult} pairs of condition {c.name}")
            if c.distractors == "near" and self.n_pairs * c.pairs_mult > self.key_group:
                raise ValueError(f"RetrievalConfig.key_group={self.key_group} is smaller than the "
                                 f"{self.n_pairs * c.pairs_mult} pairs of 'near' condition {c.name}")
        if self.distractors == "near" and self.n_pairs > self.key_group:
            raise ValueError(f"RetrievalConfig.key_group={self.key_group} < n_pairs={self.n_pairs} "
                             "for 'near' training")
        if self.n_keys % self.key_group:
            raise ValueError(f"RetrievalConfig.key_group={self.key_group} must divide n_keys={self.n_keys}")
        if self.primary not in names:
            raise ValueError(f"RetrievalConfig.primary={self.primary!r} is not allowed; "
                             f"choose one of {', '.join(names)}")
        for q in self.quant_conditions:
            if q not in names:
                raise ValueError(f"RetrievalConfig.quant_conditions: {q!r} is not allowed; "
                                 f"choose one of {', '.join(names)}")
        for b in self.quant_bits:
            if isinstance(b, bool) or not isinstance(b, int) or b < 2:
                raise ValueError(f"RetrievalConfig.quant_bits: {b!r} must be an integer >= 2")

    @property
    def layout(self) -> Layout:
        return Layout(self.n_keys, self.n_values, self.n_filler)

    def condition(self, name: str) -> Condition:
        for c in self.conditions:
            if c.name == name:
                return c
        raise ValueError(f"unknown condition {name!r}; choose one of {', '.join(c.name for c in self.conditions)}")

    def max_len(self) -> int:
        """Longest sequence of any condition: BOS + facts + filler + 2 tokens per query."""
        return max(1 + 3 * self.n_pairs * c.pairs_mult + self.filler * c.filler_mult for c in self.conditions)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["conditions"] = [c.to_dict() for c in self.conditions]
        for k in ("lr_grid", "variants", "quant_bits", "quant_conditions"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RetrievalConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown RetrievalConfig key(s): {', '.join(unknown)}; "
                             f"allowed: {', '.join(sorted(known))}")
        return cls(**d)

    def replace(self, **changes: Any) -> "RetrievalConfig":
        d = dataclasses.asdict(self)
        d["conditions"] = self.conditions
        unknown = sorted(set(changes) - set(d))
        if unknown:
            raise ValueError(f"unknown RetrievalConfig key(s): {', '.join(unknown)}")
        d.update(changes)
        return RetrievalConfig(**d)


def quick_config() -> RetrievalConfig:
    """A smoke run (about a minute on 2 idle cores): 150 steps, one lr, 2 seeds, 16 contexts per condition.
    It exercises every code path and plot; its numbers are not a measurement (the baseline is near chance)."""
    return RetrievalConfig(steps=150, lr_grid=(3e-3,), seeds=2, eval_contexts=16, val_contexts=16)
