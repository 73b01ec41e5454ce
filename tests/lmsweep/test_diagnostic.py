"""The DIFF V1 diagnostic (lmsweep/DIAGNOSTIC.md, ``diagnostic.py``) at toy size: a tiny reference sweep of the
baseline, DIFF V1 and DIFF V2, then the four arms on its journal (and the DIFF V2 diagnostic's arm on the same one).
What must hold: the reference's jobs are reused (not run again) but for the one rerun, which reproduces its journaled
loss bit for bit on this machine; every arm's grid runs on every seed and is chosen by the sweep's rule; each arm's
model has its one change (the parameter count of per_head, the multiplier 1 - lambda_init measured inside the trained
models); the reading rule is the protocol's; a resumed run runs nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difftransformer.jobs import RunOptions
from difftransformer.lmsweep import diagnostic as dg
from difftransformer.lmsweep import diagnostic_rounding as dr
from difftransformer.lmsweep import diagnostic_text as dt
from difftransformer.lmsweep import sweep
from difftransformer.lmsweep.config import LMSweepConfig
from difftransformer.lmsweep.sweep import run_lm_sweep

# One reference sweep for both diagnostics (V1 reruns the baseline and DIFF V1 from it, V2 the baseline and DIFF V2),
# as the real reference is one sweep of every variant; each diagnostic reads only its own variants' runs.
# eval_every = steps: the validation curve (Fig. 3b's) is its end point only; nothing here reads it.
TINY = LMSweepConfig(preset="tiny", widths=(16, 32), steps=6, warmup_steps=1, batch=2, seq_len=32, seeds=2,
                     lr_grid=(4e-3, 8e-3),
                     lr_widen=0, eval_every=6, variants=("baseline", "diff_v1", "diff_v2"), outlier_windows=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diag")
    with pytest.MonkeyPatch.context() as mp:  # the reference sweep's plots: nothing here reads them
        mp.setattr(sweep, "plot_all", lambda res, out: [])
        run_lm_sweep(TINY, root / "ref", workers=1, progress=False)
    res = dg.run_diagnostic(root / "ref", root / "diag", RunOptions(workers=1, progress=False))
    return root, res


def test_the_arms_run_on_the_reference_and_reuse_its_jobs(runs):
    root, res = runs
    assert res["width"] == 32 and set(res["arms"]) == {"baseline", "diff_v1", *dg.ARMS}
    assert res["timings"]["jobs_run"] == 2 * 2 + len(dg.ARMS) * 2 * 2  # 2 reruns x 2 seeds, each arm 2 lrs x 2 seeds
    assert res["rerun"]["bitwise_equal"] == 4 and res["rerun"]["verdict"] == "reproduced bit for bit"
    # on one machine the reruns are the reference's runs: the sensitivity row is the primary one
    assert res["arms"]["diff_v1"]["D"] == res["arms"]["diff_v1"]["D_reference"]
    assert all(res["arms"][a]["reading"] == res["arms"][a]["reading_reference"] for a in dg.ARMS)
    for arm in dg.ARMS:
        a = res["arms"][arm]
        assert a["reading"] in dg.READINGS and a["lr"] in TINY.lr_grid and a["D"]["n"] == 2
        assert [g["lr"] for g in a["grid"]] == list(TINY.lr_grid)
        assert a["share_closed"] == pytest.approx(-a["C"]["estimate"] / res["arms"]["diff_v1"]["D"]["estimate"])
        # C is arm minus DIFF V1 and D arm minus baseline: their difference is DIFF V1's own D, seed by seed
        assert a["D"]["estimate"] - a["C"]["estimate"] == pytest.approx(res["arms"]["diff_v1"]["D"]["estimate"])
    assert json.loads((root / "diag" / dg.RESULTS).read_text())["arms"].keys() == res["arms"].keys()
    assert (root / "diag" / dg.PLOT).stat().st_size > 1000
    assert "the reruns against the reference's runs: reproduced bit for bit" in dt.format_diagnostic(res)


def test_each_arm_makes_its_one_change(runs):
    _, res = runs
    a = res["arms"]
    assert a["per_head"]["params_non_embedding"] > a["lambda_08"]["params_non_embedding"]
    assert a["no_norm"]["params_non_embedding"] < a["lambda_08"]["params_non_embedding"]  # no norm weight
    for arm, init in (("lambda_08", 0.8), ("lambda_05", 0.5)):
        assert [r["lambda_init"] for r in a[arm]["v1_scales"]] == [init] * TINY.n_layers
        for r in a[arm]["v1_scales"]:  # Eq. (3)'s multiplier, measured between the norm and wo in the model
            assert r["multiplier_ratio"] == pytest.approx(1 - init, rel=1e-5)
    sched = [r["lambda_init"] for r in a["per_head"]["v1_scales"]]
    assert sched[0] == pytest.approx(0.2) and sched == sorted(sched)  # the paper's schedule, rising with depth
    assert all(r["before_norm"] is None and r["after_multiplier"] > 0 for r in a["no_norm"]["v1_scales"])


def test_a_resumed_diagnostic_runs_nothing(runs):
    root, res = runs
    again = dg.run_diagnostic(root / "ref", root / "diag", RunOptions(workers=1, progress=False))
    assert again["timings"]["jobs_run"] == 0 and again["arms"] == res["arms"]


def _iv(lo, hi):
    return {"estimate": (lo + hi) / 2, "ci": [lo, hi]}


def test_the_reading_rule():
    assert dg.reading(_iv(-0.1, 0.05), _iv(-0.4, -0.2), False) == "closes the gap"
    assert dg.reading(_iv(0.1, 0.2), _iv(-0.3, -0.1), False) == "closes part of the gap"
    assert dg.reading(_iv(0.2, 0.4), _iv(-0.1, 0.1), False) == "no detectable effect"
    assert dg.reading(_iv(0.4, 0.6), _iv(0.1, 0.2), False) == "widens the gap"
    assert dg.reading(_iv(-0.1, 0.05), _iv(-0.4, -0.2), True) == "inconclusive"


def test_a_reference_that_is_not_a_sweep_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"no lm-jobs\.jsonl there"):
        dg.run_diagnostic(tmp_path, tmp_path / "out", RunOptions(workers=1, progress=False))


def test_the_v2_diagnostic_reruns_and_reads_its_arm(runs):
    """retrieval/DIAGNOSTIC.md "The cross-study check" at toy size: the baseline and DIFF V2 rerun bit for bit, the
    arm's grid chosen by the sweep's rule, C = arm - DIFF V2 and D = arm - baseline, the reading from C."""
    root, _ = runs
    ref, out = root / "ref", root / "diag-v2"
    spec = dg.v2_spec(("v2_headwise_norm",))
    res = dg.run_diagnostic(ref, out, RunOptions(workers=1, progress=False), spec=spec)
    assert res["benchmark"] == "v2_diagnostic" and set(res["arms"]) == {"baseline", "diff_v2", "v2_headwise_norm"}
    assert res["timings"]["jobs_run"] == 2 * 2 + 2 * 2 and res["rerun"]["verdict"] == "reproduced bit for bit"
    a, v2 = res["arms"]["v2_headwise_norm"], res["arms"]["diff_v2"]
    assert a["reading"] in dg.V2_READINGS and a["lr"] in TINY.lr_grid
    assert a["params_non_embedding"] - v2["params_non_embedding"] == TINY.n_layers * (32 // TINY.n_heads)  # norm g
    assert a["D"]["estimate"] - a["C"]["estimate"] == pytest.approx(v2["D"]["estimate"])
    assert "v2_headwise_norm" in dt.format_v2_diagnostic(res)
    again = dg.run_diagnostic(ref, out, RunOptions(workers=1, progress=False), spec=spec)
    assert again["timings"]["jobs_run"] == 0 and again["arms"] == res["arms"]
    with pytest.raises(ValueError, match="--arms no_such"):
        dg.v2_spec(("no_such",))
    check = dr.rounding_check(ref, out, "avx2", RunOptions(workers=1, progress=False))
    assert list(check["rows"]) == ["baseline", "diff_v2", "v2_headwise_norm"] and check["timings"]["jobs_run"] == 6
    assert check["rows"]["v2_headwise_norm"]["second"]["reading"] in dg.V2_READINGS


def test_the_v2_reading_rule():
    assert dg.v2_reading(_iv(0.01, 0.2), False) == "costs loss"
    assert dg.v2_reading(_iv(-0.2, -0.01), False) == "lowers the loss"
    assert dg.v2_reading(_iv(-0.1, 0.1), False) == "no detectable effect"
    assert dg.v2_reading(_iv(0.01, 0.2), True) == "inconclusive"


def test_the_rounding_check_reruns_the_chosen_lrs_under_another_code_path(runs, capsys):
    """``lm-sweep --diagnostic v1 --rounding-check avx2``: the two reruns and every arm at the first run's chosen lrs
    on every seed, under AVX2 kernels, read with the diagnostic's rule (D, C and the reading from those runs alone)."""
    from difftransformer.cli import main
    root, res = runs
    argv = ["lm-sweep", "--diagnostic", "v1", "--reference", str(root / "ref"), "--out", str(root / "diag"),
            "--rounding-check", "avx2", "--workers", "1", "--no-progress"]
    assert main(argv) == 0
    assert "reading(s) differ" in capsys.readouterr().out
    check = json.loads((root / "diag" / "rounding.json").read_text())
    assert list(check["rows"]) == ["baseline", "diff_v1", *dg.ARMS] and check["timings"]["jobs_run"] == 12
    journal = [json.loads(x) for x in (root / "diag" / "rounding-avx2" / dg.JOURNAL).read_text().splitlines()[1:]]
    assert {r["result"]["cpu_capability"] for r in journal} == {"AVX2"}
    lr = {"baseline_rerun": res["arms"]["baseline"]["lr"], "diff_v1_rerun": res["arms"]["diff_v1"]["lr"],
          **{a: res["arms"][a]["lr"] for a in dg.ARMS}}
    assert {(r["job"][1], r["job"][3]) for r in journal} == set(lr.items())
    loss = {}
    for r in sorted(journal, key=lambda r: r["job"][2]):
        loss.setdefault(r["job"][1], []).append(r["result"]["test_loss"])
    for arm in dg.ARMS:
        row = check["rows"][arm]
        assert row["first"]["reading"] == res["arms"][arm]["reading"]
        assert row["second"]["C"]["estimate"] == pytest.approx(
            sum(loss[arm]) / 2 - sum(loss["diff_v1_rerun"]) / 2)
    assert main(argv) == 0
    assert json.loads((root / "diag" / "rounding.json").read_text())["timings"]["jobs_run"] == 0
    assert main(["lm-sweep", "--out", str(root / "x"), "--rounding-check", "avx2"]) == 2
    assert "goes with --diagnostic" in capsys.readouterr().err


