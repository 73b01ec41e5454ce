"""``run_benchmark``: the pre-registered protocol (``PROTOCOL.md``) in worker processes, into one results dict.

Order of work, every job independent (a job trains one model and measures it):
(A) tuning: every variant x lr of its grid x tuning seed, scored on the validation split at the primary condition;
    a variant whose best lr sits at an edge of its grid gets the next value past that edge (up to ``lr_widen``
    times) before its lr is settled;
(B) test: every variant x test seed at its tuned lr (the primary analysis) and at the matched lr (``matched_lr``
    variant's tuned lr: the sensitivity row), evaluated on the test split. A job asked for twice (a variant whose
    tuned lr is the matched one) runs once.
Test jobs start as soon as the lr they need is settled, so the workers stay busy.

Bitwise reproducible for a seed: every job runs with one torch thread (``_job_threads``), in a worker process or
in this one (``workers=1``), so the numbers do not depend on the process layout or on the machine's thread count.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from ..model import variants as registry
from .config import RetrievalConfig


@contextmanager
def _job_threads() -> Iterator[None]:
    """One torch thread for the job (restored after): the same reduction order whatever the process layout."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _job(cfg_d: dict, variant: str, seed: int, lr: float, test: bool) -> dict[str, Any]:
    """Train ``variant`` on ``seed`` at ``lr``; tuning jobs return the validation measures, test jobs the test
    split's (``evaluate_model``)."""
    with _job_threads():
        from .evaluate import evaluate_model, validation
        from .train import train_model
        cfg = RetrievalConfig.from_dict(cfg_d)
        r = train_model(cfg, variant, seed, lr)
        model = r.pop("model")
        out = {"variant": variant, "seed": seed, "lr": lr, "params": r["params"], "losses": r["losses"],
               "train_s": r["train_s"], "train_cpu_s": r["train_cpu_s"], "paired_tensors": len(r["copied"])}
        t0 = time.perf_counter()
        out.update(evaluate_model(model, cfg) if test else validation(model, cfg))
        out["eval_s"] = time.perf_counter() - t0
        return out


