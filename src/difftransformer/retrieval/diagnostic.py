"""The retrieval diagnostic (DIAGNOSTIC.md beside this file, read side by side with it).

"Arms": one ``ModelConfig`` change of DIFF V1 or DIFF V2 each (``ARMS``), trained and measured as the benchmark's
jobs (``benchmark._job`` with the arm's overrides). The baseline's, DIFF V1's and DIFF V2's lr choices and runs are
the reference benchmark's, read from its journal (``reference``; run on the same machine). "Learning rates, seeds,
the choice": the benchmark's own ``protocol.lr_choice`` with the arm's name as the variant. "Endpoints and
statistics": ``assess`` (D, C, share, reading, the secondary rows). "Learning slowly or failing": ``dynamics``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from ..eval import stats
from ..jobs import JobSpec, RunOptions, job_key, read_journal
from ..rundir.files import DIAGNOSTIC_RESULTS_NAME, RETRIEVAL_JOURNAL
from ..studies.followup import Arm, FollowUp, interval, paired
from .benchmark_schema import (
    RETRIEVAL_DIAGNOSTIC,
    validate_diagnostic,
    validate_retrieval_arm_run,
    validate_retrieval_run,
)
from .config import RetrievalConfig
from .protocol import Job, lr_choice, lr_robustness, needed_jobs
from .train import LOSS_THRESHOLDS

VERSION = 1  # DIAGNOSTIC.md's version: in every job key and the journal header
JOURNAL = "diag-jobs.jsonl"
RESULTS = DIAGNOSTIC_RESULTS_NAME
PLOT = "diagnostic-lr.png"
BASE, V1, V2 = "baseline", "diff_v1", "diff_v2"
# DIAGNOSTIC.md "Arms": (the variant, its one ModelConfig change)
ARMS: dict[str, Arm] = {
    "v1_no_norm": Arm(V1, {"headwise_norm": False, "headwise_norm_weight": False}),
    "v2_headwise_norm": Arm(V2, {"v2_headwise_norm": True}),
    "v2_lambda_scalar": Arm(V2, {"v2_lambda": "scalar"}),
    "v2_separate_keys": Arm(V2, {"v2_keys": "separate"}),
    # DIAGNOSTIC.md "Deviations", 2026-11-28 05:40 UTC: the follow-up form of item 4, added before any arm was read
    "v2_headwise_norm_after_first": Arm(V2, {"v2_headwise_norm": True, "v2_headwise_norm_layers": "after_first"}),
}
STUDY: FollowUp[Job] = FollowUp("retrieval diagnostic", RETRIEVAL_DIAGNOSTIC, VERSION, JOURNAL, RESULTS, Job,
                                (str, int, float), validate_retrieval_arm_run, validate_diagnostic)
GAP_READINGS = ("closes the gap", "closes part of the gap", "no detectable effect", "widens the gap")
LEAD_READINGS = ("removes the lead", "reduces the lead", "no detectable effect", "adds to the lead")
INCONCLUSIVE = "inconclusive"
STARTED, LEARNED = (f"{t:g}" for t in LOSS_THRESHOLDS)  # "1", "0.3": the loss thresholds' keys


# ---------------------------------------------------------------------------------------------- the reference
def reference(ref_dir: Path) -> tuple[RetrievalConfig, dict[Job, dict[str, Any]]]:
    """The reference benchmark's configuration and finished jobs (its journal, read only); a ValueError naming the
    directory when it is not a finished protocol-version-3 benchmark."""
    from .benchmark import PROTOCOL_VERSION
    path = Path(ref_dir) / RETRIEVAL_JOURNAL
    if not path.is_file():
        raise ValueError(f"--reference {ref_dir}: no {RETRIEVAL_JOURNAL} there (give a finished retrieval benchmark's "
                         "directory)")
    try:
        header, records = read_journal(path, validate_retrieval_run)  # every record a benchmark job's result
    except ValueError as e:
        raise ValueError(f"--reference {ref_dir}: {e}") from None
    if header.get("protocol_version") != PROTOCOL_VERSION or header.get("benchmark") != "kv_retrieval benchmark":
        raise ValueError(f"--reference {ref_dir}: not a protocol version {PROTOCOL_VERSION} retrieval benchmark")
    if header.get("quick"):
        raise ValueError(f"--reference {ref_dir}: a --quick smoke run, not a measurement")
    cfg = RetrievalConfig.from_dict(header["config"])
    done = {Job(str(r["job"][0]), int(r["job"][1]), float(r["job"][2])): r["result"] for r in records.values()}
    missing, final = needed_jobs(cfg, done)
    if not final or any(j not in done for j in missing):
        raise ValueError(f"--reference {ref_dir}: the benchmark is not finished (run the same command again to "
                         "complete it)")
    if any(v not in cfg.variants for v in (BASE, V1, V2)):
        raise ValueError(f"--reference {ref_dir}: it must have run {BASE}, {V1} and {V2}")
    return cfg, done


# ---------------------------------------------------------------------------------------------- the jobs
def run_arm_job(cfg_d: dict, arm: str, seed: int, lr: float, device: str = "cpu") -> dict[str, Any]:
    """One job: the arm's variant with its one change, trained and measured as a benchmark job."""
    from .benchmark import _job
    variant, overrides = arm_change(arm)
    out = _job(cfg_d, variant, seed, lr, device, overrides)
    out["arm"] = arm
    return out


