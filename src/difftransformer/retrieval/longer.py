"""The re-reading at longer training (LONGER.md beside this file, read side by side with it).

Every name of the answer table (the baseline, DIFF V1, DIFF V2 and the retrieval diagnostic's arms) again on the 12
test seeds at the lr it chose at 600 steps, with only the training length changed (1,200 and 2,400 steps: the lr
schedule stretched, as a run trained for that long from the start). The finished diagnostic's ``diagnostic.json``
gives the configuration, the lrs and the 600-step reading; the jobs are the diagnostic's (``run_arm_job``) with
``steps`` replaced, journaled in OUT/longer-jobs.jsonl. ``assess`` reads each length with the diagnostic's rule
(D, C, reading) and the speed endpoint (``crossing``: the first step below each loss threshold, paired, a run that
never crosses counted as such).
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional

from ..eval import stats
from ..jobs import JobSpec, RunOptions, job_key
from ..rundir.files import DIAGNOSTIC_RESULTS_NAME
from ..studies.followup import FollowUp, interval, sign_of
from .benchmark_schema import validate_diagnostic, validate_retrieval_arm_run
from .config import RetrievalConfig
from .diagnostic import ARMS, BASE, LEARNED, STARTED, V1, V2, _interval, arm_change, reading, run_arm_job
from .schema import validate_longer

VERSION = 1  # LONGER.md's version: in every job key and the journal header
JOURNAL = "longer-jobs.jsonl"
RESULTS = "longer.json"
STEPS = (1200, 2400)  # LONGER.md "What runs", in this order (every name at 1,200 first)
NAMES = (BASE, V1, V2, *ARMS)
LEVEL = 0.95


class LongJob(NamedTuple):
    name: str
    steps: int
    seed: int
    lr: float


STUDY: FollowUp[LongJob] = FollowUp("retrieval longer training", "retrieval_longer", VERSION, JOURNAL, RESULTS,
                                    LongJob, (str, int, int, float), validate_retrieval_arm_run, validate_longer)


def first_reading(diag_dir: str | Path) -> dict[str, Any]:
    """The finished retrieval diagnostic's diagnostic.json (its configuration, each name's lr and its 600-step
    reading); a ValueError naming --reference when it is not one."""
    from ..fileio import read_json
    path = Path(diag_dir) / DIAGNOSTIC_RESULTS_NAME
    if not path.is_file():
        raise ValueError(f"--reference {diag_dir}: no diagnostic.json there (give a finished retrieval diagnostic's "
                         "directory, e.g. docs/results/retrieval-diagnostic)")
    res = read_json(path, "--reference")
    validate_diagnostic(res, f"--reference {diag_dir}: diagnostic.json")
    if res["benchmark"] != "retrieval_diagnostic" or any(n not in res["rows"] for n in NAMES):
        raise ValueError(f"--reference {diag_dir}: not this version's retrieval diagnostic (it needs the rows "
                         f"{', '.join(NAMES)})")
    for n in NAMES:
        lr = res["rows"][n].get("lr")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
            raise ValueError(f"--reference {diag_dir}: diagnostic.json's rows.{n}.lr must be a positive finite "
                             f"number, got {lr!r}")
    return res


def check_steps(steps: tuple[int, ...]) -> tuple[int, ...]:
    if not steps or any(s not in STEPS for s in steps):
        raise ValueError(f"--longer: training lengths from {', '.join(map(str, STEPS))} (LONGER.md), got "
                         f"{', '.join(map(str, steps)) or 'none'}")
    return tuple(sorted(set(steps)))


def jobs_for(first: dict[str, Any], steps: tuple[int, ...]) -> list[LongJob]:
    """LONGER.md "What runs": per length (shortest first), per seed, every name at its 600-step lr."""
    seeds = RetrievalConfig.from_dict(first["config"]).test_seeds
    return [LongJob(n, st, s, float(first["rows"][n]["lr"])) for st in steps for s in seeds for n in NAMES]


def run_longer_job(cfg_d: dict, name: str, steps: int, seed: int, lr: float, device: str = "cpu") -> dict[str, Any]:
    """One job: the name's model (an arm's one change) trained ``steps`` steps, measured as a benchmark job."""
    return run_arm_job({**cfg_d, "steps": steps}, name, seed, lr, device)


def _key(cfg_d: dict[str, Any], dev: str):
    from .benchmark import job_description

    def key(j: LongJob) -> str:
        variant, overrides = arm_change(j.name)
        return job_key({"longer_version": VERSION, "arm": j.name, "overrides": overrides,
                        **job_description({**cfg_d, "steps": j.steps}, (variant, j.seed, j.lr), dev)})
    return key


# ---------------------------------------------------------------------------------------------- the speed endpoint
def sign_interval(diffs: list[float], level: float = LEVEL) -> tuple[Optional[float], list[Optional[float]], float]:
    """The median of paired differences and its distribution-free interval from the sign test (order statistics
    k and n+1-k of the sorted differences, k the largest with P(Binomial(n, 1/2) < k) <= (1 - level)/2); the
    interval's actual coverage is returned (n = 12: the 3rd and 10th, 96.1%). Fewer than 6 pairs: no interval."""
    n = len(diffs)
    if n == 0:
        return None, [None, None], 0.0
    xs = sorted(diffs)
    med = statistics.median(xs)
    alpha = (1 - level) / 2
    cdf, k = 0.0, 0
    while True:  # P(B < k+1) = sum_{i <= k} C(n, i) / 2^n
        nxt = cdf + math.comb(n, k) / 2 ** n
        if nxt > alpha:
            break
        cdf, k = nxt, k + 1
    if k == 0:
        return med, [None, None], 0.0
    return med, [xs[k - 1], xs[n - k]], 1 - 2 * cdf