class _Inline:
    """workers=1: run jobs in this process (tests, debugging), same interface as the executor."""

    def submit(self, fn, *a):
        f: Future = Future()
        f.set_result(fn(*a))
        return f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _load() -> Optional[list[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def protocol_deviations() -> list[str]:
    """The "Deviations" section of PROTOCOL.md beside this module, one string per bullet (dated, with the reason):
    results.json carries them so that the report page says what changed after results were seen."""
    path = Path(__file__).with_name("PROTOCOL.md")
    if not path.is_file():
        return ["PROTOCOL.md is missing beside the benchmark: its deviations cannot be listed"]
    text = path.read_text().split("## Deviations", 1)[-1]
    bullets = [b.strip() for b in ("\n" + text).split("\n- ")[1:]]
    return [" ".join(b.replace("**", "").split()) for b in bullets]


def lr_scores(tuning_runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per lr (ascending): the mean over tuning seeds of the validation accuracy and answer loss at the primary
    condition, and the lowest training-distribution accuracy (a floor check)."""
    out = []
    for lr in sorted({r["lr"] for r in tuning_runs}):
        rs = [r for r in tuning_runs if r["lr"] == lr]
        out.append({"lr": lr, "seeds": sorted(r["seed"] for r in rs),
                    "val_accuracy": statistics.fmean(r["val_accuracy"] for r in rs),
                    "val_loss": statistics.fmean(r["val_loss"] for r in rs),
                    "min_training_distribution": min(r["val_training_distribution"] for r in rs)})
    return out


def choose_lr(scores: list[dict[str, Any]]) -> float:
    """The pre-registered rule: the highest mean validation accuracy at the primary condition; ties (equal to the
    last digit) go to the lower mean answer loss, then to the smaller lr."""
    return min(scores, key=lambda s: (-round(s["val_accuracy"], 12), s["val_loss"], s["lr"]))["lr"]


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


def run_benchmark(cfg: RetrievalConfig, out_dir: Optional[str | Path] = None, workers: int = 2,
                  progress: bool = True, quick: bool = False) -> dict[str, Any]:
    """Tune, train and evaluate every variant x seed under both lr policies; write results.json and plots."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    from tqdm import tqdm
    t0, load0 = time.perf_counter(), _load()
    cfg_d = cfg.to_dict()
    V, S = cfg.variants, cfg.test_seeds
    bar = tqdm(total=len(V) * len(cfg.lr_grid) * len(cfg.tuning_seeds) + 2 * len(V) * len(S),
               desc="retrieval benchmark (jobs)", disable=not progress)
    tuning: dict[str, list] = {v: [] for v in V}
    grid: dict[str, list[float]] = {v: list(cfg.lr_grid) for v in V}
    widened: dict[str, list[float]] = {v: [] for v in V}
    tuned: dict[str, float] = {}
    test: dict[tuple[str, int, float], dict] = {}
    pending: dict[Future, tuple] = {}
    asked: set = set()
    pool = (ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=registry.adopt,
                                initargs=(registry.variants(),)) if workers > 1 else _Inline())

    def submit(ex, kind: str, v: str, s: int, lr: float) -> None:
        key = (kind, v, s, lr)
        if key not in asked:
            asked.add(key)
            pending[ex.submit(_job, cfg_d, v, s, lr, kind == "test")] = key

    def settle(ex, v: str) -> None:
        """All of v's tuning jobs are in: widen its grid or settle its lr and start its test jobs."""
        lr = choose_lr(lr_scores(tuning[v]))
        nxt = next_lr(grid[v], lr)
        if nxt is not None and len(widened[v]) < cfg.lr_widen:
            grid[v].append(nxt)
            widened[v].append(nxt)
            bar.total += len(cfg.tuning_seeds)
            for s in cfg.tuning_seeds:
                submit(ex, "tune", v, s, nxt)
            return
        tuned[v] = lr
        for s in S:
            submit(ex, "test", v, s, lr)
        if v == cfg.matched_lr:
            for w in V:
                for s in S:
                    submit(ex, "test", w, s, lr)
        elif cfg.matched_lr in tuned:
            for s in S:
                submit(ex, "test", v, s, tuned[cfg.matched_lr])

    with pool as ex:
        for v in V:
            for lr in cfg.lr_grid:
                for s in cfg.tuning_seeds:
                    submit(ex, "tune", v, s, lr)
        while pending:
            done = [f for f in pending if f.done()] or list(wait(list(pending), return_when=FIRST_COMPLETED)[0])
            for f in done:
                kind, v, s, lr = pending.pop(f)
                r = f.result()
                bar.update(1)
                if kind == "tune":
                    tuning[v].append(r)
                    if not any(k[0] == "tune" and k[1] == v for k in pending.values()):
                        settle(ex, v)
                else:
                    test[(v, s, lr)] = r
    bar.total = bar.n
    bar.close()
    matched = tuned[cfg.matched_lr]
    variants: dict[str, Any] = {}
    for v in V:
        scores = lr_scores(tuning[v])
        edge = next_lr(grid[v], tuned[v]) is not None
        variants[v] = {
            "params": tuning[v][0]["params"],
            "tuned_lr": tuned[v], "chosen_lr": tuned[v],
            "lr_grid": scores, "widened": widened[v], "at_edge": edge,
            "tuning_runs": sorted(tuning[v], key=lambda r: (r["lr"], r["seed"])),
            "runs": [test[(v, s, tuned[v])] for s in S],
            "matched_runs": [test[(v, s, matched)] for s in S],
        }
    results = {
        "benchmark": "kv_retrieval",
        "protocol": "PROTOCOL.md (difftransformer/retrieval), version 2",
        "quick": quick,
        "config": cfg_d,
        "primary_endpoint": {"condition": cfg.primary, "metric": "accuracy",
                             "note": "fixed in PROTOCOL.md before any run; per-seed values under variants.*.runs"},
        "chance": 1.0 / cfg.n_values,
        "matched_lr": matched,
        "deviations": protocol_deviations(),
        "conditions": [{**c.to_dict(), "inside_trained_lengths": c.context <= cfg.train_context[1]}
                       for c in cfg.conditions],
        "variants": variants,
        "timings": {"wall_s": time.perf_counter() - t0, "workers": workers, "jobs": len(asked),
                    "loadavg_before": load0, "loadavg_after": _load(), "cpu_count": os.cpu_count()},
    }
    if out_dir is not None:
        write_outputs(results, out_dir)
    return results


def write_outputs(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    import json

    from ..fileio import atomic_write
    from .plots import plot_all
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "results.json", json.dumps(results, indent=1) + "\n")
    return [out / "results.json", *plot_all(results, out)]


def seed_values(results: dict[str, Any], variant: str, condition: str, key: str = "accuracy",
                policy: str = "runs") -> list[float]:
    """Per-seed values of ``key`` at ``condition``, seed order, from ``policy`` ("runs": tuned lr, "matched_runs")."""
    return [r["conditions"][condition][key] for r in results["variants"][variant][policy]]


def mean_spread(xs: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one seed)."""
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