def arm_change(name: str) -> tuple[str, dict[str, Any]]:
    """An arm's variant and its change; the baseline, DIFF V1 and DIFF V2 themselves (the rounding check reruns
    them) with none."""
    if name in (BASE, V1, V2):
        return name, {}
    return ARMS[name].variant, ARMS[name].change


def arm_jobs(cfg: RetrievalConfig, done: dict[Job, dict[str, Any]],
             arms: Iterable[str] = ARMS) -> tuple[list[Job], bool]:
    """Each arm's grid on every test seed, widened as the benchmark's rule says; final when every choice is."""
    jobs, final = [], True
    for arm in arms:
        c = lr_choice(cfg, arm, done)
        jobs += [Job(arm, s, lr) for lr in c.grid for s in cfg.test_seeds]
        final = final and c.lr is not None
    return list(dict.fromkeys(jobs)), final


# ---------------------------------------------------------------------------------------------- endpoints
def reading(d: dict[str, Any], c: dict[str, Any], variant_d: float, above_chance: bool) -> str:
    """DIAGNOSTIC.md "Endpoints and statistics": the arm's reading from D's and C's intervals, oriented by the sign
    of its variant's own D (a gap when negative, a lead when positive)."""
    if not above_chance:
        return INCONCLUSIVE
    (c_lo, c_hi), (d_lo, d_hi) = c["ci"], d["ci"]
    if variant_d < 0:  # a gap: the arm should raise the accuracy
        if c_lo > 0:
            return GAP_READINGS[1] if d_hi < 0 else GAP_READINGS[0]
        return GAP_READINGS[3] if c_hi < 0 else GAP_READINGS[2]
    if c_hi < 0:  # a lead: does the change cost it?
        return LEAD_READINGS[1] if d_lo > 0 else LEAD_READINGS[0]
    return LEAD_READINGS[3] if c_lo > 0 else LEAD_READINGS[2]


def _interval(base: list[float], other: list[float]) -> dict[str, Any]:
    """The retrieval studies' paired interval: ``other`` minus ``base`` accuracy, by seed (higher is better)."""
    return paired(base, other, higher_is_better=True)


def _accuracies(runs: list[dict[str, Any]], cond: str) -> list[float]:
    return [r["conditions"][cond]["accuracy"] for r in runs]


def chosen(cfg: RetrievalConfig, name: str, done: dict[Job, dict[str, Any]]) -> tuple[dict[str, Any], list[dict]]:
    """A variant's or arm's lr choice (its grid's validation scores, widened values, still at an edge) and its runs at
    the chosen lr, seed order."""
    from ..studies.lr import next_lr
    from .protocol import lr_scores
    c = lr_choice(cfg, name, done)
    assert c.lr is not None, f"{name}: its lr choice is not finished"
    runs = [done[Job(name, s, c.lr)] for s in cfg.test_seeds]
    scores = lr_scores(done[Job(name, s, lr)] for lr in c.grid for s in cfg.test_seeds)
    return {"lr": c.lr, "grid": scores, "widened": c.widened, "at_edge": next_lr(c.grid, c.lr) is not None}, runs


