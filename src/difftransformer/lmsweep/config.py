"""Typed configuration of the language-model sweep (``difftransformer lm-sweep``; design in PROTOCOL.md beside it).

The defaults are the pre-registered protocol's values at the ``cpu`` scale (PROTOCOL.md version 2, "Scales");
``gpu_config`` is the ``gpu`` scale and ``SCALES`` names both.

Every model of the sweep is a ``DiffTransformerLM`` built from
the ``preset``'s [model] section with ``d_model``, ``n_layers``, ``n_heads`` and ``attention`` replaced, trained on
the preset's [data] tokens (prepared once into OUT/data) with windows of ``seq_len`` tokens, by the optimizer loop of
``difftransformer train`` (``train/steps.py``'s ``optimizer_steps``: AdamW, linear warmup then cosine to
``min_lr_ratio * lr``, clipping).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..model import variants as registry
from ..studies.config import as_tuples, check_int, check_lr_grid, flag, from_dict, to_dict

if TYPE_CHECKING:
    from ..jobs.codepath import CodePath

Scale = Literal["cpu", "gpu"]  # the pre-registered scales (``SCALES``)


@dataclass(frozen=True)
class LMSweepConfig:
    widths: tuple[int, ...] = flag((32, 64, 96), "d_model values (parameters matched across variants by the library), "
                                                 "each divisible by 2 x n_heads; gpu scale 32,64,96,128")
    n_layers: int = flag(4, "layers at every width")
    n_heads: int = flag(4, "the baseline's heads at every width, even (DIFF V1: 2 differential heads, DIFF V2: 8 "
                           "query heads); head_dim = d_model / n_heads")
    preset: str = flag("demo", "the preset whose [data] section (tokens, tokenizer) and other [model] options are used")
    data: tuple[str, ...] = flag((), "your own corpus: .txt/.jsonl files or folders, comma-separated (a tokenizer "
                                     "is trained on them; docs/lm-sweep.md)")
    seq_len: int = flag(128, "training and validation window, tokens")
    batch: int = flag(16, "windows per optimizer step (one micro-batch); gpu scale 64")
    steps: int = flag(300, "optimizer steps per run; gpu scale 600")
    warmup_steps: int = flag(30, "linear warmup steps; gpu scale 60")
    min_lr_ratio: float = 0.1  # the cosine ends at this share of the peak lr
    lr_grid: tuple[float, ...] = flag((4e-3, 8e-3, 16e-3), "peak learning rates, each run on every seed at every width")
    lr_widen: int = flag(2, "the most times a variant's grid grows past a chosen edge (per width); then "
                            "'unresolved edge'")
    seeds: int = flag(5, "paired seeds; gpu scale 6")
    seed_base: int = flag(5000, "the first seed: SEED_BASE..SEED_BASE+N-1")
    eval_every: int = flag(25, "optimizer steps between points of the test-half validation curve; gpu scale 50")
    outlier_windows: int = 8  # test-half windows for the activation-outlier measure
    variants: tuple[str, ...] = flag(factory=registry.names, help="a subset of the registered variants; the "
                                     "reference (every ratio's) is added when not named")
    scale: Scale = flag(  # noqa: RUF009 (flag is a dataclasses.field)
        "cpu", "the pre-registered scale the other values start from: cpu (99 minutes on 2 cores, "
                               "measured once) or gpu (wider, 8x the tokens, 6 seeds; for --device cuda)")
    cpu_code_path: CodePath = flag(  # noqa: RUF009 (flag is a dataclasses.field)
        "machine", "the CPU kernels every job runs: machine, or a pinned instruction set "
                                              "(rerun under another to check the verdicts against rounding)")

    def __post_init__(self) -> None:
        as_tuples(self, "widths", "variants", "data")
        object.__setattr__(self, "lr_grid", tuple(float(x) for x in self.lr_grid))
        self.validate()

    def validate(self) -> None:
        for name, lo in (("n_layers", 1), ("n_heads", 2), ("seq_len", 8), ("batch", 1), ("steps", 1),
                         ("warmup_steps", 0), ("lr_widen", 0), ("seeds", 1), ("seed_base", 0), ("eval_every", 1),
                         ("outlier_windows", 1)):
            check_int(name, getattr(self, name), lo)
        if self.n_heads % 2:
            raise ValueError(f"n_heads must be even (DIFF V1 pairs the baseline's heads), got {self.n_heads}")
        if any(not isinstance(x, str) or not x.strip() for x in self.data):
            raise ValueError(f"data must list paths to .txt/.jsonl files or folders, got {list(self.data)}")
        if len(self.widths) < 2 or len(set(self.widths)) != len(self.widths):
            raise ValueError(f"widths must list at least two distinct model widths, got {list(self.widths)}")
        for w in self.widths:
            if isinstance(w, bool) or not isinstance(w, int) or w < 8 or w % (2 * self.n_heads):
                raise ValueError(f"every width must be an integer >= 8 divisible by 2 * n_heads = {2 * self.n_heads} "
                                 f"(even head width), got {w!r}")
        check_lr_grid(self.lr_grid, math.inf, f"lr_grid must list distinct positive learning rates, got "
                                              f"{list(self.lr_grid)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")
        known = registry.names()
        bad = [v for v in self.variants if v not in known]
        if bad or not self.variants or len(set(self.variants)) != len(self.variants):
            raise ValueError(f"variants must be distinct names among {', '.join(known)}, got {list(self.variants)}")
        if registry.reference().name not in self.variants or len(self.variants) < 2:
            raise ValueError(f"variants must include the reference {registry.reference().name!r} and a DIFF variant "
                             f"(the sweep compares them), got {list(self.variants)}")
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {self.scale!r}")
        from ..jobs.codepath import CODE_PATHS
        if self.cpu_code_path not in CODE_PATHS:
            raise ValueError(f"cpu_code_path must be one of {', '.join(CODE_PATHS)}, got {self.cpu_code_path!r}")

    @property
    def test_seeds(self) -> list[int]:
        return list(range(self.seed_base, self.seed_base + self.seeds))

    @property
    def largest(self) -> int:
        return max(self.widths)

    def to_dict(self) -> dict[str, Any]:
        d = to_dict(self, "widths", "lr_grid", "variants", "data")
        if not self.data:  # written only when set: every run before the field keeps its keys and headers
            del d["data"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LMSweepConfig:
        return from_dict(cls, d)

    def replace(self, **changes: Any) -> LMSweepConfig:
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown LMSweepConfig key(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)


def cpu_config() -> LMSweepConfig:
    """The ``cpu`` scale (PROTOCOL.md version 2, "Scales"): the defaults; about 2 hours on 2 CPU cores."""
    return LMSweepConfig()


def gpu_config() -> LMSweepConfig:
    """The ``gpu`` scale (PROTOCOL.md version 2, "Scales"): wider models and 8x the training tokens per run (64
    windows of 128 tokens, 600 steps: 4.9M tokens, 3.7 epochs of the demo preset's training split), so the
    baseline's loss can fall with width; sized for one H100-class GPU shared by many jobs (unmeasured)."""
    return LMSweepConfig(widths=(32, 64, 96, 128), batch=64, steps=600, warmup_steps=60, eval_every=50, seeds=6,
                         scale="gpu")


SCALES: dict[Scale, Callable[[], LMSweepConfig]] = {"cpu": cpu_config, "gpu": gpu_config}


def quick_config() -> LMSweepConfig:
    """A smoke run (a few minutes): two tiny widths, two lrs, two seeds, 40 steps; not a measurement."""
    return LMSweepConfig(widths=(16, 32), steps=40, warmup_steps=5, lr_grid=(4e-3, 8e-3), lr_widen=0, seeds=2,
                         eval_every=10, batch=8, seq_len=64, outlier_windows=2)
