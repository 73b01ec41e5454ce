"""The head-wise norm's mechanism arms in the retrieval study (LONGER.md, its dated addition of 2026-12-01 17:10).

Three one-change arms, each with the diagnostic's lr grid (widened as its rule says) on the 12 test seeds at the
benchmark's 600 steps, read against the committed diagnostic's own runs (its ``diagnostic.json``: the baseline, DIFF
V1, DIFF V2, ``v1_no_norm`` and ``v2_headwise_norm`` per seed at their chosen lrs): D (minus the baseline), C (minus
the variant the diagnostic reads: DIFF V2 for the V2 arms, DIFF V1 for ``v1_gain``) with the diagnostic's reading,
C' (minus the other form of the same variant: ``v2_headwise_norm``, ``v1_no_norm``; descriptive) and the speed
endpoint (``longer.crossing``). Jobs journaled in OUT/mechanism-jobs.jsonl.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Optional

from ..eval import stats
from ..jobs import JobSpec, RunOptions, job_key
from ..studies.followup import Arm, FollowUp, interval
from .benchmark_schema import validate_retrieval_arm_run
from .config import RetrievalConfig
from .diagnostic import BASE, LEARNED, STARTED, V1, V2, _interval, arm_jobs, reading
from .longer import LongJob, crossing, first_reading
from .protocol import Job, lr_choice
from .schema import validate_mechanism

VERSION = 1
JOURNAL = "mechanism-jobs.jsonl"
RESULTS = "mechanism.json"
# The addition's "the longest length read above": each arm at its 600-step lr, read against the re-reading's runs
LONGEST = 2400
LONGER_JOURNAL = "mechanism-longer-jobs.jsonl"
LONGER_RESULTS = "mechanism-longer.json"
# arm -> its variant, its one change, the name C reads against, the name C' reads against
ARMS: dict[str, Arm] = {
    "v2_gain": Arm(V2, {"head_gain": "norm_start"}, V2, "v2_headwise_norm"),
    "v2_gain_one": Arm(V2, {"head_gain": "one"}, V2, "v2_headwise_norm"),
    "v1_gain": Arm(V1, {"headwise_norm": False, "headwise_norm_weight": False, "head_gain": "norm_start"}, V1,
                   "v1_no_norm"),
}
STUDY: FollowUp[Job] = FollowUp("retrieval mechanism arms", "retrieval_mechanism", VERSION, JOURNAL, RESULTS, Job,
                                (str, int, float), validate_retrieval_arm_run, validate_mechanism)
LONGER_STUDY: FollowUp[LongJob] = FollowUp(
    "retrieval mechanism arms, longer", "retrieval_mechanism_longer", VERSION, LONGER_JOURNAL, LONGER_RESULTS, LongJob,
    (str, int, int, float), validate_retrieval_arm_run, validate_mechanism)


def run_mechanism_job(cfg_d: dict, arm: str, seed: int, lr: float, device: str = "cpu") -> dict[str, Any]:
    """One job: the arm's variant with its change, trained and measured as a benchmark job."""
    from .benchmark import _job
    out = _job(cfg_d, ARMS[arm].variant, seed, lr, device, ARMS[arm].change)
    out["arm"] = arm
    return out


def _key(cfg_d: dict[str, Any], dev: str):
    from .benchmark import job_description

    def key(j: Job) -> str:
        a = ARMS[j.variant]
        return job_key({"mechanism_version": VERSION, "arm": j.variant, "overrides": a.change,
                        **job_description(cfg_d, (a.variant, j.seed, j.lr), dev)})
    return key


def _longer_key(cfg_d: dict[str, Any], dev: str):
    """A longer job's key: the 600-step key's description with ``steps`` replaced (at 600 steps, the same key)."""
    def key(j: LongJob) -> str:
        return _key({**cfg_d, "steps": j.steps}, dev)(Job(j.name, j.seed, j.lr))
    return key


def run_mechanism_longer_job(cfg_d: dict, arm: str, steps: int, seed: int, lr: float,
                             device: str = "cpu") -> dict[str, Any]:
    return run_mechanism_job({**cfg_d, "steps": steps}, arm, seed, lr, device)


