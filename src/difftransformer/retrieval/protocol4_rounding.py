"""Protocol version 4's rounding check (PROTOCOL4.md "Reproducibility and rounding"; ``retrieval --protocol 4
--rounding-check CODE_PATH --out DIR``): the finished protocol's test jobs (every name at 600 steps at its speed lr,
and at L at its capability lr) again under another CPU code path, into OUT/rounding-CODE_PATH (resumable), and both
endpoints read again from them with the protocol's own rules, side by side with the first reading
(``studies.rounding``). The lr choices and L are not replayed (the validation jobs are not rerun).

Version 4's jobs ran on the "machine" code path of more than one machine: each journal record names the kernels it
ran (``cpu_capability``, AVX512 or AVX2). A test job that ran under the kernels ``CODE_PATH`` pins is not rerun: on
an AVX2 machine the machine path and the pinned AVX2 path gave the same bits (one 600-step test job, 2026-12-02), so
such a pair carries no rounding. Its first result stands in the second reading, and the check says, per endpoint,
how many pairs it reran under the other kernel family (the rounding check proper) and how many it could not; a
check under the other code path (``avx512`` on an AVX-512 machine) reruns those.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from ..jobs import JobSpec, RunOptions
from ..jobs.codepath import kernels_of
from ..rundir.files import ROUNDING_NAME
from ..studies.followup import FollowUp
from ..studies.rounding import compare_readings
from .diagnostic import STARTED
from .protocol4 import (
    JOURNAL,
    VERSION,
    Plan,
    V4Job,
    assess,
    key_of,
    needed,
    read_capability,
    read_speed,
    run_v4_job,
)
from .protocol4 import STUDY as RUN
from .schema import validate_protocol4_rounding, validate_v4_run

ROUNDING = "rounding-{code_path}"  # the check's OUT, inside the protocol's


class NotFinished(ValueError):
    """The protocol in OUT has not run all the jobs it asks: there is nothing to check yet."""


STUDY: FollowUp[V4Job] = FollowUp("retrieval protocol 4 rounding check", "retrieval_protocol4_rounding", VERSION,
                                  JOURNAL, ROUNDING_NAME, V4Job, (str, int, int, float), validate_v4_run,
                                  validate_protocol4_rounding)


def tested_jobs(plan: Plan, one: dict[str, Any]) -> dict[str, list[V4Job]]:
    """The test jobs each endpoint of the reading ``one`` (``assess``) reads, at its lrs and L ({"speed": ...,
    "capability": ...}; capability empty where it is not read)."""
    L: int = one["length"]["L"] if one["length"] else 0  # unused where capability is not read
    return {e: [V4Job(n, steps, s, r["lr"]) for n, r in (one[e] or {}).items() for s in plan.test_seeds]
            for e, steps in (("speed", plan.speed_steps), ("capability", L))}


def _speed_rows(rows: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Endpoint 1's rows as the check compares them: D = the first step below 1.0 nats minus the baseline's, the
    reading = the verdict (and an arm's against its variant)."""
    out: dict[str, dict[str, Any]] = {}
    for n, r in rows.items():
        row: dict[str, Any] = {"lr": r["lr"]}
        if "speed" in r:
            row["D"] = r["speed"][STARTED]
            row["reading"] = r["verdict"] + (f"; against its variant {r['verdict_C']}" if "verdict_C" in r else "")
        out[n] = row
    return out


