"""docs/retrieval.md's tables of the benchmark (protocol version 3), drawn from its committed results.json
(docs/results/retrieval-v3) as ``make docs`` blocks (``study.py``): the learning-rate grid and the margin of each
choice, the accuracy at the chosen lr, and the verdicts with their sensitivity rows and the robustness endpoint.
Cells: seed mean +- seed sd."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ..model.variants import label as vlabel
from ..studies.page import counts_line
from .benchmark_schema import RetrievalResults
from .page import failures, retrieval_verdicts
from .rounding import estimate_text


def _mean_sd(xs: Sequence[float]) -> str:
    return f"{statistics.fmean(xs):.3f} +- {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"


def lr_markdown(results: RetrievalResults) -> str:
    """Per variant and lr of its grid: the validation accuracy at the primary condition (bold: the chosen lr) and the
    runs below the floor; then how far the runner-up lr trails the chosen one in the seed mean."""
    lrs = sorted({g["lr"] for x in results["variants"].values() for g in x["lr_grid"]})
    lines = ["| variant | " + " | ".join(f"{lr:g}" for lr in lrs) + " |", "| --- |" + " --- |" * len(lrs)]
    margins = []
    for v, x in results["variants"].items():
        cells = {}
        for g in x["lr_grid"]:
            acc = _mean_sd([r["val_accuracy"] for r in x["grid_runs"] if r["lr"] == g["lr"]])
            cells[g["lr"]] = (f"**{acc}**" if g["lr"] == x["tuned_lr"] else acc) + \
                f" ({len(g['seeds']) - g['passed_floor']} fail)"
        lines.append(f"| {vlabel(v)} | " + " | ".join(cells.get(lr, "") for lr in lrs) + " |")
        means = sorted((g["val_accuracy"] for g in x["lr_grid"]), reverse=True)
        margins.append(f"{means[0] - means[1]:.2f} ({vlabel(v)})")
    return "\n".join(lines) + "\n\nThe runner-up lr trails the chosen one by " + ", ".join(margins) + "."


def accuracy_markdown(results: RetrievalResults) -> str:
    """Per variant at its chosen lr (test split): parameters, runs below the floor, the training distribution's
    accuracy, and each condition at the primary's context or with the primary's facts (`*` primary, `+`
    extrapolation)."""
    cfg = results["config"]
    prim = next(c for c in results["conditions"] if c["name"] == cfg["primary"])
    conds = [c["name"] for c in results["conditions"] if c["context"] == prim["context"] or c["pairs"] == prim["pairs"]]
    mark = {cfg["primary"]: "*", cfg["extrapolation"]: "+"}
    lines = ["| variant | parameters | failed | training distribution | "
             + " | ".join(f"`{c}`{mark.get(c, '')}" for c in conds) + " |", "| --- |" + " --- |" * (3 + len(conds))]
    fl = failures(results)
    for v, x in results["variants"].items():
        runs = x["runs"]
        train = statistics.fmean(r["training_distribution"]["accuracy"] for r in runs)
        lines.append(f"| {vlabel(v)} | {x['params']:,} | {len(fl[v]['tuned'])} of {fl[v]['n']} | {train:.3f} | "
                     + " | ".join(_mean_sd([r["conditions"][c]["accuracy"] for r in runs]) for c in conds) + " |")
    return "\n".join(lines)


def verdicts_markdown(results: RetrievalResults) -> str:
    """The counted verdicts (DIFF minus baseline at the chosen lr) per claim and variant, each sensitivity row in
    parentheses where its estimate differs (with its verdict where that differs too); then the robustness endpoint
    per variant and the verdicts' count."""
    rows = retrieval_verdicts(results)
    others = {"matched lr": retrieval_verdicts(results, "matched_runs"),
              "failures dropped": retrieval_verdicts(results, "no_failures")}
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    lines = ["| claim | " + " | ".join(vlabel(v) for v in variants) + " |", "| --- |" + " --- |" * len(variants)]
    cells: dict[str, dict[str, str]] = {}
    for i, r in enumerate(rows):
        verdict = r["verdict"] if r["verdict"].startswith("inconclusive") else f"**{r['verdict']}**"
        text = f"{verdict} {estimate_text(r)}"
        for name, policy in others.items():
            o = policy[i]
            if (o["verdict"], estimate_text(o)) != (r["verdict"], estimate_text(r)):
                other = "" if o["verdict"] == r["verdict"] else f"{o['verdict']} "
                text += f" ({name}, {o['stats']['n_seeds'][0]} pairs: {other}{estimate_text(o)})"
        cells.setdefault(r["claim"], {})[r["variant"]] = text
    lines += [f"| {claim} | " + " | ".join(by.get(v, "") for v in variants) + " |" for claim, by in cells.items()]
    prim = results["config"]["primary"]
    grid = ", ".join(f"{vlabel(v)} {_mean_sd([s['conditions'][prim]['accuracy'] for s in x['lr_robustness']])}"
                     for v, x in results["variants"].items())
    passing = ", ".join(f"{vlabel(v)} {x['floor_pass_share']:.0%}" for v, x in results["variants"].items())
    return ("\n".join(lines) + f"\n\nPer-seed grid means (the robustness endpoint): {grid};\nruns passing the floor "
            f"over the whole grid: {passing}.\n{len(rows)} verdicts: {counts_line(rows)}.")
