"""The job runner apart from any study (difftransformer.jobs): the journal's one rule for a bad line, the CPU code
paths, the declared order, the options' validation, the local pool's own environment; a failing job (recorded, the
others run, a rerun retries it), a dying worker, the failure hook, the time limit."""

import json
import os

import pytest

from difftransformer.jobs import (
    EXIT_FAILED,
    EXIT_TIME_LIMIT,
    Incomplete,
    JobSpec,
    Journal,
    RunOptions,
    code_path_env,
    in_code_path,
    parse,
    read_journal,
    run_jobs,
)
from difftransformer.jobs.codepath import process_env
from difftransformer.jobs.outcome import FAIL_ENV

JOURNAL = "jobs.jsonl"


def test_journal_drops_a_torn_line_and_refuses_another_configuration(tmp_path):
    path = tmp_path / JOURNAL
    j = Journal(path, {"config": 1})
    j.append("k1", ["baseline", 1, 0.002], {"x": 0.1 + 0.2})
    j.append("k2", ["baseline", 2, 0.002], {"x": 1e-300})
    with open(path, "a") as f:
        f.write('{"key": "k3", "job": ["baseli')  # a kill in the middle of a line
    j2 = Journal(path, {"config": 1})
    assert j2.get("k1") == {"x": 0.1 + 0.2} and j2.get("k2") == {"x": 1e-300} and j2.get("k3") is None
    assert path.read_text().endswith("\n") and path.read_text().count("\n") == 3  # the torn line is gone
    j2.append("k3", ["baseline", 3, 0.002], {"x": 3})
    assert Journal(path, {"config": 1}).get("k3") == {"x": 3}
    with pytest.raises(ValueError, match="another configuration"):
        Journal(path, {"config": 2})
    path.write_text(path.read_text().replace('"k1"', "garbage", 1).replace("{", "[", 2))
    with pytest.raises(ValueError, match=r"another configuration|not a journal record"):
        Journal(path, {"config": 1})


def test_code_paths():
    assert code_path_env("machine") == {}
    assert code_path_env("avx2")["ATEN_CPU_CAPABILITY"] == "avx2" and code_path_env("avx2")["MKL_CBWR"] == "AVX2"
    with pytest.raises(ValueError, match="machine, avx2, avx512"):
        code_path_env("sse")
    assert not in_code_path("avx2") or os.environ.get("MKL_CBWR") == "AVX2"  # this process was not started pinned


def test_a_code_path_this_cpu_lacks_is_refused_before_any_job(tmp_path, monkeypatch):
    """A pin above the CPU's best kernels fails up front with one line, not once per job (exit 3)."""
    import torch

    from difftransformer.jobs import open_executor
    from difftransformer.jobs.codepath import refuse_unsupported_code_path
    clean = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    refuse_unsupported_code_path("avx2", clean)
    refuse_unsupported_code_path("machine", clean)
    with pytest.raises(ValueError, match="--cpu-code-path avx512: this CPU runs at most AVX2 kernels"):
        refuse_unsupported_code_path("avx512", clean)
    refuse_unsupported_code_path("avx512", {**clean, "ATEN_CPU_CAPABILITY": "avx2"})  # started pinned: unknowable
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    with pytest.raises(ValueError, match="--cpu-code-path avx2: this CPU runs at most DEFAULT"):
        open_executor("avx2", RunOptions(workers=2, progress=False))


ORDER: list[str] = []


def _record(name: str) -> dict:
    ORDER.append(name)
    return {"name": name}


def test_a_job_declared_later_runs_before_jobs_queued_behind_a_busy_worker(tmp_path):
    """The scheduler hands a worker one job at a time, so a job the protocol declares once results are in (a
    widened lr, listed first) runs next instead of after everything queued before it."""
    def needed(done):
        return (["a", "w", "b", "c"], True) if "a" in done else (["a", "b", "c"], False)
    ORDER.clear()
    journal = Journal(tmp_path / JOURNAL, {"test": 1})
    spec = JobSpec(needed=needed, run=_record, args=lambda j: (j,), key=lambda j: j, code_path="machine")
    done, ran = run_jobs(spec, journal, RunOptions(workers=1, progress=False))
    assert ORDER == ["a", "w", "b", "c"] and ran == 4 and set(done) == {"a", "w", "b", "c"}


