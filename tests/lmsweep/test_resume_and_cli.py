"""The language-model sweep end to end through its CLI: a sweep killed mid-run (SIGKILL, workers included), one
stopped by --time-limit and one with a failing job each end, rerun, with the results of an uninterrupted one (the
rerun runs only the unfinished or failed jobs); a failed job and the time limit are one line and an exit code of
their own; bad input is one error line. One uninterrupted sweep (in this process) serves every comparison, and its
prepared tokens every other run; the killed sweep uses 2 worker processes, every other run one worker in this
process (the numbers do not depend on it, and no process start is paid; a failing job in a worker process is
tests/jobs/test_runner.py's)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from difftransformer.cli import main
from difftransformer.jobs import EXIT_FAILED, EXIT_TIME_LIMIT
from difftransformer.jobs.outcome import FAIL_ENV
from difftransformer.lmsweep.sweep import JOURNAL
from difftransformer.rundir import SWEEP_RESULTS_NAME as RESULTS

SRC = str(Path(__file__).resolve().parents[2] / "src")
# 2 widths x 2 variants x 2 lrs x 2 seeds = 16 jobs of 10 steps on the tiny preset's tokens
ARGS = ["lm-sweep", "--preset", "tiny", "--widths", "16,32", "--steps", "10", "--warmup-steps", "2", "--batch", "4",
        "--seq-len", "32", "--seeds", "2", "--seed-base", "7", "--lr-grid", "4e-3,8e-3", "--lr-widen", "0",
        "--eval-every", "5", "--variants", "baseline,diff_v2", "--no-progress", "--workers", "2"]
JOBS = 16


def _cli(out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "difftransformer", *ARGS, *extra, "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _jobs(path: Path) -> int:
    try:
        return max(0, path.read_text().count("\n") - 1)
    except FileNotFoundError:
        return 0


def _comparable(res: dict) -> dict:
    r = json.loads(json.dumps(res))
    r.pop("timings")
    return r


def _results(out: Path) -> dict:
    return json.loads((out / RESULTS).read_text())


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The uninterrupted sweep, run once for the module (its jobs in this process: the numbers of the worker
    processes the other runs use)."""
    out = tmp_path_factory.mktemp("whole")
    assert main([*ARGS, "--workers", "1", "--out", str(out)]) == 0
    return out


def _with_tokens(whole: Path, out: Path) -> Path:
    """``out`` holding the whole run's prepared tokens (reused: the same preset and window)."""
    shutil.copytree(whole / "data", out / "data")
    return out


def test_sigkill_then_resume_equals_an_uninterrupted_sweep(whole, tmp_path, capsys):
    killed = _with_tokens(whole, tmp_path / "killed")
    p = _cli(killed)
    deadline = time.time() + 300
    while _jobs(killed / JOURNAL) < 3 and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, f"the sweep ended before it could be killed: {p.communicate()}"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    n_before = _jobs(killed / JOURNAL)
    assert 3 <= n_before < JOBS and not (killed / RESULTS).exists()
    capsys.readouterr()
    assert main([*ARGS, "--workers", "1", "--out", str(killed)]) == 0  # the rest in this process
    out = capsys.readouterr().out
    b = _results(killed)
    assert b["timings"]["jobs"] == JOBS and b["timings"]["jobs_run"] == JOBS - n_before
    assert _comparable(_results(whole)) == _comparable(b)
    assert "(d) top |attention logit| ratio" in out and "Fig. 3a parameter ratio" in out
    for name in ("lm-sweep-params.png", "lm-sweep-tokens.png", "lm-sweep-lr.png"):
        assert (killed / name).stat().st_size > 1000


INCOMPLETE = re.compile(r"difftransformer lm-sweep: incomplete: rerun the same command to resume \(--time-limit 4 s "
                        r"reached: (\d+) of 16\+? jobs done, (\d+) run now\)")


class _SlowClock:
    """The runner's clock, 1.5 s later at every reading than the last: the 4 s limit passes after a few job starts
    whatever this machine's speed (an idle machine ran all 16 tiny jobs inside 4 real seconds)."""

    def __init__(self) -> None:
        self.readings = 0

    def monotonic(self) -> float:
        self.readings += 1
        return time.monotonic() + 1.5 * self.readings


