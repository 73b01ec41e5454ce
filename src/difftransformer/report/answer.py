"""Which differential attention, with which parts, for which job: the answer table of the two studies' diagnostics,
read from the repository's committed results (docs/results/), for the README, docs/retrieval.md and the demo's page.

The table is {DIFF V1, DIFF V2} x {with the head-wise norm, without} x {retrieval accuracy at the benchmark's primary
endpoint, language-model test loss at d_model 96}; each cell is the difference from the baseline (D) with its 95%
paired interval, and the arm's reading where the cell is a diagnostic arm (retrieval/DIAGNOSTIC.md, "The answer
table"). Nothing here trains or rebuilds: ``tests/studies/test_answer.py`` rebuilds each committed results file from
its journal and checks that the README and the docs quote these numbers.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Optional

from ..fileio import read_json
from ..lmsweep.sweep_schema import validate_diagnostic as validate_lm_diagnostic
from ..retrieval.benchmark_schema import validate_diagnostic as validate_retrieval_diagnostic
from ..retrieval.benchmark_schema import validate_retrieval_results
from ..rundir.files import DIAGNOSTIC_RESULTS_NAME, RESULTS_NAME, ROUNDING_NAME
from ..studies.followup import interval
from ..studies.schema import validate_readings

# src/difftransformer/studies/ -> the repository root; an installed package has no docs/ (see ``available``)
RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"
FILES = {
    "retrieval": ("retrieval-v3", RESULTS_NAME),  # the benchmark: the baseline, DIFF V1 and V2
    "retrieval_diagnostic": ("retrieval-diagnostic", DIAGNOSTIC_RESULTS_NAME),
    "lm_v1": ("v1-diagnostic", DIAGNOSTIC_RESULTS_NAME),  # the DIFF V1 language-model diagnostic
    "lm_v2": ("v2-diagnostic", DIAGNOSTIC_RESULTS_NAME),  # the cross-study check: DIFF V2's arms
}
# (variant, with the norm?) -> (where its retrieval D is, where its language-model D is); None: no arm
CELLS: dict[tuple[str, bool], tuple[tuple[str, str], tuple[str, str]]] = {
    ("diff_v1", True): (("retrieval_diagnostic", "diff_v1"), ("lm_v1", "diff_v1")),
    ("diff_v1", False): (("retrieval_diagnostic", "v1_no_norm"), ("lm_v1", "no_norm")),
    ("diff_v2", True): (("retrieval_diagnostic", "v2_headwise_norm"), ("lm_v2", "v2_headwise_norm")),
    ("diff_v2", False): (("retrieval_diagnostic", "diff_v2"), ("lm_v2", "diff_v2")),
}
# The diagnostics' rounding checks (studies/rounding.py): each arm's reading again under AVX2 kernels, at its chosen lr
ROUNDING = {k: (FILES[k][0], ROUNDING_NAME) for k in ("retrieval_diagnostic", "lm_v1", "lm_v2")}
# Retrieval protocol version 4's endpoint 2 (PROTOCOL4.md): accuracy after L steps at a condition harder than
# training that the trained baseline solves only in part, read from its committed journal (``protocol4.rebuild``);
# each (variant, norm) is one of its names, and the cell says where the run stands until the test jobs at L are in.
V4 = "retrieval-v4"
CAPABILITY = {("diff_v1", True): "diff_v1", ("diff_v1", False): "v1_no_norm",
              ("diff_v2", True): "v2_headwise_norm", ("diff_v2", False): "diff_v2"}
LABELS = {"diff_v1": "DIFF V1", "diff_v2": "DIFF V2"}
AS_PUBLISHED = {("diff_v1", True), ("diff_v2", False)}


def available(source: Path = RESULTS) -> bool:
    """Whether ``source`` holds every committed results file the table reads (a clone does; a wheel does not)."""
    return all((source / d / f).is_file() for d, f in FILES.values())


def load(source: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every results file the table reads, and each diagnostic's rounding check where one is committed (key
    ``NAME_rounding``)."""
    out = {k: read_json(source / d / f) for k, (d, f) in FILES.items()}
    for k, (d, f) in FILES.items():  # each file against its schema
        check = {"retrieval": validate_retrieval_results, "retrieval_diagnostic": validate_retrieval_diagnostic}
        check.get(k, validate_lm_diagnostic)(out[k], f"{source / d / f}")
    out.update({f"{k}_rounding": validate_readings(read_json(source / d / f), f"{source / d / f}")
                for k, (d, f) in ROUNDING.items() if (source / d / f).is_file()})
    from ..retrieval import protocol4
    from ..retrieval import protocol4_rounding as v4_rounding
    if (source / V4 / protocol4.STUDY.journal).is_file():
        out["retrieval_v4"] = protocol4.rebuild(source / V4)
    v4_check = source / V4 / v4_rounding.ROUNDING.format(code_path="avx2") / ROUNDING_NAME
    if v4_check.is_file():
        out["retrieval_v4_rounding"] = v4_rounding.validate_protocol4_rounding(read_json(v4_check), f"{v4_check}")
    return out