def test_the_language_model_at_2x_the_tokens(runs):
    """lm-sweep --longer (retrieval/LONGER.md's language-model addition) on the toy reference: each name at twice
    the reference's steps and its pre-registered lr on every seed, read with D (minus the baseline), C (the arms minus
    their variant) and the V2 rule's reading; a second run resumes and runs nothing. The pre-registered lrs are the
    committed diagnostics' choices."""
    from pathlib import Path

    from difftransformer.lmsweep import longer
    root, _ = runs
    res = longer.run_longer(root / "ref", root / "longer", RunOptions(workers=1, progress=False))
    assert res["steps"] == 2 * TINY.steps and res["width"] == 32
    assert res["timings"]["jobs_run"] == len(longer.NAMES) * 2
    rows = res["rows"]
    assert set(rows) == set(longer.NAMES) and all(r["test_loss"] and r["lr"] == longer.LRS[n] for n, r in rows.items())
    for arm, variant in longer.ARM_OF.items():
        assert rows[arm]["D"]["estimate"] - rows[arm]["C"]["estimate"] == pytest.approx(rows[variant]["D"]["estimate"])
        assert rows[arm]["reading"] in ("costs loss", "lowers the loss", "no detectable effect", "inconclusive")
    again = longer.run_longer(root / "ref", root / "longer", RunOptions(workers=1, progress=False))
    assert again["timings"]["jobs_run"] == 0 and again["rows"] == rows
    committed = Path(__file__).resolve().parents[2] / "docs" / "results"
    v1 = json.loads((committed / "v1-diagnostic" / dg.RESULTS).read_text())["arms"]
    v2 = json.loads((committed / "v2-diagnostic" / dg.RESULTS).read_text())["arms"]
    assert longer.LRS == {"baseline": v1["baseline"]["lr"], "diff_v1": v1["diff_v1"]["lr"], "no_norm":
                          v1["no_norm"]["lr"], "diff_v2": v2["diff_v2"]["lr"], "v2_headwise_norm":
                          v2["v2_headwise_norm"]["lr"]} == {**longer.LRS, "baseline": v2["baseline"]["lr"]}


