"""The benchmark's section of the report page (its ``Study.section``, ``study.py``): the token-level retrieval
benchmark (``difftransformer retrieval``) and its verdicts.

It reads the benchmark's ``results.json`` dict only (no model, none of the benchmark's code): the benchmark decides
its verdicts (``retrieval/statistics.py``, PROTOCOL.md's "Endpoints" and "Statistics") and writes them under
``verdicts``, one list of rows per policy; this page draws them. Every claim is judged on the tuned-lr runs (the
primary analysis, failed runs included); the page adds two sensitivity rows per verdict, never counted as verdicts:
every variant at the matched lr, and the tuned runs without the seeds where either variant failed its floor.
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from ..eval import stats
from ..fileio import read_json
from ..model.variants import label as vlabel
from ..rundir.files import (
    ACCURACY_HEATMAP_PNG,
    ACCURACY_VS_DIFFICULTY_PNG,
    ACCURACY_VS_LR_PNG,
    ATTENTION_ROW_PNG,
    ATTENTION_SHARES_PNG,
    QUANTIZATION_PNG,
    ROUNDING_NAME,
)
from ..studies.page import counts_line, deviations_note, image, inline, provenance_note, table, verdict_table
from ..studies.schema import RoundingCheck, RoundingRow, validate_rounding
from .benchmark_schema import COUNTED_POLICY, POLICIES, Policy, RetrievalResults, RetrievalRun, RunsKey, VerdictRow

# How the page names results.json's verdict policies (``benchmark_schema.POLICIES``, the benchmark's)
POLICY_LABELS: dict[Policy, str] = dict(zip(POLICIES, ("tuned lr", "matched lr", "tuned lr, failed seeds dropped")))
FIGURES = ((ACCURACY_HEATMAP_PNG, "Accuracy by facts x context length per variant (Fig. 5 style), seed mean"),
           (ACCURACY_VS_DIFFICULTY_PNG, "Accuracy per condition, seed mean and standard deviation"),
           (ATTENTION_SHARES_PNG, "Scale-free answer share of the answering query per layer"),
           (QUANTIZATION_PNG, "Accuracy with attention logits quantised (Fig. 8)"),
           (ACCURACY_VS_LR_PNG, "Accuracy against learning rate per variant (every test seed), seed mean and sd"),
           (ATTENTION_ROW_PNG, "One query's attention row per variant (Fig. 1)"))
NO_VERDICTS = ("This results.json holds no verdict rows (written before the benchmark wrote its own): rerun "
               "`difftransformer retrieval --out DIR` with the same options to add them (it resumes from its journal "
               "and runs no job).")


def _runs(results: RetrievalResults, variant: str, key: RunsKey = "runs") -> list[RetrievalRun]:
    return sorted(results["variants"][variant][key], key=lambda r: r["seed"])


def retrieval_verdicts(results: RetrievalResults, policy: Policy = COUNTED_POLICY) -> list[VerdictRow]:
    """The benchmark's verdict rows under ``policy`` ("runs": the tuned lr, the only rows counted as verdicts;
    "matched_runs"; "no_failures"), as its results.json holds them; none from a results.json that predates them."""
    return list(results.get("verdicts", {}).get(policy, []))


def sensitivity_table(results: RetrievalResults) -> tuple[list[str], list[list[Any]]]:
    """Every verdict under the three policies side by side, and whether the sensitivity rows agree with it."""
    by = {p: retrieval_verdicts(results, p) for p in POLICY_LABELS}
    rows = []
    for i, r in enumerate(by["runs"]):
        cells = [r["claim"], vlabel(r["variant"])]
        for p in POLICY_LABELS:
            x = by[p][i]
            st = x["stats"]
            ci = st["ci"]
            est = (f"{st['estimate']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] n={st['n_seeds'][0]}"
                   if all(math.isfinite(c) for c in ci) else "no interval")
            cells.append(f"{x['verdict']}: {est}")
        cells.append("yes" if len({by[p][i]["verdict"] for p in POLICY_LABELS}) == 1 else "NO")
        rows.append(cells)
    return ["claim", "variant", *POLICY_LABELS.values(), "all agree"], rows


def failures(results: RetrievalResults) -> dict[str, dict[str, Any]]:
    """Per variant: runs below the floor on the training distribution (test split) under each lr policy, and the
    tuning runs below it on the validation split."""
    floor = results["config"]["floor"]
    out = {}
    for v, x in results["variants"].items():
        out[v] = {"tuned": [r["seed"] for r in x["runs"] if r["failed"]],
                  "matched": [r["seed"] for r in x["matched_runs"] if r["failed"]],
                  "tuning": [(r["seed"], r["lr"]) for r in x.get("tuning_runs", [])
                             if r["val_training_distribution"] < floor],
                  "grid": [(r["seed"], r["lr"]) for r in x.get("grid_runs", []) if r["failed"]],
                  "grid_n": len(x.get("grid_runs", [])),
                  "n": len(x["runs"])}
    return out


def _interval(xs: Sequence[float], n: int) -> str:
    m, lo, hi = stats.accuracy_interval(xs, n)
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def models_table(results: RetrievalResults) -> tuple[list[str], list[list[Any]]]:
    fl = failures(results)
    rows = [[vlabel(v), x["params"], f"{x['tuned_lr']:g}", f"{results['matched_lr']:g}", len(x["runs"]),
             f"{len(fl[v]['tuned'])} of {fl[v]['n']}" + (f" (seeds {fl[v]['tuned']})" if fl[v]["tuned"] else ""),
             f"{len(fl[v]['matched'])} of {fl[v]['n']}" + (f" (seeds {fl[v]['matched']})" if fl[v]["matched"] else "")]
            for v, x in results["variants"].items()]
    return ["variant", "parameters", "tuned lr", "matched lr", "test seeds", "failed (tuned lr)",
            "failed (matched lr)"], rows


def accuracy_table(results: RetrievalResults) -> tuple[list[str], list[list[Any]]]:
    """One row per test condition (pairs, context, model input length), one column per variant (tuned lr)."""
    cfg = results["config"]
    variants = list(results["variants"])
    rows: list[list[Any]] = []
    first = _runs(results, variants[0])[0]
    td = first["training_distribution"]["n_queries"]
    rows.append(["training distribution (floor)", "{}-{}".format(*cfg["train_pairs"]),
                 "{}-{}".format(*cfg["train_context"]), ""]
                + [_interval([r["training_distribution"]["accuracy"] for r in _runs(results, v)], td)
                   for v in variants])
    for c in results["conditions"]:
        name = c["name"]
        fc = first["conditions"][name]
        tags = [t for t, on in (("primary", name == cfg["primary"]), ("extrapolation", name == cfg["extrapolation"]),
                                ("longer than trained", c["context"] > cfg["train_context"][1])) if on]
        rows.append([name + (f" ({'; '.join(tags)})" if tags else ""), c["pairs"], c["context"], fc.get("seq_len")]
                    + [_interval([r["conditions"][name]["accuracy"] for r in _runs(results, v)], fc["n_queries"])
                       for v in variants])
    return ["condition", "facts", "context", "input length"] + [vlabel(v) for v in variants], rows


def shares_table(results: RetrievalResults) -> tuple[list[str], list[list[Any]]]:
    """The attention endpoint at the primary condition per variant and lr policy, and the best head's answer share
    in each layer (one column per layer, numbered from 0 at the input, as in the figures)."""
    cond = results["config"]["primary"]
    rows = []
    n_layers = 0
    for v in results["variants"]:
        key: RunsKey
        for key in ("runs", "matched_runs"):
            policy_label = POLICY_LABELS[key]
            xs = [r["conditions"][cond]["attention_endpoint"] for r in _runs(results, v, key)]
            per_layer = [r["conditions"][cond]["best_head_share_per_layer"] for r in _runs(results, v, key)]
            n_layers = max(n_layers, len(per_layer[0]))
            rows.append([vlabel(v), policy_label, f"{statistics.fmean(xs):.3f}",
                         f"{statistics.stdev(xs) if len(xs) > 1 else 0:.3f}",
                         *(f"{statistics.fmean(p[i] for p in per_layer):.3f}" for i in range(len(per_layer[0])))])
    return (["variant", "lr", "attention endpoint (seed mean)", "seed sd"]
            + [f"layer {i}: best head's answer share" for i in range(n_layers)], rows)


def lr_table(results: RetrievalResults) -> tuple[list[str], list[list[Any]]]:
    rows = [[vlabel(v), f"{g['lr']:g}", f"{g['val_accuracy']:.3f}", f"{g['val_loss']:.3f}",
             f"{g['min_training_distribution']:.3f}",
             f"{g['passed_floor']} of {len(g['seeds'])}" if "passed_floor" in g else "",
             ("chosen" if g["lr"] == x["tuned_lr"] else "") + (" (widened)" if g["lr"] in x["widened"] else "")
             + (" STILL AT AN EDGE" if g["lr"] == x["tuned_lr"] and x["at_edge"] else "")]
            for v, x in results["variants"].items() for g in x["lr_grid"]]
    return ["variant", "lr", "validation accuracy at the primary condition (seed mean)", "answer loss",
            "lowest training-distribution accuracy", "runs passing the floor (test split)", "choice"], rows


# The section's tables after the verdicts, each under its heading.
TABLES = (("The models: parameters, learning rates, training failures", models_table),
          ("Accuracy per test condition (tuned lr): seed mean [95% interval]", accuracy_table),
          ("Attention on the answer at the primary condition", shares_table),
          ("The learning-rate grid (validation split; the lr choice)", lr_table))


def rounding_tables(check: RoundingCheck) -> tuple[list[str], list[list[Any]]]:
    """The rounding check's two verdict tables side by side (rounding.json, ``studies.schema.RoundingCheck``)."""
    kernels = check["torch_kernels"] if "torch_kernels" in check else [[] for _ in check["code_paths"]]
    names = [f"{c} ({', '.join(k)})" for c, k in zip(check["code_paths"], kernels)]
    rows = [[r.endpoint, vlabel(r.variant), f"{r.verdict}: {r.estimate}", f"{r.other_verdict}: {r.other_estimate}",
             r.same] for r in map(RoundingRow._make, check["rows"])]
    return ["claim", "variant", f"CPU code path {names[0]}", f"CPU code path {names[1]}", "same verdict"], rows


