"""What PROTOCOL.md decides, one function per section: the jobs, the lr choice, the endpoints and their verdicts.

Nothing here runs a job (``sweep.py`` does, on the job runner ``jobs/``). A job is
``Job(width, variant, seed, lr)``; its result is ``job.run_job``'s dict. The two ratio fits and their verdict
rule are in ``fits``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np

from ..model import variants as registry
from ..studies.lr import LrChoice, next_lr, replay_lr_choice
from .config import LMSweepConfig
from .fits import param_ratio, ratio_verdict, token_ratio

MIN_FALL = 0.10  # nats: the least fitted fall of the baseline's loss a Fig. 3 ratio needs ("Applicability")
NOT_MEASURABLE = "not measurable at this scale"  # a Fig. 3 verdict whose premise failed (PROTOCOL.md, "Applicability")
UNRESOLVED_EDGE = "unresolved edge"  # a choice still at a grid edge after the last widening
OUTLIER_MAX_RATIO = 0.8


class Job(NamedTuple):
    width: int
    variant: str
    seed: int
    lr: float


def loss_of(r: dict[str, Any], key: str, cap: float) -> float:
    """A run's loss (``tune_loss`` or ``test_loss``); a diverged run counts as ``cap`` (ln vocabulary)."""
    return cap if r["diverged"] else float(r[key])


# ---------------------------------------------------------------------------------------------- learning rates
def lr_scores(runs: Iterable[dict[str, Any]], cap: float) -> list[dict[str, Any]]:
    """Per lr (ascending): the seed means of the tuning-half and test-half losses, the diverged and floor-failing
    counts."""
    runs = list(runs)
    out = []
    for lr in sorted({r["lr"] for r in runs}):
        rs = [r for r in runs if r["lr"] == lr]
        out.append({"lr": lr, "seeds": sorted(r["seed"] for r in rs),
                    "tune_loss": statistics.fmean(loss_of(r, "tune_loss", cap) for r in rs),
                    "test_loss": statistics.fmean(loss_of(r, "test_loss", cap) for r in rs),
                    "diverged": sum(bool(r["diverged"]) for r in rs),
                    "failed_floor": sum(not passed(r) for r in rs)})
    return out


def choose_lr(scores: list[dict[str, Any]]) -> float:
    """The lowest seed-mean tuning-half loss; ties (to the 12th digit) to the smaller lr."""
    return min(scores, key=lambda s: (round(s["tune_loss"], 12), s["lr"]))["lr"]


def lr_choice(cfg: LMSweepConfig, width: int, variant: str, done: dict[Job, dict[str, Any]], cap: float) -> LrChoice:
    """A variant's choice at one width: the lowest seed-mean tuning-half loss (``choose_lr``) over its grid, widened
    (the replay both studies share, ``studies.lr.replay_lr_choice``)."""
    return replay_lr_choice(cfg.lr_grid, cfg.lr_widen, cfg.test_seeds,
                            lambda lr, s: done.get(Job(width, variant, s, lr)),
                            lambda runs: choose_lr(lr_scores(runs, cap)))


def unresolved_edge(cfg: LMSweepConfig, choice: LrChoice) -> bool:
    """"Seeds, learning rates and the choice": a settled choice still at an edge of its grid after ``lr_widen``
    widenings (the grid would grow again were it not bounded)."""
    return choice.lr is not None and len(choice.widened) >= cfg.lr_widen and next_lr(choice.grid, choice.lr) is not None


def needed_jobs(cfg: LMSweepConfig, done: dict[Job, dict[str, Any]], cap: float) -> tuple[list[Job], bool]:
    """Every job the protocol asks for given the finished ones, and whether the list is final. Largest width first
    (its jobs take longest: the pool ends on short ones)."""
    base = registry.reference().name
    jobs: list[Job] = []
    final = True
    for w in sorted(cfg.widths, reverse=True):
        choices = {v: lr_choice(cfg, w, v, done, cap) for v in cfg.variants}
        for v, c in choices.items():
            jobs += [Job(w, v, s, lr) for lr in c.grid for s in cfg.test_seeds]
            final = final and c.lr is not None
        matched = choices[base].lr
        if matched is None:
            final = False
        else:
            jobs += [Job(w, v, s, matched) for v in cfg.variants for s in cfg.test_seeds]
    return list(dict.fromkeys(jobs)), final


