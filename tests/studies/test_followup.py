"""The follow-up skeleton (``studies.followup``): its parts on their own, and on every committed follow-up that can be
read back, the results a run with 0 jobs writes are, byte for byte, the rebuild from the journal (both made here, on
this machine: one reading, two ways to it). The committed files themselves are compared with the suite's stated
tolerance by each study's own rebuild test (they were written on another machine)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from difftransformer.jobs import RunOptions
from difftransformer.studies.followup import Arm, FollowUp, interval, loss_reading, paired, sign_of

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
DIAG = RESULTS / "retrieval-diagnostic"
OPTS = RunOptions(workers=1, progress=False)


class _Job(NamedTuple):
    name: str
    steps: int
    lr: float


def _check(obj, where):
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: not an object")
    return obj


TOY: FollowUp[_Job] = FollowUp("toy follow-up", "toy", 3, "toy-jobs.jsonl", "toy.json", _Job, (str, int, float),
                               _check, _check)


def test_interval_formats_every_case_the_texts_print():
    x = {"estimate": 0.1234, "ci": [-0.01, 0.25]}
    assert interval(x) == "+0.123 [-0.010, +0.250]"
    assert interval(x, "+.3g") == "+0.123 [-0.01, +0.25]"
    assert interval({"estimate": 12.0, "ci": [None, None]}, "+g") == "+12"
    assert interval({"estimate": 12.0, "ci": [None, None]}, "+.3g", bare=" [no interval]") == "+12 [no interval]"
    assert interval(None) == "" and interval({"estimate": None, "ci": [None, None]}, empty="-") == "-"


def test_sign_and_the_loss_reading_follow_the_interval():
    assert [sign_of({"ci": c}) for c in ([0.1, 0.2], [-0.2, -0.1], [-0.1, 0.1], [None, None])] == [1, -1, 0, 0]
    assert loss_reading({"ci": [0.1, 0.2]}, False) == "costs loss"
    assert loss_reading({"ci": [-0.2, -0.1]}, False) == "lowers the loss"
    assert loss_reading({"ci": [-0.1, 0.1]}, False) == "no detectable effect"
    assert loss_reading({"ci": [0.1, 0.2]}, True) == "inconclusive"
    assert loss_reading({"ci": [None, None]}, False) == "inconclusive"


def test_paired_is_other_minus_base_by_seed():
    d = paired([0.5, 0.6, 0.7], [0.6, 0.8, 0.8], higher_is_better=True)
    assert d["estimate"] == pytest.approx(0.4 / 3) and d["n"] == 3 and d["ci"][0] < d["estimate"] < d["ci"][1]


def test_an_arm_reads_against_its_variant_unless_it_names_another():
    assert Arm("diff_v2", {"head_gain": "one"}).c_name == "diff_v2"
    assert Arm("diff_v2", {}, "diff_v2_rerun", "v2_headwise_norm", "v2-diagnostic").c_name == "diff_v2_rerun"


def _journal(tmp_path: Path, title: str, jobs: list[list]) -> Path:
    lines = [json.dumps({"journal": {"benchmark": title, "version": 3, "config": {"a": 1}}})]
    lines += [json.dumps({"key": f"k{i}", "job": j, "result": {"x": i}}) for i, j in enumerate(jobs)]
    (tmp_path / TOY.journal).write_text("\n".join(lines) + "\n")
    return tmp_path


def test_read_back_types_the_jobs_and_refuses_another_studys_journal(tmp_path):
    out = _journal(tmp_path, "toy follow-up", [["a", 600, 0.002], ["b", 1200, 1]])
    header, done = TOY.read_back(out, lambda h: h["config"] == {"a": 1}, "the toy's")
    assert header["version"] == 3 and list(done) == [_Job("a", 600, 0.002), _Job("b", 1200, 1.0)]
    assert all(type(j.lr) is float for j in done)
    rebuilt = TOY.rebuilt(done, [_Job("a", 600, 0.002), _Job("c", 600, 0.002)], {"width": 8}, rows={})
    assert list(rebuilt) == ["benchmark", "version", "width", "complete", "rows"] and rebuilt["complete"] == [1, 2]
    with pytest.raises(ValueError, match="its journal is not the toy's"):
        TOY.read_back(out, lambda h: h["config"] == {"a": 2}, "the toy's")
    (tmp_path / "o").mkdir()
    other = _journal(tmp_path / "o", "another study", [])
    with pytest.raises(ValueError, match="its journal is not the toy's"):
        TOY.read_back(other, lambda h: True, "the toy's")


def test_write_adds_the_name_version_and_timings_and_checks_the_schema(tmp_path):
    import time

    res = TOY.write(tmp_path, {"rows": {"a": 1}}, {}, 0, time.perf_counter(), OPTS, job_cpu_s=0.0)
    assert list(res) == ["benchmark", "version", "rows", "timings"] and res["timings"]["job_cpu_s"] == 0.0
    assert json.loads((tmp_path / TOY.results).read_text())["benchmark"] == "toy"

    def refuse(obj, where):
        raise ValueError(f"{where}: no")

    strict = FollowUp("t", "t", 1, "t.jsonl", "t.json", _Job, (str, int, float), _check, refuse)
    with pytest.raises(ValueError, match="as written"):
        strict.write(tmp_path, {}, {}, 0, time.perf_counter(), OPTS)
    assert not (tmp_path / "t.json").exists()


# ---------------------------------------------------------------------------------------------- the committed ones
def _rows_bytes(res: dict, key: str) -> str:
    return json.dumps(json.loads(json.dumps(res[key])), indent=1)


def test_retrieval_longer_run_with_no_jobs_is_its_rebuild_byte_for_byte(tmp_path):
    from difftransformer.retrieval import longer as L
    shutil.copy(RESULTS / "retrieval-longer" / L.JOURNAL, tmp_path / L.JOURNAL)
    res = L.run_longer(DIAG, tmp_path, options=OPTS)
    assert res["timings"]["jobs_run"] == 0
    written = json.loads((tmp_path / L.RESULTS).read_text())
    assert _rows_bytes(written, "lengths") == _rows_bytes(L.rebuild(DIAG, tmp_path), "lengths")


def test_retrieval_mechanism_runs_with_no_jobs_are_their_rebuilds_byte_for_byte(tmp_path):
    from difftransformer.retrieval import mechanism as M
    for name in (M.JOURNAL, M.LONGER_JOURNAL):
        shutil.copy(RESULTS / "retrieval-mechanism" / name, tmp_path / name)
    assert M.run_mechanism(DIAG, tmp_path, OPTS)["timings"]["jobs_run"] == 0
    written = json.loads((tmp_path / M.RESULTS).read_text())
    assert _rows_bytes(written, "rows") == _rows_bytes(M.rebuild(DIAG, tmp_path), "rows")
    longer = RESULTS / "retrieval-longer"
    assert M.run_mechanism_longer(DIAG, longer, tmp_path, OPTS)["timings"]["jobs_run"] == 0
    written = json.loads((tmp_path / M.LONGER_RESULTS).read_text())
    assert _rows_bytes(written, "rows") == _rows_bytes(M.rebuild_longer(DIAG, longer, tmp_path), "rows")


def test_the_follow_ups_name_their_journals_and_results_once():
    """Every follow-up's ``FollowUp`` names the files its module exports, and no two share a title."""
    from difftransformer.lmsweep import longer as LL
    from difftransformer.lmsweep import mechanism as LM
    from difftransformer.lmsweep.diagnostic import V1_SPEC, v2_spec
    from difftransformer.retrieval import diagnostic as RD
    from difftransformer.retrieval import longer as RL
    from difftransformer.retrieval import mechanism as RM
    studies = [RD.STUDY, RL.STUDY, RM.STUDY, RM.LONGER_STUDY, LL.STUDY, LM.STUDY, V1_SPEC.study, v2_spec().study]
    assert len({s.title for s in studies}) == len(studies) and len({s.name for s in studies}) == len(studies)
    for mod in (RD, RL, RM, LL, LM):
        assert (mod.STUDY.journal, mod.STUDY.results) == (mod.JOURNAL, mod.RESULTS)
    assert (RM.LONGER_STUDY.journal, RM.LONGER_STUDY.results) == (RM.LONGER_JOURNAL, RM.LONGER_RESULTS)
