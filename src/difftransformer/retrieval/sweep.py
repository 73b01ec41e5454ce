"""``difftransformer retrieval --sweep-width W1,W2,...``: the paper's scaling claim (Fig. 3) at our scale.

Every variant x test seed is trained at every width (``d_model``; heads, layers and the task as in the config) at
every value of the lr grid (no widening), and measured like a benchmark job (``benchmark._job``). Each variant takes
its lr PER WIDTH by the pre-registered rule (``protocol.choose_lr``: the mean validation accuracy at the primary
condition over the seeds). Then, per variant, ``logit(accuracy) = a + b * log(parameters)`` is fitted to the seed
means of the test accuracy at the chosen lrs (least squares; accuracies clipped to [0.5/n, 1 - 0.5/n] for n scored
queries). The claim's measure: the parameters DIFF needs for the accuracy the baseline reaches at the config's
default width (its fitted value there), over the baseline's parameters at that width -- below 1: DIFF reaches the
baseline's accuracy with fewer parameters. The interval: a paired bootstrap over seeds (the same resampled seeds for
every variant and width, the lr choices held fixed, 2000 draws, fixed generator), percentile 95%. A draw whose
fitted slope is not positive (at most 1e-6: flat) has no ratio; more than 5% of such draws: inconclusive.
Pre-registered in PROTOCOL.md ("The scaling sweep"). Jobs are journaled in ``OUT/sweep-jobs.jsonl`` (resumable;
run by ``difftransformer.jobs``, on the local pool or a Ray cluster).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..jobs import JobSpec, Journal, RunOptions, job_key, run_jobs
from ..model import variants as registry
from ..rundir.files import SWEEP_RESULTS_NAME, WIDTH_SWEEP_JOURNAL, WIDTH_SWEEP_PNG
from .benchmark_schema import validate_retrieval_run
from .config import RetrievalConfig

MIN_SLOPE = 1e-6  # a fitted slope at or below this is flat (saturated or untrained curves): no ratio
SWEEP_JOURNAL = WIDTH_SWEEP_JOURNAL


def fit_logit(params: Sequence[float], accs: Sequence[float], n: int) -> tuple[float, float]:
    """(a, b) of logit(acc) = a + b log(params), least squares over the widths."""
    p = np.clip(np.asarray(accs, dtype=float), 0.5 / n, 1 - 0.5 / n)
    y, x = np.log(p / (1 - p)), np.log(np.asarray(params, dtype=float))
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def params_at(a: float, b: float, acc: float, n: int) -> float:
    """Parameters at which the fitted curve reaches ``acc`` (nan when the slope is not positive)."""
    if not b > MIN_SLOPE:
        return math.nan
    p = min(max(acc, 0.5 / n), 1 - 0.5 / n)
    z = (math.log(p / (1 - p)) - a) / b
    return math.exp(z) if z < 700 else math.inf  # past float range: no finite parameter count reaches it


def param_ratio(params: dict[str, list[int]], acc: dict[str, np.ndarray], variant: str, ref_params: float,
                n: int) -> float:
    """DIFF's parameters at the baseline's fitted accuracy at ``ref_params``, over ``ref_params``. ``acc[v]``:
    (widths, seeds)."""
    base = registry.reference().name
    ab, bb = fit_logit(params[base], acc[base].mean(1), n)
    if not bb > MIN_SLOPE:
        return math.nan
    target = 1 / (1 + math.exp(-(ab + bb * math.log(ref_params))))
    ad, bd = fit_logit(params[variant], acc[variant].mean(1), n)
    return params_at(ad, bd, target, n) / ref_params


def analyse(res: dict[str, Any], default_width: int) -> dict[str, Any]:
    """The fitted curves, the ratio per DIFF variant with its bootstrap interval and the verdict."""
    from ..eval import stats
    widths = res["widths"]
    V = list(res["params"])
    n = res["n_queries"]
    acc = {v: np.array(res["accuracy"][v], dtype=float) for v in V}  # (widths, seeds)
    params = res["params"]
    base = registry.reference().name
    ref = (params[base][widths.index(default_width)] if default_width in widths
           else math.exp(np.mean(np.log(params[base]))))
    out: dict[str, Any] = {"reference_params": ref, "fits": {v: fit_logit(params[v], acc[v].mean(1), n) for v in V},
                           "ratios": {}}
    rng = np.random.default_rng(0)
    S = acc[base].shape[1]
    draws = rng.integers(0, S, size=(stats.BOOT_DRAWS, S))
    for v in V:
        if v == base:
            continue
        est = param_ratio(params, acc, v, ref, n)
        boot = np.array([param_ratio(params, {w: acc[w][:, idx] for w in V}, v, ref, n) for idx in draws])
        ok = boot[np.isfinite(boot) & (boot > 0)]
        undefined = 1 - ok.size / stats.BOOT_DRAWS
        lo, hi = stats.percentile_interval(ok, "linear")  # PROTOCOL.md, "The scaling sweep"
        if not math.isfinite(est) or undefined > stats.BOOT_MAX_UNDEFINED or S < 2:
            verdict = stats.INCONCLUSIVE
            why = (f"the fitted accuracy-vs-parameters slope is not positive in {undefined:.0%} of the bootstrap "
                   "draws (or in the estimate): no parameter ratio at this scale")
        elif hi < 1:
            verdict, why = stats.HELD, "the whole ratio interval is below 1"
        elif lo > 1:
            verdict, why = stats.NOT_HELD, "the whole ratio interval is above 1"
        else:
            verdict, why = stats.INCONCLUSIVE, "the ratio interval includes 1"
        out["ratios"][v] = {"estimate": est, "ci": [lo, hi], "undefined_share": undefined, "n_boot": stats.BOOT_DRAWS,
                            "seeds": S, "verdict": verdict, "why": why}
    return out


def run_sweep(cfg: RetrievalConfig, widths: Sequence[int], out_dir: Optional[str | Path] = None, workers: int = 2,
              progress: bool = True, reuse: Optional[str | Path] = None, options: Optional[RunOptions] = None
              ) -> dict[str, Any]:
    """Train every width x variant x lr x test seed (resuming from ``out_dir/sweep-jobs.jsonl``), choose each
    variant's lr per width, fit and bootstrap; write sweep.json and sweep.png. ``reuse``: another run's journal
    (e.g. the benchmark's ``jobs.jsonl``, whose jobs are the sweep's at the default width) whose jobs are read
    instead of run where their keys match. ``options``: how the jobs run (default: ``workers`` local processes)."""
    if len(widths) < 2 or len(set(widths)) != len(widths):
        raise ValueError(f"--sweep-width needs at least two distinct widths, got {list(widths)}")
    if registry.reference().name not in cfg.variants or len(cfg.variants) < 2:
        raise ValueError("the sweep compares DIFF with the baseline: --variants must include baseline and a DIFF one")
    cfgs = {w: cfg.replace(d_model=w) for w in widths}  # validates every width (even head width, divisible)
    import tempfile

    from .benchmark import PROTOCOL_VERSION, _job, check_fits, job_description
    from .protocol import choose_lr, lr_scores
    options = options or RunOptions(workers=workers, progress=progress)
    dev = options.device
    check_fits(cfgs[max(widths)], dev)  # the widest model no job could allocate: refused before the first job
    t0 = time.perf_counter()
    ws = sorted(widths)
    jobs = [(w, v, s, lr) for w in sorted(widths, reverse=True) for v in cfg.variants for lr in cfg.lr_grid
            for s in cfg.test_seeds]
    dicts = {w: c.to_dict() for w, c in cfgs.items()}
    header = {"benchmark": "kv_retrieval width sweep", "protocol_version": PROTOCOL_VERSION,
              "config": cfg.to_dict(), "widths": ws}
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal(Path(out_dir or tmp) / SWEEP_JOURNAL, header, validate_retrieval_run)
        if reuse is not None:
            try:  # every record of it checked before any is copied, before any job
                journal.reuse_from(Path(reuse))
            except ValueError as e:
                raise ValueError(f"--reuse-jobs: {e}") from None
        spec = JobSpec(needed=lambda done: (jobs, True), run=_job, args=lambda j: (dicts[j[0]], j[1], j[2], j[3], dev),
                       key=lambda j: job_key(job_description(dicts[j[0]], tuple(j[1:]), dev)),
                       code_path=cfg.cpu_code_path, desc="retrieval width sweep (jobs)")
        runs, ran = run_jobs(spec, journal, options)
    S, P = cfg.test_seeds, cfg.primary
    chosen = {v: [choose_lr(lr_scores(runs[(w, v, s, lr)] for lr in cfg.lr_grid for s in S)) for w in ws]
              for v in cfg.variants}
    at = {v: [[runs[(w, v, s, chosen[v][i])] for s in S] for i, w in enumerate(ws)] for v in cfg.variants}
    res: dict[str, Any] = {
        "benchmark": "kv_retrieval_width_sweep", "config": cfg.to_dict(), "widths": ws, "lr_grid": list(cfg.lr_grid),
        "chosen_lr": chosen, "condition": P, "chance": 1.0 / cfg.n_values,
        "n_queries": at[cfg.variants[0]][0][0]["conditions"][P]["n_queries"],
        "params": {v: [at[v][i][0]["params"] for i in range(len(ws))] for v in cfg.variants},
        "accuracy": {v: [[r["conditions"][P]["accuracy"] for r in rs] for rs in at[v]] for v in cfg.variants},
        "failed": {v: [[r["seed"] for r in rs if r["failed"]] for rs in at[v]] for v in cfg.variants},
        "validation": {v: [[{"lr": g["lr"], "val_accuracy": g["val_accuracy"], "passed_floor": g["passed_floor"]}
                            for g in lr_scores(runs[(w, v, s, lr)] for lr in cfg.lr_grid for s in S)] for w in ws]
                       for v in cfg.variants},
        "wall_s": time.perf_counter() - t0, "workers": options.workers, "jobs": len(jobs), "jobs_run": ran,
    }
    res["analysis"] = analyse(res, cfg.d_model)
    if out_dir is not None:
        import json

        from ..fileio import atomic_write
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / SWEEP_RESULTS_NAME, json.dumps(res, indent=1) + "\n")
        plot_sweep(res, out / WIDTH_SWEEP_PNG)
    return res


def plot_sweep(res: dict[str, Any], path) -> Path:
    from ..eval.plotting import color, label
    from ..studies.report import plt, save
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    n = res["n_queries"]
    for v, ps in res["params"].items():
        acc = np.array(res["accuracy"][v])
        ax.errorbar(ps, acc.mean(1), yerr=acc.std(1, ddof=1) if acc.shape[1] > 1 else None, marker="o", capsize=3,
                    ls="none", label=label(v), color=color(v))
        a, b = res["analysis"]["fits"][v]
        xs = np.geomspace(min(ps), max(ps), 50)
        ax.plot(xs, 1 / (1 + np.exp(-(a + b * np.log(xs)))), color=color(v), lw=1)
    ax.axvline(res["analysis"]["reference_params"], color="k", ls=":", lw=0.8)
    ax.axhline(res["chance"], color="k", ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel(f"accuracy at {res['condition']} (n={n} per seed)")
    ax.set_ylim(0, 1.02)
    ax.set_title("width sweep, each variant at its lr per width, seed mean +- sd, logit fits", fontsize=9)
    ax.legend(fontsize=8)
    return save(fig, path)


def format_sweep(res: dict[str, Any]) -> str:
    lines = [f"width sweep, accuracy at {res['condition']} at each variant's lr per width (seed mean +- sd, "
             f"{len(res['accuracy'][registry.reference().name][0])} seeds):"]
    lines.append(f"{'variant':<9} " + " ".join(f"{'d=' + str(w):>22}" for w in res["widths"]))
    for v, ps in res["params"].items():
        acc = np.array(res["accuracy"][v])
        sd = acc.std(1, ddof=1) if acc.shape[1] > 1 else np.zeros(len(ps))
        lines.append(f"{v:<9} " + " ".join(f"{p:>9,} {m:.3f}+-{s:.3f}" for p, m, s in zip(ps, acc.mean(1), sd)))
        lines.append(f"{'  lr':<9} " + " ".join(f"{lr:>22g}" for lr in res["chosen_lr"][v]))
    for v, r in res["analysis"]["ratios"].items():
        lines.append(f"{v}: parameters for the baseline's accuracy at {res['analysis']['reference_params']:,.0f} "
                     f"parameters, DIFF / baseline = {r['estimate']:.3f}, 95% bootstrap CI [{r['ci'][0]:.3f}, "
                     f"{r['ci'][1]:.3f}] ({r['undefined_share']:.0%} of draws undefined): {r['verdict']} -- {r['why']}")
    fails = {v: sum(len(x) for x in f) for v, f in res["failed"].items()}
    lines.append("runs below the floor on the training distribution: " + ", ".join(f"{v} {n}" for v, n in fails.items())
                 + f"; wall {res['wall_s'] / 60:.1f} min on {res['workers']} workers")
    return "\n".join(lines)
