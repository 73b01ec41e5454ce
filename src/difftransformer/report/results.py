"""What the report measures per run, and the settings it measured with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..eval.loading import EvalModel


@dataclass
class Settings:
    quick: bool = True
    seed: int = 0
    progress: bool = True


@dataclass
class RunResults:
    ev: EvalModel
    training: dict[str, Any]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def attention(self) -> str:
        return self.ev.attention

