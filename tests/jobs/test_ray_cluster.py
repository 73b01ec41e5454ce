"""The Ray executor on a real two-node cluster on this machine (``ray.cluster_utils.Cluster``, the way Ray tests
itself; one cluster for the module, dashboards off, token authentication on as docs/cluster.md sets it up): the
results equal the local executor's bitwise, a job that fails is recorded while the others finish and a rerun (in
this process) runs it alone, a node removed mid-run still ends equal, a driver killed with SIGKILL and rerun on the
cluster runs only the unfinished jobs, and the refusals (a driver without the cluster's token among them) are one
error line before any job. Each command that joins the cluster pays for new Ray worker processes (each loads torch),
so the reference runs and the reruns that need no cluster run in this process."""

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

ray = pytest.importorskip("ray")
from ray._private.authentication_test_utils import AuthenticationEnvSnapshot, reset_auth_token_state  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from suite_helpers import comparable_results  # noqa: E402

from difftransformer.cli import main  # noqa: E402
from difftransformer.jobs import EXIT_FAILED, RunOptions  # noqa: E402
from difftransformer.jobs.outcome import FAIL_ENV  # noqa: E402
from difftransformer.retrieval.benchmark import JOURNAL, run_benchmark  # noqa: E402
from difftransformer.retrieval.config import Condition, RetrievalConfig  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")