def test_one_rule_for_a_bad_line_everywhere(tmp_path):
    """Every reader (a journal opened to append, a read-only reader, reuse_from) applies parse's rule: a bad last line
    is dropped, a bad line before it is an error naming the line."""
    path = tmp_path / JOURNAL
    j = Journal(path, {"c": 1})
    j.append("k1", [1], {"x": 1})
    j.append("k2", [2], {"x": 2})
    text = path.read_text()
    path.write_text(text + '{"key": 3}\n')  # a whole line, but not a record: the last one, so dropped
    assert set(read_journal(path)[1]) == {"k1", "k2"} and parse(path).dropped
    other = Journal(tmp_path / "other.jsonl", {"c": 2})
    assert other.reuse_from(path) == 2 and other.get("k2") == {"x": 2}
    lines = text.split("\n")
    path.write_text("\n".join([lines[0], "not json", *lines[1:]]))  # a bad line in the middle
    for read in (read_journal, lambda p: Journal(p, {"c": 1}), lambda p: other.reuse_from(p)):
        with pytest.raises(ValueError, match="line 2: not a journal record"):
            read(path)
    (tmp_path / "empty.jsonl").write_text("nothing\n")
    with pytest.raises(ValueError, match="not a job journal"):
        read_journal(tmp_path / "empty.jsonl")


@pytest.mark.parametrize("kw, needle", [(dict(workers=0), "--workers"), (dict(workers=True), "--workers"),
                                        (dict(workers=10 ** 6), "--workers must be an integer from 1 to"),
                                        (dict(executor="slurm"), "--executor"), (dict(device="tpu"), "--device"),
                                        (dict(gpus_per_job=-1, executor="ray"), "--gpus-per-job"),
                                        (dict(gpus_per_job=1.5, executor="ray"), "whole number"),
                                        (dict(cpus_per_job=0, executor="ray"), "both be 0"),
                                        (dict(ray_address="h:1"), "need --executor ray"),
                                        (dict(executor="ray", device="cuda"), "--gpus-per-job > 0")])
def test_run_options_are_validated_once(kw, needle):
    with pytest.raises(ValueError, match=needle):
        RunOptions(**kw)


def _environment(name: str) -> dict:
    return {"value": os.environ.get(name), "pinned": {k: os.environ.get(k) for k in code_path_env("avx2")}}


