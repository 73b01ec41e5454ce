"""Resuming the benchmark (its journal, run by difftransformer.jobs): a killed benchmark resumes with only its
unfinished jobs and ends with the results of an uninterrupted run; a journal of another configuration is refused.
The journal's own rules are tested in tests/jobs/test_runner.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from suite_helpers import comparable_results

from difftransformer.cli import main
from difftransformer.retrieval.benchmark import JOURNAL, run_benchmark
from difftransformer.retrieval.config import Condition, RetrievalConfig


def tiny(**kw) -> RetrievalConfig:
    d = dict(d_model=16, n_heads=2, n_layers=1, steps=3, batch=4, warmup=1, seeds=2, seed_base=10, eval_contexts=4,
             val_contexts=4, train_pairs=(2, 3), train_context=(4, 8), queries=2, cpu_code_path="machine",
             conditions=(Condition("p3c8", 3, 8), Condition("p3c12", 3, 12)), primary="p3c8", extrapolation="p3c12",
             quant_bits=(4,))
    return RetrievalConfig(**{**d, **kw})

SRC = str(Path(__file__).resolve().parents[2] / "src")
# A small benchmark through the CLI: 2 variants x 2 lrs x 3 seeds = 12 jobs of 20 steps (the default conditions).
ARGS = ["retrieval", "--d-model", "16", "--n-layers", "1", "--steps", "20", "--batch", "4", "--seeds", "3",
        "--seed-base", "50", "--lr-grid", "2e-3,4e-3", "--lr-widen", "0", "--eval-contexts", "4", "--train-pairs",
        "8,10", "--train-context", "40,48", "--queries", "2", "--variants", "baseline,diff_v2", "--cpu-code-path",
        "machine", "--no-progress", "--workers", "2"]


def _cli(out: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "difftransformer", *ARGS, "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def _jobs(path: Path) -> int:
    try:
        return max(0, path.read_text().count("\n") - 1)
    except FileNotFoundError:
        return 0


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, capsys):
    """The CLI on 2 worker processes is killed (SIGKILL, its workers too) once 4 of its 12 jobs are journaled; the
    same command finishes the run in this process (one worker: a pool's numbers, and no process start to pay) and
    equals the uninterrupted run, also made in this process."""
    killed_dir = tmp_path / "killed"
    p = _cli(killed_dir)
    deadline = time.time() + 240
    while _jobs(killed_dir / JOURNAL) < 4 and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, f"the run ended before it could be killed: {p.communicate()}"
    os.killpg(p.pid, signal.SIGKILL)  # the CLI and its workers, mid-job
    p.wait()
    n_before = _jobs(killed_dir / JOURNAL)
    assert 4 <= n_before < 12 and not (killed_dir / "results.json").exists()
    one_worker = [*ARGS, "--workers", "1"]
    assert main([*one_worker, "--out", str(tmp_path / "whole")]) == 0
    capsys.readouterr()
    assert main([*one_worker, "--out", str(killed_dir)]) == 0
    out = capsys.readouterr().out
    a = json.loads((tmp_path / "whole" / "results.json").read_text())
    b = json.loads((killed_dir / "results.json").read_text())
    assert b["timings"]["jobs"] == 12 and b["timings"]["jobs_run"] == 12 - n_before  # only the unfinished ran
    assert comparable_results(a) == comparable_results(b)
    assert "2 run now" not in out and f"{12 - n_before} run now" in out


def test_resume_in_process_reads_every_job_back(tmp_path):
    cfg = tiny(variants=("baseline", "diff_v1"), lr_grid=(2e-3, 4e-3), lr_widen=0, seeds=2)
    a = run_benchmark(cfg, tmp_path, workers=1, progress=False)
    b = run_benchmark(cfg, tmp_path, workers=1, progress=False)
    assert b["timings"]["jobs_run"] == 0 and a["timings"]["jobs_run"] == a["timings"]["jobs"] == 8
    assert comparable_results(a) == comparable_results(b)
    with pytest.raises(ValueError, match="another configuration"):
        run_benchmark(cfg.replace(steps=4), tmp_path, workers=1, progress=False)
