"""The README's language-model numbers are what this code computes from the committed journals (the sweep, its AVX2
rounding check and the DIFF V1 diagnostic): the protocol-v2 `cpu` run's journal (docs/results/lm-sweep-v2/) rebuilt
by ``lm-sweep`` without training anything gives the committed sweep.json (timings aside). Numbers are compared to
``suite_helpers.REBUILT_REL_TOL`` (1e-9 relative: another CPU's BLAS sums in another order; the last digits moved by
up to 2e-13 on an AMD EPYC), verdicts and texts exactly. A change to the analysis that moves any number fails here,
until the results are rebuilt and the README and docs/lm-sweep.md say the new numbers."""

import json
import re
import shutil
from pathlib import Path

import pytest
from suite_helpers import assert_results_close, results_differences

from difftransformer.jobs import RunOptions
from difftransformer.lmsweep import diagnostic as dg
from difftransformer.lmsweep import diagnostic_rounding as dr
from difftransformer.lmsweep import diagnostic_text as dt
from difftransformer.lmsweep.config import LMSweepConfig
from difftransformer.lmsweep.sweep import JOURNAL, run_lm_sweep
from difftransformer.rundir import SWEEP_RESULTS_NAME

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"
RESULTS = DOCS / "lm-sweep-v2"
DIAGNOSTIC = DOCS / "v1-diagnostic"
V2_DIAGNOSTIC = DOCS / "v2-diagnostic"
AVX2 = DOCS / "lm-sweep-v2-avx2"


@pytest.fixture(scope="module")
def rebuilt_sweep(tmp_path_factory):
    """The committed sweep rebuilt from its journal in a fresh directory (its tokens prepared there once)."""
    out = tmp_path_factory.mktemp("sweep")
    shutil.copy(RESULTS / JOURNAL, out / JOURNAL)
    committed = json.loads((RESULTS / SWEEP_RESULTS_NAME).read_text())
    res = run_lm_sweep(LMSweepConfig.from_dict(committed["config"]), out, workers=1, progress=False)
    return out, res


def test_the_committed_journal_rebuilds_the_committed_results(rebuilt_sweep):
    out, res = rebuilt_sweep
    committed = json.loads((RESULTS / SWEEP_RESULTS_NAME).read_text())
    assert res["timings"]["jobs"] == 160 and res["timings"]["jobs_run"] == 0
    rebuilt = json.loads((out / SWEEP_RESULTS_NAME).read_text())
    committed.pop("timings"), rebuilt.pop("timings")
    assert_results_close(rebuilt, committed)
    v2 = {r[0]: r[4] for r in rebuilt["verdict_rows"] if r[1] == "diff_v2"}
    assert v2["(a) loss, d=96 (primary)"] == "held"
    assert v2["(b) Fig. 3a parameter ratio"] == "not measurable at this scale"


def test_the_comparison_tolerates_rounding_and_nothing_more():
    """The tolerance is a tolerance for the last bits, not for a changed number, verdict or text."""
    committed = json.loads((RESULTS / SWEEP_RESULTS_NAME).read_text())
    rounded = json.loads(json.dumps(committed))
    moved = json.loads(json.dumps(committed))
    nudged = 0

    def walk(x, y, scale):
        nonlocal nudged
        for k in (range(len(x)) if isinstance(x, list) else list(x)):
            if isinstance(x[k], float) and x[k] != 0.0:
                x[k] *= 1 + 2e-13
                y[k] *= 1 + scale
                nudged += 1
            elif isinstance(x[k], (dict, list)):
                walk(x[k], y[k], scale)

    walk(rounded, moved, 1e-6)
    assert nudged > 100
    assert results_differences(rounded, committed) == []
    assert len(results_differences(moved, committed)) == nudged
    flipped = json.loads(json.dumps(committed))
    row = next(r for r in flipped["verdict_rows"] if r[4] == "held")
    row[4] = "did not hold"
    assert len(results_differences(flipped, committed)) == 1