def test_the_local_pool_gives_workers_their_own_environment_and_leaves_ours(tmp_path):
    """A pinned code path reaches the worker processes as their own environment; this process's os.environ is
    never touched (before, during or after)."""
    before = dict(os.environ)
    env = process_env("avx2", {**os.environ, "MKL_CBWR": "COMPATIBLE"})
    assert env["MKL_CBWR"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert "MKL_CBWR" not in process_env("machine", {"MKL_CBWR": "AVX2", "HOME": "/h"})
    seen = []

    def needed(done):
        seen.append(dict(os.environ))
        return ["PATH"], True
    spec = JobSpec(needed=needed, run=_environment, args=lambda j: (j,), key=lambda j: j, code_path="avx2")
    try:
        done, _ = run_jobs(spec, Journal(tmp_path / JOURNAL, {"t": 1}), RunOptions(workers=1, progress=False))
    except Incomplete as e:  # a CPU without AVX2: the job refuses; the environment still travelled (not here)
        pytest.skip(str(e))
    r = done["PATH"]
    assert r["value"] == os.environ.get("PATH") and r["pinned"] == code_path_env("avx2")
    assert dict(os.environ) == before and all(s == before for s in seen)
    assert json.loads(json.dumps(r)) == r


# ---------------------------------------------------------------------------------------------- failures, time limit
def _square(i: int) -> dict:
    if os.environ.get("TEST_RUNNER_EXIT") == str(i):
        os._exit(9)  # the worker process dies under the job
    return {"sq": i * i}


def _fails_on_three(i: int) -> dict:
    if i == 3:
        raise ValueError(f"job {i} cannot\nsecond line")
    return _square(i)


def _spec(run, n: int = 6, **kw) -> JobSpec:
    return JobSpec(needed=lambda done: (list(range(n)), True), run=run, args=lambda j: (j,), key=lambda j: f"k{j}",
                   **kw)


@pytest.mark.parametrize("workers", [1, 2])  # in this process (Inline), and the local pool's worker processes
def test_a_failing_job_is_recorded_and_the_others_run(tmp_path, workers):
    journal = Journal(tmp_path / JOURNAL, {"t": 1})
    with pytest.raises(Incomplete) as info:
        run_jobs(_spec(_fails_on_three), journal, RunOptions(workers=workers, progress=False))
    e = info.value
    assert e.exit_code == EXIT_FAILED == 3 and len(e.failures) == 1 and e.done == 5 and e.ran == 5
    tb = tmp_path / "failed" / "k3.txt"
    assert str(e) == f"1 of 6 jobs failed; first: 3 [key k3]: ValueError: job 3 cannot (traceback: {tb})"
    text = tb.read_text()
    assert text.startswith("job: 3\nkey: k3\nerror: ValueError: job 3 cannot\n")
    assert "in _fails_on_three" in text and 'raise ValueError(f"job {i} cannot' in text  # the worker's own frame
    assert set(read_journal(tmp_path / JOURNAL)[1]) == {"k0", "k1", "k2", "k4", "k5"}  # the others, journaled
    # the rerun in this process (Inline) whichever executor failed: what it reruns is the runner's, not the pool's
    done, ran = run_jobs(_spec(_square), Journal(tmp_path / JOURNAL, {"t": 1}), RunOptions(workers=1,
                                                                                           progress=False))
    assert ran == 1 and done == {i: {"sq": i * i} for i in range(6)}  # a rerun runs the failed job only
    assert not (tmp_path / "failed").exists()  # and its traceback goes once it succeeds


def test_a_worker_that_dies_fails_its_job_and_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_RUNNER_EXIT", "2")
    with pytest.raises(Incomplete) as info:
        run_jobs(_spec(_square), Journal(tmp_path / JOURNAL, {"t": 1}), RunOptions(workers=2, progress=False))
    f = info.value.failures
    assert [x.label for x in f] == ["2"] and "worker process died (exit code 9)" in f[0].error
    assert len(read_journal(tmp_path / JOURNAL)[1]) == 5


def test_the_injected_failure_hook_names_a_job_by_its_label(tmp_path, monkeypatch):
    monkeypatch.setenv(FAIL_ENV, "b 2")
    spec = JobSpec(needed=lambda done: ([("a", 1), ("b", 2)], True), run=_record, args=lambda j: (j[0],),
                   key=lambda j: j[0])
    with pytest.raises(Incomplete, match=r"1 of 2 jobs failed; first: b 2 \[key b\]: RuntimeError: injected "
                                         r"failure: DIFFTRANSFORMER_FAIL_JOB='b 2'"):
        run_jobs(spec, Journal(tmp_path / JOURNAL, {"t": 1}), RunOptions(workers=1, progress=False))


def _slow(i: int) -> dict:
    import time
    time.sleep(0.05)
    return {"i": i}


def test_the_time_limit_stops_starting_jobs_and_a_rerun_resumes(tmp_path, monkeypatch):
    """No job starts after the limit, the running ones finish and are journaled; the rerun (in this process: no
    worker to start) ends as one run would. The runner's clock is a counter (reading k says k seconds), so however
    slowly the pool's workers start, the limit of 2.5 s lets exactly 3 jobs start: the 4th reading is past it."""
    from difftransformer.jobs import runner
    readings = iter(range(1000))
    monkeypatch.setattr(runner, "time", type("CountingClock", (), {"monotonic": staticmethod(lambda: next(readings))}))
    path = tmp_path / JOURNAL
    with pytest.raises(Incomplete) as info:
        run_jobs(_spec(_slow, 8), Journal(path, {"t": 1}),
                 RunOptions(workers=2, progress=False, time_limit=2.5, start=0.0))
    e = info.value
    assert e.exit_code == EXIT_TIME_LIMIT == 75 and not e.failures and e.done == 3 and e.ran == e.done
    assert str(e).startswith("incomplete: rerun the same command to resume (--time-limit 2.5 s reached: ")
    monkeypatch.undo()
    assert len(read_journal(path)[1]) == e.done and path.read_text().endswith("\n")  # whole: every job it ran
    done, ran = run_jobs(_spec(_slow, 8), Journal(path, {"t": 1}), RunOptions(workers=1, progress=False))
    assert ran == 8 - e.done and done == {i: {"i": i} for i in range(8)}


def test_the_time_limit_counts_from_the_options_start(tmp_path):
    opts = RunOptions(workers=1, progress=False, time_limit=5, start=0.0)  # long past
    with pytest.raises(Incomplete, match=r"0 of 6 jobs done, 0 run now"):
        run_jobs(_spec(_square), Journal(tmp_path / JOURNAL, {"t": 1}), opts)
    assert not (tmp_path / JOURNAL).exists()
    for bad in (0, -1, float("nan"), True, "5"):
        with pytest.raises(ValueError, match="--time-limit must be a number of seconds > 0"):
            RunOptions(time_limit=bad)