def _capability_rows(rows: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Endpoint 2's rows: D, an arm's C, the reading = the verdict (and an arm's DIAGNOSTIC.md reading)."""
    out: dict[str, dict[str, Any]] = {}
    for n, r in rows.items():
        row: dict[str, Any] = {"lr": r["lr"]}
        if "D" in r:
            row["D"] = r["D"]
            row["reading"] = r["verdict"] + (f"; {r['reading']}" if "reading" in r else "")
        if "C" in r:
            row["C"] = r["C"]
        out[n] = row
    return out


def _pairs(jobs: list[V4Job], one: Mapping[V4Job, Any], two: Mapping[V4Job, Any]) -> dict[str, Any]:
    """Per name [reruns bitwise equal (the final 25-step training-loss window), reruns], and how many pairs ran under
    each (first, second) kernel family ("not rerun": the first ran under the second's kernels already)."""
    equal: dict[str, list[int]] = {}
    fam: Counter[str] = Counter()
    for j in jobs:
        e = equal.setdefault(j.name, [0, 0])
        if two[j] is one[j]:
            fam[f"{one[j].get('cpu_capability')}: not rerun"] += 1
            continue
        e[0] += one[j]["final_window_loss"] == two[j]["final_window_loss"]
        e[1] += 1
        fam[f"{one[j].get('cpu_capability')} -> {two[j].get('cpu_capability')}"] += 1
    return {"equal": equal, "kernels": dict(sorted(fam.items()))}


def rounding_check(out_dir: str | Path, code_path: str, options: Optional[RunOptions] = None,
                   plan: Optional[Plan] = None) -> dict[str, Any]:
    """The finished protocol in ``out_dir``: its test jobs again under ``code_path``, both endpoints read again,
    every reading under both."""
    plan, options = plan or Plan(), options or RunOptions(workers=2)
    if code_path == plan.config.cpu_code_path:
        raise ValueError(f"--rounding-check {code_path}: the protocol ran that CPU code path; name another")
    first, one, jobs, rerun = _finished(out_dir, code_path, plan)
    t0, where = time.perf_counter(), Path(out_dir) / ROUNDING.format(code_path=code_path)
    second, ran = _rerun(plan, rerun, where, code_path, options)
    two = {**first, **second}
    res: dict[str, Any] = {"study": "retrieval protocol 4", "code_paths": [plan.config.cpu_code_path, code_path]}
    lrs = {n: r["lr"] for n, r in one["speed"].items()}
    p = _pairs(jobs["speed"], first, two)
    res["speed"] = {**compare_readings(_speed_rows(one["speed"]), _speed_rows(read_speed(plan, lrs, two)),
                                       p["equal"]), "kernels": p["kernels"]}
    res["capability"] = None
    if jobs["capability"]:
        L, conds = one["length"]["L"], one["conditions"]
        cl = {n: r["lr"] for n, r in one["capability"].items()}
        p = _pairs(jobs["capability"], first, two)
        res["capability"] = {**compare_readings(_capability_rows(one["capability"]),
                                                _capability_rows(read_capability(plan, L, conds, cl, two)),
                                                p["equal"]), "kernels": p["kernels"]}
    res["differ"] = [f"{e}: {n}" for e in ("speed", "capability") if res[e] for n in res[e]["differ"]]
    where.mkdir(parents=True, exist_ok=True)
    return STUDY.write(where, res, second, ran, t0, options)


def _finished(out_dir: str | Path, code_path: str, plan: Plan) -> tuple[dict[V4Job, Any], dict[str, Any],
                                                                       dict[str, list[V4Job]], list[V4Job]]:
    """The finished protocol in ``out_dir``: (its jobs' results, its reading, the test jobs each endpoint reads, those
    the check under ``code_path`` reruns: the ones that ran under other kernels); a ValueError where it is not
    there (``NotFinished`` where it is not finished)."""
    if not (Path(out_dir) / JOURNAL).is_file():
        raise ValueError(f"--out {out_dir}: no protocol version 4 there (its {JOURNAL}); the rounding check reruns a "
                         "finished one, e.g. docs/results/retrieval-v4")
    _, first = RUN.read_back(out_dir, lambda h: h.get("plan") == plan.to_dict(),
                             "this protocol's (another plan or configuration)")
    asked, one = needed(plan, first)[0], assess(plan, first)
    if any(j not in first for j in asked) or one["speed"] is None:
        raise NotFinished(f"--out {out_dir}: the protocol there is not finished ({sum(j in first for j in asked)} of "
                         f"{len(asked)} jobs asked so far); its rounding check reruns a finished one")
    jobs, kernels = tested_jobs(plan, one), kernels_of(code_path)
    return first, one, jobs, [j for e in jobs.values() for j in e if first[j].get("cpu_capability") != kernels]


def progress(out_dir: str | Path, code_path: str, plan: Optional[Plan] = None) -> tuple[int, int]:
    """(the reruns OUT/rounding-CODE_PATH's journal holds, the reruns the check asks) for the finished protocol in
    ``out_dir``: where a check that has not finished stands (``make docs``)."""
    from ..jobs import read_journal
    plan = plan or Plan()
    rerun = _finished(out_dir, code_path, plan)[3]
    path = Path(out_dir) / ROUNDING.format(code_path=code_path) / JOURNAL
    if not path.is_file():
        return 0, len(rerun)
    header, records = read_journal(path, validate_v4_run)
    if header.get("plan") != plan.to_dict() or header.get("code_path") != code_path:
        raise ValueError(f"{path}: not this protocol's rounding check under {code_path}")
    key = key_of(plan.config.replace(cpu_code_path=code_path).to_dict(), "cpu")
    return sum(key(j) in records for j in rerun), len(rerun)


def _rerun(plan: Plan, jobs: list[V4Job], out: Path, code_path: str,
           options: RunOptions) -> tuple[dict[V4Job, Any], int]:
    """``jobs`` under ``code_path`` into ``out``'s journal: ({job: result}, jobs run now) (a seam the tests replace
    to check the reading without training)."""
    cfg_d, dev = plan.config.replace(cpu_code_path=code_path).to_dict(), options.device
    spec: JobSpec[V4Job] = JobSpec(needed=lambda d: (jobs, True), run=run_v4_job,
                                   args=lambda j: (cfg_d, j.name, j.steps, j.seed, j.lr, dev),
                                   key=key_of(cfg_d, dev), code_path=code_path,
                                   desc=f"retrieval protocol 4 rounding check ({code_path})")
    return STUDY.journaled(spec, out, STUDY.header(plan=plan.to_dict(), code_path=code_path), options)


def format_rounding(check: dict[str, Any]) -> str:
    from ..studies.rounding import format_readings
    parts = []
    for e in ("speed", "capability"):
        if check[e] is None:
            parts.append(f"retrieval protocol 4, {e}: not read, nothing to check")
            continue
        text = format_readings({**check[e], "code_paths": check["code_paths"]}, f"retrieval protocol 4, {e}")
        kernels = ", ".join(f"{k} {v}" for k, v in check[e]["kernels"].items())
        parts.append(f"{text}\n  kernels of each pair (first -> second): {kernels}")
    return "\n".join(parts)