def assess(first: dict[str, Any], done: dict[Job, dict[str, Any]]) -> dict[str, Any]:
    """Per arm at its chosen lr: accuracy, D, C with the reading, C' and the speed endpoint against the baseline and
    against C's name (the first step below 1.0 and 0.3 nats)."""
    cfg = RetrievalConfig.from_dict(first["config"])
    R, P, S = first["rows"], cfg.primary, cfg.test_seeds
    rows: dict[str, Any] = {}
    for arm, a in ARMS.items():
        overrides, c_name, c2_name = a.change, a.c_name, str(a.other)
        c = lr_choice(cfg, arm, done)
        if c.lr is None:
            continue
        runs = [done[Job(arm, s, c.lr)] for s in S]
        acc = [r["conditions"][P]["accuracy"] for r in runs]
        thr = {t: [r["loss_thresholds"][t] for r in runs] for t in (STARTED, LEARNED)}
        d, cc = _interval(R[BASE]["accuracy"], acc), _interval(R[c_name]["accuracy"], acc)
        n_q = runs[0]["conditions"][P]["n_queries"]
        ref_thr = {n: R[n]["dynamics"]["first_step_below"] for n in (BASE, c_name)}
        rows[arm] = {"lr": c.lr, "overrides": overrides, "accuracy": acc, "mean": statistics.fmean(acc),
                     "below_floor": sum(r["failed"] for r in runs), "D": d, "C": cc, "C_against": c_name,
                     "reading": reading(d, cc, R[c_name]["D"]["estimate"],
                                        stats.above_chance(acc, n_q, 1.0 / cfg.n_values)),
                     "C2": _interval(R[c2_name]["accuracy"], acc), "C2_against": c2_name,
                     "speed": {t: crossing(ref_thr[BASE][t]["per_seed"], thr[t], cfg.steps) for t in thr},
                     "speed_C": {t: crossing(ref_thr[c_name][t]["per_seed"], thr[t], cfg.steps) for t in thr}}
    return rows


def run_mechanism(diag_dir: str | Path, out_dir: str | Path, options: Optional[RunOptions] = None) -> dict[str, Any]:
    """Run (or resume) every job the addition asks for and read the arms."""
    options = options or RunOptions(workers=2)
    first = first_reading(diag_dir)
    cfg = RetrievalConfig.from_dict(first["config"])
    cfg_d, dev = first["config"], options.device
    t0 = time.perf_counter()
    spec: JobSpec[Job] = JobSpec(needed=lambda d: arm_jobs(cfg, d, ARMS), run=run_mechanism_job,
                                 args=lambda j: (cfg_d, j.variant, j.seed, j.lr, dev), key=_key(cfg_d, dev),
                                 code_path=cfg.cpu_code_path, desc="retrieval mechanism arms (jobs)")
    done, ran = STUDY.journaled(spec, Path(out_dir), STUDY.header(config=cfg_d), options)
    return STUDY.write(Path(out_dir), {"reference": str(diag_dir), "rows": assess(first, done)}, done, ran, t0,
                       options)


# ---------------------------------------------------------------------------------------------- at 2,400 steps
def chosen_lrs(diag_dir: str | Path, out_dir: str | Path) -> dict[str, float]:
    """Each arm's 600-step lr from OUT's finished 600-step journal; a ValueError naming --mechanism when an arm's
    choice is not final there (run ``--mechanism`` into the same OUT first)."""
    res: dict[str, Any] = rebuild(diag_dir, out_dir) if (Path(out_dir) / JOURNAL).is_file() else {
        "rows": {}, "complete": [0, 0]}
    missing = [a for a in ARMS if a not in res["rows"]]
    if missing or res["complete"][0] < res["complete"][1]:
        raise ValueError(f"--mechanism --longer: {out_dir} needs the arms' finished 600-step run first (no final lr "
                         f"for {', '.join(missing) or 'every arm'}; run --mechanism --out {out_dir})")
    return {a: float(res["rows"][a]["lr"]) for a in ARMS}


