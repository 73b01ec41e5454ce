"""``run_benchmark``: the pre-registered protocol (``PROTOCOL.md``, version 3) into one results dict.

``protocol.py`` declares the jobs (every variant x lr of the grid x test seed; a widened lr once a variant's grid
is in; the matched lr where a variant lacks it) and decides the learning rates and the robustness endpoint; the job
runner (``difftransformer.jobs``) runs them on the local pool or a Ray cluster, journals each one in
``OUT/jobs.jsonl`` and resumes after a kill; a failed job or ``--time-limit`` ends the run (``jobs.Incomplete``)
before any verdict. A job (``_job``) trains one model and measures it on the validation split (the lr choice) and
the test split (the verdicts).

Bitwise reproducible for a seed on one kind of machine: the runner runs every job at one torch thread, under the
configuration's CPU code path, so the numbers do not depend on the process layout, the executor, the machine's
thread count or an interruption.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional, cast

from ..jobs import JobSpec, Journal, RunOptions, device_key, job_key, run_jobs
from ..rundir.files import RESULTS_NAME, RETRIEVAL_JOURNAL
from ..studies.report import protocol_deviations
from ..studies.schema import write_checked
from .benchmark_schema import (
    RETRIEVAL_BENCHMARK,
    RUNS_OF,
    Policy,
    RetrievalResults,
    RetrievalRun,
    TestCondition,
    validate_retrieval_results,
    validate_retrieval_run,
)
from .config import RetrievalConfig
from .protocol import Job, assemble, needed_jobs
from .statistics import verdicts_by_policy

PROTOCOL_VERSION = 3
PROTOCOL = Path(__file__).with_name("PROTOCOL.md")
JOURNAL = RETRIEVAL_JOURNAL


def _job(cfg_d: dict, variant: str, seed: int, lr: float, device: str = "cpu",
         overrides: Optional[dict[str, Any]] = None,
         measure: Optional[Callable[[Any, RetrievalConfig], dict[str, Any]]] = None) -> dict[str, Any]:
    """Train ``variant`` (with ``overrides``: a diagnostic arm's ModelConfig changes) on ``seed`` at ``lr``; the
    validation measures (lr choice) and the test split's (``evaluate_model``), the training curve, the steps at which
    its loss fell below the diagnostic's thresholds and each layer's lambda and head scales (``head_dynamics``), the
    times, and the kernels torch ran; ``measure(model, cfg)``: a study's own measures, added last. On "cuda" every
    tensor the job creates is made on the GPU its process was given (``torch.device`` as the default device)."""
    import contextlib

    import torch

    from ..jobs import check_code_path
    from ..train.distributed import pick_device
    from .evaluate import evaluate_model, head_dynamics, validation
    from .train import train_model
    cfg = RetrievalConfig.from_dict(cfg_d)
    cap = check_code_path(cfg.cpu_code_path)
    dev = pick_device(device, 0)  # the one place a device name becomes a device (the trainer's)
    with torch.device(dev) if dev.type != "cpu" else contextlib.nullcontext():
        r = train_model(cfg, variant, seed, lr, overrides=overrides)
        model = r.pop("model")
        out = {"variant": variant, "seed": seed, "lr": lr, "params": r["params"], "losses": r["losses"],
               "loss_thresholds": r["loss_thresholds"], "final_window_loss": r["final_window_loss"],
               "train_s": r["train_s"], "train_cpu_s": r["train_cpu_s"], "paired_tensors": len(r["copied"]),
               "cpu_capability": cap}
        if dev.type != "cpu":
            out["device"] = torch.cuda.get_device_name(dev)
        t0 = time.perf_counter()
        out.update(validation(model, cfg))
        out.update(evaluate_model(model, cfg))
        out["dynamics"] = head_dynamics(model, cfg)
        if measure is not None:
            out.update(measure(model, cfg))
        out["eval_s"] = time.perf_counter() - t0
    return out


def _load() -> Optional[list[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def journal_header(cfg: RetrievalConfig, kind: str = "benchmark") -> dict[str, Any]:
    return {"benchmark": f"kv_retrieval {kind}", "protocol_version": PROTOCOL_VERSION, "config": cfg.to_dict()}


def job_description(cfg_d: dict[str, Any], job: tuple, device: str = "cpu") -> dict[str, Any]:
    """Everything that determines one job's numbers: the configuration's fields that shape a model, its training
    and its measurement (not which jobs exist: seeds, grid, widening, variants, matched lr), the job, the code
    path, the protocol version, and on a GPU the device and precision (``jobs.device_key``; nothing for the CPU,
    whose keys are those of before)."""
    selection = {"seeds", "seed_base", "lr_grid", "lr_widen", "variants", "matched_lr", "sweep_widths"}
    return {"config": {k: v for k, v in cfg_d.items() if k not in selection}, "job": list(job),
            "protocol_version": PROTOCOL_VERSION, **device_key(device)}


def check_fits(cfg: RetrievalConfig, device: str = "cpu") -> None:
    """Refuse, before the first job, a configuration whose every job would fail on the machine: a model (of any
    variant) whose weights, gradients and AdamW states alone exceed the device's memory, e.g. a key vocabulary
    (``--n-keys``; the vocabulary holds n_keys * n_values fact tokens) too large to allocate. One line, exit 2."""
    from ..jobs.codepath import check_device
    from ..model import variants as registry
    from ..train.distributed import DistInfo, pick_device
    from ..train.trainer import check_fits_memory
    from .train import model_config
    check_device(device)  # "cuda" without a GPU: the runner's own line, before the device is asked its memory
    info = DistInfo(device=pick_device(device, 0))
    for v in cfg.variants:
        if v in registry.names():
            check_fits_memory(model_config(cfg, v), info, "ddp",
                              lower=f"--n-keys ({cfg.n_keys:,}: a vocabulary of {cfg.layout.vocab_size:,} tokens) "
                                    "or --d-model")


def job_spec(cfg: RetrievalConfig, device: str = "cpu") -> JobSpec[Job]:
    """The benchmark's jobs as the runner takes them: what the protocol needs, ``_job``, the key."""
    cfg_d = cfg.to_dict()
    return JobSpec(needed=lambda d: needed_jobs(cfg, d), run=_job,
                   args=lambda j: (cfg_d, j.variant, j.seed, j.lr, device),
                   key=lambda j: job_key(job_description(cfg_d, tuple(j), device)), code_path=cfg.cpu_code_path,
                   desc="retrieval benchmark (jobs)")


def run_benchmark(cfg: RetrievalConfig, out_dir: Optional[str | Path] = None, workers: int = 2,
                  progress: bool = True, quick: bool = False, options: Optional[RunOptions] = None
                  ) -> dict[str, Any]:
    """Every job of the protocol (resuming from ``out_dir/jobs.jsonl``), then results.json and the plots; returns
    results.json's dict, a ``RetrievalResults`` (given as a plain dict while ``retrieval/cli.py``'s ``format_table``
    and ``demo.py`` take one).

    ``options``: how the jobs run (default: ``workers`` local processes, ``progress``). Without ``out_dir`` the
    journal lives in a temporary directory (nothing to resume)."""
    import tempfile
    options = options or RunOptions(workers=workers, progress=progress)
    check_fits(cfg, options.device)  # a model no job could allocate: refused before the first job
    t0, load0 = time.perf_counter(), _load()
    cfg_d = cfg.to_dict()
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal(Path(out_dir or tmp) / JOURNAL, {**journal_header(cfg), "quick": quick},
                          validate_retrieval_run)  # every record a RetrievalRun
        done, ran = run_jobs(job_spec(cfg, options.device), journal, options)
    runs = {Job(*j): cast(RetrievalRun, r) for j, r in done.items()}  # what ``_job`` returned, through the journal
    variants = assemble(cfg, runs)
    caps = sorted({r["cpu_capability"] for r in runs.values()})
    results: RetrievalResults = {
        "benchmark": RETRIEVAL_BENCHMARK,
        "protocol": f"PROTOCOL.md (difftransformer/retrieval), version {PROTOCOL_VERSION}",
        "quick": quick,
        "config": cast(Any, cfg_d),  # RetrievalConfig.to_dict(): a RetrievalConfigDict
        "primary_endpoint": {"condition": cfg.primary, "metric": "accuracy",
                             "note": "fixed in PROTOCOL.md before any run; per-seed values under variants.*.runs"},
        "chance": 1.0 / cfg.n_values,
        "matched_lr": variants[cfg.matched_lr]["tuned_lr"],
        "deviations": protocol_deviations(PROTOCOL),
        "conditions": [cast(TestCondition, {**c.to_dict(), "inside_trained_lengths": c.context <= cfg.train_context[1]})
                       for c in cfg.conditions],
        "variants": variants,
        "cpu": {"code_path": cfg.cpu_code_path, "torch_kernels": caps},
        "timings": {"wall_s": time.perf_counter() - t0, "workers": options.workers, **options.describe(),
                    "jobs": len(runs), "jobs_run": ran,
                    "train_s_per_job": {v: statistics.fmean(r["train_s"] for r in x["grid_runs"])
                                        for v, x in variants.items()},
                    "loadavg_before": load0, "loadavg_after": _load(), "cpu_count": os.cpu_count()},
    }
    results["verdicts"] = verdicts_by_policy(results)  # PROTOCOL.md's "Statistics": the rows the report draws
    if out_dir is not None:
        write_outputs(results, out_dir)
    return cast(dict[str, Any], results)


def write_outputs(results: RetrievalResults, out_dir: str | Path) -> list[Path]:

    from .plots import plot_all
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_checked(out / RESULTS_NAME, results, validate_retrieval_results)  # the schema the readers take
    return [out / RESULTS_NAME, *plot_all(results, out)]


def seed_values(results: Mapping[str, Any], variant: str, condition: str, policy: str = "runs") -> list[float]:
    """Per-seed accuracies at ``condition``, seed order, from ``policy`` ("runs": tuned lr, "matched_runs") of a
    ``RetrievalResults``."""
    res = cast(RetrievalResults, results)
    return [r["conditions"][condition]["accuracy"] for r in res["variants"][variant][RUNS_OF[cast(Policy, policy)]]]


def mean_spread(xs: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one seed)."""
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