def test_the_2x_tokens_classing(tmp_path):
    """docs/lm-sweep.md's table: each name's 1x D from the committed diagnostics and its status at 2x (survives,
    vanishes, reverses), or "running" without a finished lm-longer.json."""
    from pathlib import Path

    from difftransformer.lmsweep import longer
    committed = Path(__file__).resolve().parents[2] / "docs" / "results"
    assert "running" in longer.classing_table(committed, tmp_path)
    rows = {"diff_v1": {"D": {"estimate": 0.3, "ci": [0.2, 0.4]}},  # 1x +0.329, above: survives
            "no_norm": {"D": {"estimate": 0.01, "ci": [-0.02, 0.04]}},  # 1x -0.084, below: vanishes
            "diff_v2": {"D": {"estimate": 0.05, "ci": [0.02, 0.08]}},  # 1x -0.106, below: reverses
            "v2_headwise_norm": {"D": {"estimate": 0.2, "ci": [0.1, 0.3]}}}
    iv = {"n": 5, "method": "paired t, df=4"}
    full = {n: {"lr": 4e-3, "test_loss": [1.0] * 5, "mean": 1.0, "failed": 0, "D": {**r["D"], **iv}}
            for n, r in rows.items()}
    (tmp_path / longer.RESULTS).write_text(json.dumps({"benchmark": "lm_longer", "version": 1, "reference": "r",
                                                       "width": 96, "steps": 600, "rows": full, "timings": {}}))
    table = longer.classing_table(committed, tmp_path)
    assert [line.rsplit("|", 2)[1].strip() for line in table.splitlines()[2:]] == ["survives", "vanishes", "reverses",
                                                                                   "survives"]


