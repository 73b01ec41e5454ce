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
    assert ("| DIFF V2 | with | +0.010 [+0.000, +0.020], closes the gap | not run | +0.200 [+0.190, +0.210], costs "
            "loss |") in table
    assert "| DIFF V1 (as published) | with | +0.060 [+0.050, +0.070] | not run | +0.330 [+0.320, +0.340] |" in table
    page = answer.section(RESULTS)
    assert "Not measured in this run" in page and "costs loss" in page and page.count("<tr>") == 5


def _v4(capability):
    return {"complete": [560, 582], "conditions": {"primary": "p48c192"}, "length": {"L": 4800},
            "capability": capability}


def test_the_capability_column_says_where_protocol_4_stands_then_reads_endpoint_2():
    """Version 4's endpoint 2 per (variant, norm): its name's D, an arm's reading against its variant; "running" and
    the count in the heading until the test jobs at L are all in."""
    running = answer.markdown({**RESULTS, "retrieval_v4": _v4(None)})
    assert "accuracy, `p48c192`, 4,800 steps (12 seeds; higher is better; running: 560 of 582 jobs) |" in running
    assert running.count("| running |") == 4
    read = {"diff_v1": _d(0.02), "v1_no_norm": _d(-0.05, "removes the lead"), "diff_v2": _d(-0.03),
            "v2_headwise_norm": _d(0.04, "closes the gap"), "v2_gain": _d(0.5, "never shown")}
    table = answer.markdown({**RESULTS, "retrieval_v4": _v4(read)})
    assert "(12 seeds; higher is better) |" in table and "running" not in table and "never shown" not in table
    assert ("| DIFF V1 | without | -0.020 [-0.030, -0.010], removes the lead | -0.050 [-0.060, -0.040], removes the "
            "lead |") in table
    assert "| DIFF V2 (as published) | without | -0.180 [-0.190, -0.170] | -0.030 [-0.040, -0.020] |" in table
    cells = {(c["variant"], c["headwise_norm"]): c["capability"] for c in answer.cells({**RESULTS,
                                                                                         "retrieval_v4": _v4(read)})}
    assert {k: c["name"] for k, c in cells.items()} == answer.CAPABILITY
    page = answer.section({**RESULTS, "retrieval_v4": _v4(read)})
    assert "-0.050 [-0.060, -0.040], removes the lead" in page and "docs/results/retrieval-v4" in page
    assert "docs/results/retrieval-v4" not in answer.section(RESULTS)


def test_the_capability_cells_say_whether_their_reading_survives_protocol_4s_rounding_check():
    """With protocol 4's rounding check committed, each capability cell says whether its reading (D's verdict, and an
    arm's reading) is the same under AVX2: "(survives AVX2)", or the reading there; a cell without a check row says
    nothing."""
    read = {"diff_v1": _d(0.02), "v1_no_norm": _d(-0.05, "removes the lead"), "diff_v2": _d(-0.03),
            "v2_headwise_norm": _d(0.04, "closes the gap")}

    def row(first, second):
        return {"first": {"reading": first}, "second": {"reading": second}, "survives": first == second}

    check = {"capability": {"rows": {
        "diff_v1": row("no detectable difference", "no detectable difference"),
        "v1_no_norm": row("no detectable difference; removes the lead", "no detectable difference; removes the lead"),
        "v2_headwise_norm": row("no detectable difference; closes the gap",
                                "no detectable difference; no detectable effect")}}}
    results = {**RESULTS, "retrieval_v4": _v4(read), "retrieval_v4_rounding": check}
    cells = {(c["variant"], c["headwise_norm"]): answer._cell(c["capability"]) for c in answer.cells(results)}
    assert cells == {("diff_v1", True): "+0.020 [+0.010, +0.030] (survives AVX2)",
                     ("diff_v1", False): "-0.050 [-0.060, -0.040], removes the lead (survives AVX2)",
                     ("diff_v2", True): "+0.040 [+0.030, +0.050], closes the gap (AVX2: no detectable difference; no "
                                        "detectable effect)",
                     ("diff_v2", False): "-0.030 [-0.040, -0.020]"}
    # the other columns keep their own checks: no mark where none is committed
    assert "survives" not in answer._cell(answer.cells(results)[0]["retrieval"])


def test_the_demo_page_says_it_opens_with_the_committed_answer():
    from difftransformer.demo import LM_STEPS, preface
    args = Namespace(quick=False, seeds=1, init_from=None)
    text = preface(args, "demo", LM_STEPS, Path("r/retrieval"), Path("r/lm-sweep-v2"), {"commit": "x"}, True)
    assert text.index("committed results, not measured in this run") < text.index("retrieval benchmark, measured")
    assert "answer" not in preface(args, "demo", LM_STEPS, Path("r/retrieval"), None, None)
