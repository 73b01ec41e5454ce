"""Verdict statistics for the report: confidence intervals per claim instead of "2 x SE and a minimum effect".

Why: with 2-5 seeds a 2 x SE margin is far too narrow (the 95% t critical value at df=2 is 4.30, not 2); ratio,
loss, spike and order-spread claims had no uncertainty at all; the order spread at chance is pure noise; a 30-step
smoke run got coloured verdicts. Every function here is pure (numpy/scipy, no torch) and validates its input.

Rules, fixed before any data (the primary endpoint of each claim is the one number passed in):
* seeds are paired across variants (seed s of every variant shares its initialisation and data), so DIFF - baseline
  is taken per seed and given a t-interval with df = n - 1; Welch's t when unpaired, a pooled t when one side has a
  single seed; with one seed each, a normal interval from the within-seed standard error the caller supplies
  (binomial for accuracies, over windows for losses), and the reason says the seed spread is unknown;
* **held**: the whole 95% interval lies on the good side of zero and the estimate beats ``min_effect``;
  **did not hold**: the whole interval lies on the bad side and the estimate is worse by more than ``min_effect``;
  otherwise **inconclusive at this scale**; **smoke run**: training too short for any verdict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping, Optional, Sequence, Union

import numpy as np
from scipy import stats as _st

HELD, NOT_HELD, INCONCLUSIVE, SMOKE = "held", "did not hold", "inconclusive at this scale", "smoke run"
VERDICTS = (HELD, NOT_HELD, INCONCLUSIVE, SMOKE)
LEVEL = 0.95
SMOKE_MIN_STEPS = 100  # fewer optimizer steps than this: the loss is still in its first fall, nothing to compare

WithinSE = Union[float, tuple[float, float], None]


@dataclass(frozen=True)
class Verdict:
    """One claim for one DIFF variant against the baseline.

    ``estimate`` is DIFF - baseline on the measured scale (``scale="difference"``) or DIFF / baseline
    (``scale="ratio"``, computed on log scale); ``ci`` is its ``level`` confidence interval on the same scale
    ((nan, nan) when there is none); ``n_seeds`` is (baseline, DIFF).
    """

    verdict: str
    estimate: float
    ci: tuple[float, float]
    n_seeds: tuple[int, int]
    method: str
    reason: str
    level: float = LEVEL
    scale: str = "difference"

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------- validation
def _values(x: Sequence[float], name: str, positive: bool = False) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of numbers, got {x!r}") from None
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of numbers, got {x!r}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must hold finite numbers (no NaN or inf), got {x!r}")
    if positive and np.any(a <= 0):
        raise ValueError(f"{name} must hold positive numbers (a ratio is compared on log scale), got {x!r}")
    return a


def _nonneg(v: float, name: str) -> float:
    if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    return float(v)


def _level(level: float) -> float:
    if not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95, got {level!r}")
    return float(level)


def t_crit(df: float, level: float = LEVEL) -> float:
    """Two-sided critical value of Student's t (df=2 at 95%: 4.303); ``df=inf`` gives the normal 1.960."""
    _level(level)
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    q = 0.5 + level / 2
    return float(_st.norm.ppf(q) if math.isinf(df) else _st.t.ppf(q, df))