Choices = dict[int, dict[str, LrChoice]]  # width -> variant -> lr choice


def rounding_jobs(cfg: LMSweepConfig, choices: Choices) -> list[Job]:
    """The rounding check's ``chosen`` scope (PROTOCOL.md, "Clarifications"): under the other code path, the jobs at
    the reference run's chosen lrs (every width, variant and seed: endpoints (a)-(d)), then the pre-registered grid at
    the largest width (endpoint (e)); the largest width first. The lr choices are the reference's, not replayed."""
    ws = sorted(cfg.widths, reverse=True)
    jobs = [Job(w, v, s, choices[w][v].lr) for w in ws for v in cfg.variants  # type: ignore[arg-type]
            for s in cfg.test_seeds]
    jobs += [Job(cfg.largest, v, s, lr) for v in cfg.variants for lr in cfg.lr_grid for s in cfg.test_seeds]
    return list(dict.fromkeys(jobs))


def passed(r: dict[str, Any]) -> bool:
    return not r["diverged"] and r["test_loss"] < r["floor"]


# ---------------------------------------------------------------------------------------------- applicability
def applicability(log_x: Sequence[float] | np.ndarray, losses: np.ndarray,
                  min_fall: float = MIN_FALL) -> dict[str, Any]:
    """PROTOCOL.md "Applicability": whether the baseline's loss falls enough along ``log_x`` (log non-embedding
    parameters over the widths for Fig. 3a; log training tokens over the second half of the run for Fig. 3b) for a
    ratio read off it to mean anything. ``losses``: (points, seeds). Per seed the least-squares slope of loss on
    ``log_x``; their mean and a paired t interval (95%, df seeds - 1); the fitted fall is -mean slope x the span of
    ``log_x``. Measurable: the whole slope interval below 0 and the fall at least ``min_fall`` nats."""
    from ..eval import stats
    x = np.asarray(log_x, dtype=float)
    y = np.asarray(losses, dtype=float)
    n = y.shape[1] if y.ndim == 2 else 0
    if x.size < 2 or n < 2 or y.shape[0] != x.size or not np.isfinite(y).all():
        return {"measurable": False, "slope": None, "ci": [None, None], "fall": None, "min_fall": min_fall,
                "seeds": n, "points": int(x.size),
                "why": "fewer than two points or two seeds, or a diverged run: no slope interval"}
    slopes = np.array([np.polyfit(x, y[:, i], 1)[0] for i in range(n)])
    mean = float(slopes.mean())
    half = stats.t_crit(n - 1) * float(slopes.std(ddof=1)) / math.sqrt(n)
    lo, hi = mean - half, mean + half
    fall = -mean * float(x.max() - x.min())
    ok = hi < 0 and fall >= min_fall
    why = (f"the baseline's slope {mean:+.4f} [{lo:+.4f}, {hi:+.4f}] per unit log, fitted fall {fall:.3f} nats "
           f"(at least {min_fall:g} needed)")
    if not ok:
        why += ": " + ("the slope interval does not exclude 0" if hi >= 0 else "the fall is too small")
    return {"measurable": ok, "slope": mean, "ci": [lo, hi], "fall": fall, "min_fall": min_fall, "seeds": n,
            "points": int(x.size), "per_seed_slope": slopes.tolist(), "why": why}


def _not_measurable(r: dict[str, Any], app: dict[str, Any]) -> dict[str, Any]:
    """A ratio's result under the applicability rule: its estimate and interval kept, its verdict replaced when the
    premise failed."""
    out = {**r, "applicability": app}
    if not app["measurable"]:
        out.update(verdict=NOT_MEASURABLE, why=f"premise failed: {app['why']}; the ratio is shown, not judged")
    return out


def premise_3a(nb: Sequence[float], lb: np.ndarray) -> dict[str, Any]:
    """Fig. 3a's premise: the baseline's loss (widths, seeds) against log non-embedding parameters ``nb``."""
    return applicability(np.log(np.asarray(nb, dtype=float)), lb)