def test_the_committed_diagnostic_journal_rebuilds_the_committed_diagnostic(rebuilt_sweep, tmp_path):
    """docs/lm-sweep.md's and the README's DIFF V1 diagnostic numbers: its committed journal, read against the
    committed sweep, gives the committed diagnostic.json without training anything (the same tolerance)."""
    sweep_out, _ = rebuilt_sweep
    shutil.copy(DIAGNOSTIC / dg.JOURNAL, tmp_path / dg.JOURNAL)
    shutil.copytree(sweep_out / "data", tmp_path / "data")  # the same tokens: prepare reuses them
    res = dg.run_diagnostic(RESULTS, tmp_path, RunOptions(workers=1, progress=False))
    assert res["timings"]["jobs_run"] == 0
    committed = json.loads((DIAGNOSTIC / dg.RESULTS).read_text())
    rebuilt = json.loads((tmp_path / dg.RESULTS).read_text())
    for r in (committed, rebuilt):
        r.pop("timings"), r.pop("reference")
    assert_results_close(rebuilt, committed)
    assert {a: rebuilt["arms"][a]["reading"] for a in dg.ARMS} == {a: committed["arms"][a]["reading"] for a in dg.ARMS}


def test_the_committed_avx2_journal_rebuilds_the_committed_rounding_check(rebuilt_sweep, tmp_path):
    """docs/lm-sweep.md's rounding table: the committed AVX2 journal (the whole sweep under AVX2 kernels) rebuilt
    without training gives the committed AVX2 sweep.json and, against the committed reference, rounding.json."""
    import torch

    from difftransformer.lmsweep.rounding import compare
    from difftransformer.rundir.files import ROUNDING_NAME
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("the AVX2 journal is rebuilt by AVX2 workers: this CPU has no AVX2")
    sweep_out, _ = rebuilt_sweep
    shutil.copy(AVX2 / JOURNAL, tmp_path / JOURNAL)
    shutil.copytree(sweep_out / "data", tmp_path / "data")
    reference = json.loads((RESULTS / SWEEP_RESULTS_NAME).read_text())
    cfg = LMSweepConfig.from_dict(reference["config"]).replace(cpu_code_path="avx2")
    res = run_lm_sweep(cfg, tmp_path, options=RunOptions(workers=1, progress=False))
    assert res["timings"]["jobs_run"] == 0
    rebuilt, committed = (json.loads(p.read_text()) for p in (tmp_path / SWEEP_RESULTS_NAME, AVX2 / SWEEP_RESULTS_NAME))
    rebuilt.pop("timings"), committed.pop("timings")
    assert_results_close(rebuilt, committed)
    check = json.loads(json.dumps(compare(reference, res)))  # as write_rounding writes it
    assert_results_close(check, json.loads((AVX2 / ROUNDING_NAME).read_text()))
    assert check["not_run"] == 0


def test_the_committed_v2_diagnostic_journal_rebuilds_the_committed_diagnostic(rebuilt_sweep, tmp_path):
    """The cross-study check's language-model numbers (retrieval/DIAGNOSTIC.md; README's answer table): the committed
    DIFF V2 diagnostic journal, read against the committed sweep, gives its committed diagnostic.json."""
    sweep_out, _ = rebuilt_sweep
    shutil.copy(V2_DIAGNOSTIC / dg.JOURNAL, tmp_path / dg.JOURNAL)
    shutil.copytree(sweep_out / "data", tmp_path / "data")
    committed = json.loads((V2_DIAGNOSTIC / dg.RESULTS).read_text())
    arms = tuple(a for a in committed["arms"] if a in dg.V2_ARMS)
    res = dg.run_diagnostic(RESULTS, tmp_path, RunOptions(workers=1, progress=False), spec=dg.v2_spec(arms))
    assert res["timings"]["jobs_run"] == 0
    rebuilt = json.loads((tmp_path / dg.RESULTS).read_text())
    for r in (committed, rebuilt):
        r.pop("timings"), r.pop("reference")
    assert_results_close(rebuilt, committed)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "lm-sweep.md").read_text()
    assert dt.v2_markdown_table(rebuilt) in doc  # docs/lm-sweep.md quotes the rebuilt numbers