def crossing(base: list[Optional[int]], other: list[Optional[int]], steps: int) -> dict[str, Any]:
    """LONGER.md "Speed": per seed the other's first step below a threshold minus the baseline's; a run that never
    crossed counts as ``steps + 1`` (later than any crossing: the difference's sign is right, its size a bound);
    the median difference with the sign-test interval; negative: the other crosses sooner."""
    never = steps + 1
    d = [(o if o is not None else never) - (b if b is not None else never) for b, o in zip(base, other)]
    med, ci, cover = sign_interval([float(x) for x in d])
    return {"estimate": med, "ci": ci, "coverage": cover, "per_seed": d,
            "never": [sum(x is None for x in base), sum(x is None for x in other)],
            "method": "median of paired differences, sign-test interval; never crossed = steps + 1"}


# ---------------------------------------------------------------------------------------------- the reading
def length_rows(acc: dict[str, list[float]], ext: dict[str, list[float]], thr: dict[str, dict[str, list]],
                failed: dict[str, int], steps: int, n_q: int, chance: float) -> dict[str, dict[str, Any]]:
    """One training length's rows: per name the mean accuracy, D, C, the diagnostic's reading (arms), the
    extrapolation D, runs below the floor and the speed endpoint against the baseline (and for arms their variant)."""
    rows: dict[str, dict[str, Any]] = {}
    for n in NAMES:
        r: dict[str, Any] = {"accuracy": acc[n], "mean": statistics.fmean(acc[n]), "extrapolation": ext[n],
                             "below_floor": failed[n], "first_step_below": thr[n]}
        if n != BASE:
            r["D"] = _interval(acc[BASE], acc[n])
            r["D_extrapolation"] = _interval(ext[BASE], ext[n])
            r["speed"] = {t: crossing(thr[BASE][t], thr[n][t], steps) for t in (STARTED, LEARNED)}
        if n in ARMS:
            variant = ARMS[n].variant
            r["C"] = _interval(acc[variant], acc[n])
            r["speed_C"] = {t: crossing(thr[variant][t], thr[n][t], steps) for t in (STARTED, LEARNED)}
            r["reading"] = reading(r["D"], r["C"], _interval(acc[BASE], acc[variant])["estimate"],
                                   stats.above_chance(acc[n], n_q, chance))
        rows[n] = r
    return rows