def test_a_sweep_stopped_by_the_time_limit_and_rerun_equals_an_uninterrupted_one(whole, tmp_path, capsys,
                                                                                monkeypatch):
    """The same command, --time-limit 4 included, run until it ends with 0: every run before that stops with exit
    code 75 and its one line, having journaled every job it started; the last run's results are the uninterrupted
    sweep's. One worker, in this process (no process start to wait for): a job starts, and runs to its end, only
    before the limit. The runner reads a clock that runs fast (``_SlowClock``), so the limit stops the sweep on any
    machine."""
    from difftransformer.jobs import runner
    clock = _SlowClock()
    monkeypatch.setattr(runner, "time", type("FastTime", (), {"monotonic": staticmethod(clock.monotonic)}))
    out = _with_tokens(whole, tmp_path / "limited")
    command = [*ARGS, "--workers", "1", "--time-limit", "4", "--out", str(out)]
    stops = []
    for _ in range(JOBS):  # each run starts a job before its limit
        capsys.readouterr()
        clock.readings = 0  # each run's clock starts at its own start
        rc = main(command)
        if rc == 0:
            break
        err = capsys.readouterr().err.strip().splitlines()
        m = INCOMPLETE.fullmatch(err[-1])
        assert rc == EXIT_TIME_LIMIT and m, (rc, err)
        done, ran = int(m.group(1)), int(m.group(2))
        assert done == _jobs(out / JOURNAL) < JOBS and ran >= 1 and not (out / RESULTS).exists()
        stops.append(done)
    assert rc == 0 and stops, "the limit never stopped the sweep: nothing was shown"
    res = _results(out)
    assert res["timings"]["jobs_run"] == JOBS - stops[-1]
    assert _comparable(_results(whole)) == _comparable(res)
    print(f"--time-limit 4: stopped with {stops} jobs journaled, then finished")


def test_a_failing_job_is_reported_the_others_run_and_a_rerun_runs_it(whole, tmp_path, capsys, monkeypatch):
    out = _with_tokens(whole, tmp_path / "failing")
    monkeypatch.setenv(FAIL_ENV, "32 diff_v2 8 0.008")  # that job raises in its worker (jobs.outcome)
    capsys.readouterr()
    assert main([*ARGS, "--workers", "1", "--out", str(out)]) == EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    m = re.fullmatch(r"difftransformer lm-sweep: 1 of 16\+? jobs failed; first: 32 diff_v2 8 0\.008 \[key "
                     r"([0-9a-f]{12})\]: RuntimeError: injected failure: DIFFTRANSFORMER_FAIL_JOB='32 diff_v2 8 "
                     r"0\.008' \(traceback: (.+)\)", err[-1])
    assert m, err
    trace = Path(m.group(2))
    assert trace.parent == out / "failed" and trace.name.startswith(m.group(1))
    text = trace.read_text()
    assert text.startswith("job: 32 diff_v2 8 0.008\nkey: ") and "Traceback (most recent call last)" in text
    assert "in injected_failure" in text and f"jobs{os.sep}local.py" in text  # the worker's own frames (local.call)
    assert _jobs(out / JOURNAL) == JOBS - 1 and not (out / RESULTS).exists()  # the others ran; no verdicts
    monkeypatch.delenv(FAIL_ENV)
    assert main([*ARGS, "--workers", "1", "--out", str(out)]) == 0
    assert f"{JOBS} jobs (1 run now)" in capsys.readouterr().out and not trace.exists()
    assert _comparable(_results(whole)) == _comparable(_results(out))


def test_a_journal_of_another_configuration_is_refused(whole, tmp_path, assert_cli_error):
    out = _with_tokens(whole, tmp_path)
    (out / JOURNAL).write_text(json.dumps({"journal": {"benchmark": "something else"}}) + "\n")
    assert_cli_error([*ARGS, "--out", str(out)], "another configuration")


@pytest.mark.parametrize("extra, needle", [(["--widths", "32"], "at least two distinct"),
                                           (["--widths", "30,32"], "divisible"), (["--lr-grid", "x"], "--lr-grid"),
                                           (["--variants", "baseline"], "reference"), (["--n-heads", "3"], "n_heads"),
                                           (["--workers", "0"], "--workers"), (["--time-limit", "0"], "--time-limit")])