def _diagnostics(root: Path) -> Path:
    """ROOT/diags: the V1 diagnostic and the V2 one (arm ``v2_headwise_norm``) as ``--diagnostics`` reads them,
    copied from the runs of the tests above (the V2 one run here where its test did not run first); the V2 one
    without its rounding check, which the mechanism's rounding test asks for first."""
    import shutil
    diags = root / "diags"
    if not (root / "diag-v2" / dg.RESULTS).is_file():
        dg.run_diagnostic(root / "ref", root / "diag-v2", RunOptions(workers=1, progress=False),
                          spec=dg.v2_spec(("v2_headwise_norm",)))
    for name, first in (("v1-diagnostic", root / "diag"), ("v2-diagnostic", root / "diag-v2")):
        if not (diags / name).exists():
            skip = shutil.ignore_patterns("rounding-*", "rounding.json") if name == "v2-diagnostic" else None
            shutil.copytree(first, diags / name, ignore=skip)
    return diags


def test_the_mechanism_arms_at_toy_size(runs, capsys):
    """lm-sweep --mechanism (retrieval/LONGER.md's addition of 2026-12-02 00:04) on the toy reference: each arm's grid
    on every seed, its lr by the sweep's rule, D, C and C' the paired differences against the diagnostics' own runs
    (their baseline rerun, their variant's rerun, the variant's other form at its chosen lr), the V2 rule's reading; a
    second run runs nothing; the rebuild from the journal reads the same; refusals before any OUT."""
    from difftransformer.cli import main
    from difftransformer.lmsweep import mechanism as mech
    root, _ = runs
    diags = _diagnostics(root)
    res = mech.run_mechanism(root / "ref", diags, root / "mech", RunOptions(workers=1, progress=False))
    rows = res["rows"]
    assert set(rows) == set(mech.ARMS) and res["timings"]["jobs_run"] == len(mech.ARMS) * 2 * 2
    v1 = json.loads((diags / "v1-diagnostic" / dg.RESULTS).read_text())["arms"]
    v2 = json.loads((diags / "v2-diagnostic" / dg.RESULTS).read_text())["arms"]
    for arm, (variant, overrides, _, other, diag) in mech.ARMS.items():
        r, ref = rows[arm], (v1 if diag == "v1-diagnostic" else v2)
        assert r["overrides"] == overrides and r["lr"] in TINY.lr_grid and len(r["test_loss"]) == 2
        assert r["D"]["estimate"] - r["C"]["estimate"] == pytest.approx(ref[variant]["D"]["estimate"])
        mean = sum(r["test_loss"]) / 2 - sum(ref[other]["test_loss"]) / 2
        assert r["C2"]["estimate"] == pytest.approx(mean)
        assert r["reading"] in dg.V2_READINGS
    again = mech.run_mechanism(root / "ref", diags, root / "mech", RunOptions(workers=1, progress=False))
    assert again["timings"]["jobs_run"] == 0 and again["rows"] == rows
    back = mech.rebuild(root / "ref", diags, root / "mech")
    assert back["rows"] == rows and back["complete"][0] == back["complete"][1]
    assert "v2_gain" in mech.format_mechanism(res) and "`v1_gain`" in mech.markdown_table(back)
    assert main(["lm-sweep", "--out", str(root / "m2"), "--mechanism", "--reference", str(root / "ref")]) == 2
    assert "--mechanism needs --diagnostics" in capsys.readouterr().err
    assert main(["lm-sweep", "--out", str(root / "m2"), "--mechanism", "--reference", str(root / "ref"),
                 "--diagnostics", str(root)]) == 2
    assert "no finished v1-diagnostic" in capsys.readouterr().err and not (root / "m2").exists()


