"""The README's and docs/retrieval.md's retrieval numbers are what this code computes from the committed journals:
the benchmark's (docs/results/retrieval-v3/jobs.jsonl) rebuilt by ``run_benchmark`` without training gives the
committed results.json, and the diagnostic's (docs/results/retrieval-diagnostic/diag-jobs.jsonl), read against it,
the committed diagnostic.json (timings and paths aside; numbers to ``suite_helpers.REBUILT_REL_TOL``, verdicts,
readings and texts exactly). The answer table (``report.answer``) is then checked against the README and the docs,
so a number that drifts from its data fails here."""

import json
import shutil
from pathlib import Path

import pytest
from suite_helpers import assert_results_close

from difftransformer.jobs import RunOptions, read_journal
from difftransformer.retrieval import diagnostic as dg
from difftransformer.retrieval import diagnostic_rounding
from difftransformer.retrieval.benchmark import JOURNAL, run_benchmark
from difftransformer.retrieval.config import RetrievalConfig
from difftransformer.rundir.files import RESULTS_NAME
from difftransformer.report import answer

ROOT = Path(__file__).resolve().parents[2]
BENCH = answer.RESULTS / "retrieval-v3"
DIAG = answer.RESULTS / "retrieval-diagnostic"


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    out = tmp_path_factory.mktemp("kv")
    shutil.copy(BENCH / JOURNAL, out / JOURNAL)
    cfg = RetrievalConfig.from_dict(read_journal(BENCH / JOURNAL)[0]["config"])
    res = run_benchmark(cfg, out, options=RunOptions(workers=1, progress=False))
    return out, res


def _strip(r: dict) -> dict:
    r.pop("timings", None), r.pop("reference", None)
    return r


def test_the_committed_benchmark_journal_rebuilds_its_results(rebuilt):
    out, res = rebuilt
    assert res["timings"]["jobs"] == 108 and res["timings"]["jobs_run"] == 0
    committed = _strip(json.loads((BENCH / RESULTS_NAME).read_text()))
    assert_results_close(_strip(json.loads((out / RESULTS_NAME).read_text())), committed)


def test_the_committed_diagnostic_journal_rebuilds_its_results(rebuilt, tmp_path):
    out, _ = rebuilt
    shutil.copy(DIAG / dg.JOURNAL, tmp_path / dg.JOURNAL)
    res = dg.run_diagnostic(out, tmp_path, RunOptions(workers=1, progress=False))
    assert res["timings"]["jobs_run"] == 0
    committed = _strip(json.loads((DIAG / dg.RESULTS).read_text()))
    rebuilt_res = _strip(json.loads((tmp_path / dg.RESULTS).read_text()))
    assert_results_close(rebuilt_res, committed)
    assert {a: rebuilt_res["rows"][a]["reading"] for a in dg.ARMS} == {a: committed["rows"][a]["reading"]
                                                                       for a in dg.ARMS}


def test_the_readme_and_the_docs_quote_the_committed_answer():
    """The answer table in the README and docs/retrieval.md is the one the committed results give, digit for digit."""
    table = answer.markdown()
    assert table in (ROOT / "README.md").read_text()
    assert table in (ROOT / "docs" / "retrieval.md").read_text()
    assert dg.markdown_table(json.loads((DIAG / dg.RESULTS).read_text())) in (ROOT / "docs" / "retrieval.md").read_text()


def test_the_committed_rounding_check_rebuilds(rebuilt, tmp_path):
    """The diagnostic's AVX2 rounding check (DIAGNOSTIC.md "Deviations", 2026-11-28 13:40): its committed journal,
    read against the committed diagnostic, gives the committed rounding.json, and every reading survives."""
    out, _ = rebuilt
    shutil.copy(DIAG / dg.RESULTS, tmp_path / dg.RESULTS)
    (tmp_path / "rounding-avx2").mkdir()
    shutil.copy(DIAG / "rounding-avx2" / dg.JOURNAL, tmp_path / "rounding-avx2" / dg.JOURNAL)
    check = json.loads(json.dumps(diagnostic_rounding.rounding_check(out, tmp_path, "avx2", RunOptions(workers=1, progress=False))))
    assert check["timings"]["jobs_run"] == 0
    committed = json.loads((DIAG / "rounding.json").read_text())
    assert_results_close(_strip(check), _strip(committed))
    assert committed["differ"] == [] and committed["equal_runs"] == [48, 96]
    from difftransformer.studies.rounding import format_readings
    assert format_readings(committed, "retrieval diagnostic") in (ROOT / "docs" / "retrieval.md").read_text()
