"""The answer table (``report.answer``): each cell is read from the diagnostic row it names, the rows marked as
published are the variants as their sources define them, and the demo's page opens with it, marked as not measured."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

from difftransformer.report import answer


def _d(est, reading=None):
    return {"D": {"estimate": est, "ci": [est - 0.01, est + 0.01], "n": 5}, **({"reading": reading} if reading else {})}


RESULTS = {
    "retrieval": {},
    "retrieval_diagnostic": {"rows": {"diff_v1": _d(0.06), "v1_no_norm": _d(-0.02, "removes the lead"),
                                      "diff_v2": _d(-0.18), "v2_headwise_norm": _d(0.01, "closes the gap")}},
    "lm_v1": {"arms": {"diff_v1": _d(0.33), "no_norm": _d(-0.08, "closes the gap")}},
    "lm_v2": {"arms": {"diff_v2": _d(-0.11), "v2_headwise_norm": _d(0.2, "costs loss")}},
}


def test_every_cell_comes_from_its_row():
    cells = {(c["variant"], c["headwise_norm"]): c for c in answer.cells(RESULTS)}
    assert cells[("diff_v1", True)]["retrieval"]["estimate"] == 0.06 and cells[("diff_v1", True)]["as_published"]
    assert cells[("diff_v1", False)]["language_model"]["reading"] == "closes the gap"
    assert cells[("diff_v2", False)]["as_published"] and cells[("diff_v2", False)]["language_model"]["estimate"] == -0.11
    assert cells[("diff_v2", True)]["retrieval"]["reading"] == "closes the gap"
    table = answer.markdown(RESULTS)
    assert "| DIFF V2 | with | +0.010 [+0.000, +0.020], closes the gap | +0.200 [+0.190, +0.210], costs loss |" in table
    assert "| DIFF V1 (as published) | with | +0.060 [+0.050, +0.070] | +0.330 [+0.320, +0.340] |" in table
    page = answer.section(RESULTS)
    assert "Not measured in this run" in page and "costs loss" in page and page.count("<tr>") == 5


def test_the_demo_page_says_it_opens_with_the_committed_answer():
    from difftransformer.demo import LM_STEPS, preface
    args = Namespace(quick=False, seeds=1, init_from=None)
    text = preface(args, "demo", LM_STEPS, Path("r/retrieval"), Path("r/lm-sweep-v2"), {"commit": "x"}, True)
    assert text.index("committed results, not measured in this run") < text.index("retrieval benchmark, measured")
    assert "answer" not in preface(args, "demo", LM_STEPS, Path("r/retrieval"), None, None)