# ---------------------------------------------------------------------------------------------- core comparison
def _interval(base: np.ndarray, diff: np.ndarray, paired: bool, within_se: WithinSE,
              level: float) -> tuple[float, float, float, str, str]:
    """(estimate DIFF - baseline, half-width, df, method, caveat); half-width nan when no interval exists."""
    nb, nd = base.size, diff.size
    est = float(diff.mean() - base.mean())
    if nb == 1 and nd == 1:
        if within_se is None:
            return est, math.nan, math.nan, "none", "one seed each and no within-seed standard error: no interval"
        if isinstance(within_se, tuple):
            if len(within_se) != 2:
                raise ValueError(f"within_se must be one SE of the difference or (se_base, se_diff), got {within_se!r}")
            se = math.hypot(_nonneg(within_se[0], "within_se[0]"), _nonneg(within_se[1], "within_se[1]"))
        else:
            se = _nonneg(within_se, "within_se")
        return est, t_crit(math.inf, level) * se, math.inf, "normal, within-seed SE", \
            "one seed: the seed spread is unknown, within-seed interval only"
    if paired:
        d = diff - base
        n = d.size
        se = float(d.std(ddof=1) / math.sqrt(n))
        return est, t_crit(n - 1, level) * se, n - 1, f"paired t, df={n - 1}", ""
    if nb == 1 or nd == 1:  # one side's spread unknown: pooled (equal-variance) t, the spread from the other side
        s2 = float(np.var(base if nb > 1 else diff, ddof=1))
        df = nb + nd - 2
        se = math.sqrt(s2 * (1 / nb + 1 / nd))
        return est, t_crit(df, level) * se, df, f"pooled t, df={df}", "one side has one seed: equal spread assumed"
    vb, vd = float(np.var(base, ddof=1)) / nb, float(np.var(diff, ddof=1)) / nd
    se = math.sqrt(vb + vd)
    df = (vb + vd) ** 2 / (vb ** 2 / (nb - 1) + vd ** 2 / (nd - 1)) if vb + vd > 0 else nb + nd - 2
    return est, t_crit(df, level) * se, df, f"Welch t, df={df:.1f}", ""


def _decide(est: float, half: float, good_sign: int, min_effect: float) -> tuple[str, str]:
    """The verdict rule of the module docstring on (estimate, half-width); good_sign +1: higher is better."""
    if not math.isfinite(half):
        return INCONCLUSIVE, "no interval"
    lo, hi = est - half, est + half
    gain = good_sign * est  # > 0: DIFF better
    on_good = lo > 0 if good_sign > 0 else hi < 0
    on_bad = hi < 0 if good_sign > 0 else lo > 0
    if on_good and gain > min_effect:
        return HELD, f"the whole interval is on the good side and the estimate beats {min_effect:.3g}"
    if on_bad and -gain > min_effect:
        return NOT_HELD, f"the whole interval is on the bad side and the estimate is worse by more than {min_effect:.3g}"
    if on_good or on_bad:
        return INCONCLUSIVE, f"the interval excludes 0 but the estimate is within the minimum effect {min_effect:.3g}"
    return INCONCLUSIVE, "interval includes 0"


def compare_seeds(base: Sequence[float], diff: Sequence[float], higher_is_better: bool, min_effect: float,
                  paired: bool = True, within_se: WithinSE = None, level: float = LEVEL) -> Verdict:
    """DIFF vs baseline on one number per seed (validation loss, answer mass, accuracy, spikes, NLL gains...).

    ``paired=True`` needs equal lengths, seed s of both at position s (see ``pair_by_seed``); ``paired=False`` gives
    Welch's t. With one seed each, ``within_se`` is the within-seed SE: one float for the SE of the difference (both
    models scored on the same items) or ``(se_base, se_diff)`` for independent ones; without it: inconclusive.
    """
    b, d = _values(base, "base"), _values(diff, "diff")
    me = _nonneg(min_effect, "min_effect")
    _level(level)
    if paired and b.size != d.size:
        raise ValueError(f"paired=True needs as many base as diff values (seed s of each), got {b.size} and "
                         f"{d.size}; pair them with pair_by_seed or pass paired=False")
    est, half, _, method, caveat = _interval(b, d, paired, within_se, level)
    verdict, why = _decide(est, half, 1 if higher_is_better else -1, me)
    reason = "; ".join(x for x in (caveat, why) if x and x != "no interval")
    return Verdict(verdict, est, (est - half, est + half), (int(b.size), int(d.size)), method, reason, level)


