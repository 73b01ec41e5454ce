"""``run_benchmark``: the pre-registered protocol (``PROTOCOL.md``, version 3) into one results dict.

``protocol.py`` declares the jobs (every variant x lr of the grid x test seed; a widened lr once a variant's grid
is in; the matched lr where a variant lacks it) and decides the learning rates and the robustness endpoint;
``scheduler.py`` runs the jobs in worker processes, journals each one in ``OUT/jobs.jsonl`` and resumes after a
kill. A job (``_job``) trains one model and measures it on the validation split (the lr choice) and the test split
(the verdicts).

Bitwise reproducible for a seed on one machine: every job runs with one torch thread (``_job_threads``), in a
worker process or in this one, under the configuration's CPU code path, so the numbers do not depend on the
process layout, the machine's thread count or an interruption.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from .config import RetrievalConfig
from .protocol import Job, assemble, needed_jobs
from .scheduler import JOURNAL, Journal, job_key, run_jobs

PROTOCOL_VERSION = 3


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


def _job(cfg_d: dict, variant: str, seed: int, lr: float) -> dict[str, Any]:
    """Train ``variant`` on ``seed`` at ``lr``; the validation measures (lr choice) and the test split's
    (``evaluate_model``), the training curve and times, and the kernels torch ran."""
    with _job_threads():
        from .evaluate import evaluate_model, validation
        from .scheduler import check_code_path
        from .train import train_model
        cfg = RetrievalConfig.from_dict(cfg_d)
        cap = check_code_path(cfg.cpu_code_path)
        r = train_model(cfg, variant, seed, lr)
        model = r.pop("model")
        out = {"variant": variant, "seed": seed, "lr": lr, "params": r["params"], "losses": r["losses"],
               "train_s": r["train_s"], "train_cpu_s": r["train_cpu_s"], "paired_tensors": len(r["copied"]),
               "cpu_capability": cap}
        t0 = time.perf_counter()
        out.update(validation(model, cfg))
        out.update(evaluate_model(model, cfg))
        out["eval_s"] = time.perf_counter() - t0
        return out


def _load() -> Optional[list[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def protocol_deviations(path: Optional[Path] = None) -> list[str]:
    """The "Deviations" section of a PROTOCOL.md (default: the one beside this module), one string per bullet
    (dated, with the reason): results carry them so that the report page says what changed after results were seen."""
    path = Path(__file__).with_name("PROTOCOL.md") if path is None else path
    if not path.is_file():
        return ["PROTOCOL.md is missing beside the benchmark: its deviations cannot be listed"]
    text = path.read_text().split("## Deviations", 1)[-1]
    bullets = [b.strip() for b in ("\n" + text).split("\n- ")[1:]]
    return [" ".join(b.replace("**", "").split()) for b in bullets]


def journal_header(cfg: RetrievalConfig, kind: str = "benchmark") -> dict[str, Any]:
    return {"benchmark": f"kv_retrieval {kind}", "protocol_version": PROTOCOL_VERSION, "config": cfg.to_dict()}


def job_description(cfg_d: dict[str, Any], job: tuple) -> dict[str, Any]:
    """Everything that determines one job's numbers: the configuration's fields that shape a model, its training
    and its measurement (not which jobs exist: seeds, grid, widening, variants, matched lr), the job, the code
    path, the protocol version."""
    selection = {"seeds", "seed_base", "lr_grid", "lr_widen", "variants", "matched_lr", "sweep_widths"}
    return {"config": {k: v for k, v in cfg_d.items() if k not in selection}, "job": list(job),
            "protocol_version": PROTOCOL_VERSION}


def run_benchmark(cfg: RetrievalConfig, out_dir: Optional[str | Path] = None, workers: int = 2,
                  progress: bool = True, quick: bool = False) -> dict[str, Any]:
    """Every job of the protocol (resuming from ``out_dir/jobs.jsonl``), then results.json and the plots.

    Without ``out_dir`` the journal lives in a temporary directory (nothing to resume)."""
    import tempfile
    t0, load0 = time.perf_counter(), _load()
    cfg_d = cfg.to_dict()
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal(Path(out_dir or tmp) / JOURNAL, {**journal_header(cfg), "quick": quick})
        done, ran = run_jobs(lambda d: needed_jobs(cfg, d), _job, lambda j: (cfg_d, j.variant, j.seed, j.lr),
                             lambda j: job_key(job_description(cfg_d, tuple(j))), journal, workers,
                             cfg.cpu_code_path, progress, desc="retrieval benchmark (jobs)")
    done = {Job(*j): r for j, r in done.items()}
    variants = assemble(cfg, done)
    caps = sorted({r["cpu_capability"] for r in done.values()})
    results = {
        "benchmark": "kv_retrieval",
        "protocol": f"PROTOCOL.md (difftransformer/retrieval), version {PROTOCOL_VERSION}",
        "quick": quick,
        "config": cfg_d,
        "primary_endpoint": {"condition": cfg.primary, "metric": "accuracy",
                             "note": "fixed in PROTOCOL.md before any run; per-seed values under variants.*.runs"},
        "chance": 1.0 / cfg.n_values,
        "matched_lr": variants[cfg.matched_lr]["tuned_lr"],
        "deviations": protocol_deviations(),
        "conditions": [{**c.to_dict(), "inside_trained_lengths": c.context <= cfg.train_context[1]}
                       for c in cfg.conditions],
        "variants": variants,
        "cpu": {"code_path": cfg.cpu_code_path, "torch_kernels": caps},
        "timings": {"wall_s": time.perf_counter() - t0, "workers": workers, "jobs": len(done), "jobs_run": ran,
                    "train_s_per_job": {v: statistics.fmean(r["train_s"] for r in x["grid_runs"])
                                        for v, x in variants.items()},
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


