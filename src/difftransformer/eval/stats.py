"""Verdict statistics for the report: confidence intervals per claim instead of "2 x SE and a minimum effect".

Why: with 2-5 seeds 2 x SE is too narrow (the 95% t value at df=2 is 4.30); ratio, loss, spike and order-spread
claims had no uncertainty; the order spread at chance is noise; a 30-step smoke run got coloured verdicts.
Seeds are paired across variants (seed s of each shares initialisation and data): DIFF - baseline per seed, a
t-interval with df = n - 1 (Welch's t unpaired; with one seed each, a normal interval from a within-seed SE the
caller supplies, and the reason says the seed spread is unknown). **held**: the whole 95% interval on the good side
of 0 and the estimate beyond ``min_effect``; **did not hold**: the same on the bad side; else **inconclusive at this
scale**; **smoke run**: training too short for any verdict. Pure functions (numpy/scipy), every input validated.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Optional, Union

import numpy as np

from ..extras import require

HELD, NOT_HELD, INCONCLUSIVE, SMOKE = "held", "did not hold", "inconclusive at this scale", "smoke run"
VERDICTS = (HELD, NOT_HELD, INCONCLUSIVE, SMOKE)
LEVEL = 0.95
SMOKE_MIN_STEPS = 100  # fewer optimizer steps than this: the loss is still in its first fall, nothing to compare

WithinSE = Union[float, tuple[float, float], None]


@dataclass(frozen=True)
class Verdict:
    """One claim, one DIFF variant vs the baseline. ``estimate``: DIFF - baseline (``scale="difference"``) or
    DIFF / baseline (``scale="ratio"``, from logs); ``ci``: its ``level`` interval, (nan, nan) when there is none;
    ``n_seeds``: (baseline, DIFF); ``method``: how the interval was made; ``reason``: one sentence why."""
    verdict: str
    estimate: float
    ci: tuple[float, float]
    n_seeds: tuple[int, int]
    method: str
    reason: str
    level: float = LEVEL
    scale: str = "difference"


def _values(x: Sequence[float], name: str, positive: bool = False) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of numbers, got {x!r}") from None
    if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be a non-empty 1-D sequence of finite numbers (no NaN), got {x!r}")
    if positive and np.any(a <= 0):
        raise ValueError(f"{name} must hold positive numbers (a ratio is compared on log scale), got {x!r}")
    return a


def _num(v: float, name: str, lo: float, hi: float, allowed: str, closed: bool = True) -> float:
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or not (lo <= v <= hi if closed else lo < v < hi):
        raise ValueError(f"{name} must be in {allowed}, got {v!r}")
    return float(v)


def _accs(x: Sequence[float], name: str, min_len: int = 1) -> np.ndarray:
    a = _values(x, name)
    if a.size < min_len or np.any((a < 0) | (a > 1)):
        raise ValueError(f"{name} must hold >= {min_len} accuracies in [0, 1], got {x!r}")
    return a


def _level(level: float) -> float:
    return _num(level, "level", 0, 1, "(0, 1), e.g. 0.95", closed=False)


def _count(n: int, name: str) -> int:
    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
    return int(n)


def t_crit(df: float, level: float = LEVEL) -> float:
    """Two-sided critical value of Student's t (df=2 at 95%: 4.303); ``df=inf`` gives the normal 1.960."""
    _level(level)
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    _st = require("scipy.stats", "report", "the report's statistics")  # imported here: scipy is an extra
    return float(_st.norm.ppf(0.5 + level / 2) if math.isinf(df) else _st.t.ppf(0.5 + level / 2, df))