def pair_by_seed(base: Mapping[int, float], diff: Mapping[int, float]) -> tuple[list[float], list[float], list[int]]:
    """Values of the seeds both variants have, in seed order, and the seeds dropped (a run that failed)."""
    common = sorted(set(base) & set(diff))
    if not common:
        raise ValueError(f"base and diff share no seed (base {sorted(base)}, diff {sorted(diff)})")
    return [base[s] for s in common], [diff[s] for s in common], sorted(set(base) ^ set(diff))


# ---------------------------------------------------------------------------------------------- ratios
def compare_ratio(base: Sequence[float], diff: Sequence[float], max_ratio: float = 0.8, paired: bool = True,
                  within_se_log: WithinSE = None, level: float = LEVEL) -> Verdict:
    """Smaller-is-better ratio claims (attention-logit and hidden-state outliers, gradient-norm peaks).

    log DIFF - log baseline per seed, a t-interval, back-transformed: held when the whole ratio interval is below 1
    and the ratio below ``max_ratio`` (0.8: 20% smaller); did not hold when it is above 1 and the ratio above
    1/``max_ratio``. One seed: ``within_se_log`` is the SE of log(value) (e.g. from ``log_mean_se`` over evaluation
    sequences or training blocks); a single peak has none, so it stays inconclusive.
    """
    if not isinstance(max_ratio, (int, float)) or not 0 < max_ratio < 1:
        raise ValueError(f"max_ratio must be in (0, 1), e.g. 0.8, got {max_ratio!r}")
    v = compare_seeds(np.log(_values(base, "base", True)), np.log(_values(diff, "diff", True)), False,
                      -math.log(max_ratio), paired, within_se_log, level)
    lo, hi = v.ci
    return Verdict(v.verdict, math.exp(v.estimate), (math.exp(lo), math.exp(hi)), v.n_seeds,
                   v.method + " on log scale", v.reason.replace("minimum effect", "minimum log-ratio"), level, "ratio")


def log_mean_se(samples: Sequence[float]) -> tuple[float, float]:
    """Geometric mean and the SE of its log over samples (per-sequence maxima, per-block peaks): a ratio claim's
    within-seed uncertainty for one seed."""
    a = np.log(_values(samples, "samples", True))
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else math.nan
    return float(math.exp(a.mean())), se


# ---------------------------------------------------------------------------------------------- accuracies
def _count(n: int, name: str) -> int:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
    return int(n)


def wilson_interval(acc: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of one accuracy over ``n`` queries (sound near 0 and 1, unlike p +- z*SE)."""
    n = _count(n, "n")
    if not isinstance(acc, (int, float)) or not 0 <= acc <= 1:
        raise ValueError(f"acc must be in [0, 1], got {acc!r}")
    z = t_crit(math.inf, level)
    c = (acc + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(acc * (1 - acc) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def binomial_se(acc: float, n: int) -> float:
    """SE of an accuracy over ``n`` queries, floored at p=1/n so that 0% and 100% still carry uncertainty."""
    n = _count(n, "n")
    if not isinstance(acc, (int, float)) or not 0 <= acc <= 1:
        raise ValueError(f"acc must be in [0, 1], got {acc!r}")
    return math.sqrt(max(acc * (1 - acc), (1 - 1 / n) / n) / n)


def accuracy_interval(accs: Sequence[float], n_queries: int, level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, low, high) of one variant's accuracy: Wilson for one seed; for several, the t-interval of the seed
    mean with the binomial variance of the (shared) query sample added, since every seed is scored on one set."""
    a = _values(accs, "accs")
    n = _count(n_queries, "n_queries")
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"accs must be in [0, 1], got {accs!r}")
    m = float(a.mean())
    if a.size == 1:
        lo, hi = wilson_interval(m, n, level)
        return m, lo, hi
    se = math.sqrt(a.var(ddof=1) / a.size + m * (1 - m) / n)
    h = t_crit(a.size - 1, level) * se
    return m, max(0.0, m - h), min(1.0, m + h)