def from_first(first: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The 600-step row, from the diagnostic's own per-seed numbers."""
    cfg = RetrievalConfig.from_dict(first["config"])
    R = first["rows"]
    thr = {n: {t: R[n]["dynamics"]["first_step_below"][t]["per_seed"] for t in (STARTED, LEARNED)} for n in NAMES}
    return length_rows({n: R[n]["accuracy"] for n in NAMES}, {n: R[n]["extrapolation"] for n in NAMES}, thr,
                       {n: R[n]["dynamics"]["below_floor"] for n in NAMES}, cfg.steps,
                       _n_queries(cfg), 1.0 / cfg.n_values)


def _n_queries(cfg: RetrievalConfig) -> int:
    """Queries per test condition (``evaluate.evaluate_model``: every asked key of every test context)."""
    return cfg.eval_contexts * cfg.queries


def assess(first: dict[str, Any], done: dict[LongJob, dict[str, Any]]) -> dict[str, Any]:
    """Every finished length's rows (a length is read only when all its jobs are in), the 600-step row beside."""
    cfg = RetrievalConfig.from_dict(first["config"])
    P, X, S = cfg.primary, cfg.extrapolation, cfg.test_seeds
    out: dict[str, Any] = {str(cfg.steps): from_first(first)}
    for st in STEPS:
        jobs = [j for j in jobs_for(first, (st,))]
        if not all(j in done for j in jobs):
            continue
        runs = {n: [done[LongJob(n, st, s, float(first["rows"][n]["lr"]))] for s in S] for n in NAMES}
        acc = {n: [r["conditions"][P]["accuracy"] for r in runs[n]] for n in NAMES}
        ext = {n: [r["conditions"][X]["accuracy"] for r in runs[n]] for n in NAMES}
        thr = {n: {t: [r["loss_thresholds"][t] for r in runs[n]] for t in (STARTED, LEARNED)} for n in NAMES}
        n_q = runs[BASE][0]["conditions"][P]["n_queries"]
        out[str(st)] = length_rows(acc, ext, thr, {n: sum(r["failed"] for r in runs[n]) for n in NAMES}, st, n_q,
                                   1.0 / cfg.n_values)
    return out


# ---------------------------------------------------------------------------------------------- the run
def run_longer(diag_dir: str | Path, out_dir: str | Path, steps: tuple[int, ...] = STEPS,
               options: Optional[RunOptions] = None, code_path: Optional[str] = None) -> dict[str, Any]:
    """Run (or resume) the jobs LONGER.md asks for at ``steps`` and read every finished length. ``code_path``: every
    job under that CPU code path instead of the reference's (the rounding check; its own keys and journal header)."""
    options = options or RunOptions(workers=2)
    first = first_reading(diag_dir)
    steps = check_steps(steps)
    if code_path is not None:
        first = {**first, "config": RetrievalConfig.from_dict(first["config"]).replace(
            cpu_code_path=code_path).to_dict()}
    cfg_d, dev = first["config"], options.device
    t0 = time.perf_counter()
    header = STUDY.header(config=cfg_d, lrs={n: first["rows"][n]["lr"] for n in NAMES})
    todo = jobs_for(first, steps)
    spec: JobSpec[LongJob] = JobSpec(needed=lambda d: (todo, True), run=run_longer_job,
                                     args=lambda j: (cfg_d, j.name, j.steps, j.seed, j.lr, dev), key=_key(cfg_d, dev),
                                     code_path=RetrievalConfig.from_dict(cfg_d).cpu_code_path,
                                     desc="retrieval at longer training (jobs)")
    done, ran = STUDY.journaled(spec, Path(out_dir), header, options)
    return STUDY.write(Path(out_dir), {"reference": str(diag_dir), "lengths": assess(first, done)}, done, ran, t0,
                       options)


def rebuild(diag_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """OUT's journal read back (nothing trained, finished or not): every length whose jobs are all in, as
    ``run_longer`` reads them, and how many of the jobs LONGER.md asks for are in (``complete``)."""
    first = first_reading(diag_dir)
    _, done = STUDY.read_back(out_dir, lambda h: h.get("config") == first["config"],
                              f"this study's on the configuration of {diag_dir}")
    return STUDY.rebuilt(done, jobs_for(first, STEPS), {"reference": str(diag_dir)}, lengths=assess(first, done))


def format_longer(res: dict[str, Any]) -> str:
    def iv(x: dict[str, Any]) -> str:
        return interval(x, "+.3g", empty="-", bare=" [no interval]")

    lines = ["retrieval at longer training (LONGER.md): accuracy at p48c48, D = minus the baseline, C = minus the "
             "arm's variant (95% paired t); speed = median paired difference of the first step below 1.0 / 0.3 nats "
             "(sign-test interval; negative = sooner)"]
    for st, rows in res["lengths"].items():
        lines.append(f"-- {st} steps")
        for n, r in rows.items():
            parts = [f"  {n:30s} acc {r['mean']:.3f} below floor {r['below_floor']:>2}"]
            if "D" in r:
                parts.append(f"D {iv(r['D'])}")
            if "C" in r:
                parts.append(f"C {iv(r['C'])}: {r['reading']}")
            if "speed" in r:
                parts.append(f"speed {iv(r['speed'][STARTED])} / {iv(r['speed'][LEARNED])}")
            lines.append("  ".join(parts))
    return "\n".join(lines)


def markdown_table(res: dict[str, Any]) -> str:
    """docs/retrieval.md's table of the re-reading: per finished length and name, the accuracy at p48c48, D and C
    with the arm's reading, D at p48c96, the runs below the floor, and the speed endpoint (the first step below 1.0
    and 0.3 nats, paired against the baseline: median difference and sign-test interval, negative = sooner)."""
    iv = interval
    lines = ["| steps | name | accuracy | D (minus baseline) | C (minus its variant): reading | p48c96, D | below the "
             "floor | steps to 1.0 nats, minus baseline | steps to 0.3 nats, minus baseline |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for st, rows in res["lengths"].items():
        for n, r in rows.items():
            c = f"{iv(r['C'])}: {r['reading']}" if "C" in r else ""
            sp = r.get("speed", {})
            lines.append(f"| {st} | `{n}` | {r['mean']:.3f} | {iv(r.get('D'))} | {c} | {iv(r.get('D_extrapolation'))} "
                         f"| {r['below_floor']} of {len(r['accuracy'])} | {iv(sp.get(STARTED), '+g')} | "
                         f"{iv(sp.get(LEARNED), '+g')} |")
    done, total = res.get("complete", [None, None])
    if done is not None and done < total:
        lines.append("")
        lines.append(f"Incomplete: {done} of {total} jobs are in the committed journal; a length is shown once all "
                     "its jobs are.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the classing
ANSWER_CELLS = {  # the answer table's retrieval cells (report/answer.py CELLS): name -> the row's words
    "diff_v1": "DIFF V1 (as published), with the norm",
    "v1_no_norm": "DIFF V1 without the norm",
    "v2_headwise_norm": "DIFF V2 with the norm",
    "diff_v2": "DIFF V2 (as published), without the norm",
}
CEILING = 0.99


def classify(lengths: dict[str, dict[str, dict[str, Any]]], first_steps: int = 600,
             extrapolation: bool = False) -> dict[str, dict[str, Any]]:
    """LONGER.md "How a verdict is classed", per name other than the baseline: the verdict at 600 steps (an arm's
    reading, else D's side), its status at each longer length read (survives, vanishes, reverses; "at the ceiling"
    when both sides' mean accuracy is at least 0.99), and the class once 2,400 steps are read: capability (survives),
    speed (vanishes while the 600-step speed endpoint, 1.0 nats, favours the same side), else none. ``extrapolation``:
    the same for D at the extrapolation condition (p48c96; the variants' D, no reading)."""
    base = lengths[str(first_steps)]
    out: dict[str, dict[str, Any]] = {}
    for n in NAMES[1:]:
        arm = n in ARMS and not extrapolation
        key, ref = ("C", ARMS[n].variant) if arm else ("D_extrapolation" if extrapolation else "D", BASE)
        acc = "extrapolation" if extrapolation else "accuracy"
        side = sign_of(base[n][key])
        row: dict[str, Any] = {"verdict": base[n]["reading"] if arm else {1: "above", -1: "below", 0: "none"}[side],
                               "side": side, "lengths": {}}
        for st in (str(s) for s in STEPS):
            if st not in lengths:
                continue
            r = lengths[st][n]
            now = sign_of(r[key])
            status = ("survives" if (r["reading"] == base[n]["reading"] if arm else now == side and side != 0)
                      else "vanishes" if now == 0 else "reverses" if side != 0 else "appears")
            mean = statistics.fmean(r[acc])
            ceiling = min(mean, statistics.fmean(lengths[st][ref][acc])) >= CEILING
            row["lengths"][st] = {"status": status, "at_ceiling": ceiling, "mean": mean,
                                  "estimate": r[key]["estimate"], "ci": r[key]["ci"]}
        speed = base[n]["speed_C" if arm else "speed"][STARTED]
        speed_side = -sign_of(speed)  # sooner (negative) is the good side
        last = row["lengths"].get(str(STEPS[-1]))
        if side == 0 or last is None:
            row["class"] = None if last is None else "none"
        elif last["status"] == "survives":
            row["class"] = "capability"
        elif last["status"] == "vanishes" and speed_side == side:
            row["class"] = "speed"
        else:
            row["class"] = "none"
        out[n] = row
    return out


def classing_table(res: dict[str, Any]) -> str:
    """The README's line per answer-table retrieval cell: its 600-step verdict, what each longer length read says,
    and the class (or "pending" while 2,400 steps are not all in)."""
    cls, ext = classify(res["lengths"]), classify(res["lengths"], extrapolation=True)
    heads = [f"{s:,} steps" for s in STEPS]
    lines = ["| retrieval cell | at 600 steps | " + " | ".join(heads) + " | reading |",
             "| --- | --- | " + " | ".join("---" for _ in STEPS) + " | --- |"]
    rows = [(cls[n], n, words) for n, words in ANSWER_CELLS.items()]
    rows += [(ext[n], n, f"{words.split(' (')[0]} beyond the trained length (p48c96)")
             for n, words in ANSWER_CELLS.items() if n not in ARMS]
    for c, _n, words in rows:
        cells = []
        for s in STEPS:
            x = c["lengths"].get(str(s))
            if x is None:
                cells.append("running")
                continue
            lo, hi = x["ci"]
            cells.append(f"{x['status']}{' (at the ceiling)' if x['at_ceiling'] else ''}: {x['estimate']:+.3f} "
                         f"[{lo:+.3f}, {hi:+.3f}], accuracy {x['mean']:.3f}")
        sides = {"above": "better than the baseline", "below": "worse than the baseline", "none": "no difference"}
        verdict = sides.get(c["verdict"], c["verdict"])  # an arm's reading as it is
        reading = {"capability": "**capability**", "speed": "**speed**", "none": "neither (see the lengths)",
                   None: "pending"}[c["class"]]
        lines.append(f"| {words} | {verdict} | " + " | ".join(cells) + f" | {reading} |")
    return "\n".join(lines)