def longer_jobs(cfg: RetrievalConfig, lrs: dict[str, float], steps: int = LONGEST) -> list[LongJob]:
    return [LongJob(a, steps, s, lrs[a]) for s in cfg.test_seeds for a in ARMS]


def assess_longer(first: dict[str, Any], lrs: dict[str, float], longer_row: dict[str, Any],
                  done: dict[LongJob, dict[str, Any]], steps: int = LONGEST) -> dict[str, Any]:
    """Per arm at ``steps`` (read only when all its jobs are in): D, C with the reading and C' against the
    re-reading's runs of the baseline and the arm's names at the same length, and the speed endpoint."""
    cfg = RetrievalConfig.from_dict(first["config"])
    P, S = cfg.primary, cfg.test_seeds
    rows: dict[str, Any] = {}
    for arm, a in ARMS.items():
        overrides, c_name, c2_name = a.change, a.c_name, str(a.other)
        jobs = [LongJob(arm, steps, s, lrs[arm]) for s in S]
        if not all(j in done for j in jobs):
            continue
        runs = [done[j] for j in jobs]
        acc = [r["conditions"][P]["accuracy"] for r in runs]
        thr = {t: [r["loss_thresholds"][t] for r in runs] for t in (STARTED, LEARNED)}
        R = longer_row
        d, cc = _interval(R[BASE]["accuracy"], acc), _interval(R[c_name]["accuracy"], acc)
        n_q = runs[0]["conditions"][P]["n_queries"]
        rows[arm] = {"lr": lrs[arm], "overrides": overrides, "accuracy": acc, "mean": statistics.fmean(acc),
                     "below_floor": sum(r["failed"] for r in runs), "D": d, "C": cc, "C_against": c_name,
                     "reading": reading(d, cc, _interval(R[BASE]["accuracy"], R[c_name]["accuracy"])["estimate"],
                                        stats.above_chance(acc, n_q, 1.0 / cfg.n_values)),
                     "C2": _interval(R[c2_name]["accuracy"], acc), "C2_against": c2_name,
                     "speed": {t: crossing(R[BASE]["first_step_below"][t], thr[t], steps) for t in thr},
                     "speed_C": {t: crossing(R[c_name]["first_step_below"][t], thr[t], steps) for t in thr}}
    return rows


def _longer_row(diag_dir: str | Path, longer_dir: str | Path, steps: int) -> dict[str, Any]:
    from . import longer
    lengths = longer.rebuild(diag_dir, longer_dir)["lengths"]
    if str(steps) not in lengths:
        raise ValueError(f"--longer-reference {longer_dir}: the re-reading has no finished {steps}-step length")
    return lengths[str(steps)]


def run_mechanism_longer(diag_dir: str | Path, longer_dir: str | Path, out_dir: str | Path,
                         options: Optional[RunOptions] = None, steps: int = LONGEST) -> dict[str, Any]:
    """The arms at ``steps`` (their 600-step lrs from OUT), journaled in OUT/mechanism-longer-jobs.jsonl, read
    against the finished re-reading in ``longer_dir`` (``retrieval --longer``'s OUT)."""
    options = options or RunOptions(workers=2)
    first = first_reading(diag_dir)
    cfg = RetrievalConfig.from_dict(first["config"])
    row, lrs = _longer_row(diag_dir, longer_dir, steps), chosen_lrs(diag_dir, out_dir)
    cfg_d, dev, out = first["config"], options.device, Path(out_dir)
    t0 = time.perf_counter()
    todo = longer_jobs(cfg, lrs, steps)
    spec: JobSpec[LongJob] = JobSpec(needed=lambda d: (todo, True), run=run_mechanism_longer_job,
                                     args=lambda j: (cfg_d, j.name, j.steps, j.seed, j.lr, dev),
                                     key=_longer_key(cfg_d, dev), code_path=cfg.cpu_code_path,
                                     desc=f"retrieval mechanism arms at {steps} steps (jobs)")
    done, ran = LONGER_STUDY.journaled(spec, out, LONGER_STUDY.header(config=cfg_d, steps=steps, lrs=lrs), options)
    return LONGER_STUDY.write(out, {"reference": str(diag_dir), "longer_reference": str(longer_dir), "steps": steps,
                                    "rows": assess_longer(first, lrs, row, done, steps)}, done, ran, t0, options)