def _capability(v4: Optional[dict[str, Any]], check: Optional[dict[str, Any]], name: str) -> dict[str, Any]:
    """Version 4's endpoint 2 for ``name``: D with an arm's reading against its variant (C), or where the run stands
    (``standing``) while its test jobs at L are not all in; with its rounding check's row where that is committed
    (the reading there is D's verdict, and an arm's reading)."""
    if v4 is None:
        return {"standing": "not run"}
    if v4["capability"] is None:
        return {"standing": "running"}
    row = v4["capability"][name]
    second = check["capability"]["rows"].get(name) if check and check.get("capability") else None
    rounding = {"reading": second["second"]["reading"], "survives": second["survives"]} if second else None
    return {**row["D"], "reading": row.get("reading"), "name": name, "rounding": rounding}


def _capability_head(v4: Optional[dict[str, Any]]) -> str:
    """The capability column's heading: the condition and length once version 4 has chosen them, and how many of
    the jobs asked so far are in while it runs."""
    cond, length = (v4 or {}).get("conditions"), (v4 or {}).get("length")
    where = (f", `{cond['primary']}`, {length['L']:,} steps" if cond and cond.get("primary") and length else "")
    running = (f"; running: {v4['complete'][0]} of {v4['complete'][1]} jobs" if v4 and v4["capability"] is None
               else "")
    return f"retrieval capability (protocol 4): accuracy{where} (12 seeds; higher is better{running})"


def _rounding(results: dict[str, Any], where: str, name: str) -> Optional[dict[str, Any]]:
    """An arm's row of its diagnostic's rounding check: the reading under the other code path and whether it is the
    same; None when that check is not committed or the name has no reading."""
    check = results.get(f"{where}_rounding")
    row = check["rows"].get(name) if check else None
    if not row or "reading" not in row["second"]:
        return None
    return {"reading": row["second"]["reading"], "survives": row["survives"]}


def _row(results: dict[str, Any], where: str, name: str) -> dict[str, Any]:
    r = results[where]
    return r["rows"][name] if "rows" in r else r["arms"][name]


