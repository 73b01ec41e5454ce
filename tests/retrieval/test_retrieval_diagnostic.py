"""The retrieval diagnostic (retrieval/DIAGNOSTIC.md, ``diagnostic.py``) at toy size: a tiny benchmark, then the four
arms on its journal. What must hold: the reference's runs are read, not run again; every arm's grid runs on every
seed and is chosen by the benchmark's rule; each arm's model has its one change; C and D are the paired differences
the protocol names; the reading rule is the protocol's, oriented by the variant's gap or lead; every job records the
loss-threshold steps and per-layer lambda and head scales; a resumed run runs nothing; bad references are refused."""

from __future__ import annotations

import json
import statistics

import pytest
from test_end_to_end import tiny

from difftransformer.cli import main
from difftransformer.jobs import RunOptions
from difftransformer.retrieval import diagnostic as dg
from difftransformer.retrieval.benchmark import run_benchmark


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rdiag")
    run_benchmark(tiny(), root / "ref", workers=1, progress=False)
    res = dg.run_diagnostic(root / "ref", root / "diag", RunOptions(workers=1, progress=False))
    return root, res


def test_the_arms_run_on_the_reference(runs):
    root, res = runs
    rows = res["rows"]
    assert set(rows) == {"baseline", "diff_v1", "diff_v2", *dg.ARMS}
    n_grid = sum(len(rows[a]["grid"]) for a in dg.ARMS) * 2  # each arm's grid (widened or not) on 2 seeds
    assert res["timings"]["jobs_run"] == n_grid  # none of the reference's jobs ran again
    for arm, spec in dg.ARMS.items():
        variant, overrides, r = spec.variant, spec.change, rows[arm]
        assert r["variant"] == variant and r["overrides"] == overrides and r["lr"] in [g["lr"] for g in r["grid"]]
        assert r["reading"] in (*dg.GAP_READINGS, *dg.LEAD_READINGS, dg.INCONCLUSIVE)
        # C = arm - variant and D = arm - baseline, paired: D - C is the variant's own D
        assert r["D"]["estimate"] - r["C"]["estimate"] == pytest.approx(rows[variant]["D"]["estimate"])
        assert r["C"]["estimate"] == pytest.approx(statistics.fmean(r["accuracy"])
                                                   - statistics.fmean(rows[variant]["accuracy"]))
    assert rows["v2_separate_keys"]["params"] - rows["diff_v2"]["params"] == 16 * 2 * 8  # d_model x H_kv x d, 1 layer
    assert rows["v2_headwise_norm"]["params"] - rows["diff_v2"]["params"] == 8  # the norm's 8-wide weight
    assert rows["v1_no_norm"]["params"] - rows["diff_v1"]["params"] == -16  # V1's 16-wide norm weight gone
    assert json.loads((root / "diag" / dg.RESULTS).read_text())["rows"].keys() == rows.keys()
    assert (root / "diag" / dg.PLOT).stat().st_size > 1000
    assert "summary:" in dg.format_diagnostic(res)


def test_every_job_records_its_dynamics(runs):
    root, res = runs
    for name, r in res["rows"].items():
        dyn = r["dynamics"]
        assert dyn["of"] == 2 and dyn["below_floor"] == dyn["learned_slowly"] + dyn["failed_to_start"]
        assert set(dyn["first_step_below"]) == {dg.STARTED, dg.LEARNED}
    journal = (root / "diag" / dg.JOURNAL).read_text().splitlines()[1:]
    rec = json.loads(journal[0])["result"]
    layer = rec["dynamics"][0]
    assert set(rec["loss_thresholds"]) == {"1", "0.3"} and rec["final_window_loss"] > 0
    assert len(layer["head_rms"]) in (1, 2) and all(x > 0 for x in layer["head_rms"])  # V1: 1 head; V2: 2
    assert "lambda_mean" in layer and "lambda_init" in layer


def test_a_resumed_diagnostic_runs_nothing(runs):
    root, res = runs
    again = dg.run_diagnostic(root / "ref", root / "diag", RunOptions(workers=1, progress=False))
    assert again["timings"]["jobs_run"] == 0 and again["rows"] == res["rows"]


def _iv(lo, hi):
    return {"estimate": (lo + hi) / 2, "ci": [lo, hi]}