def premise_3b(steps: Sequence[int], cb: np.ndarray, total_steps: int) -> dict[str, Any]:
    """Fig. 3b's premise: the baseline's test-half curves (seeds, points) against log steps (log tokens up to a
    constant) over the second half of its run (the points at or after half the steps)."""
    keep = [i for i, s in enumerate(steps) if 2 * s >= total_steps]
    return applicability(np.log([float(steps[i]) for i in keep]), np.asarray(cb, dtype=float)[:, keep].T)


# ---------------------------------------------------------------------------------------------- assembling
def _json_float(x: float) -> Any:
    return x if math.isfinite(x) else ("inf" if x > 0 else ("-inf" if x < 0 else None))


def _verdict_dict(v, n: int, extra: str = "") -> dict[str, Any]:
    return {"verdict": v.verdict, "estimate": v.estimate, "ci": list(v.ci), "n": n, "method": v.method,
            "why": "; ".join(x for x in (v.reason, extra) if x)}


def _compare(base_runs: list[dict], diff_runs: list[dict], value: Callable[[dict], float],
             ratio: bool = False) -> dict[str, Any]:
    """A paired comparison of ``value`` (a t interval on the differences, or on the log ratios with ``ratio``), made
    inconclusive by the training floor (``floor_rule``)."""
    from ..eval import stats
    b, d = [value(r) for r in base_runs], [value(r) for r in diff_runs]
    v = (stats.compare_ratio(b, d, max_ratio=OUTLIER_MAX_RATIO) if ratio
         else stats.compare_seeds(b, d, higher_is_better=False, min_effect=0.0))
    bad = [f"{r['variant']} seed {r['seed']} lr {r['lr']:g}" for r in base_runs + diff_runs if not passed(r)]
    out = _verdict_dict(v, len(b))
    if bad:
        out.update(verdict=stats.INCONCLUSIVE,
                   why=f"diverged or above the unigram floor: {', '.join(bad)}; " + out["why"])
    return out


