"""``run_benchmark``: lr grid, seeds, variants, in worker processes (one torch thread each), into one results dict.

Order of work: (A) the lr grid on ``lr_search_seed`` only, every variant, scored on the validation split (held-out
generator seed); (B) the chosen lr's seed-``lr_search_seed`` model is evaluated, and the other seeds train at the
chosen lr and are evaluated in the same job. Every job is independent, so (A) and (B) each fill all workers.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Optional

import multiprocessing as mp

from .config import RetrievalConfig


def _threads() -> None:
    import torch
    torch.set_num_threads(1)  # 2 shared cores: one thread per worker, the workers give the parallelism


def _train_job(cfg_d: dict, variant: str, seed: int, lr: float, evaluate: bool) -> dict[str, Any]:
    _threads()
    from .evaluate import evaluate_model, validation
    from .train import train_model
    cfg = RetrievalConfig.from_dict(cfg_d)
    r = train_model(cfg, variant, seed, lr)
    model = r.pop("model")
    out = {"variant": variant, "seed": seed, "lr": lr, "params": r["params"], "losses": r["losses"],
           "train_s": r["train_s"], "train_cpu_s": r["train_cpu_s"], "paired_tensors": len(r["copied"]),
           **validation(model, cfg)}
    if evaluate:
        t0 = time.perf_counter()
        out.update(evaluate_model(model, cfg))
        out["eval_s"] = time.perf_counter() - t0
    else:
        out["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


def _eval_job(cfg_d: dict, variant: str, state: dict) -> dict[str, Any]:
    _threads()
    from .evaluate import evaluate_model
    from .train import build_paired
    cfg = RetrievalConfig.from_dict(cfg_d)
    model, _ = build_paired(cfg, variant, 0)
    model.load_state_dict(state)
    t0 = time.perf_counter()
    out = evaluate_model(model, cfg)
    out["eval_s"] = time.perf_counter() - t0
    return out


class _Inline:
    """workers=1: run jobs in this process (tests, debugging), same interface as the executor."""

    def submit(self, fn, *a):
        from concurrent.futures import Future
        f = Future()
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


def choose_lr(grid_runs: list[dict[str, Any]]) -> float:
    """Lowest validation answer loss (accuracy saturates at the training condition); ties: the smaller lr."""
    return min(grid_runs, key=lambda r: (r["val_loss"], r["lr"]))["lr"]


def run_benchmark(cfg: RetrievalConfig, out_dir: Optional[str | Path] = None, workers: int = 2,
                  progress: bool = True, quick: bool = False) -> dict[str, Any]:
    """Train and evaluate every variant x seed (lr grid on one seed); write results.json and plots to out_dir."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    from tqdm import tqdm
    t0, load0 = time.perf_counter(), _load()
    cfg_d = cfg.to_dict()
    s0 = cfg.lr_search_seed
    n_jobs = len(cfg.variants) * (len(cfg.lr_grid) + cfg.seeds)
    bar = tqdm(total=n_jobs, desc="retrieval benchmark (jobs)", disable=not progress)
    variants: dict[str, Any] = {v: {"lr_grid": [], "runs": []} for v in cfg.variants}
    pool = (ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) if workers > 1 else _Inline())
    with pool as ex:
        # (A) the lr grid on one seed
        futs = [ex.submit(_train_job, cfg_d, v, s0, lr, False) for v in cfg.variants for lr in cfg.lr_grid]
        states = {}
        for f in as_completed(futs):
            r = f.result()
            states[(r["variant"], r["lr"])] = r.pop("state")
            variants[r["variant"]]["lr_grid"].append(r)
            bar.update(1)
        # (B) evaluate the chosen seed-s0 models; the other seeds train at the chosen lr and evaluate
        jobs = {}
        for v in cfg.variants:
            grid = sorted(variants[v]["lr_grid"], key=lambda r: r["lr"])
            variants[v]["lr_grid"] = grid
            lr = variants[v]["chosen_lr"] = choose_lr(grid)
            variants[v]["params"] = grid[0]["params"]
            jobs[ex.submit(_eval_job, cfg_d, v, states[(v, lr)])] = (v, next(r for r in grid if r["lr"] == lr))
            for s in range(cfg.seeds):
                if s != s0:
                    jobs[ex.submit(_train_job, cfg_d, v, s, lr, True)] = (v, None)
        for f in as_completed(jobs):
            v, grid_run = jobs[f]
            r = f.result()
            if grid_run is not None:
                r = {**grid_run, **r}
            variants[v]["runs"].append(r)
            bar.update(1)
    bar.update(n_jobs - bar.n)
    bar.close()
    for v in cfg.variants:
        variants[v]["runs"].sort(key=lambda r: r["seed"])
    results = {
        "benchmark": "kv_retrieval",
        "quick": quick,
        "config": cfg_d,
        "primary_endpoint": {"condition": cfg.primary, "metric": "accuracy",
                             "note": "fixed in the config before any run; per-seed values under variants.*.runs"},
        "chance": 1.0 / cfg.n_values,
        "conditions": [{**c.to_dict(), "pairs": cfg.n_pairs * c.pairs_mult, "filler": cfg.filler * c.filler_mult}
                       for c in cfg.conditions],
        "variants": variants,
        "timings": {"wall_s": time.perf_counter() - t0, "workers": workers, "loadavg_before": load0,
                    "loadavg_after": _load(), "cpu_count": os.cpu_count()},
    }
    if out_dir is not None:
        write_outputs(results, out_dir)
    return results


def write_outputs(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    import json
    from .plots import plot_all
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return [out / "results.json", *plot_all(results, out)]


def seed_values(results: dict[str, Any], variant: str, condition: str, key: str = "accuracy") -> list[float]:
    """Per-seed values of ``key`` at ``condition``, seed order (the t-intervals over seeds are computed elsewhere)."""
    return [r["conditions"][condition][key] for r in results["variants"][variant]["runs"]]


def mean_spread(xs: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one seed)."""
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def layer_mean(run: dict[str, Any], condition: str, key: str) -> float:
    """A share averaged over layers (per-layer values stay in the results)."""
    return statistics.fmean(l[key] for l in run["conditions"][condition]["attention"])


def retrieval_layer_value(run: dict[str, Any], condition: str, key: str) -> float:
    """``key`` in the run's retrieval layer: the layer with the highest answer share at ``condition``."""
    att = run["conditions"][condition]["attention"]
    return max(att, key=lambda l: l["answer_share"])[key]
