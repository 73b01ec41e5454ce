"""The head-wise norm's mechanism arms (retrieval/LONGER.md, the addition of 17:10): the committed journal read back
(every record's key is the one the study computes for its job, from the committed diagnostic's configuration), its
rebuild equal to the committed ``mechanism.json`` once the journal is complete, and the rebuild's refusal of another
study's journal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from suite_helpers import assert_results_close

from difftransformer.retrieval import mechanism as M
from difftransformer.retrieval.protocol import Job

ROOT = Path(__file__).resolve().parents[2]
DIAG = ROOT / "docs" / "results" / "retrieval-diagnostic"
OUT = ROOT / "docs" / "results" / "retrieval-mechanism"


def test_the_committed_journal_rebuilds():
    first = json.loads((DIAG / "diagnostic.json").read_text())
    res = M.rebuild(DIAG, OUT)
    key = M._key(first["config"], "cpu")
    lines = (OUT / M.JOURNAL).read_text().splitlines()[1:]
    assert lines, "the journal holds no job"
    for line in lines:
        rec = json.loads(line)
        assert rec["key"] == key(Job(*rec["job"]))
        assert rec["job"][0] in M.ARMS
    done, total = res["complete"]
    assert done == len(lines) and total >= 3 * 3 * 12  # three arms, a grid of at least three lrs, 12 seeds
    if done == total:  # finished: the committed results are this rebuild's reading, number for number
        from difftransformer.retrieval.schema import read, validate_mechanism
        committed = read(OUT / M.RESULTS, validate_mechanism)  # the schema the writer checks
        assert set(committed["rows"]) == set(M.ARMS)
        assert_results_close(json.loads(json.dumps(res["rows"])), committed["rows"])  # REBUILT_REL_TOL
    for arm, row in res["rows"].items():
        assert row["C_against"] == M.ARMS[arm][2] and len(row["accuracy"]) == 12


def test_rebuild_refuses_another_studys_journal(tmp_path):
    shutil.copytree(OUT, tmp_path / "m")
    j = tmp_path / "m" / M.JOURNAL
    lines = j.read_text().splitlines()
    head = json.loads(lines[0])
    head["journal"]["benchmark"] = "retrieval longer training"
    j.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    with pytest.raises(ValueError):
        M.rebuild(DIAG, tmp_path / "m")


# ---------------------------------------------------------------------------------------------- at 2,400 steps
def test_a_longer_key_is_the_600_step_key_at_600_steps_and_another_at_2400():
    first = json.loads((DIAG / "diagnostic.json").read_text())
    cfg = first["config"]
    short, longer = M._key(cfg, "cpu"), M._longer_key(cfg, "cpu")
    job = Job("v2_gain", 1000, 0.002)
    assert longer(M.LongJob("v2_gain", cfg["steps"], 1000, 0.002)) == short(job)
    assert longer(M.LongJob("v2_gain", M.LONGEST, 1000, 0.002)) != short(job)


def _run(seed: int, acc: float, first_below: int) -> dict:
    return {"conditions": {"p48c48": {"accuracy": acc, "n_queries": 2000}}, "failed": acc < 0.3,  # primary
            "loss_thresholds": {M.STARTED: first_below, M.LEARNED: first_below + 100}}


def test_the_longer_reading_pairs_each_arm_with_the_rereadings_runs():
    """Synthetic runs: D, C and C' are the paired differences against the re-reading's row at that length (the
    baseline, the arm's variant, its other form), the speed endpoint the paired crossing differences."""
    first = json.loads((DIAG / "diagnostic.json").read_text())
    from difftransformer.retrieval.config import RetrievalConfig
    cfg = RetrievalConfig.from_dict(first["config"])
    seeds = cfg.test_seeds
    names = {"baseline", "diff_v1", "diff_v2", "v1_no_norm", "v2_headwise_norm"}
    thr_keys = (M.STARTED, M.LEARNED)
    base_acc = [0.90 + 0.001 * i for i in range(12)]
    row = {n: {"accuracy": [a + (0.02 if n == "diff_v2" else 0.0) for a in base_acc],
               "first_step_below": {t: [300] * 12 for t in thr_keys}} for n in names}
    lrs = {a: 0.002 for a in M.ARMS}
    done = {M.LongJob(a, M.LONGEST, s, 0.002): _run(s, base_acc[i] + 0.05, 250)
            for a in M.ARMS for i, s in enumerate(seeds)}
    rows = M.assess_longer(first, lrs, row, done)
    assert set(rows) == set(M.ARMS)
    v2 = rows["v2_gain"]
    assert v2["D"]["estimate"] == pytest.approx(0.05) and v2["C"]["estimate"] == pytest.approx(0.03)
    assert v2["C2"]["estimate"] == pytest.approx(0.05) and v2["speed"][M.STARTED]["estimate"] == -50
    missing = dict(done)
    missing.pop(M.LongJob("v1_gain", M.LONGEST, seeds[0], 0.002))
    assert "v1_gain" not in M.assess_longer(first, lrs, row, missing)  # read only when all its jobs are in


@pytest.mark.parametrize("extra,match", [
    (["--longer", "1200"], "the arms are read at 2400 steps"),
    ([], "--longer-reference"),
    (["--longer-reference", "nowhere"], "no diagnostic.json there|nowhere"),
])
def test_the_longer_arms_refuse_before_any_job(extra, match, tmp_path, capsys):
    from difftransformer.cli import main
    argv = ["retrieval", "--out", str(tmp_path / "o"), "--mechanism", "--reference", str(DIAG)]
    if "--longer" not in extra:
        argv += ["--longer", "2400"]
    rc = main(argv + extra)
    assert rc == 2 and not (tmp_path / "o").exists()
    assert capsys.readouterr().err.count("\n") == 1


def test_the_longer_arms_need_the_600_step_run_in_out(tmp_path):
    with pytest.raises(ValueError, match="needs the arms' finished 600-step run first"):
        M.chosen_lrs(DIAG, tmp_path)


@pytest.mark.parametrize("lr", [0, -0.001, float("nan"), "0.002"])
def test_a_reference_with_a_bad_lr_is_refused_before_out_is_made(lr, tmp_path, capsys):
    """retrieval --longer and --mechanism read their lrs from the reference: 0, negative, NaN or text is one line, and
    no OUT (issue 70 item 8)."""
    from difftransformer.cli import main
    ref = tmp_path / "ref"
    shutil.copytree(DIAG, ref)
    d = json.loads((ref / "diagnostic.json").read_text())
    d["rows"]["diff_v2"]["lr"] = lr
    (ref / "diagnostic.json").write_text(json.dumps(d))
    for mode in (["--longer", "1200"], ["--mechanism"]):
        rc = main(["retrieval", "--out", str(tmp_path / "o"), *mode, "--reference", str(ref)])
        err = capsys.readouterr().err
        assert rc == 2 and "rows.diff_v2.lr" in err and err.count("\n") == 1, err
        assert not (tmp_path / "o").exists()


def test_a_refused_device_leaves_no_out(tmp_path, capsys):
    from difftransformer.cli import main
    rc = main(["retrieval", "--out", str(tmp_path / "o"), "--longer", "1200", "--reference", str(DIAG),
               "--device", "cuda"])
    assert rc == 2 and not (tmp_path / "o").exists(), capsys.readouterr().err


def test_the_committed_longer_journal_rebuilds():
    """The arms at 2,400 steps: every record's key is the one the study computes, at the 600-step run's final lrs,
    and once complete the rebuild is the committed mechanism-longer.json, number for number."""
    from difftransformer.retrieval.schema import read, validate_mechanism
    first = json.loads((DIAG / "diagnostic.json").read_text())
    key = M._longer_key(first["config"], "cpu")
    lrs = M.chosen_lrs(DIAG, OUT)
    lines = (OUT / M.LONGER_JOURNAL).read_text().splitlines()
    assert json.loads(lines[0])["journal"]["lrs"] == lrs
    for line in lines[1:]:
        rec = json.loads(line)
        job = M.LongJob(*rec["job"])
        assert rec["key"] == key(job) and job.steps == M.LONGEST and job.lr == lrs[job.name]
    res = M.rebuild_longer(DIAG, ROOT / "docs" / "results" / "retrieval-longer", OUT)
    if res["complete"][0] == res["complete"][1]:
        committed = read(OUT / M.LONGER_RESULTS, validate_mechanism)
        assert_results_close(json.loads(json.dumps(res["rows"])), committed["rows"])  # REBUILT_REL_TOL


def test_the_rounding_check_refuses_before_any_job(tmp_path, capsys):
    """``--mechanism --rounding-check``: without finished arms in OUT, or without the diagnostic's own rounding check
    under that code path, one line and exit 2, nothing written."""
    from suite_helpers import cli_fails
    argv = ["retrieval", "--mechanism", "--rounding-check", "avx2", "--reference", str(DIAG), "--out",
            str(tmp_path / "o"), "--workers", "1"]
    cli_fails(capsys, argv, "no finished mechanism arms there")
    assert not (tmp_path / "o").exists()
    bare = tmp_path / "diag"
    bare.mkdir()
    shutil.copy(DIAG / "diagnostic.json", bare / "diagnostic.json")
    arms = tmp_path / "arms"
    arms.mkdir()
    shutil.copy(OUT / M.JOURNAL, arms / M.JOURNAL)  # the finished arms, without their rounding check
    cli_fails(capsys, [*argv[:5], str(bare), "--out", str(arms), "--workers", "1"],
              "the diagnostic has no rounding check under avx2")
    assert sorted(p.name for p in arms.iterdir()) == [M.JOURNAL]


def test_the_committed_rounding_check_rebuilds(tmp_path):
    """The arms' committed AVX2 rounding check (docs/results/retrieval-mechanism/rounding-avx2 and rounding.json):
    its journal, read against the committed diagnostic's own AVX2 runs, gives the committed rounding.json without
    training anything (the suite's stated tolerance; its readings exactly); docs/retrieval.md quotes it."""
    import torch

    from difftransformer.jobs import RunOptions
    from difftransformer.retrieval import mechanism_rounding as mr
    from difftransformer.studies.rounding import format_readings
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("the AVX2 journal is rebuilt by AVX2 workers: this CPU has no AVX2")
    committed = json.loads((OUT / "rounding.json").read_text())
    shutil.copy(OUT / M.JOURNAL, tmp_path / M.JOURNAL)
    shutil.copytree(OUT / "rounding-avx2", tmp_path / "rounding-avx2")
    check = json.loads(json.dumps(mr.rounding_check(DIAG, tmp_path, "avx2", RunOptions(workers=1, progress=False))))
    assert check["timings"]["jobs_run"] == 0
    for r in (check, committed):
        r.pop("timings"), r.pop("reference")
    assert_results_close(check, committed)
    assert check["differ"] == committed["differ"]
    doc = (ROOT / "docs" / "retrieval.md").read_text()
    assert format_readings(committed, committed["study"]) in doc