def floor_rule(runs: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """"Seeds, learning rates and the choice": a comparison whose chosen runs include a diverged or floor-failing
    run is inconclusive whatever its interval; None when every run passed."""
    if all(passed(r) for r in runs):
        return None
    from ..eval import stats
    return {"verdict": stats.INCONCLUSIVE, "estimate": None, "ci": [None, None],
            "why": "a run at the chosen lr diverged or stayed above the unigram floor"}


Runs = dict[int, list[dict[str, Any]]]  # width -> the runs of one variant, seed order


def endpoint_a(at_base: Runs, at_diff: Runs, loss: Callable[[dict], float]) -> dict[str, Any]:
    """(a) final loss per width: DIFF minus baseline test-half loss per seed, paired t."""
    return {str(w): _compare(at_base[w], at_diff[w], loss) for w in at_base}


def endpoint_b(at_base: Runs, at_diff: Runs, loss: Callable[[dict], float], count: str) -> dict[str, Any]:
    """(b) Fig. 3a: the parameter ratio of the log-linear fits over the widths (``count``: "params_non_embedding",
    the protocol's; "params", the sensitivity row), bootstrap over seeds."""
    ws = list(at_base)
    nb = [at_base[w][0][count] for w in ws]
    nd = [at_diff[w][0][count] for w in ws]
    lb = np.array([[loss(r) for r in at_base[w]] for w in ws])  # (widths, seeds)
    ld = np.array([[loss(r) for r in at_diff[w]] for w in ws])
    return _not_measurable(_ratio_json(ratio_verdict(_param_fn(nb, lb, nd, ld), lb.shape[1])), premise_3a(nb, lb))


def endpoint_c(cfg: LMSweepConfig, base_runs: list[dict], diff_runs: list[dict]) -> dict[str, Any]:
    """(c) Fig. 3b at the largest width: the token ratio of the seed-mean test-half curves, bootstrap over seeds."""
    if (bad := floor_rule(base_runs + diff_runs)) is not None:
        return bad
    cb = np.array([r["curve"]["test_loss"] for r in base_runs])  # (seeds, points)
    cd = np.array([r["curve"]["test_loss"] for r in diff_runs])
    steps = base_runs[0]["curve"]["steps"]
    tokens = [s * cfg.batch * cfg.seq_len for s in steps]
    return _not_measurable(_ratio_json(ratio_verdict(_token_fn(tokens, cb, cd), len(base_runs))),
                           premise_3b(steps, cb, cfg.steps))


def endpoint_d(base_runs: list[dict], diff_runs: list[dict], field: str) -> dict[str, Any]:
    """(d) Table 5 at the largest width: DIFF over baseline of the run's largest ``field`` ("attention_logit_top1",
    "hidden_state_top1"), paired t on the log."""
    if (bad := floor_rule(base_runs + diff_runs)) is not None:
        return bad
    return _compare(base_runs, diff_runs, _outlier(field), ratio=True)


def endpoint_e(cfg: LMSweepConfig, w: int, base: str, v: str, done: dict[Job, dict[str, Any]], cap: float
               ) -> dict[str, Any]:
    """(e) at one width: per seed the grid-mean test-half loss (diverged capped), DIFF minus baseline, paired t."""
    from ..eval import stats

    def per_seed(var: str) -> list[float]:
        return [statistics.fmean(loss_of(done[Job(w, var, s, lr)], "test_loss", cap) for lr in cfg.lr_grid)
                for s in cfg.test_seeds]
    b, d = per_seed(base), per_seed(v)
    out = _verdict_dict(stats.compare_seeds(b, d, higher_is_better=False, min_effect=0.0), len(b))
    out["base"], out["diff"] = b, d
    return out


def endpoints(cfg: LMSweepConfig, done: dict[Job, dict[str, Any]], cap: float, at: dict[str, Runs],
              matched: dict[str, Runs], variant: str) -> dict[str, Any]:
    """Every endpoint of one DIFF variant against the baseline ("Endpoints and statistics"), with the sensitivity
    rows (the matched lr, total parameters)."""
    base = registry.reference().name
    ws = sorted(at[base])
    big = max(ws)
    test = lambda r: loss_of(r, "test_loss", cap)  # noqa: E731
    e: dict[str, Any] = {"loss": endpoint_a(at[base], at[variant], test),
                         "loss_matched_lr": endpoint_a(matched[base], matched[variant], test)}
    if len(ws) > 1:  # a fit needs two widths (a partial rounding check may have one)
        e["param_ratio"] = endpoint_b(at[base], at[variant], test, "params_non_embedding")
        e["param_ratio_total"] = endpoint_b(at[base], at[variant], test, "params")
    e["token_ratio"] = endpoint_c(cfg, at[base][big], at[variant][big])
    e["outliers_attention_logit"] = endpoint_d(at[base][big], at[variant][big], "attention_logit_top1")
    e["outliers_hidden_state"] = endpoint_d(at[base][big], at[variant][big], "hidden_state_top1")
    e["lr_robustness"] = {str(w): endpoint_e(cfg, w, base, variant, done, cap) for w in ws  # every width's grid,
                          if all(Job(w, x, s, lr) in done for x in (base, variant)  # but in a rounding check's
                                 for lr in cfg.lr_grid for s in cfg.test_seeds)}  # chosen scope
    return e


def assemble(cfg: LMSweepConfig, done: dict[Job, dict[str, Any]], cap: float,
             widths: Optional[Sequence[int]] = None,
             choices: Optional[Choices] = None) -> dict[str, Any]:
    """sweep.json's body from the finished jobs: choices, per-width tables, every endpoint with its verdict.
    ``widths``: a subset (a partial rounding check); ``choices``: the lr choices to use instead of replaying them
    from ``done`` (the rounding check's chosen scope: the reference run's), where the matched-lr rows and the
    lr-robustness widths whose jobs did not run are left out."""
    base = registry.reference().name
    diffs = [v for v in cfg.variants if v != base]
    S, ws = cfg.test_seeds, sorted(widths or cfg.widths)
    big = max(ws)
    choices = choices or {w: {v: lr_choice(cfg, w, v, done, cap) for v in cfg.variants} for w in ws}
    chosen = {v: [choices[w][v].lr for w in ws] for v in cfg.variants}
    at = {v: {w: [done[Job(w, v, s, choices[w][v].lr)] for s in S] for w in ws}  # type: ignore[arg-type]
          for v in cfg.variants}
    m_ws = [w for w in ws if all(Job(w, v, s, choices[w][base].lr) in done for v in cfg.variants for s in S)]  # type: ignore[arg-type]
    matched = {v: {w: [done[Job(w, v, s, choices[w][base].lr)] for s in S] for w in m_ws}  # type: ignore[arg-type]
               for v in cfg.variants}
    table = {v: [{"width": w, "lr": choices[w][v].lr, "widened": choices[w][v].widened,
                  "edge": UNRESOLVED_EDGE if unresolved_edge(cfg, choices[w][v]) else "",
                  "params": at[v][w][0]["params"], "params_non_embedding": at[v][w][0]["params_non_embedding"],
                  "test_loss": [loss_of(r, "test_loss", cap) for r in at[v][w]],  # a diverged seed at the cap
                  "diverged": [r["seed"] for r in at[v][w] if r["diverged"]], "floor": at[v][w][0]["floor"],
                  "grid": lr_scores((r for j, r in done.items() if j.width == w and j.variant == v), cap)}
                 for w in ws] for v in cfg.variants}
    found = {v: endpoints(cfg, done, cap, at, matched, v) for v in diffs}
    from ..eval import stats
    if stats.smoke_run(cfg.steps) is not None:  # too few steps for any verdict (the library's smoke rule)
        _smoke(found, f"{cfg.steps} training steps, fewer than {stats.SMOKE_MIN_STEPS}: a smoke run")
    return {
        "widths": ws, "seeds": S, "lr_grid": list(cfg.lr_grid), "loss_cap": cap, "chosen_lr": chosen,
        "table": table, "endpoints": found,
        "applicability": premises(cfg, at[base], cap),
        "unresolved_edges": [{"variant": v, "width": r["width"], "lr": r["lr"]} for v in cfg.variants
                             for r in table[v] if r["edge"]],
        "curves": {v: {"tokens": [s * cfg.batch * cfg.seq_len for s in at[v][big][0]["curve"]["steps"]],
                       "test_loss": [r["curve"]["test_loss"] for r in at[v][big]]} for v in cfg.variants},
        "diverged_runs": {v: sum(bool(r["diverged"]) for j, r in done.items() if j.variant == v)
                          for v in cfg.variants},
        "failed_floor_runs": {v: sum(not passed(r) for j, r in done.items() if j.variant == v) for v in cfg.variants},
        "runs_total": {v: sum(j.variant == v for j in done) for v in cfg.variants},
    }


def premises(cfg: LMSweepConfig, base: Runs, cap: float) -> dict[str, Any]:
    """Both Fig. 3 premises ("Applicability") on the baseline's runs at its chosen lrs, for the page and the text
    (the endpoints carry the same result beside each ratio)."""
    ws = sorted(base)
    big = max(ws)
    out: dict[str, Any] = {}
    if len(ws) > 1:
        out["param_ratio"] = premise_3a([base[w][0]["params_non_embedding"] for w in ws],
                                        np.array([[loss_of(r, "test_loss", cap) for r in base[w]] for w in ws]))
    if all(passed(r) for r in base[big]):
        out["token_ratio"] = premise_3b(base[big][0]["curve"]["steps"],
                                        np.array([r["curve"]["test_loss"] for r in base[big]]), cfg.steps)
    return out


def _smoke(node: Any, why: str) -> None:
    """Every verdict under ``node`` replaced by the smoke-run verdict."""
    from ..eval import stats
    if isinstance(node, dict):
        if "verdict" in node:
            node.update(verdict=stats.SMOKE, why=why)
        for x in node.values():
            _smoke(x, why)


def _param_fn(nb: list[int], lb: np.ndarray, nd: list[int], ld: np.ndarray) -> Callable[[np.ndarray], float]:
    """Fig. 3a's ratio from the seeds at ``idx`` (losses: (widths, seeds))."""
    return lambda idx: param_ratio(nb, lb[:, idx].mean(1), nd, ld[:, idx].mean(1))


def _token_fn(tokens: list[int], cb: np.ndarray, cd: np.ndarray) -> Callable[[np.ndarray], float]:
    """Fig. 3b's ratio from the seeds at ``idx`` (curves: (seeds, points))."""
    return lambda idx: token_ratio(tokens, cb[idx].mean(0), cd[idx].mean(0))


def _outlier(field: str) -> Callable[[dict[str, Any]], float]:
    return lambda r: float(r["outliers"][field])


def _ratio_json(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "estimate": _json_float(r["estimate"]), "ci": [_json_float(x) for x in r["ci"]],
            "per_seed": [_json_float(x) for x in r["per_seed"]]}
