"""What PROTOCOL.md (version 3) decides, one function per section: which jobs exist, which learning rate wins, and
the learning-rate robustness endpoint (the lr choice's replay is ``studies/lr.py``'s). Nothing here runs a job:
``benchmark.py`` runs what ``needed_jobs`` declares on ``jobs/``, in whatever order and on whatever worker, and
hands the finished jobs back.

A job is one model: ``Job(variant, seed, lr)``, trained on the seed's stream at that lr, then measured on the
validation split (the lr choice) and the test split (the verdicts).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, cast

from ..studies.lr import LrChoice, next_lr, replay_lr_choice
from .benchmark_schema import LrRobustnessRow, LrScore, RetrievalRun, VariantResult
from .config import RetrievalConfig


class Job(NamedTuple):
    variant: str
    seed: int
    lr: float


# ---------------------------------------------------------------------------------------------- "Learning rates"
def lr_scores(runs: Iterable[Mapping[str, Any]]) -> list[LrScore]:
    """Per lr (ascending): the mean over seeds of the validation accuracy and answer loss at the primary condition,
    the lowest validation training-distribution accuracy, and how many of the runs passed the floor (test split)."""
    runs = list(runs)
    out: list[LrScore] = []
    for lr in sorted({r["lr"] for r in runs}):
        rs = [r for r in runs if r["lr"] == lr]
        out.append({"lr": lr, "seeds": sorted(r["seed"] for r in rs),
                    "val_accuracy": statistics.fmean(r["val_accuracy"] for r in rs),
                    "val_loss": statistics.fmean(r["val_loss"] for r in rs),
                    "min_training_distribution": min(r["val_training_distribution"] for r in rs),
                    "passed_floor": sum(not r["failed"] for r in rs)})
    return out


def choose_lr(scores: list[LrScore]) -> float:
    """The pre-registered rule: the highest mean validation accuracy at the primary condition; ties (equal to the
    12th digit) go to the lower mean answer loss, then to the smaller lr."""
    return min(scores, key=lambda s: (-round(s["val_accuracy"], 12), s["val_loss"], s["lr"]))["lr"]


def lr_choice(cfg: RetrievalConfig, variant: str, done: Mapping[Job, Any]) -> LrChoice:
    """A variant's choice: the highest seed-mean validation accuracy (``choose_lr``) over its grid, widened.
    ``done``: the finished jobs (``RetrievalRun``s)."""
    return replay_lr_choice(cfg.lr_grid, cfg.lr_widen, cfg.test_seeds, lambda lr, s: done.get(Job(variant, s, lr)),
                            lambda runs: choose_lr(lr_scores(runs)))


# ---------------------------------------------------------------------------------------------- the jobs
def needed_jobs(cfg: RetrievalConfig, done: Mapping[Job, Any]) -> tuple[list[Job], bool]:
    """Every job the protocol asks for, given the finished ones, and whether that list is final (every lr settled).

    The grid on every test seed for every variant; a widened value once a variant's grid is in; the matched lr (the
    ``matched_lr`` variant's choice) for every variant once it is settled, when it lies outside their grids."""
    jobs: list[Job] = []
    choices = {v: lr_choice(cfg, v, done) for v in cfg.variants}
    for v, c in choices.items():
        jobs += [Job(v, s, lr) for lr in c.grid for s in cfg.test_seeds]
    matched = choices[cfg.matched_lr].lr
    if matched is not None:
        for v in cfg.variants:
            jobs += [Job(v, s, matched) for s in cfg.test_seeds]
    final = all(c.lr is not None for c in choices.values())
    return list(dict.fromkeys(jobs)), final


# ---------------------------------------------------------------------------------------------- "Endpoints"
def lr_robustness(cfg: RetrievalConfig, variant: str, done: Mapping[Job, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Secondary 4, per test seed: the mean over the pre-registered grid (``cfg.lr_grid``; widened values excluded,
    so every variant is measured on the same lrs) of the test accuracy at the primary condition, and how many of the
    seed's grid runs passed the floor. Shaped like a run ({'seed', 'conditions': {primary: {'accuracy',
    'n_queries'}}}) so the report judges it as it judges the primary endpoint."""
    out: list[dict[str, Any]] = []  # LrRobustnessRow's (the diagnostic reads them as plain dicts too)
    for s in cfg.test_seeds:
        rs = [done[Job(variant, s, lr)] for lr in cfg.lr_grid]
        acc = statistics.fmean(r["conditions"][cfg.primary]["accuracy"] for r in rs)
        n = rs[0]["conditions"][cfg.primary]["n_queries"]
        out.append({"seed": s, "lrs": list(cfg.lr_grid), "conditions": {cfg.primary: {"accuracy": acc, "n_queries": n}},
                    "passed_floor": sum(not r["failed"] for r in rs), "failed": False})
    return out


def assemble(cfg: RetrievalConfig, done: dict[Job, RetrievalRun]) -> dict[str, VariantResult]:
    """results.json's per-variant part from the finished jobs: the choice, the runs under each policy, every grid
    run, the robustness endpoint's per-seed values."""
    choices = {v: lr_choice(cfg, v, done) for v in cfg.variants}
    matched = choices[cfg.matched_lr].lr
    assert matched is not None, "assemble before every choice"
    S = cfg.test_seeds
    out: dict[str, VariantResult] = {}
    for v, c in choices.items():
        assert c.lr is not None, "assemble before every choice"
        grid_runs = sorted((r for j, r in done.items() if j.variant == v), key=lambda r: (r["lr"], r["seed"]))
        out[v] = {
            "params": grid_runs[0]["params"],
            "tuned_lr": c.lr, "chosen_lr": c.lr,
            "lr_grid": lr_scores(r for r in grid_runs if r["lr"] in c.grid), "widened": c.widened,
            "at_edge": next_lr(c.grid, c.lr) is not None,
            "runs": [done[Job(v, s, c.lr)] for s in S],
            "matched_runs": [done[Job(v, s, matched)] for s in S],
            "lr_robustness": cast(list[LrRobustnessRow], lr_robustness(cfg, v, done)),
            "floor_pass_share": statistics.fmean(not done[Job(v, s, lr)]["failed"] for lr in cfg.lr_grid for s in S),
            "grid_runs": grid_runs,
        }
    return out