def _intro(results: RetrievalResults) -> str:
    """The benchmark in words: the task, the training, the lr choice, the seeds and the endpoints."""
    cfg = results["config"]
    seeds = [r["seed"] for r in _runs(results, next(iter(results["variants"])))]
    grid = ", ".join(f"{x:g}" for x in cfg.get("lr_grid", []))
    if "tuning_seeds" in cfg:  # a version-2 results.json
        how = (f"Each variant's learning rate was chosen from its grid on tuning seeds "
               f"{', '.join(str(s) for s in cfg['tuning_seeds'])} (never test seeds)")
    else:
        how = (f"Every variant ran the lr grid ({grid}) on every test seed; each variant's learning rate was chosen "
               f"by the seed mean of its validation accuracy at the primary condition (the validation split; the "
               f"verdicts read the test split)")
    return (f"Pre-registered in the benchmark's {results.get('protocol', 'PROTOCOL.md, version 2')}. Each training "
            f"context holds {cfg['train_pairs'][0]}-{cfg['train_pairs'][1]} key-value facts (one token each, drawn "
            f"per example) in {cfg['train_context'][0]}-{cfg['train_context'][1]} tokens (drawn per batch), the rest "
            f"filler; {cfg['queries']} keys are asked per context; chance is {results['chance']:.3g}. Trained "
            f"{cfg['steps']} steps per model. {how}; the {len(seeds)} test seeds ({seeds[0]}-{seeds[-1]}) are judged "
            f"at it (the primary analysis) and at the matched lr {results['matched_lr']:g} "
            f"({vlabel(cfg['matched_lr'])}'s, a sensitivity row). Seed s of every variant sees the same example "
            f"stream and starts from the same tensors where shapes match. Primary endpoint: accuracy at "
            f"{cfg['primary']}, {cfg['train_context'][1]} tokens or fewer (inside the trained lengths); length "
            f"extrapolation ({cfg['extrapolation']}) and stability across the lr grid are secondary. Cells: seed "
            f"mean [95% interval].")


