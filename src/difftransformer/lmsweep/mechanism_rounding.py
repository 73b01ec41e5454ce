"""The language-model mechanism arms' rounding check (retrieval/LONGER.md's addition of 2026-12-02 00:04;
``lm-sweep --mechanism --rounding-check CODE_PATH``): the finished arms' jobs at their chosen lrs again under another
CPU code path, into OUT/rounding-CODE_PATH (resumable), read against the committed diagnostics' own rounding checks
under that code path (each diagnostic's OUT/rounding-CODE_PATH journal: its baseline rerun, its variant's rerun and
the other form at their chosen lrs), so both sides of every D and C round the second way; every reading side by side
(``studies.rounding``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from ..fileio import read_json
from ..jobs import JobSpec, RunOptions, open_executor, read_journal
from ..rundir.files import DIAGNOSTIC_RESULTS_NAME, ROUNDING_NAME
from ..studies.followup import FollowUp
from ..studies.rounding import compare_readings
from ..studies.schema import validate_readings
from .analysis import Job, _compare, loss_of, passed
from .diagnostic import JOURNAL as DIAG_JOURNAL
from .diagnostic import _interval, cap_of, out_removed_on_refusal, prepare_reference_tokens, reference, v2_reading
from .mechanism import ARMS, CHOSEN, JOURNAL, VERSION, _key, rebuild, run_mechanism_job
from .sweep_schema import validate_lm_arm_run

STUDY: FollowUp[Job] = FollowUp("language-model mechanism arms rounding check", "lm_mechanism_rounding", VERSION,
                                JOURNAL, ROUNDING_NAME, Job, (int, str, int, float), validate_lm_arm_run,
                                validate_readings)
KEEP = ("lr", "D", "C", "reading")  # what a row of the check compares


def second_runs(ref_dir: str | Path, diag_root: str | Path, code_path: str) -> dict[str, dict[str, list[dict]]]:
    """Per committed diagnostic the arms read against, its rounding-check runs under ``code_path`` of each name the
    arms compare with (at its chosen lr, every test seed); one ValueError naming --diagnostics when one is missing."""
    cfg, fp, _ = reference(Path(ref_dir))
    width, want = cfg.largest, cfg.replace(cpu_code_path=code_path).to_dict()
    out: dict[str, dict[str, list[dict]]] = {}
    for name in sorted({str(a.reads) for a in ARMS.values()}):
        d = Path(diag_root) / name
        path = d / f"rounding-{code_path}" / DIAG_JOURNAL
        if not path.is_file() or not (d / DIAGNOSTIC_RESULTS_NAME).is_file():
            raise ValueError(f"--diagnostics {diag_root}: {name} has no rounding check under {code_path} ({name}/"
                             f"rounding-{code_path}/{DIAG_JOURNAL}); the arms are read against its runs")
        header, records = read_journal(path, validate_lm_arm_run)
        if header.get("config") != want or header.get("width") != width or header.get("data") != fp:
            raise ValueError(f"--diagnostics {diag_root}: {name}'s {code_path} rounding check ran another "
                             "configuration")
        done = {Job(int(r["job"][0]), str(r["job"][1]), int(r["job"][2]), float(r["job"][3])): r["result"]
                for r in records.values()}
        arms = read_json(d / DIAGNOSTIC_RESULTS_NAME, "--diagnostics")["arms"]
        names = {"baseline_rerun", *(a.c_name for a in ARMS.values() if a.reads == name)}
        runs: dict[str, list[dict]] = {}
        for n in sorted(names):
            lr = float(arms[CHOSEN.get(n, n)]["lr"])
            if any(Job(width, n, s, lr) not in done for s in cfg.test_seeds):
                raise ValueError(f"--diagnostics {diag_root}: {name}'s {code_path} rounding check lacks {n} at lr "
                                 f"{lr:g}")
            runs[n] = [done[Job(width, n, s, lr)] for s in cfg.test_seeds]
        out[name] = runs
    return out


def rounding_check(ref_dir: str | Path, diag_root: str | Path, out_dir: str | Path, code_path: str,
                   options: Optional[RunOptions] = None) -> dict[str, Any]:
    """The finished arms in ``out_dir`` at their chosen lrs again under ``code_path``; per arm D and C (with the V2
    rule's reading) under both code paths, each against the diagnostics' runs under the same code path."""
    options = options or RunOptions(workers=2)
    cfg, fp, _ = reference(Path(ref_dir))
    if code_path == cfg.cpu_code_path:
        raise ValueError(f"--rounding-check {code_path}: the arms already ran that CPU code path; name another")
    one = rebuild(ref_dir, diag_root, out_dir) if (Path(out_dir) / JOURNAL).is_file() else None
    if one is None or one["complete"][0] < one["complete"][1]:
        raise ValueError(f"--out {out_dir}: no finished mechanism arms there; the rounding check reruns a finished "
                         "run, e.g. docs/results/lm-mechanism")
    ref = second_runs(ref_dir, diag_root, code_path)  # before any job or token
    width, S = cfg.largest, cfg.test_seeds
    lrs = {a: float(one["rows"][a]["lr"]) for a in ARMS}
    other = cfg.replace(cpu_code_path=code_path)
    out = Path(out_dir) / f"rounding-{code_path}"
    t0 = time.perf_counter()
    ex = open_executor(code_path, options)
    try:
        with out_removed_on_refusal(out):
            data, vocab = prepare_reference_tokens(other, fp, out, ref_dir, options.progress)
        dev, cfg_d, data_dir = options.device, other.to_dict(), str(data.directory)
        jobs = [Job(width, a, s, lrs[a]) for a in ARMS for s in S]
        spec: JobSpec[Job] = JobSpec(
            needed=lambda d: (jobs, True), run=run_mechanism_job,
            args=lambda j: (cfg_d, data_dir, j.width, j.variant, j.seed, j.lr, dev), key=_key(cfg_d, fp, dev),
            code_path=code_path, desc=f"language-model mechanism arms rounding check ({code_path})")
        header = STUDY.header(config=cfg_d, data=fp, width=width, vocab=vocab, scope="chosen")
        done, ran = STUDY.journaled(spec, out, header, options, ex)
    finally:
        ex.close()
    cap = cap_of(vocab)

    def loss(r: dict[str, Any]) -> float:
        return loss_of(r, "test_loss", cap)

    second, equal = {}, {}
    for a, arm in ARMS.items():
        runs = [done[Job(width, a, s, lrs[a])] for s in S]
        base, var = ref[str(arm.reads)]["baseline_rerun"], ref[str(arm.reads)][arm.c_name]
        cc = _compare(var, runs, loss)
        second[a] = {"lr": lrs[a], "D": _interval(_compare(base, runs, loss)), "C": _interval(cc),
                     "reading": v2_reading(cc, not all(passed(r) for r in base + var + runs))}
        mine = [loss(r) for r in runs]
        equal[a] = [sum(x == y for x, y in zip(one["rows"][a]["test_loss"], mine)), len(mine)]
    check = compare_readings({a: {k: one["rows"][a][k] for k in KEEP} for a in ARMS}, second, equal)
    caps = sorted({str(r.get("cpu_capability")) for r in done.values()})
    check.update(study="language-model mechanism arms", reference=str(ref_dir), width=width,
                 code_paths=[f"{cfg.cpu_code_path} (the first run's)", f"{code_path} ({', '.join(caps)})"],
                 timings={"wall_s": time.perf_counter() - t0, **options.describe(), "jobs": len(done),
                          "jobs_run": ran})
    validate_readings(json.loads(json.dumps(check)), "the language-model mechanism arms' rounding.json (as written)")
    return check
