"""The verdict on each of the paper's claims (see the package docstring): DIFF V1 and V2 vs the baseline.

``verdicts(runs)`` is the entry point: one row per claim and DIFF variant, from the runs' results and training
summaries. Each claim names the measure it reads; the analyses' specs list the claim titles they feed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .results import RunResults

VARIANTS = ("baseline", "diff_v1", "diff_v2")
NAMES = {"baseline": "Baseline", "diff_v1": "DIFF V1", "diff_v2": "DIFF V2"}
HELD, NOT_HELD, INCONCLUSIVE = "held", "did not hold", "inconclusive at this scale"

RULE = """Each of the paper's claims gets a verdict comparing DIFF (V1 and V2 separately) with the baseline: **held** when
DIFF is better by more than the margin, **did not hold** when it is worse by more than the margin, otherwise
**inconclusive at this scale**. The margin is twice the combined standard error (binomial for accuracies, over
samples for masses and losses, plus the spread over seeds when several seeds are given), and never less than a
stated minimum effect. Accuracy claims are also inconclusive when no model is clearly above chance."""


@dataclass
class Measure:
    """One number per run with its standard error (0 when the analysis gives none)."""

    value: float
    se: float = 0.0


def _group(runs: Sequence[RunResults], key: Callable[[RunResults], Optional[Measure]]) -> dict[str, list[Measure]]:
    g: dict[str, list[Measure]] = {}
    for r in runs:
        try:
            m = key(r)
        except (KeyError, IndexError, TypeError, ZeroDivisionError):
            m = None
        if m is not None and math.isfinite(m.value):
            g.setdefault(r.attention, []).append(m)
    return g


def _mean_se(ms: Sequence[Measure]) -> tuple[float, float, float]:
    """(mean, standard error, seed spread max - min) of one variant's runs."""
    vals = [m.value for m in ms]
    mean = sum(vals) / len(vals)
    within = math.sqrt(sum(m.se ** 2 for m in ms)) / len(ms)
    between = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
    return mean, math.sqrt(within ** 2 + between ** 2), max(vals) - min(vals)


def compare(base: Sequence[Measure], diff: Sequence[Measure], higher_is_better: bool, min_effect: float,
            floor: Optional[float] = None) -> tuple[str, str]:
    """Verdict and a one-line reason for DIFF vs baseline on one measure (see the module docstring)."""
    mb, sb, spread_b = _mean_se(base)
    md, sd, spread_d = _mean_se(diff)
    delta = (md - mb) if higher_is_better else (mb - md)  # > 0: DIFF better
    margin = max(2 * math.sqrt(sb ** 2 + sd ** 2), min_effect)
    seeds = f"{len(base)}/{len(diff)} seed(s)"
    spread = f"; seed spread {spread_b:.3g} / {spread_d:.3g}" if len(base) > 1 or len(diff) > 1 else ""
    why = f"baseline {mb:.4g} vs DIFF {md:.4g} (margin {margin:.3g}, {seeds}{spread})"
    if floor is not None and max(mb, md) <= floor + margin:
        return INCONCLUSIVE, why + f"; neither is clearly above chance ({floor:.3g})"
    if delta > margin:
        return HELD, why
    if delta < -margin:
        return NOT_HELD, why
    return INCONCLUSIVE, why


def _binomial_se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1.0 / max(n, 1)) / max(n, 1))


def _needle_acc(r: RunResults) -> Measure:
    x = r.results["needles"]
    n = x["samples_per_cell"] * len(x["lengths"]) * len(x["depths"])
    return Measure(x["mean_accuracy"], _binomial_se(x["mean_accuracy"], n))


def _noise(key: str) -> Callable[[RunResults], Measure]:
    return lambda r: Measure(r.results["noise"][key], r.results["noise"][f"{key}_sem"])


def _outlier(kind: str) -> Callable[[RunResults], Measure]:
    return lambda r: Measure(r.results["outliers"][kind]["top1"])


def _quant_row(r: RunResults, bits: int) -> dict[str, Any]:
    return next(row for row in r.results["quantized"]["rows"] if row["bits"] == bits)


def _quant_acc(bits: int) -> Callable[[RunResults], Measure]:
    def f(r: RunResults) -> Measure:
        acc = _quant_row(r, bits)["accuracy"]
        return Measure(acc, _binomial_se(acc, r.results["quantized"]["samples"]))
    return f


def _quant_loss(bits: int) -> Callable[[RunResults], Measure]:
    return lambda r: Measure(_quant_row(r, bits)["loss_increase"])


def _positions_tail(r: RunResults) -> Measure:
    x = r.results["positions"]
    return Measure(x["tail_nll"], x.get("tail_nll_se", 0.0))


def _icl_best(r: RunResults) -> Measure:
    x = r.results["icl"]
    return Measure(x["max_shot_accuracy"], _binomial_se(x["max_shot_accuracy"], x.get("max_shot_samples", 1)))


def _icl_spread(r: RunResults) -> Measure:
    return Measure(r.results["icl"]["order"]["spread"])


def _val_loss(r: RunResults) -> Optional[Measure]:
    v = r.training.get("final_val_loss")
    return Measure(v) if v is not None else None