def test_lm_longer_refuses_a_journal_of_another_shape_before_preparing_tokens(runs, tmp_path):
    """Issue 70 item 8: a journal of another configuration in OUT is refused before the reference's tokens are
    prepared into OUT (no OUT/data left behind)."""
    from difftransformer.lmsweep import longer
    root, _ = runs
    out = tmp_path / "longer"
    out.mkdir()
    (out / longer.JOURNAL).write_text(json.dumps({"journal": {"benchmark": "something else"}}) + "\n")
    with pytest.raises(ValueError, match="holds jobs of another configuration"):
        longer.run_longer(root / "ref", out, RunOptions(workers=1, progress=False))
    assert not (out / "data").exists()


def test_the_mechanism_arms_rounding_check_at_toy_size(runs, capsys):
    """``lm-sweep --mechanism --rounding-check avx2``: the arms at their chosen lrs again under AVX2, read against the
    diagnostics' own AVX2 runs (their rounding checks' journals); refused in one line before any job where a
    diagnostic has no such check; a second call runs nothing."""
    import shutil

    from difftransformer.cli import main
    from difftransformer.lmsweep import diagnostic_rounding as dr
    from difftransformer.lmsweep import mechanism as mech
    from difftransformer.lmsweep import mechanism_rounding as mr
    root, _ = runs
    opts = RunOptions(workers=1, progress=False)
    diags = _diagnostics(root)
    if not (root / "mech" / mech.JOURNAL).is_file():
        mech.run_mechanism(root / "ref", diags, root / "mech", opts)
    argv = ["lm-sweep", "--mechanism", "--rounding-check", "avx2", "--reference", str(root / "ref"),
            "--diagnostics", str(diags), "--out", str(root / "mech"), "--workers", "1", "--no-progress"]
    if not (diags / "v2-diagnostic" / "rounding-avx2").exists():
        assert main(argv) == 2 and "v2-diagnostic has no rounding check under avx2" in capsys.readouterr().err
        assert not (root / "mech" / "rounding-avx2").exists()
    for name, first in (("v1-diagnostic", root / "diag"), ("v2-diagnostic", root / "diag-v2")):
        if (first / "rounding-avx2").is_dir():  # its own test ran that check: the same jobs, their journal copied
            shutil.copytree(first / "rounding-avx2", diags / name / "rounding-avx2", dirs_exist_ok=True)
        dr.rounding_check(root / "ref", diags / name, "avx2", opts)  # reads them: 0 jobs where copied
    assert main(argv) == 0
    check = json.loads((root / "mech" / "rounding.json").read_text())
    assert list(check["rows"]) == list(mech.ARMS) and check["timings"]["jobs_run"] == len(mech.ARMS) * 2
    first = mech.rebuild(root / "ref", diags, root / "mech")["rows"]
    ref = mr.second_runs(root / "ref", diags, "avx2")
    journal = [json.loads(x) for x in (root / "mech" / "rounding-avx2" / mech.JOURNAL).read_text().splitlines()[1:]]
    assert {r["result"]["cpu_capability"] for r in journal} == {"AVX2"}
    for arm, spec in mech.ARMS.items():
        row = check["rows"][arm]
        assert row["first"]["C"] == first[arm]["C"] and row["second"]["lr"] == first[arm]["lr"]
        mine = [r["result"]["test_loss"] for r in sorted(journal, key=lambda r: r["job"][2]) if r["job"][1] == arm]
        theirs = [r["test_loss"] for r in ref[spec.reads][spec.c_name]]
        assert row["second"]["C"]["estimate"] == pytest.approx(sum(mine) / 2 - sum(theirs) / 2)
    assert "language-model mechanism arms" in capsys.readouterr().out
    assert main(argv) == 0 and json.loads((root / "mech" / "rounding.json").read_text())["timings"]["jobs_run"] == 0
