"""Choosing a learning rate over a grid, the idea both studies pre-register (retrieval: PROTOCOL.md "Learning
rates"; the language-model sweep: "Seeds, learning rates and the choice"): the grid on every seed, the study's own
rule picks a value, and a value at an edge of the grid widens it one step past that edge, a bounded number of times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional


def next_lr(grid: list[float], chosen: float) -> Optional[float]:
    """The value one step past the edge where ``chosen`` sits (the grid's own ratio at that edge, 2 for a one-value
    grid); None when ``chosen`` is inside the grid."""
    g = sorted(grid)
    if len(g) == 1:
        return None
    if chosen == g[-1]:
        return g[-1] * (g[-1] / g[-2])
    if chosen == g[0]:
        return g[0] / (g[1] / g[0])
    return None


class LrChoice(NamedTuple):
    """A variant's lr choice from the runs so far: ``lr`` when settled (None while runs are missing), the values
    run so far, and the widened ones."""

    lr: Optional[float]
    grid: list[float]
    widened: list[float]


def replay_lr_choice(grid: Sequence[float], widen: int, seeds: Sequence[int],
                     run_at: Callable[[float, int], Optional[dict[str, Any]]],
                     choose: Callable[[list[dict[str, Any]]], float]) -> LrChoice:
    """Replay an lr choice from the finished runs: the grid on every seed; at a chosen edge the next value
    (``next_lr``), up to ``widen`` times. ``run_at(lr, seed)``: the finished run or None; ``choose``: the study's
    own pre-registered rule over the runs of the grid so far."""
    grid, widened = list(grid), list[float]()
    while True:
        runs = [run_at(lr, s) for lr in grid for s in seeds]
        if any(r is None for r in runs):
            return LrChoice(None, grid, widened)
        chosen = choose([r for r in runs if r is not None])
        nxt = next_lr(grid, chosen)
        if nxt is None or len(widened) >= widen:
            return LrChoice(chosen, grid, widened)
        grid.append(nxt)
        widened.append(nxt)