def _interval(b: np.ndarray, d: np.ndarray, paired: bool, within_se: WithinSE, level: float):
    """(estimate DIFF - baseline, half-width, method, caveat); half-width nan when no interval exists."""
    nb, nd, est = b.size, d.size, float(d.mean() - b.mean())
    if nb == 1 and nd == 1:
        if within_se is None:
            return est, math.nan, "none", "one seed each and no within-seed standard error: no interval"
        parts = within_se if isinstance(within_se, tuple) and len(within_se) == 2 else (within_se,)
        se = math.hypot(*(_num(x, "within_se", 0, math.inf, "[0, inf), or a pair (se_base, se_diff)") for x in parts))
        return est, t_crit(math.inf, level) * se, "normal, within-seed SE", \
            "one seed: the seed spread is unknown, within-seed interval only"
    if paired:
        return est, t_crit(nb - 1, level) * float((d - b).std(ddof=1)) / math.sqrt(nb), f"paired t, df={nb - 1}", ""
    if nb == 1 or nd == 1:  # one side's spread unknown: pooled (equal-variance) t, df = nb + nd - 2
        se = math.sqrt(float(np.var(b if nb > 1 else d, ddof=1)) * (1 / nb + 1 / nd))
        return est, t_crit(nb + nd - 2, level) * se, f"pooled t, df={nb + nd - 2}", \
            "one side has one seed: equal spread assumed"
    vb, vd = float(np.var(b, ddof=1)) / nb, float(np.var(d, ddof=1)) / nd
    df = (vb + vd) ** 2 / (vb ** 2 / (nb - 1) + vd ** 2 / (nd - 1)) if vb + vd > 0 else nb + nd - 2
    return est, t_crit(df, level) * math.sqrt(vb + vd), f"Welch t, df={df:.1f}", ""


def _compare(b, d, good: int, min_effect: float, paired: bool, within_se: WithinSE, level: float,
             texts: tuple[str, str, str, str]) -> Verdict:
    """The verdict rule of the module docstring; ``good`` +1 when higher is better; ``texts``: why held / did not
    hold / excludes 0 but small / includes 0."""
    est, half, method, caveat = _interval(b, d, paired, within_se, level)
    lo, hi = est - half, est + half
    verdict, why = INCONCLUSIVE, texts[3]
    if not math.isfinite(half):
        why = ""
    elif (lo > 0 if good > 0 else hi < 0):
        verdict, why = (HELD, texts[0]) if good * est > min_effect else (INCONCLUSIVE, texts[2])
    elif (hi < 0 if good > 0 else lo > 0):
        verdict, why = (NOT_HELD, texts[1]) if -good * est > min_effect else (INCONCLUSIVE, texts[2])
    reason = "; ".join(x for x in (caveat, why) if x)
    return Verdict(verdict, est, (lo, hi), (int(b.size), int(d.size)), method, reason, level)