def above_chance(accs: Sequence[float], n_queries: int, chance: float, level: float = LEVEL) -> bool:
    """True only when the lower bound of the accuracy interval is above ``chance`` (the gate of accuracy claims)."""
    if not isinstance(chance, (int, float)) or not 0 <= chance < 1:
        raise ValueError(f"chance must be in [0, 1), got {chance!r}")
    return accuracy_interval(accs, n_queries, level)[1] > chance


def compare_accuracy(base: Sequence[float], diff: Sequence[float], n_queries: int, chance: float,
                     min_effect: float = 0.05, paired: bool = True, level: float = LEVEL) -> Verdict:
    """Accuracy claims (needles, 6-bit retrieval, many-shot ICL): gated on either model being above chance, then
    ``compare_seeds`` (one seed: binomial SEs of both, treated as independent: conservative on shared queries)."""
    ok_b, ok_d = above_chance(base, n_queries, chance, level), above_chance(diff, n_queries, chance, level)
    v = compare_seeds(base, diff, True, min_effect, paired,
                      (binomial_se(float(base[0]), n_queries), binomial_se(float(diff[0]), n_queries)), level)
    if ok_b or ok_d:
        return v
    return Verdict(INCONCLUSIVE, v.estimate, v.ci, v.n_seeds, v.method,
                   f"no model above chance ({chance:.3g}): the accuracy difference is noise", level)


# ---------------------------------------------------------------------------------------------- order spread
def spread_interval(correct: Sequence[Sequence[float]], n_boot: int = 2000, seed: int = 0,
                    level: float = LEVEL) -> tuple[float, float, float, float]:
    """(spread, low, high, SE) of best - worst accuracy over k orderings, bootstrapping the queries (the same
    resampled queries for every ordering, as they share them). ``correct``: k x n of 0/1 per ordering and query."""
    c = np.asarray(correct, dtype=float)
    if c.ndim != 2 or c.shape[0] < 2 or c.shape[1] < 1 or not np.all((c == 0) | (c == 1)):
        raise ValueError(f"correct must be k >= 2 orderings x n >= 1 queries of 0/1, got shape {c.shape}")
    _count(n_boot, "n_boot")
    acc = c.mean(1)
    idx = np.random.default_rng(seed).integers(0, c.shape[1], size=(n_boot, c.shape[1]))
    boot = c[:, idx].mean(2)  # (k, n_boot)
    s = boot.max(0) - boot.min(0)
    q = (1 - _level(level)) / 2
    return float(acc.max() - acc.min()), float(np.quantile(s, q)), float(np.quantile(s, 1 - q)), float(s.std(ddof=1))


def spread_se_binomial(accs: Sequence[float], n_queries: int, n_boot: int = 2000, seed: int = 0) -> float:
    """SE of best - worst over orderings from their accuracies alone (orderings treated as independent binomials:
    conservative, shared queries correlate them). For results that kept no per-query outcomes."""
    a = _values(accs, "accs")
    n = _count(n_queries, "n_queries")
    if a.size < 2 or np.any((a < 0) | (a > 1)):
        raise ValueError(f"accs must be >= 2 accuracies in [0, 1] (one per ordering), got {accs!r}")
    sim = np.random.default_rng(seed).binomial(n, a, size=(_count(n_boot, "n_boot"), a.size)) / n
    return float((sim.max(1) - sim.min(1)).std(ddof=1))


