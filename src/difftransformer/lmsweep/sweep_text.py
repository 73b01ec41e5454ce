"""docs/lm-sweep.md's text of the protocol-version-2 sweep and of its rounding check, written by ``make docs``
(``study.py``'s blocks) from the committed sweep.json files, rounding.json and journals: each number of those
sections is formatted here, once."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ..model.variants import label
from ..studies.schema import RoundingRow
from .sweep import _ratio


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; a "|" inside a cell (|attention logit|) is escaped, a cell's text and not a border."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(header), line(["---"] * len(header)), *map(line, rows)])


def _reached(estimate: str) -> str:
    return "not reached on any seed (> 1)" if estimate.startswith(">1") else estimate


def _by_endpoint(rows: list[tuple[str, str, str]]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(the variants in order, {endpoint: {variant: cell}}) of (endpoint, variant, cell) rows."""
    cells: dict[str, dict[str, str]] = {}
    for endpoint, v, cell in rows:
        cells.setdefault(endpoint, {})[v] = cell
    return list(dict.fromkeys(v for _, v, _ in rows)), cells


def markdown_lr_table(res: dict[str, Any]) -> str:
    """The chosen lrs and test-half losses per variant and width (non-embedding parameters; seed mean and sample
    sd), from sweep.json."""
    rows = [[label(v), *(f"{r['params_non_embedding']:,}: lr {r['lr']:g}, {statistics.fmean(r['test_loss']):.3f} ± "
                         f"{statistics.stdev(r['test_loss']):.3f}" for r in t)] for v, t in res["table"].items()]
    return _markdown(["variant", *(f"d={w}" for w in res["widths"])], rows)


def markdown_verdicts(res: dict[str, Any]) -> str:
    """The verdict table (sweep.json's verdict_rows): per endpoint each DIFF variant's estimate with its interval
    and verdict, and the paper's figure."""
    paper = {r[0]: r[5] for r in res["verdict_rows"]}
    vs, cells = _by_endpoint([(e, v, f"{_reached(est)}, **{verdict}**") for e, v, est, _n, verdict, _p
                              in res["verdict_rows"]])
    return _markdown(["endpoint", *map(label, vs), "paper"],
                     [[e, *(c.get(v, "") for v in vs), paper[e]] for e, c in cells.items()])


def markdown_sensitivity(res: dict[str, Any]) -> str:
    """The sensitivity rows (sweep.json's sensitivity_rows, not verdicts), a column per DIFF variant."""
    vs, cells = _by_endpoint([(e, v, f"{_reached(est)}, {verdict}") for e, v, est, verdict
                              in res["sensitivity_rows"]])
    return _markdown(["sensitivity row (not a verdict)", *map(label, vs)],
                     [[e, *(c.get(v, "") for v in vs)] for e, c in cells.items()])


def markdown_applicability(res: dict[str, Any]) -> str:
    """Each Fig. 3 ratio's premise (PROTOCOL.md "Applicability"): the baseline's slope, its fitted fall, the state."""
    big = max(res["widths"])
    along = {"param_ratio": ("Fig. 3a", "ln(non-embedding parameters) across the widths"),
             "token_ratio": ("Fig. 3b", f"ln(training tokens) over the second half of its run at d={big}")}
    out = []
    for key, (fig, what) in along.items():
        a = res["applicability"][key]
        state = "measurable" if a["measurable"] else "not measurable at this scale"
        out.append(f"{fig}: the baseline's slope of loss on {what} is {a['slope']:+.4f} [{a['ci'][0]:+.4f}, "
                   f"{a['ci'][1]:+.4f}] per unit log, a fitted fall of {a['fall']:.3f} nats (at least "
                   f"{a['min_fall']:g} needed): **{state}**.")
    return "**Applicability.** " + " ".join(out)