def _failures_notes(results: RetrievalResults) -> list[str]:
    """The training failures per variant and policy, and a caution where half or more of the test seeds failed."""
    fl = failures(results)
    fails = "; ".join(f"{vlabel(v)} {len(f['tuned'])} of {f['n']} (tuned lr), {len(f['matched'])} of {f['n']} "
                      f"(matched lr)" + (f", {len(f['grid'])} of {f['grid_n']} grid runs" if f["grid_n"] else
                                         f", {len(f['tuning'])} tuning run(s)") for v, f in fl.items())
    floor = (f"Training failures (accuracy on held-out contexts of the training distribution below "
             f"{results['config']['floor']:.0%}): {fails}. The primary analysis includes them; a sensitivity row "
             f"drops their seeds.")
    parts = [f"<p>{html.escape(floor)}</p>"]
    weak = [vlabel(v) for v, f in fl.items() if f["n"] and 2 * len(f["tuned"]) >= f["n"]]
    if weak:
        parts.append(f"<p class='note'><b>Caution:</b> {', '.join(weak)} failed the floor in half or more of the test "
                     "seeds at the tuned lr, so the verdicts against it compare with a model that mostly did not learn "
                     "the task; read them with the matched-lr and failures-dropped rows below.</p>")
    return parts


def _rounding_part(fig_dir: Path) -> str:
    """The rounding check's tables, where ``fig_dir`` holds its rounding.json; else nothing."""
    rounding = fig_dir / ROUNDING_NAME
    if not rounding.is_file():
        return ""
    check = validate_rounding(read_json(rounding), f"--retrieval: {rounding} is not a rounding check")
    head, rows = rounding_tables(check)
    differ = [f"{r[1]}: {r[0]}" for r in rows if r[-1] == "NO"]
    eq, n = check.get("grid_runs_equal_at_primary", [0, 0])
    return ("<h3>The rounding check: every job rerun under another CPU code path</h3>"
            + table(head, rows, left=len(head))
            + "<p class='note'>" + html.escape(
                (f"{len(differ)} verdict(s) differ between the two code paths, so they rest on float rounding "
                 f"rather than on the variants: {'; '.join(differ)}." if differ else
                 "Every verdict is the same under both code paths.")
                + f" Grid runs with bitwise the same primary accuracy: {eq} of {n}.") + "</p>")