def cells(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (variant, norm): its retrieval and language-model D (estimate, interval) and readings."""
    out = []
    for (variant, norm), (ret, lm) in CELLS.items():
        r, m = _row(results, *ret), _row(results, *lm)
        out.append({"variant": variant, "headwise_norm": norm, "as_published": (variant, norm) in AS_PUBLISHED,
                    "retrieval": {**r["D"], "reading": r.get("reading"), "name": ret[1],
                                  "rounding": _rounding(results, *ret)},
                    "language_model": {**m["D"], "reading": m.get("reading"), "name": lm[1],
                                       "rounding": _rounding(results, *lm)},
                    "capability": _capability(results.get("retrieval_v4"), results.get("retrieval_v4_rounding"),
                                              CAPABILITY[(variant, norm)])})
    return out


def _cell(d: dict[str, Any]) -> str:
    if "standing" in d:
        return d["standing"]
    r = d.get("rounding")  # None where no rounding check reads the cell (a diagnostic's variant: no reading)
    rounding = "" if not r else " (survives AVX2)" if r["survives"] else f" (AVX2: {r['reading']})"
    return interval(d) + (f", {d['reading']}" if d.get("reading") else "") + rounding


def markdown(results: Optional[dict[str, dict[str, Any]]] = None) -> str:
    """The answer table in Markdown (the README's and docs/retrieval.md's)."""
    results = results or load()
    lines = ["| DIFF minus baseline (95% interval; arm's reading) | head-wise norm | retrieval speed: accuracy, "
             "`p48c48`, 600 steps (12 seeds; higher is better) | "
             f"{_capability_head(results.get('retrieval_v4'))} | "
             "language-model loss, d=96 (5 seeds; lower is better) |",
             "| --- | --- | --- | --- | --- |"]
    for c in cells(results):
        name = LABELS[c["variant"]] + (" (as published)" if c["as_published"] else "")
        lines.append(f"| {name} | {'with' if c['headwise_norm'] else 'without'} | {_cell(c['retrieval'])} | "
                     f"{_cell(c['capability'])} | {_cell(c['language_model'])} |")
    return "\n".join(lines)


def html_table(results: dict[str, dict[str, Any]]) -> str:
    """The same table as HTML, for the report page."""
    head = ("<tr><th>DIFF minus baseline</th><th>head-wise norm</th><th>retrieval speed: accuracy at p48c48 after "
            f"600 steps (12 seeds; higher is better)</th><th>"
            f"{html.escape(_capability_head(results.get('retrieval_v4')).replace('`', ''))}</th>"
            "<th>language-model loss at d=96 (5 seeds; lower is better)</th></tr>")
    rows = []
    for c in cells(results):
        name = LABELS[c["variant"]] + (" (as published)" if c["as_published"] else "")
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{'with' if c['headwise_norm'] else 'without'}</td>"
                    f"<td>{html.escape(_cell(c['retrieval']))}</td><td>{html.escape(_cell(c['capability']))}</td>"
                    f"<td>{html.escape(_cell(c['language_model']))}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def section(results: dict[str, dict[str, Any]]) -> str:
    """The report page's opening section (the demo's): the answer table, marked as not measured in the run that shows
    it, with where its numbers come from and the commands that measure them again."""
    dirs = [d for d, _ in FILES.values()] + ([V4] if results.get("retrieval_v4") else [])
    folders = ", ".join(f"<code>docs/results/{d}</code>" for d in dirs)
    return ("<h2>Which differential attention, for which job</h2>"
            "<div class='provenance'><p><b>Not measured in this run.</b> The repository's committed results of the "
            f"pre-registered diagnostics ({folders}), read as committed: a test rebuilds each from its journal. "
            "To measure them again on your machine: <code>difftransformer retrieval --out runs/kv</code>, then "
            "<code>difftransformer retrieval --diagnostic --reference runs/kv --out runs/kv-diag</code> (about 90 "
            "min on 2 cores together), and <code>difftransformer lm-sweep --diagnostic v2 --reference "
            "docs/results/lm-sweep-v2 --out runs/v2-diag</code> (about 25 min).</p></div>"
            f"{html_table(results)}<p class='note'>Each cell: DIFF minus the baseline with its 95% paired interval; "
            "an arm's reading against its own variant (retrieval/DIAGNOSTIC.md). The rows marked as published are "
            "the variants as their sources define them. \"(survives AVX2)\": the same reading when every run it "
            "reads is made again under AVX2 kernels at the same lr (the diagnostics' rounding checks; for the "
            "capability column, protocol 4's, which reruns its test jobs that ran under AVX-512).</p>"
            "<p class='note'><b>The retrieval speed column</b> was read after 600 training steps. "
            "Re-read at 2x and 4x the steps (same seeds and learning rates; retrieval/LONGER.md, pre-registered), "
            "every retrieval cell vanishes: each variant ends at the ceiling on this lookup, while the head-wise "
            "norm still makes it learned sooner. The language-model column is read at the end of training. "
            "docs/retrieval.md, \"Speed or capability\", has each length. The capability column is retrieval "
            "protocol version 4's endpoint 2 (retrieval/PROTOCOL4.md, pre-registered): the accuracy of models "
            "trained L steps, on 12 fresh seeds, at a condition harder than training that the trained baseline "
            "solves only in part (chosen on validation seeds, below the ceiling).</p>")
