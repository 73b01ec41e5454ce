"""Measure the job runner's executors on this machine (a script, not a test; BENCHMARKS.md, "Jobs on Ray").

    .venv/bin/python tests/jobs/measure_executors.py            # dispatch cost: trivial jobs, local pool vs Ray
    .venv/bin/python tests/jobs/measure_executors.py --quick    # and `retrieval --quick` both ways, A B A B, and on
                                                                #   a two-node ray.cluster_utils.Cluster

Prints the times and the ratios of the same run, with the load average (other work on the machine shows up in
wall times: compare CPU seconds and the time outside jobs too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from difftransformer.jobs import JobSpec, Journal, RunOptions, open_executor, run_jobs


def noop(i: int) -> dict:
    return {"i": i}


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def dispatch(n: int = 200) -> None:
    from measure_executors import noop as job  # by module name, so that a worker can import it
    res = {}
    for name, opts in (("local", RunOptions(workers=2, progress=False)),
                       ("ray", RunOptions(executor="ray", progress=False))):
        t0 = time.perf_counter()
        ex = open_executor("machine", opts)
        warm = JobSpec(needed=lambda d: ([-1, -2], True), run=job, args=lambda j: (j,), key=str)
        run_jobs(warm, Journal(Path(tempfile.mkdtemp()) / "w.jsonl", {}), opts, ex)  # the workers are up
        t1 = time.perf_counter()
        spec = JobSpec(needed=lambda d: (list(range(n)), True), run=job, args=lambda j: (j,), key=str)
        _, ran = run_jobs(spec, Journal(Path(tempfile.mkdtemp()) / "j.jsonl", {}), opts, ex)
        t2 = time.perf_counter()
        ex.close()
        res[name] = (t1 - t0, (t2 - t1) / ran)
        print(f"{name}: start (open + 2 jobs) {t1 - t0:.2f} s; {ran} trivial jobs at {1000 * res[name][1]:.2f} ms "
              f"each (journal fsync included); load {_load()}")
    print(f"ray / local: start {res['ray'][0] / res['local'][0]:.2f}x, per job {res['ray'][1] / res['local'][1]:.2f}x")


def _summary(path: Path) -> dict:
    r = json.loads((path / "results.json").read_text())
    runs = [x for v in r["variants"].values() for x in v["grid_runs"]]
    t = r["timings"]
    in_jobs = sum(x["train_s"] + x["eval_s"] for x in runs) / 2  # two slots
    return {"wall": t["wall_s"], "jobs": t["jobs"], "cpu": statistics.fmean(x["train_cpu_s"] for x in runs),
            "outside": t["wall_s"] - in_jobs, "load": t["loadavg_before"]}


def quick(out: Path) -> None:
    from difftransformer.cli import main
    from difftransformer.retrieval.benchmark import run_benchmark
    from difftransformer.retrieval.config import quick_config
    rows = {}
    for i in (1, 2):
        for ex in ("local", "ray"):
            d = out / f"{ex}{i}"
            assert main(["retrieval", "--quick", "--no-progress", "--executor", ex, "--out", str(d)]) == 0
            rows[d.name] = _summary(d)
    from ray.cluster_utils import Cluster
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    try:
        run_benchmark(quick_config(), out / "cluster", quick=True,
                      options=RunOptions(executor="ray", ray_address=c.address, progress=False))
    finally:
        c.shutdown()
    rows["cluster"] = _summary(out / "cluster")
    for name, s in rows.items():
        print(f"{name:<8} {s['jobs']} jobs, wall {s['wall']:.1f} s = {60 * s['jobs'] / s['wall']:.2f} jobs/min; "
              f"train CPU {s['cpu']:.2f} s per job; outside jobs {s['outside']:.1f} s; load before {s['load']}")
    for what in ("wall", "outside"):
        lo = statistics.fmean(rows[f"local{i}"][what] for i in (1, 2))
        ra = statistics.fmean(rows[f"ray{i}"][what] for i in (1, 2))
        print(f"mean {what}: local {lo:.1f} s, ray {ra:.1f} s: ray / local {ra / lo:.2f}x")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="also the retrieval benchmark's quick configuration")
    p.add_argument("--out", default=None, help="where the quick runs go (default: a temporary directory)")
    a = p.parse_args()
    dispatch()
    if a.quick:
        quick(Path(a.out or tempfile.mkdtemp()))