@pytest.mark.parametrize("where", ["v2-diagnostic", "v1-diagnostic"])
def test_the_committed_diagnostic_rounding_checks_rebuild(rebuilt_sweep, tmp_path, where):
    """Each language-model diagnostic's AVX2 rounding check (retrieval/DIAGNOSTIC.md "Deviations", 2026-11-28 13:40):
    its committed journal, read against the committed diagnostic, gives the committed rounding.json; docs/lm-sweep.md
    quotes it."""
    from difftransformer.studies.rounding import format_readings
    src = DOCS / where
    assert (src / "rounding.json").is_file(), f"no rounding check committed in docs/results/{where}"
    sweep_out, _ = rebuilt_sweep
    shutil.copy(src / dg.RESULTS, tmp_path / dg.RESULTS)
    shutil.copytree(src / "rounding-avx2", tmp_path / "rounding-avx2")
    shutil.copytree(sweep_out / "data", tmp_path / "rounding-avx2" / "data")
    check = json.loads(json.dumps(dr.rounding_check(RESULTS, tmp_path, "avx2", RunOptions(workers=1,
                                                                                              progress=False))))
    assert check["timings"]["jobs_run"] == 0
    committed = json.loads((src / "rounding.json").read_text())
    for r in (check, committed):
        r.pop("timings"), r.pop("reference")
    assert_results_close(check, committed)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "lm-sweep.md").read_text()
    block = format_readings(committed, committed["study"])
    assert block in doc
    # the prose above the block: "no D or C moved by more than X nats" with X the largest move, rounded up
    said = re.findall(r"no D or C moved by more than (\d\.\d+) nats", doc[:doc.index(block)])[-1]
    moves = [abs(r["first"][k]["estimate"] - r["second"][k]["estimate"]) for r in committed["rows"].values()
             for k in ("D", "C") if k in r["first"]]
    assert max(moves) <= float(said) < max(moves) + 0.001, (said, max(moves))


def test_the_committed_mechanism_journal_rebuilds():
    """The language-model mechanism arms' committed journal (complete or not): every record's key is the one the
    study computes from the reference sweep's configuration and data, every arm one of the addition's, and the
    rebuild reads it against the committed diagnostics' runs."""
    from difftransformer.lmsweep import mechanism as mech
    out = DOCS / "lm-mechanism"
    cfg, fp, _ = dg.reference(RESULTS)
    key = mech._key(cfg.to_dict(), fp, "cpu")
    lines = (out / mech.JOURNAL).read_text().splitlines()
    assert json.loads(lines[0])["journal"]["config"] == cfg.to_dict() and len(lines) > 1
    for line in lines[1:]:
        rec = json.loads(line)
        from difftransformer.lmsweep.analysis import Job
        job = Job(*rec["job"])
        assert job.variant in mech.ARMS
        assert rec["key"] == key(job)
    res = mech.rebuild(RESULTS, DOCS, out)
    assert res["complete"][0] == len(lines) - 1 and res["complete"][1] >= 45
    if res["complete"][0] == res["complete"][1]:  # finished: the committed results are the rebuild, number for number
        from difftransformer.lmsweep.schema import read, validate_mechanism
        assert_results_close(json.loads(json.dumps(res["rows"])), read(out / mech.RESULTS, validate_mechanism)["rows"])


def test_the_committed_mechanism_rounding_check_rebuilds(rebuilt_sweep, tmp_path):
    """The arms' committed AVX2 rounding check (docs/results/lm-mechanism/rounding-avx2 and rounding.json): its
    journal, read against the committed diagnostics' own AVX2 runs, gives the committed rounding.json without
    training anything (the suite's stated tolerance; its readings exactly); docs/lm-sweep.md quotes it."""
    import torch

    from difftransformer.lmsweep import mechanism as mech
    from difftransformer.lmsweep import mechanism_rounding as mr
    from difftransformer.studies.rounding import format_readings
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("the AVX2 journal is rebuilt by AVX2 workers: this CPU has no AVX2")
    out = DOCS / "lm-mechanism"
    committed = json.loads((out / "rounding.json").read_text())
    shutil.copy(out / mech.JOURNAL, tmp_path / mech.JOURNAL)
    shutil.copytree(out / "rounding-avx2", tmp_path / "rounding-avx2")
    shutil.copytree(rebuilt_sweep[0] / "data", tmp_path / "rounding-avx2" / "data")  # the same tokens, reused
    check = json.loads(json.dumps(mr.rounding_check(RESULTS, DOCS, tmp_path, "avx2",
                                                    RunOptions(workers=1, progress=False))))
    assert check["timings"]["jobs_run"] == 0
    for r in (check, committed):
        r.pop("timings"), r.pop("reference")
    assert_results_close(check, committed)
    assert check["differ"] == committed["differ"] == []
    doc = (DOCS.parent / "lm-sweep.md").read_text()
    assert format_readings(committed, committed["study"]) in doc
    assert "Every reading survives the other rounding" in doc
