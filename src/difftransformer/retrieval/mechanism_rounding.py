"""The mechanism arms' rounding check (LONGER.md's addition of 17:10; ``retrieval --mechanism --rounding-check
CODE_PATH``): the finished arms' jobs at their chosen 600-step lrs again under another CPU code path, into
OUT/rounding-CODE_PATH (resumable), read against the committed diagnostic's own rounding check under that code path
(its OUT/rounding-CODE_PATH journal: the baseline, the variants and their other forms at their chosen lrs), so both
sides of every D, C and C' round the second way; every reading side by side (``studies.rounding``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from ..eval import stats
from ..jobs import JobSpec, RunOptions, read_journal
from ..rundir.files import ROUNDING_NAME
from ..studies.followup import FollowUp
from ..studies.rounding import compare_readings
from ..studies.schema import validate_readings
from .benchmark_schema import validate_retrieval_arm_run
from .config import RetrievalConfig
from .diagnostic import BASE, _interval, reading
from .diagnostic import JOURNAL as DIAG_JOURNAL
from .longer import first_reading
from .mechanism import ARMS, VERSION, _key, rebuild, run_mechanism_job
from .protocol import Job

STUDY: FollowUp[Job] = FollowUp("retrieval mechanism arms rounding check", "retrieval_mechanism_rounding", VERSION,
                                "mechanism-jobs.jsonl", ROUNDING_NAME, Job, (str, int, float),
                                validate_retrieval_arm_run, validate_readings)
KEEP = ("lr", "D", "C", "reading")  # what a row of the check compares


def diagnostic_second_runs(diag_dir: str | Path, code_path: str) -> dict[Job, dict[str, Any]]:
    """The committed diagnostic's rounding-check runs under ``code_path`` ({job: result}); a ValueError naming
    --reference when it has none (run ``retrieval --diagnostic --rounding-check CODE_PATH`` there first)."""
    first = first_reading(diag_dir)
    path = Path(diag_dir) / f"rounding-{code_path}" / DIAG_JOURNAL
    if not path.is_file():
        raise ValueError(f"--reference {diag_dir}: the diagnostic has no rounding check under {code_path} "
                         f"({path.relative_to(diag_dir)}); the arms are read against its runs")
    header, records = read_journal(path, validate_retrieval_arm_run)
    want = RetrievalConfig.from_dict(first["config"]).replace(cpu_code_path=code_path).to_dict()
    if header.get("config") != want:
        raise ValueError(f"--reference {diag_dir}: its {code_path} rounding check ran another configuration")
    return {Job(str(r["job"][0]), int(r["job"][1]), float(r["job"][2])): r["result"] for r in records.values()}


def rounding_check(diag_dir: str | Path, out_dir: str | Path, code_path: str,
                   options: Optional[RunOptions] = None) -> dict[str, Any]:
    """The finished mechanism arms in ``out_dir`` at their chosen lrs again under ``code_path``; per arm D, C (with
    its reading) under both code paths, each against the diagnostic's runs under the same code path."""
    options = options or RunOptions(workers=2)
    first = first_reading(diag_dir)
    cfg = RetrievalConfig.from_dict(first["config"])
    if code_path == cfg.cpu_code_path:
        raise ValueError(f"--rounding-check {code_path}: the arms already ran that CPU code path; name another")
    one = rebuild(diag_dir, out_dir) if (Path(out_dir) / "mechanism-jobs.jsonl").is_file() else None
    if one is None or one["complete"][0] < one["complete"][1]:
        raise ValueError(f"--out {out_dir}: no finished mechanism arms there; the rounding check reruns a finished "
                         "run, e.g. docs/results/retrieval-mechanism")
    ref = diagnostic_second_runs(diag_dir, code_path)  # before any job
    R, S = first["rows"], cfg.test_seeds
    missing = [n for n in {BASE, *(a.c_name for a in ARMS.values())} if any(
        Job(n, s, float(R[n]["lr"])) not in ref for s in S)]
    if missing:
        raise ValueError(f"--reference {diag_dir}: its {code_path} rounding check lacks {', '.join(sorted(missing))}")
    t0 = time.perf_counter()
    cfg_d, dev = cfg.replace(cpu_code_path=code_path).to_dict(), options.device
    lrs = {a: float(one["rows"][a]["lr"]) for a in ARMS}
    jobs = [Job(a, s, lrs[a]) for a in ARMS for s in S]
    spec: JobSpec[Job] = JobSpec(needed=lambda d: (jobs, True), run=run_mechanism_job,
                                 args=lambda j: (cfg_d, j.variant, j.seed, j.lr, dev), key=_key(cfg_d, dev),
                                 code_path=code_path, desc=f"retrieval mechanism arms rounding check ({code_path})")
    done, ran = STUDY.journaled(spec, Path(out_dir) / f"rounding-{code_path}",
                                STUDY.header(config=cfg_d, scope="chosen"), options)
    P = cfg.primary

    def acc(runs: list[dict[str, Any]]) -> list[float]:
        return [r["conditions"][P]["accuracy"] for r in runs]

    base = acc([ref[Job(BASE, s, float(R[BASE]["lr"]))] for s in S])
    second, equal = {}, {}
    for a, arm in ARMS.items():
        runs = [done[Job(a, s, lrs[a])] for s in S]
        mine, against = acc(runs), acc([ref[Job(arm.c_name, s, float(R[arm.c_name]["lr"]))] for s in S])
        d, c = _interval(base, mine), _interval(against, mine)
        n_q = runs[0]["conditions"][P]["n_queries"]
        above = stats.above_chance(mine, n_q, 1.0 / cfg.n_values)
        gap = _interval(base, against)["estimate"]  # C's name's own D, under this code path too
        second[a] = {"lr": lrs[a], "D": d, "C": c, "reading": reading(d, c, gap, above)}
        equal[a] = [sum(x == y for x, y in zip(one["rows"][a]["accuracy"], mine)), len(mine)]
    check = compare_readings({a: {k: one["rows"][a][k] for k in KEEP} for a in ARMS}, second, equal)
    caps = sorted({str(r.get("cpu_capability")) for r in done.values()})
    check.update(study="retrieval mechanism arms", reference=str(diag_dir),
                 code_paths=[f"{cfg.cpu_code_path} (the first run's)", f"{code_path} ({', '.join(caps)})"],
                 timings={"wall_s": time.perf_counter() - t0, **options.describe(), "jobs": len(done),
                          "jobs_run": ran})
    validate_readings(json.loads(json.dumps(check)), "the mechanism arms' rounding.json (as written)")
    return check
