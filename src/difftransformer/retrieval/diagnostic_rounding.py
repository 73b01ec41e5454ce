"""The retrieval diagnostic's rounding check (DIAGNOSTIC.md "Rounding"; ``retrieval --diagnostic --rounding-check
CODE_PATH``): the finished diagnostic's jobs at its chosen lrs again under another CPU code path, every D, C and
reading side by side."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from ..eval import stats
from ..jobs import JobSpec, RunOptions
from ..rundir.files import ROUNDING_NAME
from ..studies.followup import FollowUp
from ..studies.schema import validate_readings
from .benchmark_schema import validate_retrieval_arm_run
from .diagnostic import (
    ARMS,
    BASE,
    JOURNAL,
    V1,
    V2,
    VERSION,
    _accuracies,
    _interval,
    _key,
    first_run,
    reading,
    reference,
    run_arm_job,
)
from .protocol import Job

# the rounding check: its journal in OUT/rounding-CODE_PATH, its readings in OUT/rounding.json (the command's)
STUDY: FollowUp[Job] = FollowUp("retrieval diagnostic rounding check", "retrieval_diagnostic_rounding", VERSION,
                                JOURNAL, ROUNDING_NAME, Job, (str, int, float), validate_retrieval_arm_run,
                                validate_readings)


def rounding_check(ref_dir: str | Path, out_dir: str | Path, code_path: str,
                   options: Optional[RunOptions] = None) -> dict[str, Any]:
    """DIAGNOSTIC.md "Rounding": the finished diagnostic in ``out_dir``'s jobs at its chosen lrs (the baseline, DIFF
    V1, DIFF V2 and every arm, every test seed) again under ``code_path`` into OUT/rounding-CODE_PATH (resumable),
    and every D, C and reading side by side (``studies.rounding``); the command writes OUT/rounding.json."""
    from ..studies.rounding import compare_readings
    options = options or RunOptions(workers=2)
    cfg, ref = reference(Path(ref_dir))
    first = first_run(out_dir)
    if first["config"] != cfg.to_dict():
        raise ValueError(f"--out {out_dir}: that diagnostic read another reference than --reference {ref_dir}")
    if code_path == cfg.cpu_code_path:
        raise ValueError(f"--rounding-check {code_path}: the diagnostic already ran that CPU code path; name another")
    t0 = time.perf_counter()
    other = cfg.replace(cpu_code_path=code_path)
    dev, cfg_d = options.device, other.to_dict()
    names = (BASE, V1, V2, *ARMS)
    jobs = [Job(n, s, first["rows"][n]["lr"]) for n in names for s in cfg.test_seeds]
    spec: JobSpec[Job] = JobSpec(needed=lambda d: (jobs, True), run=run_arm_job,
                                 args=lambda j: (cfg_d, j.variant, j.seed, j.lr, dev), key=_key(cfg_d, dev),
                                 code_path=code_path, desc=f"retrieval diagnostic rounding check ({code_path})")
    done, ran = STUDY.journaled(spec, Path(out_dir) / f"rounding-{code_path}",
                                STUDY.header(config=cfg_d, scope="chosen"), options)
    runs = {n: [done[Job(n, s, first["rows"][n]["lr"])] for s in cfg.test_seeds] for n in names}
    acc = {n: _accuracies(runs[n], cfg.primary) for n in names}
    n_q = runs[BASE][0]["conditions"][cfg.primary]["n_queries"]

    def row(n: str, accs: dict[str, list[float]]) -> dict[str, Any]:
        r: dict[str, Any] = {"lr": first["rows"][n]["lr"]}
        if n != BASE:
            r["D"] = _interval(accs[BASE], accs[n])
        if n in ARMS:
            variant = ARMS[n].variant
            r["C"] = _interval(accs[variant], accs[n])
            r["reading"] = reading(r["D"], r["C"], _interval(accs[BASE], accs[variant])["estimate"],
                                   stats.above_chance(accs[n], n_q, 1.0 / cfg.n_values))
        return r

    one = {n: first["rows"][n]["accuracy"] for n in names}
    second = {n: row(n, acc) for n in names}
    check = compare_readings({n: {k: v for k, v in first["rows"][n].items() if k in ("lr", "D", "C", "reading")}
                              for n in names}, second,
                             {n: [sum(a == b for a, b in zip(one[n], acc[n])), len(acc[n])] for n in names})
    caps = sorted({r.get("cpu_capability") or "?" for r in ref.values()})
    check.update(study="retrieval diagnostic", reference=str(ref_dir),
                 code_paths=[f"{cfg.cpu_code_path} ({', '.join(caps)})",
                             f"{code_path} ({runs[BASE][0].get('cpu_capability')})"],
                 timings={"wall_s": time.perf_counter() - t0, **options.describe(), "jobs": len(done),
                          "jobs_run": ran})
    validate_readings(json.loads(json.dumps(check)), "the retrieval diagnostic's rounding.json (as written)")
    return check
