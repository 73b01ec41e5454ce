"""The rounding check's chosen scope (PROTOCOL.md, "Clarifications"): under the other CPU code path only the jobs at
the reference's chosen lrs and the largest width's grid run, decided at the reference's lr choices; a row whose jobs
did not run reads "not run"; the same journal lets a later full check run only the rest."""

import json
from pathlib import Path

import pytest
from test_protocol import CAP, bowl, cfg, run

from difftransformer.eval import stats
from difftransformer.lmsweep.analysis import Job, lr_choice, rounding_jobs
from difftransformer.lmsweep.rounding import JOURNAL, format_partial_rounding, partial_rounding


def _journal(path: Path, c, code_path: str, jobs: dict) -> None:
    path.mkdir()
    lines = [json.dumps({"journal": {"config": {**c.to_dict(), "cpu_code_path": code_path}, "data": "x"}})]
    lines += [json.dumps({"key": str(i), "job": list(j), "result": r}) for i, (j, r) in enumerate(jobs.items())]
    (path / JOURNAL).write_text("\n".join(lines) + "\n")


def _choices(c, done):
    return {w: {v: lr_choice(c, w, v, done, CAP) for v in c.variants} for w in c.widths}


def test_the_chosen_scope_is_the_chosen_lrs_then_the_largest_widths_grid():
    c = cfg(widths=(16, 32, 48), lr_widen=0)
    done = bowl(c, 4e-3)
    for s in c.test_seeds:  # the baseline chooses 8e-3 at d=16
        done[Job(16, "baseline", s, 8e-3)] = run(16, "baseline", s, 8e-3, 1.0)
    jobs = rounding_jobs(c, _choices(c, done))
    chosen = [Job(w, v, s, 8e-3 if (w, v) == (16, "baseline") else 4e-3) for w in (48, 32, 16)
              for v in c.variants for s in c.test_seeds]
    assert jobs[:len(chosen)] == chosen  # the largest width first
    grid = {Job(48, v, s, lr) for v in c.variants for lr in c.lr_grid for s in c.test_seeds}
    assert set(jobs[len(chosen):]) == grid - set(chosen) and len(jobs) == len(set(jobs))


def test_a_chosen_scope_check_judges_every_verdict_at_the_references_lrs(tmp_path):
    c = cfg(widths=(16, 32, 48), lr_widen=0)
    full = bowl(c, 4e-3)
    _journal(tmp_path / "ref", c, "machine", full)
    other = {j: full[j] for j in rounding_jobs(c, _choices(c, full))}
    for s in c.test_seeds:  # the other code path: DIFF ahead at d=48 where the reference has a tie
        j = Job(48, "diff_v1", s, 4e-3)
        other[j] = {**other[j], "test_loss": other[j]["test_loss"] - 0.1 - 0.01 * s}
    _journal(tmp_path / "avx2", c, "avx2", other)
    check = partial_rounding(tmp_path / "ref", tmp_path / "avx2", "chosen")
    assert check["widths"] == [16, 32, 48] and check["not_run"] == 0 and check["lr_choices_differ"] == {}
    rows = {r.endpoint: r for r in check["rows"]}
    assert "(b) Fig. 3a parameter ratio" in rows and "(e) lr robustness, d=48" in rows  # every width: the fit counts
    primary = rows["(a) loss, d=48 (primary)"]
    assert primary.same == "NO" and primary.other_verdict == stats.HELD
    assert check["verdicts_same"] < check["verdicts"] == len(check["rows"])
    assert "reference run's" in format_partial_rounding(check)
    assert partial_rounding(tmp_path / "ref", tmp_path / "avx2")["widths"] == [48]  # "all": only d=48 has its grid


