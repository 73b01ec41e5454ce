"""The language-model diagnostics' rounding check (retrieval/DIAGNOSTIC.md "Rounding"; ``lm-sweep --diagnostic v1|v2
--rounding-check CODE_PATH``): the finished diagnostic's reruns and arms at their chosen lrs again under another CPU
code path, every D, C and reading side by side."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from ..jobs import JobSpec, RunOptions, device_key, job_key, open_executor
from ..studies.schema import validate_readings
from .analysis import Job, _compare, loss_of, passed
from .diagnostic import (
    BASE,
    RESULTS,
    V1_SPEC,
    V2,
    _interval,
    cap_of,
    prepare_reference_tokens,
    reading,
    reference,
    run_arm_job,
    v2_reading,
    v2_spec,
)
from .sweep_schema import validate_diagnostic


def rounding_check(ref_dir: str | Path, out_dir: str | Path, code_path: str,
                   options: Optional[RunOptions] = None) -> dict[str, Any]:
    """retrieval/DIAGNOSTIC.md "Rounding": the finished diagnostic in ``out_dir`` (V1's or V2's, from its
    diagnostic.json), its reruns and arms at their chosen lrs on every seed again under ``code_path`` into
    OUT/rounding-CODE_PATH (resumable), every D, C and reading side by side (``studies.rounding``); the command
    writes OUT/rounding.json."""
    from ..fileio import read_json
    from ..studies.rounding import compare_readings
    options = options or RunOptions(workers=2)
    path = Path(out_dir) / RESULTS
    if not path.is_file():
        raise ValueError(f"--rounding-check: {out_dir} holds no finished diagnostic ({RESULTS}); run the diagnostic "
                         "there first")
    first = read_json(path, "--out")
    validate_diagnostic(first, f"--out {out_dir}: {RESULTS} is not a diagnostic's")
    kind = {"v1_diagnostic": "v1", "v2_diagnostic": "v2"}.get(str(first["benchmark"]))
    if kind is None:
        raise ValueError(f"--out {out_dir}: {RESULTS} is not a language-model diagnostic's")
    cfg, fp, _ = reference(Path(ref_dir))
    if first["config"] != cfg.to_dict():
        raise ValueError(f"--out {out_dir}: that diagnostic read another reference than --reference {ref_dir}")
    if code_path == cfg.cpu_code_path:
        raise ValueError(f"--rounding-check {code_path}: the diagnostic already ran that CPU code path; name another")
    a, width = first["arms"], first["width"]
    spec = V1_SPEC if kind == "v1" else v2_spec(tuple(n for n in a if n not in (BASE, V2)))
    lr = {**{name: a[variant]["lr"] for name, variant in spec.reruns.items()}, **{n: a[n]["lr"] for n in spec.arms}}
    t0 = time.perf_counter()
    other = cfg.replace(cpu_code_path=code_path)
    out = Path(out_dir) / f"rounding-{code_path}"
    out.mkdir(parents=True, exist_ok=True)
    ex = open_executor(code_path, options)
    try:
        data, vocab = prepare_reference_tokens(other, fp, out, ref_dir, options.progress)
        dev, cfg_d, data_dir = options.device, other.to_dict(), str(data.directory)
        jobs = [Job(width, name, s, x) for name, x in lr.items() for s in cfg.test_seeds]
        which = {} if spec.name == "v1" else {"diagnostic": spec.name}
        study = replace(spec.study, title=f"{spec.title} rounding check")  # its journal: another study's title
        header = study.header(config=cfg_d, data=fp, width=width, scope="chosen")
        job_spec: JobSpec[Job] = JobSpec(
            needed=lambda d: (jobs, True), run=run_arm_job,
            args=lambda j: (cfg_d, data_dir, j.width, j.variant, j.seed, j.lr, dev, spec.name),
            key=lambda j: job_key({"diagnostic_version": spec.version, **which, "config": cfg_d, "data": fp,
                                   "job": list(j), "overrides": spec.change(j.variant), **device_key(dev)}),
            code_path=code_path, desc=f"{spec.title} rounding check ({code_path})")
        done, ran = study.journaled(job_spec, out, header, options, ex)
    finally:
        ex.close()
    cap = cap_of(vocab)

    def loss(r: dict[str, Any]) -> float:
        return loss_of(r, "test_loss", cap)

    runs = {name: [done[Job(width, name, s, x)] for s in cfg.test_seeds] for name, x in lr.items()}
    base_name, var_name = list(spec.reruns)
    base, var = runs[base_name], runs[var_name]
    second: dict[str, dict[str, Any]] = {BASE: {"lr": lr[base_name]},
                                         spec.variant: {"lr": lr[var_name], "D": _interval(_compare(base, var, loss))}}
    for arm in spec.arms:
        d, c = _compare(base, runs[arm], loss), _compare(var, runs[arm], loss)
        bad = not all(passed(r) for r in base + var + runs[arm])
        second[arm] = {"lr": lr[arm], "D": _interval(d), "C": _interval(c),
                       "reading": reading(d, c, bad) if kind == "v1" else v2_reading(c, bad)}
    names = [BASE, spec.variant, *spec.arms]
    first_rows = {n: {k: v for k, v in a[n].items() if k in ("lr", "D", "C", "reading")} for n in names}
    first_loss = {n: a[n]["test_loss"] for n in names}
    here = {n: [loss(r) for r in runs[m]] for n, m in zip(names, [base_name, var_name, *spec.arms])}
    check = compare_readings(first_rows, {n: second[n] for n in names},
                             {n: [sum(x == y for x, y in zip(first_loss[n], here[n])), len(here[n])] for n in names})
    caps = sorted({str(r.get("cpu_capability")) for r in done.values()})
    check.update(study=spec.title, reference=str(ref_dir), width=width,
                 code_paths=[f"{cfg.cpu_code_path} (the first run's)", f"{code_path} ({', '.join(caps)})"],
                 timings={"wall_s": time.perf_counter() - t0, **options.describe(), "jobs": len(done),
                          "jobs_run": ran})
    validate_readings(json.loads(json.dumps(check)), f"the {spec.title}'s rounding.json (as written)")
    return check
