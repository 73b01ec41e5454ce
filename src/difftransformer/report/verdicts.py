"""The verdict on each of the paper's claims: DIFF V1 and V2 vs the baseline, with the statistics of ``eval.stats``.

``verdicts(runs)`` is the entry point: one row per claim and DIFF variant, from the runs' results and training
summaries. Each claim names its measure (its primary endpoint, fixed here before any run) and the ``stats``
function that judges it; the analyses' specs list the claim titles they feed. Runs are paired across variants by
their training seed (seed s of every variant shares its initialisation and data).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ..eval import stats
from ..eval.long_context import compare_context_gains
from ..model import variants as registry
from ..model.variants import label
from .results import RunResults

HELD, NOT_HELD, INCONCLUSIVE, SMOKE = stats.HELD, stats.NOT_HELD, stats.INCONCLUSIVE, stats.SMOKE

RULE = ("Verdicts: DIFF minus the baseline per seed (seeds are paired: same initialisation where shapes match, "
        "same data), with a 95% t-interval over seeds (df = n - 1); ratio claims on a log scale. 'held' when the "
        "whole interval lies on DIFF's good side of zero and the estimate beats the claim's minimum effect; 'did not "
        "hold' when the same is true on the bad side; otherwise 'inconclusive at this scale'. With one seed per "
        "variant the seed spread is unknown: the interval then covers only the evaluation's sampling error (the "
        "reason says so), and a claim with no such error reads inconclusive. Accuracy claims (and the attention "
        "measures taken on those queries) need a model above chance first; the order-spread claim needs both. "
        f"Runs shorter than {stats.SMOKE_MIN_STEPS} steps are smoke runs: no verdicts.")

Judge = Callable[[list[RunResults], list[RunResults]], stats.Verdict]


@dataclass
class Claim:
    title: str
    paper: str  # the paper's figure or table and its number
    measure: str  # the primary endpoint, in words
    judge: Judge  # (baseline runs, DIFF runs), paired by seed -> Verdict


def _inconclusive(reason: str, n: tuple[int, int] = (0, 0)) -> stats.Verdict:
    return stats.Verdict(INCONCLUSIVE, math.nan, (math.nan, math.nan), n, "none", reason)


def _values(runs: Sequence[RunResults], get: Callable[[RunResults], Any]) -> list:
    return [get(r) for r in runs]


def _task(runs: Sequence[RunResults], analysis: str) -> dict[str, Any]:
    x = runs[0].results[analysis]
    return x.get("task", x)


def _accuracy(analysis: str, get: Callable[[dict], float], n: Callable[[dict], int], chance_key: str) -> Judge:
    def judge(b: list[RunResults], d: list[RunResults]) -> stats.Verdict:
        x = b[0].results[analysis]
        return stats.compare_accuracy(_values(b, lambda r: get(r.results[analysis])),
                                      _values(d, lambda r: get(r.results[analysis])), n(x),
                                      _task(b, analysis)[chance_key], 0.05)
    return judge


def _needle_n(x: dict) -> int:
    return x["samples_per_cell"] * len(x["lengths"]) * len(x["depths"])


def _quant_row(x: dict, bits: int) -> dict[str, Any]:
    return next(row for row in x["rows"] if row["bits"] == bits)


def _needles_answered(runs: Sequence[RunResults]) -> bool:
    """Whether any model retrieves prose needles above the random-needle level: the attention measures are taken
    at the answering query, which means little when no model answers."""
    accs: dict[str, list[float]] = {r.attention: [] for r in runs}
    for r in runs:
        accs[r.attention].append(r.results["needles"]["mean_accuracy"])
    x = runs[0].results["needles"]
    return any(stats.above_chance(a, _needle_n(x), x["task"]["random_needle"]) for a in accs.values())


def _share(key: str, higher_is_better: bool) -> Judge:
    def judge(b: list[RunResults], d: list[RunResults]) -> stats.Verdict:
        if not _needles_answered(b + d):
            return _inconclusive("no model retrieves the needles above the random-needle level, so the attention "
                                 "at the answering query is not that of a retrieval", (len(b), len(d)))
        get = lambda r: r.results["noise"].get(f"{key}_share", r.results["noise"][key])  # noqa: E731
        se = lambda r: r.results["noise"].get(f"{key}_share_sem", r.results["noise"][f"{key}_sem"])  # noqa: E731
        return stats.compare_seeds(_values(b, get), _values(d, get), higher_is_better, 0.01,
                                   within_se=(se(b[0]), se(d[0])))
    return judge


def _outlier(kind: str) -> Judge:
    def judge(b: list[RunResults], d: list[RunResults]) -> stats.Verdict:
        per = [r.results["outliers"].get("per_sequence", {}).get(kind) for r in b + d]
        if all(p and len(p) > 1 for p in per):  # geometric mean of per-sequence maxima, with its log-scale SE
            gm = [stats.log_mean_se(p) for p in per]
            return stats.compare_ratio([g[0] for g in gm[:len(b)]], [g[0] for g in gm[len(b):]], 0.8,
                                       within_se_log=(gm[0][1], gm[len(b)][1]))
        top = lambda r: r.results["outliers"][kind]["top1"]  # noqa: E731
        return stats.compare_ratio(_values(b, top), _values(d, top), 0.8)
    return judge


def _quant_loss(bits: int) -> Judge:
    def judge(b: list[RunResults], d: list[RunResults]) -> stats.Verdict:
        rows = [_quant_row(r.results["quantized"], bits) for r in b + d]
        b_se, d_se = rows[0].get("loss_increase_se"), rows[len(b)].get("loss_increase_se")
        return stats.compare_seeds([x["loss_increase"] for x in rows[:len(b)]],
                                   [x["loss_increase"] for x in rows[len(b):]], False, 0.005,
                                   within_se=(b_se, d_se) if b_se is not None and d_se is not None else None)
    return judge


def _long_context(part: str) -> Judge:
    def judge(b: list[RunResults], d: list[RunResults]) -> stats.Verdict:
        x = b[0].results["positions"]
        docs = [r.results["positions"].get("nll_docs") for r in b + d]
        if "nll_docs" not in x:
            return _inconclusive("this positions result predates the long-text measure")
        if not all(docs):
            return _inconclusive(x.get("note") or "no held-out text longer than the training length")
        v = compare_context_gains(docs[:len(b)], docs[len(b):], x["train_len"], 0.02)[part]
        return v if v is not None else _inconclusive("the texts evaluated end before twice the training length")
    return judge


def _spread(b: list[RunResults], d: list[RunResults]) -> stats.Verdict:
    x: Any = b[0].results["icl"]  # JSON
    orders = lambda rs: [r.results["icl"]["order"]["accuracies"] for r in rs]  # noqa: E731
    n = x["order"].get("samples") or x.get("max_shot_samples")
    return stats.compare_spread(orders(b), orders(d), n, x["task"]["chance"] if "task" in x else x["chance"], 0.05)


def _val_loss(b: list[RunResults], d: list[RunResults]) -> stats.Verdict:
    get = lambda r: r.training["final_val_loss"]  # noqa: E731
    return stats.compare_seeds(_values(b, get), _values(d, get), False, 0.02)


def _spikes(b: list[RunResults], d: list[RunResults]) -> stats.Verdict:
    nb, nd = (_values(rs, lambda r: float(len(r.training["spikes"]))) for rs in (b, d))
    # Poisson SE of one count (spikes cluster, so this is rough); used only with one seed each.
    return stats.compare_seeds(nb, nd, False, 1.0, within_se=(math.sqrt(max(nb[0], 1)), math.sqrt(max(nd[0], 1))))


def _grad_peaks(b: list[RunResults], d: list[RunResults]) -> stats.Verdict:
    blocks = [r.training.get("grad_norm_block_max") or [] for r in b + d]
    if all(len(x) > 1 for x in blocks):  # the peak of each tenth of training: a log-scale SE for one seed
        gm = [stats.log_mean_se(x) for x in blocks]
        return stats.compare_ratio([g[0] for g in gm[:len(b)]], [g[0] for g in gm[len(b):]], 0.8,
                                   within_se_log=(gm[0][1], gm[len(b)][1]))
    return stats.compare_ratio(_values(b, lambda r: r.training["grad_norm_max"]),
                               _values(d, lambda r: r.training["grad_norm_max"]), 0.8)


def claims() -> list[Claim]:
    return [
        Claim("lower validation loss at the same parameters and tokens", "Fig. 3; V2: 0.02-0.03 below baseline",
              "final validation loss (nats); min effect 0.02", _val_loss),
        Claim("better multi-needle retrieval", "Table 2: N=6, R=2 at 4K 0.85 vs 0.55",
              "mean exact-match accuracy over the grid; gate: above the random-needle level",
              _accuracy("needles", lambda x: x["mean_accuracy"], _needle_n, "random_needle")),
        Claim("more attention on the answer span", "Table 3: 0.27-0.40 vs 0.03-0.09",
              "answer share of the answering query's |attention| over the context (scale-free)",
              _share("answer", True)),
        Claim("less attention noise", "Table 3: 0.01-0.02 vs 0.49-0.54",
              "share of the answering query's |attention| on the rest of the context (scale-free)",
              _share("noise", False)),
        Claim("smaller attention-logit outliers", "Table 5: top-1 38.8 vs 318.0",
              "top-1 |attention logit| (per-sequence geometric mean when recorded); ratio below 0.8",
              _outlier("attention_logits")),
        Claim("smaller hidden-state outliers", "Table 5: top-1 1688 vs 3609",
              "top-1 |hidden state| (per-sequence geometric mean when recorded); ratio below 0.8",
              _outlier("hidden_states")),
        Claim("retrieval kept at 6-bit attention logits", "Fig. 8", "retrieval accuracy with 6-bit logits",
              _accuracy("quantized", lambda x: _quant_row(x, 6)["accuracy"], lambda x: x["samples"], "random_needle")),
        Claim("smaller loss increase at 4-bit attention logits", "Fig. 8: 4-bit DIFF ~ 6-bit baseline",
              "validation loss increase at 4 bits vs full precision; min effect 0.005", _quant_loss(4)),
        Claim("lower NLL within the training length", "Fig. 4",
              "NLL gain over [L/2, L) relative to the model's own first L/8 positions, long held-out texts "
              "(held only where DIFF's NLL there is not above the baseline's)",
              _long_context("within")),
        Claim("lower NLL beyond the training length", "Fig. 4",
              "NLL gain over [L, 2L) relative to the model's own first L/8 positions, long held-out texts "
              "(held only where DIFF's NLL there is not above the baseline's)",
              _long_context("beyond")),
        Claim("more accurate many-shot in-context learning", "Fig. 6", "accuracy at the largest shot count that fits",
              _accuracy("icl", lambda x: x["max_shot_accuracy"], lambda x: x.get("max_shot_samples", 1), "chance")),
        Claim("less sensitive to demonstration order", "Fig. 7",
              "best - worst accuracy over orderings; gate: both models above chance", _spread),
        Claim("fewer loss spikes", "V2 article (seed 002)",
              "training steps whose loss exceeds 1.1x the median of the previous 10 (after warm-up)", _spikes),
        Claim("smaller gradient-norm peaks", "V2 article (seed 002)",
              "pre-clipping gradient-norm peak per tenth of training after warm-up; ratio below 0.8", _grad_peaks),
    ]


def _paired(runs: Sequence[RunResults], variant: str) -> tuple[list[RunResults], list[RunResults]]:
    """Baseline and ``variant`` runs of the seeds both have, in seed order (unknown seeds pair by position)."""
    def by_seed(v: str) -> dict[Any, RunResults]:
        rs = [r for r in runs if r.attention == v]
        return {(r.ev.seed if r.ev.seed is not None else i): r for i, r in enumerate(rs)}
    b, d = by_seed(registry.reference().name), by_seed(variant)
    common = sorted(set(b) & set(d), key=str)
    return [b[s] for s in common], [d[s] for s in common]


def min_steps(runs: Sequence[RunResults]) -> Optional[int]:
    steps = [r.training["step"][-1] for r in runs if r.training.get("step")]
    return min(steps) if steps else None


def verdicts(runs: Sequence[RunResults]) -> list[dict[str, Any]]:
    """One row per claim and DIFF variant present: verdict, reason, the interval and the method."""
    rows = []
    steps = min_steps(runs)
    smoke = stats.smoke_run(steps) if steps is not None else None
    for c in claims():
        for v in (x.name for x in registry.compared()):
            if v not in {r.attention for r in runs}:
                continue
            b, d = _paired(runs, v)
            if smoke is not None:
                verdict = smoke
            elif not b:
                verdict = _inconclusive(f"no baseline run shares a seed with {label(v)}")
            else:
                try:
                    verdict = c.judge(b, d)
                except (KeyError, IndexError, TypeError, StopIteration):
                    verdict = _inconclusive("not measured for every run (see the errors below)")
                except ValueError as e:  # e.g. a NaN measure: say why instead of failing the page
                    verdict = _inconclusive(f"not comparable: {e}")
            rows.append(stats.verdict_row(c.title, c.paper, v, c.measure, verdict))
    return rows


def parameter_notes(runs: Sequence[RunResults]) -> list[str]:
    """The page's note when a DIFF variant's parameter count differs from the baseline's (V2: about 5% more)."""
    params = {r.attention: r.ev.model.num_parameters() for r in runs}
    base = registry.reference().name
    if base not in params:
        return []
    notes = [stats.parameter_note(params[base], params[v.name], v.label) for v in registry.compared()
             if v.name in params]
    return [note for differs, note in notes if differs]


def summary_note(rows: Sequence[dict[str, Any]]) -> str:
    """How many verdicts the page makes and how many 'held' chance alone would give (the multiplicity note)."""
    vs = [stats.Verdict(**{**r["stats"], "ci": tuple(r["stats"]["ci"]), "n_seeds": tuple(r["stats"]["n_seeds"])})
          for r in rows]
    return stats.verdict_summary(vs)["note"] if vs else ""