def section(results: RetrievalResults, fig_dir: Path, provenance: Optional[dict[str, Any]] = None) -> str:
    """The HTML of the lead section: the verdicts (the tuned-lr rows, with their counts), then the benchmark's
    tables and figures from ``fig_dir``; ``provenance``: committed results' (``studies.page.provenance_note``)."""
    counted = retrieval_verdicts(results)
    parts = ["<h2>Retrieval among distractors: token-level key-value benchmark</h2>",
             provenance_note(provenance) if provenance else "",
             "<h3>Verdicts (the primary analysis: each variant at its tuned learning rate)</h3>",
             verdict_table(counted),
             f"<p><b>Summary.</b> {html.escape(counts_line(counted))}.</p>" if counted else "",
             f"<p>{html.escape(_intro(results))}</p>", *_failures_notes(results),
             deviations_note(results.get("deviations"))]
    if results.get("quick"):
        parts.append("<p class='note'>A quick benchmark: a smoke run, its numbers mean nothing.</p>")
    if "verdicts" not in results:
        parts.append(f"<p class='note'>{inline(NO_VERDICTS)}</p>")
    head, rows = sensitivity_table(results)
    parts.append("<h3>Every verdict under the sensitivity policies (not counted as verdicts)</h3>"
                 + table(head, rows, left=len(head)))
    if any(r[-1] == "NO" for r in rows):
        parts.append("<p class='note'>Where a row says NO, the verdict depends on the learning-rate policy or on "
                     "the failed runs: read it with that caution.</p>")
    for title, make in TABLES:
        head, rows = make(results)
        parts.append(f"<h3>{html.escape(title)}</h3>" + table(head, rows, left=1))
    parts.append(_rounding_part(fig_dir))
    for name, title in FIGURES:
        if (fig_dir / name).is_file():
            parts.append(f"<h3>{html.escape(title)}</h3>" + image(fig_dir / name, title))
    t = results.get("timings", {})
    if t:
        parts.append(f"<p class='note'>Benchmark wall time {t.get('wall_s', 0) / 60:.1f} min, {t.get('jobs')} jobs "
                     f"on {t.get('workers')} worker(s).</p>")
    return "".join(parts)
