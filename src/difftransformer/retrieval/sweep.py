"""``difftransformer retrieval --sweep-width W1,W2,...``: the paper's scaling claim (Fig. 3) at our scale.

Every variant x test seed is trained at every width (``d_model``; heads, layers and the task as in the config) at
ONE learning rate (``sweep_lr``, the same for every variant and width: the sweep is not tuned per width, which
would cost a tuning grid per width), and scored on the primary condition's test split. Then, per variant,
``logit(accuracy) = a + b * log(parameters)`` is fitted to the seed means (least squares; accuracies clipped to
[0.5/n, 1 - 0.5/n] for n scored queries). The claim's measure: the parameters DIFF needs for the accuracy the
baseline reaches at the config's default width (its fitted value there), over the baseline's parameters at that
width -- below 1: DIFF reaches the baseline's accuracy with fewer parameters. The interval: a paired bootstrap
over seeds (the same resampled seeds for every variant and width, 2000 draws, fixed generator), percentile 95%.
A draw whose fitted slope is not positive (at most 1e-6: flat) has no ratio; more than 5% of such draws:
inconclusive. Pre-registered in PROTOCOL.md ("The scaling sweep").
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..model import variants as registry
from .config import RetrievalConfig

N_BOOT = 2000
MAX_UNDEFINED = 0.05
MIN_SLOPE = 1e-6  # a fitted slope at or below this is flat (saturated or untrained curves): no ratio


def _sweep_job(cfg_d: dict, variant: str, seed: int) -> dict[str, Any]:
    from .benchmark import _job_threads
    with _job_threads():
        from .evaluate import accuracy
        from .task import condition_batch, eval_rng, training_distribution_batches
        from .train import train_model
        cfg = RetrievalConfig.from_dict(cfg_d)
        r = train_model(cfg, variant, seed, cfg.sweep_lr)
        m = r["model"]
        b = condition_batch(cfg, cfg.condition(cfg.primary), cfg.eval_contexts, eval_rng(cfg, "test", cfg.primary))
        dist = accuracy(m, training_distribution_batches(cfg, "test", cfg.eval_contexts))
        return {"variant": variant, "seed": seed, "d_model": cfg.d_model, "params": r["params"],
                "accuracy": accuracy(m, b), "n_queries": int(b.answers.numel()),
                "training_distribution": dist, "failed": dist < cfg.floor, "train_s": r["train_s"]}


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
    draws = rng.integers(0, S, size=(N_BOOT, S))
    for v in V:
        if v == base:
            continue
        est = param_ratio(params, acc, v, ref, n)
        boot = np.array([param_ratio(params, {w: acc[w][:, idx] for w in V}, v, ref, n) for idx in draws])
        ok = boot[np.isfinite(boot) & (boot > 0)]
        undefined = 1 - ok.size / N_BOOT
        lo, hi = (float(np.percentile(ok, 2.5)), float(np.percentile(ok, 97.5))) if ok.size else (math.nan, math.nan)
        if not math.isfinite(est) or undefined > MAX_UNDEFINED or S < 2:
            verdict = stats.INCONCLUSIVE
            why = (f"the fitted accuracy-vs-parameters slope is not positive in {undefined:.0%} of the bootstrap "
                   "draws (or in the estimate): no parameter ratio at this scale")
        elif hi < 1:
            verdict, why = stats.HELD, "the whole ratio interval is below 1"
        elif lo > 1:
            verdict, why = stats.NOT_HELD, "the whole ratio interval is above 1"
        else:
            verdict, why = stats.INCONCLUSIVE, "the ratio interval includes 1"
        out["ratios"][v] = {"estimate": est, "ci": [lo, hi], "undefined_share": undefined, "n_boot": N_BOOT,
                            "seeds": S, "verdict": verdict, "why": why}
    return out


def run_sweep(cfg: RetrievalConfig, widths: Sequence[int], out_dir: Optional[str | Path] = None, workers: int = 2,
              progress: bool = True) -> dict[str, Any]:
    """Train every variant x test seed at every width at ``cfg.sweep_lr``; write sweep.json and sweep.png."""
    if len(widths) < 2 or len(set(widths)) != len(widths):
        raise ValueError(f"--sweep-width needs at least two distinct widths, got {list(widths)}")
    if registry.reference().name not in cfg.variants or len(cfg.variants) < 2:
        raise ValueError("the sweep compares DIFF with the baseline: --variants must include baseline and a DIFF one")
    cfgs = {w: cfg.replace(d_model=w) for w in widths}  # validates every width (even head width, divisible)
    from tqdm import tqdm
    t0 = time.perf_counter()
    jobs = [(w, v, s) for w in sorted(widths, reverse=True) for v in cfg.variants for s in cfg.test_seeds]
    bar = tqdm(total=len(jobs), desc="retrieval width sweep (jobs)", disable=not progress)
    runs: dict[tuple, dict] = {}
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=registry.adopt,
                                 initargs=(registry.variants(),)) as ex:
            futs = {ex.submit(_sweep_job, cfgs[w].to_dict(), v, s): (w, v, s) for w, v, s in jobs}
            for f in as_completed(futs):
                runs[futs[f]] = f.result()
                bar.update(1)
    else:
        for w, v, s in jobs:
            runs[(w, v, s)] = _sweep_job(cfgs[w].to_dict(), v, s)
            bar.update(1)
    bar.close()
    ws = sorted(widths)
    res: dict[str, Any] = {
        "benchmark": "kv_retrieval_width_sweep", "config": cfg.to_dict(), "widths": ws, "lr": cfg.sweep_lr,
        "condition": cfg.primary, "chance": 1.0 / cfg.n_values,
        "n_queries": runs[(ws[0], cfg.variants[0], 0)]["n_queries"],
        "params": {v: [runs[(w, v, 0)]["params"] for w in ws] for v in cfg.variants},
        "accuracy": {v: [[runs[(w, v, s)]["accuracy"] for s in cfg.test_seeds] for w in ws] for v in cfg.variants},
        "failed": {v: [[s for s in cfg.test_seeds if runs[(w, v, s)]["failed"]] for w in ws] for v in cfg.variants},
        "wall_s": time.perf_counter() - t0, "workers": workers,
    }
    res["analysis"] = analyse(res, cfg.d_model)
    if out_dir is not None:
        import json

        from ..fileio import atomic_write
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "sweep.json", json.dumps(res, indent=1) + "\n")
        plot_sweep(res, out / "sweep.png")
    return res


def plot_sweep(res: dict[str, Any], path) -> Path:
    from .plots import _save, color, label, plt
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
    ax.set_title(f"width sweep at lr {res['lr']:g}, seed mean +- sd, logit fits", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def format_sweep(res: dict[str, Any]) -> str:
    lines = [f"width sweep at lr {res['lr']:g}, accuracy at {res['condition']} (seed mean +- sd, "
             f"{len(res['accuracy']['baseline'][0])} seeds):"]
    lines.append(f"{'variant':<9} " + " ".join(f"{'d=' + str(w):>22}" for w in res["widths"]))
    for v, ps in res["params"].items():
        acc = np.array(res["accuracy"][v])
        sd = acc.std(1, ddof=1) if acc.shape[1] > 1 else np.zeros(len(ps))
        lines.append(f"{v:<9} " + " ".join(f"{p:>9,} {m:.3f}+-{s:.3f}" for p, m, s in zip(ps, acc.mean(1), sd)))
    for v, r in res["analysis"]["ratios"].items():
        lines.append(f"{v}: parameters for the baseline's accuracy at {res['analysis']['reference_params']:,.0f} "
                     f"parameters, DIFF / baseline = {r['estimate']:.3f}, 95% bootstrap CI [{r['ci'][0]:.3f}, "
                     f"{r['ci'][1]:.3f}] ({r['undefined_share']:.0%} of draws undefined): {r['verdict']} -- {r['why']}")
    fails = {v: sum(len(x) for x in f) for v, f in res["failed"].items()}
    lines.append("runs below the floor on the training distribution: " + ", ".join(f"{v} {n}" for v, n in fails.items())
                 + f"; wall {res['wall_s'] / 60:.1f} min on {res['workers']} workers")
    return "\n".join(lines)
