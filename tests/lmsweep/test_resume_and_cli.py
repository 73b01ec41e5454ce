"""The language-model sweep end to end through its CLI: a sweep killed mid-run (SIGKILL, workers included) resumes
with only its unfinished jobs and ends with the results of an uninterrupted one; bad input is one error line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from difftransformer.lmsweep.sweep import JOURNAL
from difftransformer.rundir import SWEEP_RESULTS_NAME as RESULTS

SRC = str(Path(__file__).resolve().parents[2] / "src")
# 2 widths x 2 variants x 2 lrs x 2 seeds = 16 jobs of 20 steps on the demo preset's tokens
ARGS = ["lm-sweep", "--widths", "16,32", "--steps", "20", "--warmup-steps", "2", "--batch", "4", "--seq-len", "32",
        "--seeds", "2", "--seed-base", "7", "--lr-grid", "4e-3,8e-3", "--lr-widen", "0", "--eval-every", "5",
        "--variants", "baseline,diff_v2", "--no-progress", "--workers", "2"]
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


def test_sigkill_then_resume_equals_an_uninterrupted_sweep(tmp_path):
    whole = _cli(tmp_path / "whole")
    killed = tmp_path / "killed"
    p = _cli(killed)
    deadline = time.time() + 300
    while _jobs(killed / JOURNAL) < 3 and p.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert p.poll() is None, f"the sweep ended before it could be killed: {p.communicate()}"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    n_before = _jobs(killed / JOURNAL)
    assert 3 <= n_before < JOBS and not (killed / RESULTS).exists()
    again = _cli(killed)
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert whole.wait(timeout=600) == 0, whole.communicate()[1]
    a = json.loads((tmp_path / "whole" / RESULTS).read_text())
    b = json.loads((killed / RESULTS).read_text())
    assert b["timings"]["jobs"] == JOBS and b["timings"]["jobs_run"] == JOBS - n_before
    assert _comparable(a) == _comparable(b)
    assert "(d) top |attention logit| ratio" in out and "Fig. 3a parameter ratio" in out
    for name in ("lm-sweep-params.png", "lm-sweep-tokens.png", "lm-sweep-lr.png"):
        assert (killed / name).stat().st_size > 1000


def test_a_journal_of_another_configuration_is_refused(tmp_path):
    (tmp_path / JOURNAL).write_text(json.dumps({"journal": {"benchmark": "something else"}}) + "\n")
    p = _cli(tmp_path)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 2 and "another configuration" in err and "Traceback" not in err


def test_bad_flags_are_one_error_line(tmp_path):
    for extra, needle in ((["--widths", "32"], "at least two distinct"), (["--widths", "30,32"], "divisible"),
                          (["--lr-grid", "x"], "--lr-grid"), (["--variants", "baseline"], "reference"),
                          (["--n-heads", "3"], "n_heads"), (["--workers", "0"], "--workers")):
        p = _cli(tmp_path / "bad", *extra)
        _, err = p.communicate(timeout=120)
        assert p.returncode == 2, (extra, err)
        assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (extra, err)


def test_a_protocol_version_1_journal_is_refused_in_one_line(tmp_path):
    header = {"benchmark": "language-model sweep", "protocol_version": 1, "config": {}, "data": "x"}
    (tmp_path / JOURNAL).write_text(json.dumps({"journal": header}) + "\n")
    p = _cli(tmp_path)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 2 and "protocol version 1 journal" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


def test_the_gpu_scale_runs_end_to_end_on_the_cpu_at_toy_size(tmp_path):
    # the gpu scale's code path (its config, its journal, its verdicts) with shrunk flags, on the CPU
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = ["--scale", "gpu", "--widths", "16,32", "--steps", "6", "--warmup-steps", "1", "--batch", "2",
            "--seq-len", "32", "--seeds", "2", "--lr-grid", "4e-3,8e-3", "--lr-widen", "0", "--eval-every", "3",
            "--variants", "baseline,diff_v2", "--device", "cpu", "--workers", "1", "--no-progress"]
    p = subprocess.run([sys.executable, "-m", "difftransformer", "lm-sweep", *args, "--out", str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    res = json.loads((tmp_path / RESULTS).read_text())
    assert res["protocol_version"] == 2 and res["config"]["scale"] == "gpu" and res["config"]["n_heads"] == 4
    assert res["config"]["outlier_windows"] == 8 and res["timings"]["jobs"] == 16  # the gpu scale's own defaults
    assert "param_ratio" in res["applicability"]  # (3b's premise only where the largest width's runs pass the floor)
    assert "Fig. 3a premise" in p.stdout and "unresolved edge" in p.stdout  # lr_widen 0: every edge choice