def _check(base, diff, paired: bool, level: float, positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
    b, d = _values(base, "base", positive), _values(diff, "diff", positive)
    _level(level)
    if paired and b.size != d.size:
        raise ValueError(f"paired=True needs as many base as diff values (seed s of each), got {b.size} and "
                         f"{d.size}; pair them with pair_by_seed or pass paired=False")
    return b, d


def compare_seeds(base: Sequence[float], diff: Sequence[float], higher_is_better: bool, min_effect: float,
                  paired: bool = True, within_se: WithinSE = None, level: float = LEVEL) -> Verdict:
    """DIFF vs baseline on one number per seed (validation loss, answer mass, accuracy, spikes, NLL gains...).
    ``paired=True`` needs equal lengths, seed s of both at position s (see ``pair_by_seed``); ``paired=False``: Welch.
    One seed each: ``within_se`` is one float (SE of the difference, both scored on the same items) or
    ``(se_base, se_diff)`` (independent); without it, no interval: inconclusive."""
    b, d = _check(base, diff, paired, level)
    me = _num(min_effect, "min_effect", 0, math.inf, "[0, inf)")
    return _compare(b, d, 1 if higher_is_better else -1, me, paired, within_se, level,
                    (f"the whole interval is on the good side and the estimate beats {me:.3g}",
                     f"the whole interval is on the bad side and the estimate is worse by more than {me:.3g}",
                     f"the interval excludes 0 but the estimate is within the minimum effect {me:.3g}",
                     "interval includes 0"))


def pair_by_seed(base: Mapping[int, float], diff: Mapping[int, float]) -> tuple[list[float], list[float], list[int]]:
    """Values of the seeds both variants have, in seed order, and the seeds dropped (a run that failed)."""
    common = sorted(set(base) & set(diff))
    if not common:
        raise ValueError(f"base and diff share no seed (base {sorted(base)}, diff {sorted(diff)})")
    return [base[s] for s in common], [diff[s] for s in common], sorted(set(base) ^ set(diff))


def compare_ratio(base: Sequence[float], diff: Sequence[float], max_ratio: float = 0.8, paired: bool = True,
                  within_se_log: WithinSE = None, level: float = LEVEL) -> Verdict:
    """Smaller-is-better ratio claims (attention-logit and hidden-state outliers, gradient-norm peaks): log DIFF -
    log baseline per seed, t-interval, back-transformed. held: the ratio interval below 1 and the ratio below
    ``max_ratio``; did not hold: above 1 and above 1/``max_ratio``. One seed: ``within_se_log`` is the SE of
    log(value) (``log_mean_se`` over evaluation sequences or training blocks); a lone peak has none: inconclusive."""
    r = _num(max_ratio, "max_ratio", 0, 1, "(0, 1), e.g. 0.8", closed=False)
    b, d = _check(base, diff, paired, level, positive=True)
    v = _compare(np.log(b), np.log(d), -1, -math.log(r), paired, within_se_log, level,
                 (f"the whole ratio interval is below 1 and the ratio below {r:g}",
                  f"the whole ratio interval is above 1 and the ratio above {1 / r:.3g}",
                  f"the ratio interval excludes 1 but the ratio is within {r:g}-{1 / r:.3g}",
                  "ratio interval includes 1"))
    return replace(v, estimate=math.exp(v.estimate), ci=(math.exp(v.ci[0]), math.exp(v.ci[1])),
                   method=v.method + " on log scale", scale="ratio")


def log_mean_se(samples: Sequence[float]) -> tuple[float, float]:
    """Geometric mean and the SE of its log over samples (per-sequence maxima, per-block peaks): a ratio claim's
    within-seed uncertainty for one seed."""
    a = np.log(_values(samples, "samples", True))
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else math.nan
    return float(math.exp(a.mean())), se


def wilson_interval(acc: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of one accuracy over ``n`` queries (sound near 0 and 1, unlike p +- z*SE)."""
    n, acc = _count(n, "n"), _num(acc, "acc", 0, 1, "[0, 1]")
    z2 = t_crit(math.inf, level) ** 2
    c, h = acc + z2 / (2 * n), math.sqrt(z2 * acc * (1 - acc) / n + z2 * z2 / (4 * n * n))
    return max(0.0, (c - h) / (1 + z2 / n)), min(1.0, (c + h) / (1 + z2 / n))


def binomial_se(acc: float, n: int) -> float:
    """SE of an accuracy over ``n`` queries, floored at p=1/n so that 0% and 100% still carry uncertainty."""
    n, acc = _count(n, "n"), _num(acc, "acc", 0, 1, "[0, 1]")
    return math.sqrt(max(acc * (1 - acc), (1 - 1 / n) / n) / n)


def accuracy_interval(accs: Sequence[float], n_queries: int, level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, low, high) of one variant's accuracy: Wilson for one seed; for several, the t-interval of the seed
    mean with the binomial variance of the (shared) query sample added, since every seed is scored on one set."""
    a, n = _accs(accs, "accs"), _count(n_queries, "n_queries")
    m = float(a.mean())
    if a.size == 1:
        return (m, *wilson_interval(m, n, level))
    h = t_crit(a.size - 1, level) * math.sqrt(a.var(ddof=1) / a.size + m * (1 - m) / n)
    return m, max(0.0, m - h), min(1.0, m + h)


def above_chance(accs: Sequence[float], n_queries: int, chance: float, level: float = LEVEL) -> bool:
    """True only when the lower bound of the accuracy interval is above ``chance`` (the gate of accuracy claims)."""
    _num(chance, "chance", 0, 1, "[0, 1]")
    return accuracy_interval(accs, n_queries, level)[1] > chance


def compare_accuracy(base: Sequence[float], diff: Sequence[float], n_queries: int, chance: float,
                     min_effect: float = 0.05, paired: bool = True, level: float = LEVEL) -> Verdict:
    """Accuracy claims (needles, 6-bit retrieval, many-shot ICL): gated on either model being above chance, then
    ``compare_seeds`` (one seed: binomial SEs of both, treated as independent: conservative on shared queries)."""
    ok = above_chance(base, n_queries, chance, level) or above_chance(diff, n_queries, chance, level)
    v = compare_seeds(base, diff, True, min_effect, paired,
                      (binomial_se(float(base[0]), n_queries), binomial_se(float(diff[0]), n_queries)), level)
    return v if ok else replace(v, verdict=INCONCLUSIVE, reason=f"no model above chance ({chance:.3g})")


def spread_interval(correct: Sequence[Sequence[float]], n_boot: int = 2000, seed: int = 0,
                    level: float = LEVEL) -> tuple[float, float, float, float]:
    """(spread, low, high, SE) of best - worst accuracy over k orderings, bootstrapping the queries (the same
    resampled queries for every ordering, as they share them). ``correct``: k x n of 0/1 per ordering and query."""
    c = np.asarray(correct, dtype=float)
    if c.ndim != 2 or c.shape[0] < 2 or c.shape[1] < 1 or not np.all((c == 0) | (c == 1)):
        raise ValueError(f"correct must be k >= 2 orderings x n >= 1 queries of 0/1, got shape {c.shape}")
    _count(n_boot, "n_boot")
    acc, q = c.mean(1), (1 - _level(level)) / 2
    boot = c[:, np.random.default_rng(seed).integers(0, c.shape[1], size=(n_boot, c.shape[1]))].mean(2)  # (k, B)
    s = boot.max(0) - boot.min(0)
    return float(acc.max() - acc.min()), float(np.quantile(s, q)), float(np.quantile(s, 1 - q)), float(s.std(ddof=1))


def spread_se_binomial(accs: Sequence[float], n_queries: int, n_boot: int = 2000, seed: int = 0) -> float:
    """SE of best - worst over orderings from their accuracies alone (orderings treated as independent binomials:
    conservative, shared queries correlate them). For results that kept no per-query outcomes."""
    a, n = _accs(accs, "accs", 2), _count(n_queries, "n_queries")
    sim = np.random.default_rng(seed).binomial(n, a, size=(_count(n_boot, "n_boot"), a.size)) / n
    return float((sim.max(1) - sim.min(1)).std(ddof=1))


def compare_spread(base_orders: Sequence[Sequence[float]], diff_orders: Sequence[Sequence[float]], n_queries: int,
                   chance: float, min_effect: float = 0.05, level: float = LEVEL, seed: int = 0) -> Verdict:
    """"Less sensitive to demonstration order" (Fig. 7), from each seed's accuracies over orderings. Gated first on
    both models' mean accuracy being above chance: at chance the spread is noise (0.16 on average at 4 orderings of
    32 queries). Then the spreads are compared per seed, lower better (one seed: ``spread_se_binomial``)."""
    spreads, means = [], []
    for name, orders in (("base_orders", base_orders), ("diff_orders", diff_orders)):
        if len(orders) == 0:
            raise ValueError(f"{name} must hold one sequence of accuracies per seed, got none")
        rows = [_accs(o, f"{name}[{i}]", 2) for i, o in enumerate(orders)]
        spreads.append([float(r.max() - r.min()) for r in rows])
        means.append([float(r.mean()) for r in rows])
    ses = (spread_se_binomial(base_orders[0], n_queries, seed=seed),
           spread_se_binomial(diff_orders[0], n_queries, seed=seed))
    v = compare_seeds(spreads[0], spreads[1], False, min_effect, len(spreads[0]) == len(spreads[1]), ses, level)
    ok = all(above_chance(m, n_queries, chance, level) for m in means)
    return v if ok else replace(v, verdict=INCONCLUSIVE, reason=f"not both models above chance ({chance:.3g}): "
                                                                "the order spread is noise there")


BOOT_DRAWS = 2000  # the draws of every pre-registered bootstrap ratio interval (generator seed 0)
BOOT_MAX_UNDEFINED = 0.05  # a larger share of draws without a ratio: inconclusive


PercentileRule = Literal["linear", "inverted_cdf"]


def percentile_interval(draws: np.ndarray, method: PercentileRule) -> tuple[float, float]:
    """The 95% percentile interval of bootstrap ``draws``, (nan, nan) without any. ``method``: numpy's quantile rule,
    pre-registered by each study ("linear" for the retrieval width sweep; "inverted_cdf" for the language-model
    sweep, an order statistic that tolerates an infinite ratio)."""
    if not draws.size:
        return math.nan, math.nan
    return float(np.quantile(draws, 0.025, method=method)), float(np.quantile(draws, 0.975, method=method))


def verdict_row(claim: str, paper: str, variant: str, measure: str, v: Verdict) -> dict[str, Any]:
    """One verdict row of a page or a study's JSON (the claim's words beside the statistics)."""
    why = v.reason
    if all(math.isfinite(x) for x in v.ci):
        what = "DIFF / baseline" if v.scale == "ratio" else "DIFF - baseline"
        why = (f"{what} {v.estimate:.4g}, {v.level:.0%} CI [{v.ci[0]:.4g}, {v.ci[1]:.4g}] ({v.method}, seeds "
               f"{v.n_seeds[0]}/{v.n_seeds[1]}); {v.reason}")
    return {"claim": claim, "paper": paper, "variant": variant, "measure": measure, "verdict": v.verdict, "why": why,
            "stats": asdict(v)}


def smoke_run(steps: int, min_steps: int = SMOKE_MIN_STEPS) -> Optional[Verdict]:
    """A "smoke run" verdict for a run too short to mean anything (the quick demo's 30 steps), else None."""
    steps, min_steps = _count(steps, "steps"), _count(min_steps, "min_steps")
    return None if steps >= min_steps else Verdict(SMOKE, math.nan, (math.nan, math.nan), (0, 0), "none",
                                                   f"{steps} training steps (< {min_steps}): a smoke run, no verdicts")


def verdict_summary(verdicts: Sequence[Verdict], level: float = LEVEL) -> dict:
    """Counts and the multiplicity note: how many verdicts the page makes and how many would read "held" by
    chance alone if DIFF changed nothing (each tested verdict has (1 - level)/2 of it)."""
    _level(level)
    if any(not isinstance(v, Verdict) or v.verdict not in VERDICTS for v in verdicts):
        raise ValueError(f"verdicts must be Verdict objects with a verdict in {VERDICTS}, got {verdicts!r}")
    tested = sum(all(math.isfinite(x) for x in v.ci) for v in verdicts)
    expected = tested * (1 - level) / 2
    return {"total": len(verdicts), "tested": tested, "expected_false_held": expected,
            "counts": {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS},
            "note": f"This page makes {len(verdicts)} verdicts ({tested} with an interval) at {level:.0%} each, with "
                    f"no correction for multiplicity: if DIFF changed nothing, about {expected:.1f} would still read "
                    "'held' by chance (and as many 'did not hold')."}


def parameter_note(base_params: int, diff_params: int, variant: str = "DIFF",
                   equal_size_base_params: Optional[int] = None, tolerance: float = 0.01) -> tuple[bool, str]:
    """(differs, note) for "lower loss at the same parameters": whether the counts differ by more than
    ``tolerance`` (1%) and the sentence the page prints (DIFF V2 has ~5% more parameters than the baseline)."""
    base_params, diff_params = _count(base_params, "base_params"), _count(diff_params, "diff_params")
    _num(tolerance, "tolerance", 0, 0.5, "[0, 0.5]")
    rel = diff_params / base_params - 1
    if abs(rel) <= tolerance:
        return False, f"{variant} and the baseline have the same parameter count within {tolerance:.0%} ({rel:+.1%})."
    head = f"{variant} has {abs(rel):.1%} {'more' if rel > 0 else 'fewer'} parameters than the baseline; "
    if equal_size_base_params is None:
        return True, head + "its loss verdict does not account for that."
    eq = _count(equal_size_base_params, "equal_size_base_params") / diff_params - 1
    return True, head + f"its loss verdict is against a baseline of equal size ({eq:+.1%} parameters)."