def _grad_max(r: RunResults) -> Optional[Measure]:
    g = r.training.get("grad_norm_max")
    return Measure(g) if g is not None else None


def _spikes(r: RunResults) -> Optional[Measure]:
    return Measure(float(len(r.training["spikes"]))) if r.training["step"] else None


def _chance(runs: Sequence[RunResults], analysis: str, key: str = "chance") -> Optional[float]:
    for r in runs:
        x = r.results.get(analysis)
        if x is not None:
            return x.get("task", x).get(key)
    return None


@dataclass
class Claim:
    title: str
    paper: str  # the paper's figure or table and its number
    measure: Callable[[RunResults], Optional[Measure]]
    higher_is_better: bool
    min_effect: float
    unit: str
    floor: Optional[Callable[[Sequence[RunResults]], Optional[float]]] = None
    only: Optional[str] = None  # a claim about one variant (V2's seed claims)


def claims() -> list[Claim]:
    return [
        Claim("lower validation loss at the same parameters and tokens", "Fig. 3; V2: 0.02-0.03 below baseline",
              _val_loss, False, 0.02, "final validation loss (nats); min effect 0.02 when seed spread is unknown"),
        Claim("better multi-needle retrieval", "Table 2: N=6, R=2 at 4K 0.85 vs 0.55", _needle_acc, True, 0.05,
              "mean exact-match accuracy over the grid", lambda rs: _chance(rs, "needles", "random_needle")),
        Claim("more attention on the answer span", "Table 3: 0.27-0.40 vs 0.03-0.09", _noise("answer"), True, 0.01,
              "attention mass on the target needle at the answering query"),
        Claim("less attention noise", "Table 3: 0.01-0.02 vs 0.49-0.54", _noise("noise"), False, 0.01,
              "attention mass on the rest of the context"),
        Claim("smaller attention-logit outliers", "Table 5: top-1 38.8 vs 318.0", _outlier("attention_logits"), False,
              0.0, "top-1 |attention logit|; DIFF must be below 0.8x baseline", None),
        Claim("smaller hidden-state outliers", "Table 5: top-1 1688 vs 3609", _outlier("hidden_states"), False, 0.0,
              "top-1 |hidden state|; DIFF must be below 0.8x baseline", None),
        Claim("retrieval kept at 6-bit attention logits", "Fig. 8", _quant_acc(6), True, 0.05,
              "retrieval accuracy with 6-bit logits", lambda rs: _chance(rs, "quantized", "random_needle")),
        Claim("smaller loss increase at 4-bit attention logits", "Fig. 8: 4-bit DIFF ~ 6-bit baseline",
              _quant_loss(4), False, 0.005, "validation loss increase at 4 bits vs full precision"),
        Claim("lower NLL deep into long context", "Fig. 4", _positions_tail, False, 0.02,
              "mean NLL over the last quarter of the positions evaluated"),
        Claim("more accurate many-shot in-context learning", "Fig. 6", _icl_best, True, 0.05,
              "accuracy at the largest shot count that fits", lambda rs: _chance(rs, "icl")),
        Claim("less sensitive to demonstration order", "Fig. 7", _icl_spread, False, 0.05,
              "best - worst accuracy over orderings"),
        Claim("fewer loss spikes", "V2 article (seed 002)", _spikes, False, 1.0,
              "training steps whose loss exceeds 1.1x the median of the previous 10 (after warm-up)"),
        Claim("smaller gradient-norm peaks", "V2 article (seed 002)", _grad_max, False, 0.0,
              "largest pre-clipping gradient norm after warm-up; DIFF must be below 0.8x baseline"),
    ]


RATIO_CLAIMS = {"smaller attention-logit outliers", "smaller hidden-state outliers", "smaller gradient-norm peaks"}


def verdicts(runs: Sequence[RunResults]) -> list[dict[str, Any]]:
    """One row per claim and DIFF variant present: verdict, reason, the values compared."""
    rows = []
    for c in claims():
        g = _group(runs, c.measure)
        for v in ("diff_v1", "diff_v2"):
            if v not in {r.attention for r in runs}:
                continue
            row = {"claim": c.title, "paper": c.paper, "variant": v, "measure": c.unit}
            if "baseline" not in g or v not in g:
                missing = "baseline" if "baseline" not in g else NAMES[v]
                row.update(verdict=INCONCLUSIVE, why=f"not measured for {missing} (see the errors below)")
            elif c.title in RATIO_CLAIMS:
                mb, md = _mean_se(g["baseline"])[0], _mean_se(g[v])[0]
                ratio = md / mb if mb else float("inf")
                verdict = HELD if ratio < 0.8 else NOT_HELD if ratio > 1.25 else INCONCLUSIVE
                row.update(verdict=verdict, why=f"baseline {mb:.4g} vs DIFF {md:.4g} (ratio {ratio:.2f}; held below "
                                                f"0.8, did not hold above 1.25)")
            else:
                floor = c.floor(runs) if c.floor else None
                verdict, why = compare(g["baseline"], g[v], c.higher_is_better, c.min_effect, floor)
                row.update(verdict=verdict, why=why)
            rows.append(row)
    return rows