def test_bad_flags_are_one_error_line(tmp_path, assert_cli_error, extra, needle):
    assert_cli_error([*ARGS, *extra, "--out", str(tmp_path / "bad")], needle)
    assert not (tmp_path / "bad").exists()


def test_a_window_the_data_cannot_hold_is_refused_before_any_job(tmp_path, assert_cli_error):
    """Issue 57: --seq-len longer than the validation split holds twice failed every job alike ("16 of 16 jobs
    failed", exit 3); it is one line and exit code 2 once the tokens are prepared, before the first job."""
    out = tmp_path / "long"
    assert_cli_error([*ARGS, "--seq-len", "3000", "--out", str(out)], "--seq-len 3000",
                     "holds fewer than two windows of 3000 tokens")
    assert not (out / JOURNAL).exists() and not (out / "failed").exists()


def test_a_protocol_version_1_journal_is_refused_in_one_line(tmp_path, assert_cli_error):
    header = {"benchmark": "language-model sweep", "protocol_version": 1, "config": {}, "data": "x"}
    (tmp_path / JOURNAL).write_text(json.dumps({"journal": header}) + "\n")
    assert_cli_error([*ARGS, "--out", str(tmp_path)], "protocol version 1 journal")


def test_the_gpu_scale_runs_end_to_end_on_the_cpu_at_toy_size(whole, tmp_path, capsys):
    # the gpu scale's code path (its config, its journal, its verdicts) with shrunk flags, on the CPU
    args = ["--scale", "gpu", "--preset", "tiny", "--widths", "16,32", "--steps", "6", "--warmup-steps", "1",
            "--batch", "2", "--seq-len", "32", "--seeds", "2", "--lr-grid", "4e-3,8e-3", "--lr-widen", "0",
            "--eval-every", "3", "--variants", "baseline,diff_v2", "--device", "cpu", "--workers", "1",
            "--no-progress"]
    out = _with_tokens(whole, tmp_path / "gpu")
    capsys.readouterr()
    assert main(["lm-sweep", *args, "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    res = _results(out)
    assert res["protocol_version"] == 2 and res["config"]["scale"] == "gpu" and res["config"]["n_heads"] == 4
    assert res["config"]["outlier_windows"] == 8 and res["timings"]["jobs"] == 16  # the gpu scale's own defaults
    assert "param_ratio" in res["applicability"]  # (3b's premise only where the largest width's runs pass the floor)
    assert "Fig. 3a premise" in stdout and "unresolved edge" in stdout  # lr_widen 0: every edge choice


def test_a_diagnostic_refused_after_preparing_leaves_no_out(tmp_path, capsys, monkeypatch):
    """--diagnostic's refusals remove the OUT they made: one line, exit 2, no directory (issue 66 item 7). A reference
    whose data fingerprint is not this preset's tokens' is refused before the tokens are made; a refusal that comes
    after they are in OUT (the windows they cannot hold, ``sweep.prepare``'s: here one injected there) removes them."""
    from difftransformer.cli import main as cli_main
    from difftransformer.lmsweep import sweep
    src = Path(__file__).resolve().parents[2] / "docs" / "results" / "lm-sweep-v2"
    ref = tmp_path / "ref"
    ref.mkdir()
    lines = (src / "lm-jobs.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["journal"]["data"] = "0" * 16
    (ref / "lm-jobs.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    (ref / "sweep.json").write_text((src / "sweep.json").read_text())
    out = tmp_path / "out"
    argv = ["lm-sweep", "--diagnostic", "v1", "--reference", str(ref), "--out", str(out), "--workers", "1",
            "--no-progress"]
    made = []
    real_prepare = sweep.prepare
    monkeypatch.setattr(sweep, "prepare", lambda *a: made.append(a) or real_prepare(*a))
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data fingerprint" in err[0]
    assert not out.exists() and made == []  # refused before any token was made

    def tokens_then_refusal(cfg, where, progress):
        (where / "data").mkdir(parents=True)
        (where / "data" / "train.bin").write_bytes(b"\0" * 64)
        raise ValueError("--seq-len 4096: the tokens hold no such window (injected)")
    monkeypatch.setattr(sweep, "prepare", tokens_then_refusal)
    (ref / "lm-jobs.jsonl").write_text((src / "lm-jobs.jsonl").read_text())  # the reference's own fingerprint
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "injected" in err[0]
    assert not out.exists()