def tiny(**kw) -> RetrievalConfig:
    d = dict(d_model=16, n_heads=2, n_layers=1, steps=3, batch=4, warmup=1, seeds=2, seed_base=10, eval_contexts=4,
             val_contexts=4, train_pairs=(2, 3), train_context=(4, 8), queries=2, cpu_code_path="machine",
             lr_grid=(2e-3, 4e-3), lr_widen=0, variants=("baseline", "diff_v2"), quant_bits=(4,),
             conditions=(Condition("p3c8", 3, 8), Condition("p3c12", 3, 12)), primary="p3c8", extrapolation="p3c12")
    return RetrievalConfig(**{**d, **kw})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head and a worker node of one CPU each: two job slots, on two raylets. Token authentication is on as
    docs/cluster.md sets it up: RAY_AUTH_MODE=token and the token in the environment of every node and of the
    driver (this process, and the CLI processes it starts). Two drivers without the token start at once and are
    checked by the last test (Ray retries a refused connection for about 20 s; the other tests overlap that)."""
    before = AuthenticationEnvSnapshot.capture()
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    reset_auth_token_state()  # Ray caches the mode and the token per process
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
        tmp = tmp_path_factory.mktemp("no-token")
        bare = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(tmp)}
        c.refused = {"no auth": _cli(tmp / "a", "--executor", "ray", "--ray-address", c.address, env=bare),
                     "no token": _cli(tmp / "b", "--executor", "ray", "--ray-address", c.address,
                                      env={**bare, "RAY_AUTH_MODE": "token"})}
        yield c
    finally:
        for p in getattr(c, "refused", {}).values():
            p.kill()
            p.communicate()
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()
        before.restore()
        reset_auth_token_state()


def ray_options(cluster, **kw) -> RunOptions:
    return RunOptions(executor="ray", ray_address=cluster.address, progress=False, **kw)


def test_results_equal_the_local_executors_bitwise(cluster, tmp_path):
    cfg = tiny()
    local = run_benchmark(cfg, tmp_path / "local", workers=1, progress=False)  # in this process: a pool's numbers
    t0 = time.perf_counter()
    on_ray = run_benchmark(cfg, tmp_path / "ray", options=ray_options(cluster))
    print(f"two-node cluster: {on_ray['timings']['jobs']} jobs in {time.perf_counter() - t0:.1f} s")
    assert on_ray["timings"]["executor"] == "ray" and on_ray["timings"]["jobs_run"] == 8
    assert comparable_results(local) == comparable_results(on_ray)
    assert not ray.is_initialized()  # the command joined the cluster and left it
    moved = run_benchmark(cfg, tmp_path / "ray", workers=2, progress=False)  # the cluster's journal, read locally
    assert moved["timings"]["jobs_run"] == 0 and comparable_results(moved) == comparable_results(local)


def test_a_language_model_sweep_on_the_cluster_equals_the_local_one(cluster, tmp_path):
    from difftransformer.lmsweep.config import LMSweepConfig
    from difftransformer.lmsweep.sweep import run_lm_sweep
    cfg = LMSweepConfig(preset="tiny", widths=(16, 32), steps=6, warmup_steps=1, batch=2, seq_len=32, seeds=2,
                        seed_base=7, lr_grid=(4e-3, 8e-3), lr_widen=0, eval_every=3, variants=("baseline", "diff_v2"),
                        outlier_windows=1)
    a = run_lm_sweep(cfg, tmp_path / "local", workers=1, progress=False)  # in this process: a pool's numbers
    shutil.copytree(tmp_path / "local" / "data", tmp_path / "ray" / "data")  # the same tokens, not prepared twice
    b = run_lm_sweep(cfg, tmp_path / "ray", options=ray_options(cluster))
    strip = lambda r: {k: v for k, v in r.items() if k != "timings"}  # noqa: E731
    assert b["timings"]["jobs_run"] == 16 and strip(a) == strip(b)


def test_a_node_removed_mid_run_still_ends_equal(cluster, tmp_path):
    """A third node joins, takes jobs, and is killed while it runs one: Ray retries its jobs on the other two."""
    cfg = tiny(steps=30, seeds=3)
    extra = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=run_benchmark(cfg, tmp_path / "ray",
                                                                    options=ray_options(cluster))))
    t.start()
    deadline = time.time() + 120
    while not (tmp_path / "ray" / JOURNAL).is_file() or (tmp_path / "ray" / JOURNAL).read_text().count("\n") < 2:
        assert time.time() < deadline and t.is_alive(), "no job finished on the three-node cluster"
        time.sleep(0.05)
    cluster.remove_node(extra, allow_graceful=False)
    t.join(timeout=300)
    assert "r" in out, "the run did not end after the node was removed"
    local = run_benchmark(cfg, None, workers=1, progress=False)  # in this process: the same numbers as a pool's
    assert out["r"]["timings"]["jobs_run"] == 12 and comparable_results(out["r"]) == comparable_results(local)


ARGS = ["retrieval", "--d-model", "16", "--n-layers", "1", "--steps", "20", "--batch", "4", "--seeds", "3",
        "--seed-base", "50", "--lr-grid", "2e-3,4e-3", "--lr-widen", "0", "--eval-contexts", "4", "--train-pairs",
        "8,10", "--train-context", "40,48", "--queries", "2", "--variants", "baseline,diff_v2", "--cpu-code-path",
        "machine", "--no-progress"]  # 12 jobs


def _cli(out: Path, *extra: str, env: Optional[dict] = None) -> subprocess.Popen:
    env = {**(os.environ if env is None else env), "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "difftransformer", *ARGS, *extra, "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> dict:
    """ARGS run whole on the local executor (in this process's CLI), for the Ray runs to equal."""
    out = tmp_path_factory.mktemp("whole")
    assert main([*ARGS, "--workers", "1", "--out", str(out)]) == 0  # its jobs in this process: a pool's numbers
    return json.loads((out / "results.json").read_text())


def test_a_failing_job_is_recorded_the_others_finish_and_a_rerun_runs_it(cluster, whole, tmp_path, capsys,
                                                                        monkeypatch):
    out, ray_flags = tmp_path / "failing", ("--executor", "ray", "--ray-address", cluster.address)
    monkeypatch.setenv(FAIL_ENV, "diff_v2 51 0.004")  # that job raises in its worker (jobs.outcome)
    capsys.readouterr()
    assert main([*ARGS, *ray_flags, "--out", str(out)]) == EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    m = re.fullmatch(r"difftransformer retrieval: 1 of 12\+? jobs failed; first: diff_v2 51 0\.004 \[key "
                     r"[0-9a-f]{12}\]: RuntimeError: injected failure: DIFFTRANSFORMER_FAIL_JOB='diff_v2 51 0\.004' "
                     r"\(traceback: (.+)\)", err[-1])
    assert m, err
    trace = Path(m.group(1)).read_text()
    assert trace.startswith("job: diff_v2 51 0.004\nkey: ") and "Traceback (most recent call last)" in trace
    assert "in injected_failure" in trace and f"jobs{os.sep}local.py" in trace  # the frames of the Ray worker
    assert (out / JOURNAL).read_text().count("\n") == 1 + 11 and not (out / "results.json").exists()
    monkeypatch.delenv(FAIL_ENV)
    # the rerun in this process, on the local executor: what a rerun runs is the runner's (the journal and failed/,
    # whichever executor wrote them), and a rerun on the cluster is test_a_driver_killed_and_rerun_...'s
    assert main([*ARGS, "--workers", "1", "--out", str(out)]) == 0
    assert "(1 run now," in capsys.readouterr().out and not (out / "failed").exists()
    assert comparable_results(json.loads((out / "results.json").read_text())) == comparable_results(whole)


def test_a_driver_killed_and_rerun_runs_only_the_unfinished_jobs(cluster, whole, tmp_path, capsys):
    """The driver (the CLI, in a process of its own) is killed with SIGKILL mid-run; the same command, rerun in this
    process on the cluster, runs only the jobs its journal lacks."""
    killed = tmp_path / "killed"
    ray_flags = ("--executor", "ray", "--ray-address", cluster.address)
    p = _cli(killed, *ray_flags)
    deadline = time.time() + 240
    while (not (killed / JOURNAL).is_file() or (killed / JOURNAL).read_text().count("\n") < 3) \
            and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, f"the run ended before it could be killed: {p.communicate()}"
    os.killpg(p.pid, signal.SIGKILL)  # the driver; its tasks on the cluster die with their owner
    p.wait()
    n_before = (killed / JOURNAL).read_text().count("\n") - 1
    assert 2 <= n_before < 12 and not (killed / "results.json").exists()
    capsys.readouterr()
    assert main([*ARGS, *ray_flags, "--out", str(killed)]) == 0
    out = capsys.readouterr().out
    b = json.loads((killed / "results.json").read_text())
    assert b["timings"]["jobs_run"] == 12 - n_before and comparable_results(whole) == comparable_results(b)
    assert f"{12 - n_before} run now" in out and "Ray (" in out


def _one_error_line(capsys, tmp_path, *flags) -> str:
    rc = main([*ARGS, "--out", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert not (tmp_path / "o").exists()  # refused before any job: nothing written
    return err[0]


def test_refusals_are_one_line_before_any_job(cluster, tmp_path, capsys, monkeypatch):
    t0 = time.perf_counter()
    line = _one_error_line(capsys, tmp_path, "--executor", "ray", "--ray-address", "127.0.0.1:9")
    assert "nothing answers at 127.0.0.1:9" in line and time.perf_counter() - t0 < 30
    line = _one_error_line(capsys, tmp_path, "--executor", "ray", "--ray-address", cluster.address,
                           "--gpus-per-job", "0.5")
    assert "no node of the cluster offers one job's 1 CPU and 0.5 GPU" in line and not ray.is_initialized()
    line = _one_error_line(capsys, tmp_path, "--executor", "ray", "--ray-address", cluster.address,
                           "--cpus-per-job", "2")
    assert "no node of the cluster offers" in line
    line = _one_error_line(capsys, tmp_path, "--ray-address", cluster.address)
    assert "need --executor ray" in line
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    line = _one_error_line(capsys, tmp_path, "--executor", "ray")
    assert "pip install 'difftransformer[ray]'" in line


@pytest.mark.parametrize("driver, needle", [("no auth", "Failed to connect to Ray cluster"),
                                            ("no token", "no authentication token was found")])
def test_a_driver_without_the_token_is_refused_in_one_line(cluster, driver, needle):
    """The cluster runs with token authentication: a driver without the token (RAY_AUTH_MODE unset: the cluster
    refuses it; RAY_AUTH_MODE=token: it finds no token to send) ends with one error line, exit code 2, nothing
    written (before it, Ray's own C++ client may log its retries)."""
    p = cluster.refused[driver]
    _, err = p.communicate(timeout=300)
    last = err.strip().splitlines()[-1]
    assert p.returncode == 2 and "Traceback" not in err, err
    assert last.startswith("difftransformer retrieval: error: --executor ray: could not join the Ray cluster at ")
    assert needle in last and "token authentication" in last
    assert not Path(p.args[-1]).exists()