def markdown_grid(res: dict[str, Any]) -> str:
    """The largest width's test-half loss over each variant's grid (seed mean), and every seed's Fig. 3 ratios."""
    i = res["widths"].index(max(res["widths"]))
    lrs = sorted({g["lr"] for t in res["table"].values() for g in t[i]["grid"]})
    rows = []
    for v, t in res["table"].items():
        got = {g["lr"]: g["test_loss"] for g in t[i]["grid"]}
        rows.append([label(v), *(f"{got[x]:.3f}" if x in got else "" for x in lrs)])

    def seeds(d: dict[str, Any]) -> str:
        xs = d["per_seed"]
        return "not reached on any seed" if all(x == "inf" for x in xs) else ", ".join(map(_ratio, xs))
    ratios = "; ".join(f"{label(v)} {fig} ({e[key]['verdict']}): {seeds(e[key])}" for v, e in res["endpoints"].items()
                       for key, fig in (("token_ratio", "Fig. 3b"), ("param_ratio", "Fig. 3a")))
    return (f"Test-half loss over the grid at d={max(res['widths'])} (seed mean; a blank: that lr did not run):\n\n"
            + _markdown(["variant", *(f"lr {x:g}" for x in lrs)], rows) + f"\n\nPer-seed ratios: {ratios}.")


def markdown_rounding(check: dict[str, Any], ref: dict[str, Any], other: dict[str, Any]) -> str:
    """The rounding check (its rounding.json, and both sweeps' sweep.json): the verdicts side by side, how many are
    the same, and each lr choice that moved with both runs' tuning-half losses over its grid."""
    p, q = check["code_paths"]
    rows = [RoundingRow._make(r) for r in check["rows"]]
    vs, cells = _by_endpoint([(r.endpoint, r.variant, f"{_reached(r.estimate)} / {_reached(r.other_estimate)}, "
                               + (f"{r.verdict} both" if r.verdict == r.other_verdict
                                  else f"{r.verdict} / {r.other_verdict}")) for r in rows])
    table = _markdown(["endpoint", *(f"{label(v)}: {p} / {q}" for v in vs)],
                      [[e, *(c.get(v, "") for v in vs)] for e, c in cells.items()])
    moved = [(v, w, x, y) for v, d in check["lr_choices_differ"].items() for w, x, y in d]

    def grid(res: dict[str, Any], v: str, w: int) -> str:
        row = res["table"][v][res["widths"].index(w)]
        return " / ".join(f"{g['lr']:g}: {g['tune_loss']:.4f}" for g in row["grid"]) + (
            f" ({row['edge']})" if row.get("edge") else "")
    said = (f"**{check['verdicts_same']} of {check['verdicts']} verdicts are the same; {len(moved)} of the "
            f"{sum(map(len, ref['chosen_lr'].values()))} lr choices moved**")
    if not moved:
        return f"{table}\n\n{said}."
    return (f"{table}\n\n{said}:\n\n" + _markdown(
        ["lr choice that moved", f"tuning-half loss over its grid, {p}", f"the same, {q}"],
        [[f"{label(v)} at d={w}: {x:g} -> {y:g}", grid(ref, v, w), grid(other, v, w)] for v, w, x, y in moved]))


def rounding_jobs(ref_dir: Path, other_dir: Path) -> str:
    """Over the jobs both journals hold: how many test losses are bitwise equal, the largest difference, and the
    median difference in the chosen scope (``analysis.rounding_jobs``) and outside it."""
    from .analysis import rounding_jobs as chosen_scope
    from .config import LMSweepConfig
    from .rounding import read_journal, reference_choices
    (header, a), (_, b) = read_journal(ref_dir), read_journal(other_dir)
    chosen = set(chosen_scope(LMSweepConfig.from_dict(header["config"]), reference_choices(ref_dir)))
    both = [j for j in a if j in b and a[j]["test_loss"] is not None and b[j]["test_loss"] is not None]
    gap = {j: abs(a[j]["test_loss"] - b[j]["test_loss"]) for j in both}
    inside, outside = [gap[j] for j in both if j in chosen], [gap[j] for j in both if j not in chosen]
    equal = sum(a[j]["test_loss"] == b[j]["test_loss"] for j in both)
    return (f"{len(both)} jobs ran under both code paths, {equal} of them with a bitwise-equal test loss; the largest "
            f"difference is {max(gap.values()):.3f} nats, the median {statistics.median(inside):.4f} over the "
            f"{len(inside)} jobs of the chosen scope and {statistics.median(outside):.4f} over the other "
            f"{len(outside)}.")