def rebuild_longer(diag_dir: str | Path, longer_dir: str | Path, out_dir: str | Path,
                   steps: int = LONGEST) -> dict[str, Any]:
    """OUT's longer journal read back, finished or not (``complete``: its jobs in, of those asked for)."""
    first = first_reading(diag_dir)
    cfg = RetrievalConfig.from_dict(first["config"])
    header, done = LONGER_STUDY.read_back(out_dir, lambda h: h.get("config") == first["config"],
                                          f"the mechanism arms' longer run on {diag_dir}")
    lrs = {str(k): float(v) for k, v in header["lrs"].items()}
    return LONGER_STUDY.rebuilt(done, longer_jobs(cfg, lrs, steps), {"steps": steps},
                                rows=assess_longer(first, lrs, _longer_row(diag_dir, longer_dir, steps), done, steps))


# ---------------------------------------------------------------------------------------------- read back
def rebuild(diag_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """OUT's journal read back (nothing trained, finished or not): the arms whose lr choice is final, as
    ``run_mechanism`` reads them, and how many of the jobs the addition asks for are in (``complete``: the jobs needed
    given those in, which grows where a grid widens)."""
    first = first_reading(diag_dir)
    cfg = RetrievalConfig.from_dict(first["config"])
    _, done = STUDY.read_back(out_dir, lambda h: h.get("config") == first["config"],
                              f"the mechanism arms' on the configuration of {diag_dir}")
    return STUDY.rebuilt(done, arm_jobs(cfg, done, ARMS)[0], {"reference": str(diag_dir)}, rows=assess(first, done))


def markdown_table(res: dict[str, Any]) -> str:
    """docs/retrieval.md's table of the mechanism arms: per arm its chosen lr, the accuracy at p48c48, D and C with
    the reading, C' (descriptive), the runs below the floor and the speed endpoint against the baseline and against
    C's name (steps to 1.0 nats; median paired difference, sign-test interval; negative = sooner)."""
    lines = ["| arm | lr | accuracy | D (minus baseline) | C (minus its variant): reading | C' (minus the variant's "
             "other form) | below the floor | steps to 1.0 nats, minus baseline | minus C's name |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, r in res["rows"].items():
        lines.append(f"| `{arm}` | {r['lr']:g} | {r['mean']:.3f} | {interval(r['D'])} | {interval(r['C'])} against "
                     f"`{r['C_against']}`: {r['reading']} | {interval(r['C2'])} against `{r['C2_against']}` | "
                     f"{r['below_floor']} of {len(r['accuracy'])} | {interval(r['speed'][STARTED], '+g')} | "
                     f"{interval(r['speed_C'][STARTED], '+g')} |")
    done, total = res.get("complete", [None, None])
    if done is not None and done < total:
        lines += ["", f"Incomplete: {done} of {total} jobs are in the committed journal; an arm is shown once its lr "
                      "choice is final."]
    return "\n".join(lines)


def format_mechanism(res: dict[str, Any]) -> str:
    lines = ["retrieval mechanism arms (LONGER.md): accuracy at p48c48; D = minus the baseline, C = minus the "
             "variant (reading), C' = minus the variant's other form; speed: steps to 1.0 nats minus the baseline's"]
    for arm, r in res["rows"].items():
        lines.append(f"  {arm:12s} lr {r['lr']:<6g} acc {r['mean']:.3f}  D {interval(r['D'])}  C ({r['C_against']}) "
                     f"{interval(r['C'])}: {r['reading']}  C' ({r['C2_against']}) {interval(r['C2'])}  speed "
                     f"{interval(r['speed'][STARTED], '+g')}  below floor {r['below_floor']}")
    return "\n".join(lines)