def compare_spread(base_orders: Sequence[Sequence[float]], diff_orders: Sequence[Sequence[float]], n_queries: int,
                   chance: float, min_effect: float = 0.05, level: float = LEVEL, seed: int = 0) -> Verdict:
    """"Less sensitive to demonstration order" (Fig. 7): per seed the accuracies over orderings of each model.

    Gate first: both models' mean accuracy over orderings must be above chance, since at chance the spread is pure
    noise (0.16 on average at 4 orderings of 32 queries). Then the spreads per seed are compared, lower better.
    """
    spreads, means = [], []
    for name, orders in (("base_orders", base_orders), ("diff_orders", diff_orders)):
        if len(orders) == 0:
            raise ValueError(f"{name} must hold one sequence of accuracies per seed, got none")
        rows = [_values(o, f"{name}[{i}]") for i, o in enumerate(orders)]
        if any(r.size < 2 for r in rows):
            raise ValueError(f"{name}: each seed needs >= 2 orderings for a spread")
        spreads.append([float(r.max() - r.min()) for r in rows])
        means.append([float(r.mean()) for r in rows])
    ses = tuple(spread_se_binomial(o[0], n_queries, seed=seed) for o in (base_orders, diff_orders))
    v = compare_seeds(spreads[0], spreads[1], False, min_effect, len(spreads[0]) == len(spreads[1]), ses, level)
    if all(above_chance(m, n_queries, chance, level) for m in means):
        return v
    return Verdict(INCONCLUSIVE, v.estimate, v.ci, v.n_seeds, v.method,
                   f"not both models above chance ({chance:.3g}): the order spread is noise there", level)


# ---------------------------------------------------------------------------------------------- page-level
def smoke_run(steps: int, min_steps: int = SMOKE_MIN_STEPS) -> Optional[Verdict]:
    """A "smoke run" verdict for a run too short to mean anything (the quick demo's 30 steps), else None."""
    steps, min_steps = _count(steps, "steps"), _count(min_steps, "min_steps")
    if steps >= min_steps:
        return None
    return Verdict(SMOKE, math.nan, (math.nan, math.nan), (0, 0), "none",
                   f"{steps} training steps (< {min_steps}): a smoke run, no verdicts")


def verdict_summary(verdicts: Sequence[Verdict], level: float = LEVEL) -> dict:
    """Counts and the multiplicity note: how many verdicts the page makes and how many would read "held" by
    chance alone if DIFF changed nothing (each tested verdict has (1 - level)/2 of it)."""
    _level(level)
    for v in verdicts:
        if not isinstance(v, Verdict) or v.verdict not in VERDICTS:
            raise ValueError(f"verdicts must be Verdict objects with a verdict in {VERDICTS}, got {v!r}")
    counts = {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS}
    tested = sum(all(math.isfinite(x) for x in v.ci) for v in verdicts)
    expected = tested * (1 - level) / 2
    note = (f"This page makes {len(verdicts)} verdicts ({tested} with an interval) at {level:.0%} each, with no "
            f"correction for multiplicity: if DIFF changed nothing, about {expected:.1f} would still read 'held' "
            "by chance (and as many 'did not hold').")
    return {"total": len(verdicts), "tested": tested, "counts": counts, "expected_false_held": expected,
            "note": note}


def parameter_note(base_params: int, diff_params: int, variant: str = "DIFF",
                   equal_size_base_params: Optional[int] = None, tolerance: float = 0.01) -> tuple[bool, str]:
    """(differs, note) for "lower loss at the same parameters": whether the counts differ by more than
    ``tolerance`` (1%) and the sentence the page prints (DIFF V2 has ~5% more parameters than the baseline)."""
    base_params, diff_params = _count(base_params, "base_params"), _count(diff_params, "diff_params")
    if not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    rel = diff_params / base_params - 1
    if abs(rel) <= tolerance:
        return False, f"{variant} and the baseline have the same parameter count within {tolerance:.0%} ({rel:+.1%})."
    more = "more" if rel > 0 else "fewer"
    if equal_size_base_params is not None:
        eq = _count(equal_size_base_params, "equal_size_base_params") / diff_params - 1
        return True, (f"{variant} has {abs(rel):.1%} {more} parameters than the baseline; its loss verdict is against "
                      f"a baseline of equal size ({eq:+.1%}).")
    return True, (f"{variant} has {abs(rel):.1%} {more} parameters than the baseline; its loss verdict does not "
                  "account for that.")