def test_the_reading_rule():
    gap, lead = -0.2, 0.1
    assert dg.reading(_iv(-0.05, 0.02), _iv(0.1, 0.3), gap, True) == "closes the gap"
    assert dg.reading(_iv(-0.2, -0.05), _iv(0.02, 0.1), gap, True) == "closes part of the gap"
    assert dg.reading(_iv(-0.3, -0.1), _iv(-0.05, 0.05), gap, True) == "no detectable effect"
    assert dg.reading(_iv(-0.4, -0.3), _iv(-0.2, -0.05), gap, True) == "widens the gap"
    assert dg.reading(_iv(-0.05, 0.02), _iv(-0.2, -0.05), lead, True) == "removes the lead"
    assert dg.reading(_iv(0.02, 0.05), _iv(-0.1, -0.02), lead, True) == "reduces the lead"
    assert dg.reading(_iv(0.05, 0.15), _iv(-0.05, 0.05), lead, True) == "no detectable effect"
    assert dg.reading(_iv(0.15, 0.25), _iv(0.02, 0.1), lead, True) == "adds to the lead"
    assert dg.reading(_iv(0.15, 0.25), _iv(0.02, 0.1), lead, False) == "inconclusive"


def test_bad_references_are_refused_in_one_line(tmp_path, capsys):
    assert main(["retrieval", "--diagnostic", "--reference", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no jobs.jsonl there" in capsys.readouterr().err
    assert main(["retrieval", "--diagnostic", "--out", str(tmp_path / "o")]) == 2
    assert "--diagnostic needs --reference DIR" in capsys.readouterr().err
    assert main(["retrieval", "--diagnostic", "--reference", str(tmp_path), "--steps", "5",
                 "--out", str(tmp_path / "o")]) == 2
    assert "takes its configuration from --reference" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_rounding_check_reruns_the_chosen_lrs_under_another_code_path(runs, capsys):
    """``--rounding-check avx2`` with ``--diagnostic``: the baseline, both variants and every arm at the first run's
    chosen lrs on every seed, under AVX2 kernels, read with the diagnostic's own rule; a second call runs nothing."""
    from difftransformer.studies.rounding import compare_readings
    root, res = runs
    argv = ["retrieval", "--diagnostic", "--reference", str(root / "ref"), "--out", str(root / "diag"),
            "--rounding-check", "avx2", "--workers", "1", "--no-progress"]
    assert main(argv) == 0
    assert "reading(s) differ" in capsys.readouterr().out
    check = json.loads((root / "diag" / "rounding.json").read_text())
    names = ["baseline", "diff_v1", "diff_v2", *dg.ARMS]
    assert list(check["rows"]) == names and check["timings"]["jobs_run"] == 2 * len(names)
    journal = [json.loads(x) for x in (root / "diag" / "rounding-avx2" / dg.JOURNAL).read_text().splitlines()[1:]]
    assert {(r["job"][0], r["job"][2]) for r in journal} == {(n, res["rows"][n]["lr"]) for n in names}
    assert {r["result"]["cpu_capability"] for r in journal} == {"AVX2"}
    acc = {r["job"][0]: [] for r in journal}
    for r in sorted(journal, key=lambda r: r["job"][1]):
        acc[r["job"][0]].append(r["result"]["conditions"]["p3c8"]["accuracy"])
    for name, row in check["rows"].items():
        assert row["first"]["lr"] == row["second"]["lr"] == res["rows"][name]["lr"]
        if name != "baseline":  # D from the AVX2 runs alone
            assert row["second"]["D"]["estimate"] == pytest.approx(statistics.fmean(acc[name])
                                                                   - statistics.fmean(acc["baseline"]))
        if name in dg.ARMS:
            assert row["first"]["reading"] == res["rows"][name]["reading"]
            assert row["survives"] == (row["first"]["reading"] == row["second"]["reading"])
    assert main(argv) == 0  # resumed: every job read back
    assert json.loads((root / "diag" / "rounding.json").read_text())["timings"]["jobs_run"] == 0
    first = {"a": {"lr": 1.0, "D": _iv(0.1, 0.2), "C": _iv(0.1, 0.2), "reading": "closes the gap"}}
    moved = compare_readings(first, {"a": {**first["a"], "reading": "no detectable effect"}}, {"a": [0, 2]})
    assert moved["differ"] == ["a"] and not moved["rows"]["a"]["survives"]
    assert main([*argv[:5], str(root / "nowhere"), *argv[6:]]) == 2
    assert "holds no finished diagnostic" in capsys.readouterr().err
    assert main([*argv[:7], "machine", *argv[8:]]) == 2
    assert "already ran that CPU code path" in capsys.readouterr().err


def test_the_mechanism_arms_on_the_diagnostic(runs):
    """retrieval --mechanism (LONGER.md's 17:10 addition) on the toy diagnostic: each arm's grid on every seed, its
    change in the model (the head gain's parameters), D, C and C' the paired differences against the diagnostic's
    own runs, the reading by the diagnostic's rule, the speed endpoint; a resumed run runs nothing."""
    from difftransformer.retrieval import mechanism as mech
    root, diag = runs
    res = mech.run_mechanism(root / "diag", root / "mech", RunOptions(workers=1, progress=False))
    rows, ref = res["rows"], diag["rows"]
    assert set(rows) == set(mech.ARMS) and res["timings"]["jobs_run"] >= len(mech.ARMS) * 2
    for arm, (_, overrides, c_name, c2_name, _) in mech.ARMS.items():
        r = rows[arm]
        assert r["overrides"] == overrides and r["C_against"] == c_name and r["C2_against"] == c2_name
        assert r["D"]["estimate"] - r["C"]["estimate"] == pytest.approx(ref[c_name]["D"]["estimate"]
                                                                        if c_name != "baseline" else 0.0)
        assert r["C2"]["estimate"] == pytest.approx(statistics.fmean(r["accuracy"])
                                                    - statistics.fmean(ref[c2_name]["accuracy"]))
        assert r["reading"] in (*dg.GAP_READINGS, *dg.LEAD_READINGS, dg.INCONCLUSIVE)
        assert set(r["speed"]) == {dg.STARTED, dg.LEARNED}
    again = mech.run_mechanism(root / "diag", root / "mech", RunOptions(workers=1, progress=False))
    assert again["timings"]["jobs_run"] == 0 and again["rows"] == rows
    assert "v2_gain" in mech.format_mechanism(res)


def test_the_norm_start_gain_is_set_by_the_first_training_batch():
    """The paired initialisation copies the baseline's tensors in place (no state-dict load that would mark the gain
    as set): the arm starts pending and its first training batch sets every layer's gain away from 1."""
    import torch

    from difftransformer.retrieval.train import build_paired, train_model
    cfg = tiny()
    model, _ = build_paired(cfg, "diff_v2", 3000, {"head_gain": "norm_start"})
    assert all(layer.attn.gain_pending for layer in model.layers)
    model = train_model(cfg.replace(steps=1), "diff_v2", 3000, 2e-3, overrides={"head_gain": "norm_start"})["model"]
    for layer in model.layers:
        assert not layer.attn.gain_pending and not torch.allclose(layer.attn.head_gain, torch.ones_like(
            layer.attn.head_gain))


def test_the_mechanism_arms_rounding_check(runs, capsys):
    """``--mechanism --rounding-check avx2``: the arms at their chosen lrs again under AVX2, read against the
    diagnostic's own AVX2 runs (its rounding check's journal), every D, C and reading under both; refused in one line
    before any job without that journal or without finished arms; a second call runs nothing."""
    from difftransformer.retrieval import diagnostic_rounding, mechanism
    from difftransformer.retrieval import mechanism_rounding as mr
    from suite_helpers import cli_fails
    root, _ = runs
    opts = RunOptions(workers=1, progress=False)
    argv = ["retrieval", "--mechanism", "--rounding-check", "avx2", "--reference", str(root / "diag"), "--out",
            str(root / "mech"), "--workers", "1", "--no-progress"]
    if not (root / "mech" / mechanism.JOURNAL).is_file():
        cli_fails(capsys, argv, "no finished mechanism arms there")
        mechanism.run_mechanism(root / "diag", root / "mech", opts)
    if not (root / "diag" / "rounding-avx2").is_dir():
        cli_fails(capsys, argv, "the diagnostic has no rounding check under avx2")
        diagnostic_rounding.rounding_check(root / "ref", root / "diag", "avx2", opts)
    assert main(argv) == 0
    check = json.loads((root / "mech" / "rounding.json").read_text())
    assert list(check["rows"]) == list(mechanism.ARMS) and check["timings"]["jobs_run"] == 2 * len(mechanism.ARMS)
    from difftransformer.jobs import read_journal
    from difftransformer.retrieval.protocol import Job
    first = mechanism.rebuild(root / "diag", root / "mech")["rows"]
    ref = mr.diagnostic_second_runs(root / "diag", "avx2")
    diag = json.loads((root / "diag" / "diagnostic.json").read_text())["rows"]
    _, recs = read_journal(root / "mech" / "rounding-avx2" / mr.STUDY.journal)
    mine = {Job(*r["job"]): r["result"] for r in recs.values()}

    def acc(runs):
        return statistics.fmean(r["conditions"]["p3c8"]["accuracy"] for r in runs)

    for arm, spec in mechanism.ARMS.items():
        row, lr = check["rows"][arm], first[arm]["lr"]
        assert row["first"]["C"] == first[arm]["C"] and row["second"]["lr"] == lr
        runs = [mine[Job(arm, s, lr)] for s in (10, 11)]
        assert {r["cpu_capability"] for r in runs} == {"AVX2"}
        for key, name in (("D", "baseline"), ("C", spec.c_name)):  # both sides under AVX2
            other = [ref[Job(name, s, diag[name]["lr"])] for s in (10, 11)]
            assert row["second"][key]["estimate"] == pytest.approx(acc(runs) - acc(other))
    assert "retrieval mechanism arms" in capsys.readouterr().out
    assert main(argv) == 0 and json.loads((root / "mech" / "rounding.json").read_text())["timings"]["jobs_run"] == 0