def test_a_chosen_scope_check_cut_short_reads_not_run(tmp_path):
    c = cfg(widths=(16, 32), lr_widen=0)
    full = bowl(c, 4e-3)
    _journal(tmp_path / "ref", c, "machine", full)
    jobs = rounding_jobs(c, _choices(c, full))
    _journal(tmp_path / "avx2", c, "avx2", {j: full[j] for j in jobs[:2 * len(c.variants) * len(c.test_seeds)]})
    check = partial_rounding(tmp_path / "ref", tmp_path / "avx2", "chosen")
    rows = {r.endpoint: r for r in check["rows"]}
    assert check["widths"] == [16, 32] and rows["(e) lr robustness, d=32"].same == "not run"
    assert check["not_run"] == len(c.variants) - 1 and check["verdicts"] == check["verdicts_same"] > 0
    with pytest.raises(ValueError, match="scope must be one of"):
        partial_rounding(tmp_path / "ref", tmp_path / "avx2", "some")


def _sweep(capsys, out: Path, *extra: str) -> tuple[int, str, str]:
    """``difftransformer lm-sweep`` in this process (the CLI's own entry point): (exit status, stdout, stderr).
    One worker: the reference's jobs run inline, a pinned run's in one worker process started with the pinning
    variables (``jobs/codepath.py``: the only way to pin torch's kernels), as with more workers."""
    from difftransformer.cli import main
    args = ["--preset", "tiny", "--widths", "16,32", "--steps", "6", "--warmup-steps", "1", "--batch", "2",
            "--seq-len", "32",
            "--seeds", "2", "--lr-grid", "4e-3,8e-3", "--lr-widen", "0", "--eval-every", "3",
            "--variants", "baseline,diff_v2", "--workers", "1", "--no-progress"]
    capsys.readouterr()
    rc = main(["lm-sweep", *args, *extra, "--out", str(out)])
    o = capsys.readouterr()
    return rc, o.out, o.err


def test_the_chosen_scope_end_to_end_then_the_full_check_from_the_same_journal(tmp_path, capsys, monkeypatch):
    """The three runs in this process, not a ``python -m difftransformer`` each (a start, and each worker's, costs
    about 2 s of CPU); the plots, which nothing here reads, are left out."""
    from difftransformer.lmsweep import sweep
    monkeypatch.setattr(sweep, "plot_all", lambda res, out: [])
    ref, other = tmp_path / "ref", tmp_path / "avx2"
    rc, _, err = _sweep(capsys, ref)
    assert rc == 0, err
    rc, out, err = _sweep(capsys, other, "--cpu-code-path", "avx2", "--rounding-of", str(ref),
                          "--rounding-scope", "chosen")
    assert rc == 0, err
    check = json.loads((other / "rounding.json").read_text())
    n_scoped = len(rounding_jobs(*_ref_choices(ref)))
    assert check["scope"] == "chosen" and check["jobs"][1] == n_scoped < 16 and check["not_run"] == 0
    assert check["widths"] == [16, 32] and "verdicts the same" in out
    rc, out, err = _sweep(capsys, other, "--cpu-code-path", "avx2", "--rounding-of", str(ref))  # the rest only
    assert rc == 0, err
    res = json.loads((other / "sweep.json").read_text())
    assert res["timings"]["jobs"] == 16 and res["timings"]["jobs_run"] == 16 - n_scoped
    journal = [json.loads(x) for x in (other / JOURNAL).read_text().splitlines()[1:]]
    assert {r["result"]["cpu_capability"] for r in journal} == {"AVX2"}  # every job ran pinned, in its worker
    assert "rounding_scope" not in res and "verdicts the same" in out
    rc, _, err = _sweep(capsys, tmp_path / "x", "--rounding-scope", "chosen")
    assert rc == 2 and "goes with --rounding-partial or --rounding-of" in err and "Traceback" not in err


def _ref_choices(ref: Path):
    from difftransformer.lmsweep.config import LMSweepConfig
    from difftransformer.lmsweep.rounding import read_journal, reference_choices
    header, _ = read_journal(ref)
    return LMSweepConfig.from_dict(header["config"]), reference_choices(ref)
