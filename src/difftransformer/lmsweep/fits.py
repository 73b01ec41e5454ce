"""Fig. 3's two ratios (PROTOCOL.md, endpoints (b) and (c)) and their verdict rule: pure functions of loss arrays,
so the tests feed them curves built to a known ratio (``analysis`` applies them to the sweep's runs)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

MAX_SLOPE = -1e-9  # a loss-vs-log-parameters slope at or above this is flat or rising: no parameter ratio


def fit_loglinear(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(a, b) of y = a + b log x, least squares."""
    b, a = np.polyfit(np.log(np.asarray(x, dtype=float)), np.asarray(y, dtype=float), 1)
    return float(a), float(b)


def param_ratio(params_base: Sequence[float], loss_base: Sequence[float], params_diff: Sequence[float],
                loss_diff: Sequence[float]) -> float:
    """Fig. 3a: the parameters at which DIFF's fitted loss equals the baseline's fitted loss at the baseline's
    largest parameter count, over that count. nan when a fitted slope is not negative (flat or rising curves)."""
    ab, bb = fit_loglinear(params_base, loss_base)
    ad, bd = fit_loglinear(params_diff, loss_diff)
    if not (bb < MAX_SLOPE and bd < MAX_SLOPE):
        return math.nan
    ref = float(max(params_base))
    target = ab + bb * math.log(ref)
    z = (target - ad) / bd - math.log(ref)
    return math.exp(z) if z < 700 else math.inf


def token_ratio(tokens: Sequence[float], curve_base: Sequence[float], curve_diff: Sequence[float]) -> float:
    """Fig. 3b: the tokens at which DIFF's curve first reaches the baseline's final loss (linear in log tokens
    between points; the first point when already there), over the baseline's final token count; inf when never."""
    t = np.asarray(tokens, dtype=float)
    target = float(curve_base[-1])
    d = np.asarray(curve_diff, dtype=float)
    hit = np.nonzero(d <= target)[0]
    if hit.size == 0:
        return math.inf
    i = int(hit[0])
    if i == 0:
        return float(t[0] / t[-1])
    lo, hi = math.log(t[i - 1]), math.log(t[i])
    f = (d[i - 1] - target) / (d[i - 1] - d[i])
    return math.exp(lo + f * (hi - lo)) / float(t[-1])


def ratio_verdict(ratio_fn: Callable[[np.ndarray], float], seeds: int, n_boot: Optional[int] = None) -> dict[str, Any]:
    """Estimate, paired percentile bootstrap over seeds and per-seed ratios, and the verdict (PROTOCOL.md (b)).

    ``ratio_fn(idx)``: the ratio from the seeds at positions ``idx`` (seed means over them)."""
    from ..eval import stats
    n_boot = n_boot or stats.BOOT_DRAWS
    est = ratio_fn(np.arange(seeds))
    rng = np.random.default_rng(0)
    boot = np.array([ratio_fn(idx) for idx in rng.integers(0, seeds, size=(n_boot, seeds))])
    per_seed = [ratio_fn(np.array([i])) for i in range(seeds)]
    ok = boot[~np.isnan(boot)]
    undefined = 1 - ok.size / n_boot
    lo, hi = stats.percentile_interval(ok, "inverted_cdf")  # an order statistic: no interpolation with an inf
    seeds_ok = all(not math.isnan(r) for r in per_seed)
    if math.isnan(est) or undefined > stats.BOOT_MAX_UNDEFINED or not seeds_ok:
        verdict, why = stats.INCONCLUSIVE, (f"no ratio in {undefined:.0%} of the bootstrap draws, the estimate or a "
                                           "seed (a fitted curve that does not fall)")
    elif hi < 1 and all(r < 1 for r in per_seed):
        verdict, why = stats.HELD, "the whole interval and every seed's own ratio are below 1"
    elif lo > 1 and all(r > 1 for r in per_seed):
        verdict, why = stats.NOT_HELD, "the whole interval and every seed's own ratio are above 1"
    else:
        verdict, why = stats.INCONCLUSIVE, ("the interval includes 1" if lo <= 1 <= hi
                                            else "the interval excludes 1 but a seed's own ratio does not")
    return {"estimate": est, "ci": [lo, hi], "per_seed": per_seed, "undefined_share": undefined, "n_boot": n_boot,
            "seeds": seeds, "verdict": verdict, "why": why}
