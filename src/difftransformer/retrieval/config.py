"""Typed configuration of the token-level key-value retrieval benchmark (paper Fig. 1, Table 2, Fig. 5, Table 3).

The design (training distribution, endpoints, tuning, seeds, floors, statistics) is pre-registered in
``PROTOCOL.md`` beside this file; the defaults here are that protocol's values.

Each context holds ``pairs`` *fact* tokens -- ONE token each, encoding a key and a value -- among filler tokens,
``context`` tokens in all (facts + filler). Then ``queries`` of its keys are asked, each by a query token answered
by its value token. The loss is on the answer tokens only: the filler and the facts are unpredictable by design,
and a loss on them would only add noise to the gradient of the lookup we want to measure.

Training draws the shape: per batch a context length in ``train_context`` (inclusive range), per example a number
of facts in ``train_pairs`` (at most the context length); the rest of the context is filler. Test conditions are
fixed shapes (pairs, context). The primary endpoint is a condition INSIDE the trained lengths and fact counts (the
hardest corner: the most facts at high density); conditions longer than any trained context are the secondary
length-extrapolation endpoint.

Vocabulary layout (token ids, contiguous ranges, see ``Layout``)::

    [0]                      BOS
    [1, 1+K)                 query tokens, one per key
    [1+K, 1+K+V)             value (answer) tokens
    [1+K+V, 1+K+V+F)         filler tokens
    [1+K+V+F, ... + K*V)     fact tokens: fact(k, v) = base + k*V + v

"near" distractors: keys are grouped (``key_group`` consecutive keys per group) and in a "near" context every fact's
key comes from ONE group. With one learned embedding per token the nearness is only structural (no shared
sub-token); an earlier version measured it no harder than random keys, so no default condition uses it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..model import variants as registry
from ..studies.config import as_tuples, check_int, check_lr_grid, flag, from_dict, to_dict

if TYPE_CHECKING:
    from ..jobs.codepath import CodePath

Distractors = Literal["random", "near"]
DISTRACTOR_KINDS: tuple[Distractors, ...] = get_args(Distractors)
RetrievalBackend = Literal["eager", "sdpa"]  # the attention paths the benchmark allows (``ModelConfig.backend``'s)
BACKENDS: tuple[RetrievalBackend, ...] = get_args(RetrievalBackend)


@dataclass(frozen=True)
class Condition:
    """A test condition: ``pairs`` facts in a context of ``context`` tokens (facts + filler), a distractor kind."""

    name: str
    pairs: int
    context: int
    distractors: Distractors = "random"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def default_conditions() -> tuple[Condition, ...]:
    """The (facts x context) grid of Fig. 5 style: contexts of 48 tokens lie inside the trained lengths (24-48),
    96 and 192 beyond them (length extrapolation); 8 and 24 facts lie inside the trained counts (8-24), 48 beyond
    them (every one of the 48 context tokens a fact: the most distractors at the highest density)."""
    return tuple(Condition(f"p{p}c{c}", p, c) for c in (48, 96, 192) for p in (8, 24, 48))


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


@dataclass(frozen=True)
class RetrievalConfig:
    # --- task ---
    train_pairs: tuple[int, int] = flag((8, 24), "facts per training context, drawn per example (inclusive range)")
    train_context: tuple[int, int] = flag((24, 48), "training context length (facts + filler), drawn per batch")
    distractors: Distractors = flag("random", "training distractor kind")  # noqa: RUF009 (flag is a field)
    queries: int = flag(8, "keys asked per context (training and test)")
    n_keys: int = flag(64, "key vocabulary (>= the most facts of any condition)")
    n_values: int = 8  # value vocabulary: chance is 1 / n_values
    n_filler: int = 64  # filler vocabulary
    key_group: int = 32  # keys per near-duplicate group
    # --- model (ModelConfig fields; the library parameter-matches the variants) ---
    d_model: int = flag(64, "model width, every variant (parameters matched by the library)")
    n_layers: int = flag(2, "transformer layers")
    n_heads: int = 4
    # --- training ---
    steps: int = flag(600, "training steps per model")
    batch: int = flag(32, "contexts per training step")
    warmup: int = 50
    weight_decay: float = 0.0
    backend: RetrievalBackend = "eager"  # the attention path: "eager" (explicit maps; fastest at these lengths)
    fused_adamw: bool = True  # PyTorch's fused CPU AdamW (one kernel over every tensor) instead of its for-loop one
    # --- learning rates (PROTOCOL.md, "Learning rates"): the grid runs on every test seed, chosen on validation ---
    lr_grid: tuple[float, ...] = flag((1e-3, 2e-3, 4e-3), "learning rates, each run on every test seed; each "
                                                          "variant's lr is chosen on the validation split")
    lr_widen: int = flag(1, "times the grid may grow by one value past an edge that was chosen")
    # the sensitivity row: every variant at this variant's tuned lr (default: the reference, the baseline)
    matched_lr: str = field(default_factory=lambda: registry.reference().name)
    # --- test ---
    seeds: int = flag(12, "test seeds per variant, paired across variants")
    seed_base: int = flag(3000, "the first test seed: SEED_BASE..SEED_BASE+N-1 (version 3's fresh block; versions "
                                "1-2 used 0..7)")
    variants: tuple[str, ...] = flag(factory=registry.names, help="a subset of the registered variants")
    floor: float = 0.9  # accuracy on the training distribution below which a run is a training failure
    eval_contexts: int = flag(128, "test contexts per condition, and validation contexts for the lr choice")
    # validation contexts (their own generator seed) for the lr choice: --eval-contexts sets them too
    val_contexts: int = field(default=128, metadata={"follows": "eval_contexts"})
    conditions: tuple[Condition, ...] = field(default_factory=default_conditions)
    primary: str = flag("p48c48", "the primary endpoint's condition, inside the trained lengths; PROTOCOL.md fixes "
                                  "it: changing it is a deviation to report")
    extrapolation: str = flag("p48c96", "the length-extrapolation endpoint's condition, longer than any trained")
    # Fig. 8's widths, plus 3: at this scale the top |logit| is ~8-12 (measured), so 4 bits barely hurt
    quant_bits: tuple[int, ...] = (8, 6, 4, 3)
    data_seed: int = 1234  # training stream; validation uses data_seed + 1, test data_seed + 2
    # the CPU kernels every job runs (jobs/codepath.py)
    cpu_code_path: CodePath = flag(  # noqa: RUF009 (flag is a dataclasses.field)
        "machine", "the CPU kernels every job runs: machine lets each library pick them; "
                                              "avx2/avx512 pin PyTorch's, MKL's and oneDNN's (PROTOCOL.md, "
                                              "'Reproducibility')")

    def __post_init__(self) -> None:
        as_tuples(self, "train_pairs", "train_context", "variants", "quant_bits")
        object.__setattr__(self, "lr_grid", tuple(float(x) for x in self.lr_grid))
        object.__setattr__(self, "conditions",
                           tuple(c if isinstance(c, Condition) else Condition(**c) for c in self.conditions))
        self.validate()

    def validate(self) -> None:
        """Every field, in this order: the task's sizes, the training and the lr grid, the test conditions and the
        endpoints, the quantisation widths. The first problem raises, naming the field and what it allows."""
        self._validate_task()
        self._validate_training()
        self._validate_conditions()
        for b in self.quant_bits:
            if isinstance(b, bool) or not isinstance(b, int) or b < 2:
                raise ValueError(f"RetrievalConfig.quant_bits: {b!r} must be an integer >= 2")

    def _validate_task(self) -> None:
        for n in ("queries", "n_keys", "n_values", "n_filler", "key_group", "d_model", "n_layers", "n_heads",
                  "steps", "batch", "seeds", "eval_contexts", "val_contexts"):
            check_int(f"RetrievalConfig.{n}", getattr(self, n))
        for n in ("train_pairs", "train_context"):
            r = getattr(self, n)
            if len(r) != 2:
                raise ValueError(f"RetrievalConfig.{n} must be a (low, high) pair, got {r!r}")
            for x in r:
                check_int(f"RetrievalConfig.{n}", x)
            if r[0] > r[1]:
                raise ValueError(f"RetrievalConfig.{n}={r} must have low <= high")
        if self.train_pairs[0] < self.queries:
            raise ValueError(f"RetrievalConfig.train_pairs={self.train_pairs}: every context needs at least "
                             f"queries={self.queries} facts")
        if self.train_pairs[1] > self.n_keys:
            raise ValueError(f"RetrievalConfig.train_pairs={self.train_pairs} exceeds n_keys={self.n_keys}")
        if self.train_context[0] < self.train_pairs[0]:
            raise ValueError(f"RetrievalConfig.train_context={self.train_context} must leave room for "
                             f"train_pairs={self.train_pairs} (low context >= low pairs)")

    def _validate_training(self) -> None:
        for n in ("warmup", "lr_widen", "seed_base"):
            check_int(f"RetrievalConfig.{n}", getattr(self, n), 0)
        from ..jobs.codepath import CODE_PATHS
        if self.cpu_code_path not in CODE_PATHS:
            raise ValueError(f"RetrievalConfig.cpu_code_path={self.cpu_code_path!r} is not allowed; choose one of "
                             f"{', '.join(CODE_PATHS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"RetrievalConfig.backend={self.backend!r} is not allowed; choose one of "
                             f"{', '.join(BACKENDS)}")
        if not isinstance(self.fused_adamw, bool):
            raise ValueError(f"RetrievalConfig.fused_adamw must be true or false, got {self.fused_adamw!r}")
        if self.distractors not in DISTRACTOR_KINDS:
            raise ValueError(f"RetrievalConfig.distractors={self.distractors!r} is not allowed; choose one of "
                             f"{', '.join(DISTRACTOR_KINDS)}")
        check_lr_grid(self.lr_grid, 1.0, f"RetrievalConfig.lr_grid={self.lr_grid} must be distinct values in (0, 1)")
        if (not self.variants or any(v not in registry.names() for v in self.variants)
                or len(set(self.variants)) != len(self.variants)):
            raise ValueError(f"RetrievalConfig.variants={self.variants} is not allowed; choose distinct ones of "
                             f"{', '.join(registry.names())}")
        if self.matched_lr not in self.variants:
            raise ValueError(f"RetrievalConfig.matched_lr={self.matched_lr!r} is not allowed; choose one of the "
                             f"variants {', '.join(self.variants)}")
        if not 0 < self.floor <= 1:
            raise ValueError(f"RetrievalConfig.floor must be in (0, 1], got {self.floor}")
        if self.weight_decay < 0:
            raise ValueError(f"RetrievalConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if self.n_heads % 2:
            raise ValueError(f"RetrievalConfig.n_heads={self.n_heads} must be even (DIFF V1 uses n_heads/2 heads)")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"RetrievalConfig.d_model={self.d_model} must give an even head width with "
                             f"n_heads={self.n_heads}")

    def _validate_conditions(self) -> None:
        names = [c.name for c in self.conditions]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"RetrievalConfig.conditions: names must be distinct and non-empty, got {names}")
        for c in self.conditions:
            check_int(f"RetrievalConfig.conditions[{c.name}].pairs", c.pairs)
            check_int(f"RetrievalConfig.conditions[{c.name}].context", c.context)
            if c.distractors not in DISTRACTOR_KINDS:
                raise ValueError(f"RetrievalConfig.conditions[{c.name}].distractors={c.distractors!r} is not "
                                 f"allowed; choose one of {', '.join(DISTRACTOR_KINDS)}")
            if c.pairs > c.context:
                raise ValueError(f"RetrievalConfig.conditions[{c.name}]: pairs={c.pairs} exceed context={c.context}")
            if c.pairs < self.queries:
                raise ValueError(f"RetrievalConfig.conditions[{c.name}]: pairs={c.pairs} is fewer than "
                                 f"queries={self.queries}")
            if c.pairs > self.n_keys:
                raise ValueError(f"RetrievalConfig.n_keys={self.n_keys} is fewer than the {c.pairs} pairs of "
                                 f"condition {c.name}")
            if c.distractors == "near" and c.pairs > self.key_group:
                raise ValueError(f"RetrievalConfig.key_group={self.key_group} is smaller than the {c.pairs} pairs "
                                 f"of 'near' condition {c.name}")
        if self.distractors == "near" and self.train_pairs[1] > self.key_group:
            raise ValueError(f"RetrievalConfig.key_group={self.key_group} < train_pairs={self.train_pairs} "
                             "for 'near' training")
        if self.n_keys % self.key_group:
            raise ValueError(f"RetrievalConfig.key_group={self.key_group} must divide n_keys={self.n_keys}")
        for n in ("primary", "extrapolation"):
            if getattr(self, n) not in names:
                raise ValueError(f"RetrievalConfig.{n}={getattr(self, n)!r} is not allowed; "
                                 f"choose one of {', '.join(names)}")
        if self.condition(self.primary).context > self.train_context[1]:
            raise ValueError(f"RetrievalConfig.primary={self.primary!r} is longer than any trained context "
                             f"({self.train_context[1]}): the primary endpoint must lie inside the trained lengths")
        if self.condition(self.extrapolation).context <= self.train_context[1]:
            raise ValueError(f"RetrievalConfig.extrapolation={self.extrapolation!r} must be longer than the "
                             f"longest trained context ({self.train_context[1]})")

    @property
    def test_seeds(self) -> tuple[int, ...]:
        return tuple(range(self.seed_base, self.seed_base + self.seeds))

    @property
    def layout(self) -> Layout:
        return Layout(self.n_keys, self.n_values, self.n_filler)

    def condition(self, name: str) -> Condition:
        for c in self.conditions:
            if c.name == name:
                return c
        raise ValueError(f"unknown condition {name!r}; choose one of {', '.join(c.name for c in self.conditions)}")

    def max_len(self) -> int:
        """Longest model input of training or any condition: BOS + context + 2 tokens per query, less the last."""
        return max([self.train_context[1]] + [c.context for c in self.conditions]) + 2 * self.queries

    def to_dict(self) -> dict[str, Any]:
        d = to_dict(self, "train_pairs", "train_context", "lr_grid", "variants", "quant_bits")
        d["conditions"] = [c.to_dict() for c in self.conditions]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RetrievalConfig:
        return from_dict(cls, d)

    def replace(self, **changes: Any) -> RetrievalConfig:
        d = dataclasses.asdict(self)
        d["conditions"] = self.conditions
        unknown = sorted(set(changes) - set(d))
        if unknown:
            raise ValueError(f"unknown RetrievalConfig key(s): {', '.join(unknown)}")
        d.update(changes)
        return RetrievalConfig(**d)


def quick_config() -> RetrievalConfig:
    """A smoke run (about a minute on 2 idle cores): 150 steps, a two-value lr grid, 2 test seeds, 16 contexts per
    condition. It exercises every code path and plot; its numbers are not a measurement."""
    return RetrievalConfig(steps=150, lr_grid=(2e-3, 4e-3), lr_widen=0, seeds=2, eval_contexts=16, val_contexts=16)
