"""PROTOCOL.md's "Endpoints" and "Statistics" (with the "Seeds, floors and failures" treatment): the benchmark's
verdict rows, written to its results.json (``verdicts``), which the report draws.

One judge per endpoint, named after it; each reads the per-seed values of ``results.json``'s runs. Every claim is
judged on the tuned-lr runs (the primary analysis, failed runs included); the sensitivity policies (every variant at
the matched lr; the tuned runs without the seeds where either variant failed its floor) give rows never counted as
verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

from ..eval import stats
from ..model import variants as registry
from .benchmark_schema import (
    COUNTED_POLICY,
    POLICIES,
    RUNS_OF,
    Policy,
    RetrievalResults,
    RetrievalRun,
    SeedRow,
    VerdictRow,
)

QUANT_BITS = 4
MIN_EFFECT = 0.02  # "Statistics": the minimum effect, the same for every endpoint

Runs = Sequence[SeedRow]  # a variant's runs, or the lr-robustness endpoint's per-seed rows: seed, conditions, failed


def _runs(results: RetrievalResults, variant: str, policy: Policy, endpoint: str = "") -> Runs:
    x = results["variants"][variant]
    rows: Runs = x["lr_robustness"] if endpoint == "lr" else x[RUNS_OF[policy]]
    return sorted(rows, key=lambda r: r["seed"])


def _no_interval(b: Runs, d: Runs, reason: str) -> stats.Verdict:
    return stats.Verdict(stats.INCONCLUSIVE, math.nan, (math.nan, math.nan), (len(b), len(d)), "none", reason)


def _accuracy(rs: Runs, cond: str) -> list[float]:
    return [r["conditions"][cond]["accuracy"] for r in rs]


def _above_chance_gate(results: RetrievalResults, cond: str, b: Runs, d: Runs) -> bool:
    """"Statistics", gates: a variant above chance (its accuracy interval's lower bound) at ``cond``."""
    n = b[0]["conditions"][cond]["n_queries"]
    return any(stats.above_chance(_accuracy(rs, cond), n, results["chance"]) for rs in (b, d))


def _compare_accuracy(results: RetrievalResults, cond: str, b: Runs, d: Runs) -> stats.Verdict:
    """An accuracy endpoint: the gate (above chance) is part of ``stats.compare_accuracy``."""
    n = b[0]["conditions"][cond]["n_queries"]
    return stats.compare_accuracy(_accuracy(b, cond), _accuracy(d, cond), n, results["chance"], MIN_EFFECT)


def primary_accuracy(results: RetrievalResults, b: Runs, d: Runs) -> stats.Verdict:
    """Primary: accuracy at the primary condition."""
    return _compare_accuracy(results, results["config"]["primary"], b, d)


def attention_on_the_answer(results: RetrievalResults, b: Runs, d: Runs) -> stats.Verdict:
    """Secondary 1: the attention endpoint at the primary condition, gated on a variant above chance there."""
    cond = results["config"]["primary"]
    if not _above_chance_gate(results, cond, b, d):
        return _no_interval(b, d, f"no model retrieves above chance ({results['chance']:.3g}) at {cond}")
    get = lambda rs: [r["conditions"][cond]["attention_endpoint"] for r in rs]  # noqa: E731
    return stats.compare_seeds(get(b), get(d), True, MIN_EFFECT)


def length_extrapolation(results: RetrievalResults, b: Runs, d: Runs) -> stats.Verdict:
    """Secondary 2: accuracy at the extrapolation condition."""
    return _compare_accuracy(results, results["config"]["extrapolation"], b, d)


def _quant_drop(run: RetrievalRun, condition: str, bits: int) -> float:
    rows = run["quantized"][condition]
    full = next(r["accuracy"] for r in rows if r["bits"] is None)
    return full - next(r["accuracy"] for r in rows if r["bits"] == bits)


def quantised_logits(results: RetrievalResults, b: Runs, d: Runs) -> stats.Verdict:
    """Secondary 3: accuracy lost at ``QUANT_BITS``-bit attention logits at the primary condition (lower is better),
    gated on a variant above chance there."""
    cond = results["config"]["primary"]
    if not _above_chance_gate(results, cond, b, d):
        return _no_interval(b, d, f"no model retrieves above chance ({results['chance']:.3g}) at {cond}")
    try:
        # the runs of an lr policy (only the "lr" endpoint judges the lr-robustness rows)
        drops = [[_quant_drop(cast(RetrievalRun, r), cond, QUANT_BITS) for r in rs] for rs in (b, d)]
    except (KeyError, StopIteration):
        return _no_interval(b, d, f"{QUANT_BITS}-bit accuracy at {cond} was not measured (see quant_bits)")
    return stats.compare_seeds(drops[0], drops[1], False, MIN_EFFECT)


def lr_robustness(results: RetrievalResults, b: Runs, d: Runs) -> stats.Verdict:
    """Secondary 4: per seed the grid-mean test accuracy at the primary condition (``variants.*.lr_robustness``)."""
    return _compare_accuracy(results, results["config"]["primary"], b, d)


class Endpoint(NamedTuple):
    claim: str
    paper: str
    key: str  # results.json's name of the endpoint
    measure: str  # in words; {cond}: the primary condition, {extra}: the extrapolation condition
    judge: Callable[[RetrievalResults, Runs, Runs], stats.Verdict]


ENDPOINTS = (
    Endpoint("retrieves better among distractors (primary)", "Fig. 1, Table 2, Fig. 5", "acc",
             "accuracy at {cond}, inside the trained lengths; gate: above chance", primary_accuracy),
    Endpoint("more attention on the answer", "Table 3", "attention",
             "best head's scale-free answer share per layer, layer mean, at {cond}", attention_on_the_answer),
    Endpoint("retrieves better beyond the trained length", "length extrapolation", "extrapolation",
             "accuracy at {extra}, longer than any trained context; gate: above chance", length_extrapolation),
    Endpoint("more robust to quantised attention logits", "Fig. 8", "quant",
             f"accuracy lost at {QUANT_BITS}-bit logits at {{cond}}", quantised_logits),
    Endpoint("stable across learning rates", "V2 article; V1 reuses the baseline's hyperparameters", "lr",
             "test accuracy at {cond}, mean over the pre-registered lr grid per seed; gate: above chance",
             lr_robustness))


def paired(results: RetrievalResults, variant: str, policy: Policy, endpoint: str = "") -> tuple[Runs, Runs]:
    """Baseline and ``variant`` runs on the seeds both have, seed order; policy "no_failures" drops the seeds where
    either run failed its floor ("Seeds, floors and failures": the treatment). The "lr" endpoint reads one value
    per seed over the whole grid (``lr_robustness``): no lr policy applies."""
    b, d = _runs(results, registry.reference().name, policy, endpoint), _runs(results, variant, policy, endpoint)
    seeds = sorted({r["seed"] for r in b} & {r["seed"] for r in d})
    if policy == "no_failures":
        bad = {r["seed"] for r in [*b, *d] if r["failed"]}
        seeds = [s for s in seeds if s not in bad]
    return [r for r in b if r["seed"] in seeds], [r for r in d if r["seed"] in seeds]


def smoke(results: RetrievalResults) -> bool:
    """"Statistics": a quick benchmark, or runs shorter than the library's smoke rule, give no verdicts."""
    return bool(results.get("quick")) or stats.smoke_run(results["config"]["steps"]) is not None


def judge(results: RetrievalResults, endpoint: Endpoint, b: Runs, d: Runs) -> stats.Verdict:
    """One endpoint's verdict on the paired runs; the t-interval over seeds needs two pairs."""
    if smoke(results):
        return stats.Verdict(stats.SMOKE, math.nan, (math.nan, math.nan), (len(b), len(d)), "none",
                             "a quick or short benchmark trains too few steps for any verdict (a smoke run)")
    if len(b) < 2 or len(d) < 2:
        return _no_interval(b, d, f"{min(len(b), len(d))} seed pair(s) left: no interval over seeds")
    return endpoint.judge(results, b, d)


def _diff_variants(results: RetrievalResults) -> list[str]:
    base = registry.reference().name
    return [v for v in results["variants"] if v != base] if base in results["variants"] else []


def verdicts(results: RetrievalResults, policy: Policy = COUNTED_POLICY) -> list[VerdictRow]:
    """One row per endpoint and DIFF variant, paired by seed, under ``policy`` ("runs": the tuned lr, the primary
    analysis and the only rows counted as verdicts; "matched_runs"; "no_failures")."""
    cfg = results["config"]
    out: list[VerdictRow] = []
    for e in ENDPOINTS:
        if e.key == "lr" and not all("lr_robustness" in x for x in results["variants"].values()):
            continue  # a version-2 results.json: no such endpoint
        for v in _diff_variants(results):
            b, d = paired(results, v, policy, e.key)
            measure = e.measure.format(cond=cfg["primary"], extra=cfg["extrapolation"])
            out.append(cast(VerdictRow, stats.verdict_row(e.claim, e.paper, v, measure, judge(results, e, b, d))))
    return out


def verdicts_by_policy(results: RetrievalResults) -> dict[Policy, list[VerdictRow]]:
    """results.json's ``verdicts``: the rows under every policy (only "runs" counts)."""
    return {p: verdicts(results, p) for p in POLICIES}