def dynamics(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """DIAGNOSTIC.md "Learning slowly or failing" for one arm's or variant's runs at its chosen lr."""
    def median(xs: list[Optional[int]]) -> Optional[float]:
        got = [x for x in xs if x is not None]
        return statistics.median(got) if got else None

    def layer_means(rs: list[dict[str, Any]], key: str) -> Optional[list[Optional[float]]]:
        if not rs or not all(r.get("dynamics") for r in rs):
            return None
        out = []
        for i in range(len(rs[0]["dynamics"])):
            xs = [r["dynamics"][i].get(key) for r in rs]
            xs = [statistics.fmean(x) if isinstance(x, list) else x for x in xs]  # head_rms: the head mean
            out.append(statistics.fmean(xs) if all(x is not None for x in xs) else None)
        return out

    failed = [r for r in runs if r["failed"]]
    passed = [r for r in runs if not r["failed"]]
    return {
        "below_floor": len(failed), "of": len(runs),
        "learned_slowly": sum(r["loss_thresholds"][STARTED] is not None for r in failed),
        "failed_to_start": sum(r["loss_thresholds"][STARTED] is None for r in failed),
        "first_step_below": {t: {"passed_median": median([r["loss_thresholds"][t] for r in passed]),
                                 "per_seed": [r["loss_thresholds"][t] for r in runs]} for t in (STARTED, LEARNED)},
        "final_window_loss": [r["final_window_loss"] for r in runs],
        "head_rms": {"below_floor": layer_means(failed, "head_rms"), "passed": layer_means(passed, "head_rms")},
        **{k: {"below_floor": layer_means(failed, k), "passed": layer_means(passed, k)}
           for k in ("lambda_mean", "lambda_sd")},
    }


def assess(cfg: RetrievalConfig, ref: dict[Job, dict[str, Any]], arms: dict[Job, dict[str, Any]]) -> dict[str, Any]:
    """Per variant (the reference's) and per arm: the lr choice, the per-seed test accuracies at the primary
    condition, D (vs the baseline), C (arms: vs their variant), share, reading, the secondary rows and the
    dynamics."""
    P, X, S = cfg.primary, cfg.extrapolation, cfg.test_seeds
    chance = 1.0 / cfg.n_values
    rows: dict[str, dict[str, Any]] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    grid_mean: dict[str, list[float]] = {}
    for name in (BASE, V1, V2, *ARMS):
        done = ref if name in (BASE, V1, V2) else arms
        info, runs[name] = chosen(cfg, name, done)
        grid_mean[name] = _accuracies(lr_robustness(cfg, name, done), P)
        grid_fail = sum(done[Job(name, s, lr)]["failed"] for lr in cfg.lr_grid for s in S)
        n_q = runs[name][0]["conditions"][P]["n_queries"]
        rows[name] = {**info, "params": runs[name][0]["params"], "accuracy": _accuracies(runs[name], P),
                      "above_chance": stats.above_chance(_accuracies(runs[name], P), n_q, chance),
                      "extrapolation": _accuracies(runs[name], X), "grid_mean": grid_mean[name],
                      "grid_below_floor": grid_fail, "dynamics": dynamics(runs[name])}
    for name in (V1, V2, *ARMS):
        rows[name]["D"] = _interval(rows[BASE]["accuracy"], rows[name]["accuracy"])
        rows[name]["D_grid_mean"] = _interval(grid_mean[BASE], grid_mean[name])
        rows[name]["D_extrapolation"] = _interval(rows[BASE]["extrapolation"], rows[name]["extrapolation"])
    for arm, a in ARMS.items():
        variant = a.variant
        r, v = rows[arm], rows[variant]
        r.update(variant=variant, overrides=a.change,
                 C=_interval(v["accuracy"], r["accuracy"]), C_grid_mean=_interval(grid_mean[variant], grid_mean[arm]),
                 C_extrapolation=_interval(v["extrapolation"], r["extrapolation"]))
        gap = v["D"]["estimate"]
        r["share"] = (r["C"]["estimate"] / -gap) if gap else None
        r["reading"] = reading(r["D"], r["C"], gap, r["above_chance"])
    return rows


def summary(rows: dict[str, dict[str, Any]]) -> str:
    """DIAGNOSTIC.md's summary sentence."""
    closing = [a for a, arm in ARMS.items() if arm.variant == V2 and rows[a]["reading"] in GAP_READINGS[:2]]
    named = ", ".join(f"{a} ({rows[a]['reading']})" for a in closing)
    v2 = f"the DIFF V2 arms that close its gap: {named}" if closing else "no single part explains V2's retrieval loss"
    r = rows["v1_no_norm"]["reading"]
    v1 = ("the head-wise norm buys DIFF V1's retrieval" if r in LEAD_READINGS[:2]
          else f"removing DIFF V1's head-wise norm: {r}")
    return f"{v2}; {v1}"


# ---------------------------------------------------------------------------------------------- the run
def run_diagnostic(ref_dir: str | Path, out_dir: str | Path, options: Optional[RunOptions] = None) -> dict[str, Any]:
    """Run (or resume) every arm job DIAGNOSTIC.md asks for, decide, and write OUT/diagnostic.json and the plot."""
    options = options or RunOptions(workers=2)
    cfg, ref = reference(Path(ref_dir))
    out = Path(out_dir)
    t0 = time.perf_counter()
    dev, cfg_d = options.device, cfg.to_dict()
    spec: JobSpec[Job] = JobSpec(needed=lambda d: arm_jobs(cfg, d), run=run_arm_job,
                                 args=lambda j: (cfg_d, j.variant, j.seed, j.lr, dev), key=_key(cfg_d, dev),
                                 code_path=cfg.cpu_code_path, desc="retrieval diagnostic (jobs)")
    arms, ran = STUDY.journaled(spec, out, STUDY.header(config=cfg_d), options)
    rows = assess(cfg, ref, arms)
    res = STUDY.write(out, {"reference": str(ref_dir), "config": cfg_d, "primary": cfg.primary,
                            "extrapolation": cfg.extrapolation, "chance": 1.0 / cfg.n_values,
                            "loss_thresholds": list(LOSS_THRESHOLDS), "rows": rows, "summary": summary(rows)},
                      arms, ran, t0, options, job_cpu_s=sum(r.get("train_cpu_s", 0.0) for r in arms.values()))
    plot_lr(cfg, ref, arms, out / PLOT)
    return res


def _key(cfg_d: dict[str, Any], dev: str):
    from .benchmark import job_description

    def key(j: Job) -> str:
        variant, overrides = arm_change(j.variant)
        return job_key({"diagnostic_version": VERSION, "arm": j.variant, "overrides": overrides,
                        **job_description(cfg_d, (variant, j.seed, j.lr), dev)})
    return key


def first_run(out_dir: str | Path) -> dict[str, Any]:
    """A finished diagnostic's OUT/diagnostic.json (the rounding check's first run); a ValueError naming the flag."""
    from ..fileio import read_json
    path = Path(out_dir) / RESULTS
    if not path.is_file():
        raise ValueError(f"--rounding-check: {out_dir} holds no finished diagnostic ({RESULTS}); run the diagnostic "
                         "there first")
    res = read_json(path, "--out")
    validate_diagnostic(res, f"--out {out_dir}: {RESULTS} is not a diagnostic's")
    if res["benchmark"] != RETRIEVAL_DIAGNOSTIC or any(n not in res["rows"] for n in (BASE, V1, V2, *ARMS)):
        raise ValueError(f"--out {out_dir}: {RESULTS} is not this version's retrieval diagnostic")
    return res


def plot_lr(cfg: RetrievalConfig, ref: dict[Job, dict[str, Any]], arms: dict[Job, dict[str, Any]], path: Path) -> Path:
    """Test accuracy at the primary condition across every lr run (the grid and any widened value), seed mean with
    the seed standard deviation, per variant and arm; an arm drawn dashed in its variant's colour."""
    import numpy as np

    from ..eval.plotting import color, label, pyplot, save_figure
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 4.0), sharey=True)
    for ax, variant in zip(axes, (V1, V2)):
        names = [BASE, variant, *(a for a, arm in ARMS.items() if arm.variant == variant)]
        for k, name in enumerate(names):
            done = ref if name in (BASE, V1, V2) else arms
            lrs = sorted({j.lr for j in done if j.variant == name})
            acc = np.array([[done[Job(name, s, lr)]["conditions"][cfg.primary]["accuracy"] for s in cfg.test_seeds]
                            for lr in lrs])
            style = "-" if name in (BASE, V1, V2) else ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))[(k - 2) % 4]
            col = color(name) if name in (BASE, V1, V2) else color(variant)
            ax.errorbar(np.array(lrs) * (1 + 0.03 * (k - 1)), acc.mean(1), yerr=acc.std(1, ddof=1), ls=style,
                        marker="o", ms=3, capsize=2, color=col, label=label(name) if name in (BASE, V1, V2) else name)
        ax.axhline(1.0 / cfg.n_values, color="k", ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_title(f"{label(variant)} and its arms", fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel(f"test accuracy at {cfg.primary}\n({len(cfg.test_seeds)} seeds, mean +- sd)")
    save_figure(fig, list(axes), path)
    return path


def format_diagnostic(res: dict[str, Any]) -> str:
    """The text summary: one line per variant and arm, the secondary rows, the dynamics."""
    rows = res["rows"]


    lines = [f"retrieval diagnostic: accuracy at {res['primary']}, n = {len(rows[BASE]['accuracy'])} paired "
             "seeds, 95% paired t; D = minus the baseline, C = minus the arm's variant"]
    lines.append(f"  {'baseline':18s} lr {rows[BASE]['lr']:<6g} acc {statistics.fmean(rows[BASE]['accuracy']):.3f}  "
                 f"below floor {rows[BASE]['dynamics']['below_floor']}/{rows[BASE]['dynamics']['of']}")
    for name in (V1, V2, *ARMS):
        r = rows[name]
        edge = " (at an edge)" if r["at_edge"] else ""
        share = "" if r.get("share") is None else f", share {r['share']:+.0%}"
        c = f", C {interval(r['C'])}{share}: {r['reading']}" if name in ARMS else ""
        lines.append(f"  {name:18s} lr {r['lr']:<6g}{edge} acc {statistics.fmean(r['accuracy']):.3f}  "
                     f"D {interval(r['D'])}{c}  below floor {r['dynamics']['below_floor']}/{r['dynamics']['of']} "
                     "(learned slowly "
                     f"{r['dynamics']['learned_slowly']}, failed to start {r['dynamics']['failed_to_start']})")
    lines.append("  secondary (descriptive): grid mean D / C; extrapolation D / C; grid runs below the floor (of "
                 f"{len(res['config']['lr_grid']) * len(rows[BASE]['accuracy'])})")
    for name in (V1, V2, *ARMS):
        r = rows[name]
        c1 = f" / {interval(r['C_grid_mean'])}" if name in ARMS else ""
        c2 = f" / {interval(r['C_extrapolation'])}" if name in ARMS else ""
        lines.append(f"  {name:18s} {interval(r['D_grid_mean'])}{c1}; {interval(r['D_extrapolation'])}{c2}; "
                     f"{r['grid_below_floor']}")
    lines.append(f"  summary: {res['summary']}")
    return "\n".join(lines)


def markdown_table(res: dict[str, Any]) -> str:
    """docs/retrieval.md's table of the diagnostic: per variant and arm its lr, mean accuracy, D, C, share, reading,
    floor failures (learned slowly / failed to start) and the secondary D of the grid mean and extrapolation."""
    rows = res["rows"]


    lines = ["| arm | lr | accuracy | D (minus baseline) | C (minus its variant) | share | reading | below the floor "
             "(learned slowly, failed to start) | grid mean, D | p48c96, D |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in (BASE, V1, V2, *ARMS):
        r, dyn = rows[name], rows[name]["dynamics"]
        edge = " (edge)" if r["at_edge"] else ""
        is_arm = name in ARMS
        share = "" if not is_arm or r["share"] is None else f"{r['share']:+.0%}"
        lines.append(
            f"| `{name}` | {r['lr']:g}{edge} | {statistics.fmean(r['accuracy']):.3f} | "
            f"{interval(r['D']) if name != BASE else ''} | {interval(r['C']) if is_arm else ''} | {share} | "
            f"{r['reading'] if is_arm else ''} | {dyn['below_floor']} of {dyn['of']} ({dyn['learned_slowly']}, "
            f"{dyn['failed_to_start']}) | {interval(r['D_grid_mean']) if name != BASE else ''} | "
            f"{interval(r['D_extrapolation']) if name != BASE else ''} |")
    return "\n".join(lines)


def dynamics_table(res: dict[str, Any]) -> str:
    """docs/retrieval.md's "learning slowly or failing" table: per variant and arm at its chosen lr, the runs below the
    floor (learned slowly / failed to start), the median first step below each loss threshold over the runs that
    passed, and per layer the head RMS before any norm and lambda (mean), for the runs that passed and those below."""
    rows = res["rows"]

    def fmt(xs: Optional[list[Optional[float]]], digits: int = 2) -> str:
        return "" if xs is None else " / ".join("-" if x is None else f"{x:.{digits}f}" for x in xs)

    def step(x: Optional[float]) -> str:
        return "never" if x is None else f"{x:g}"

    lines = [f"| arm | below the floor (learned slowly, failed to start) | median step below {STARTED} / {LEARNED} "
             "nats (passed) | head RMS per layer, passed | below the floor | lambda per layer, passed | below the "
             "floor |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in (BASE, V1, V2, *ARMS):
        d = rows[name]["dynamics"]
        fs = d["first_step_below"]
        steps = ("none passed" if d["below_floor"] == d["of"] else
                 f"{step(fs[STARTED]['passed_median'])} / {step(fs[LEARNED]['passed_median'])}")
        lines.append(f"| `{name}` | {d['below_floor']} ({d['learned_slowly']}, {d['failed_to_start']}) | {steps} | "
                     f"{fmt(d['head_rms']['passed'])} | {fmt(d['head_rms']['below_floor'])} | "
                     f"{fmt(d['lambda_mean']['passed'])} | {fmt(d['lambda_mean']['below_floor'])} |")
    return "\n".join(lines)
