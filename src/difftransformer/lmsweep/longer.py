"""The language model at 2x the tokens (retrieval/LONGER.md, its dated addition of 2026-12-01 17:00 UTC).

The answer table's language-model names (the baseline, DIFF V1, DIFF V1 without its head-wise norm, DIFF V2, DIFF V2
with the norm) at the sweep's largest width, trained ``FACTOR`` times the steps of the reference sweep (the lr
schedule stretched) at the lr each chose at 1x in its diagnostic (``LRS``, fixed by the pre-registration), on the
sweep's test seeds; journaled in OUT/lm-longer-jobs.jsonl. ``assess``: the test-half loss, D (minus the baseline),
C (the arms minus their variant) and the diagnostics' readings; beside them the 1x values of the committed
diagnostics (``first``), so a verdict can be read as surviving or vanishing with training.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional

from ..jobs import JobSpec, RunOptions, device_key, job_key, open_executor
from ..studies.followup import Arm, FollowUp, interval, loss_reading, paired, sign_of
from .config import LMSweepConfig
from .diagnostic import (
    ARMS,
    BASE,
    V1,
    V2,
    V2_ARMS,
    cap_of,
    loss_of,
    out_removed_on_refusal,
    passed,
    prepare_reference_tokens,
    reference,
)
from .schema import validate_longer
from .sweep_schema import validate_lm_arm_run

VERSION = 1  # LONGER.md's language-model addition: in every job key and the journal header
JOURNAL = "lm-longer-jobs.jsonl"
RESULTS = "lm-longer.json"
FACTOR = 2
# name -> its variant and one ModelConfig change: the answer table's language-model cells
NAMES: dict[str, Arm] = {
    BASE: Arm(BASE, {}), V1: Arm(V1, {}), "no_norm": ARMS["no_norm"],
    V2: Arm(V2, {}), "v2_headwise_norm": V2_ARMS["v2_headwise_norm"],
}
# LONGER.md: each name's lr chosen at 1x in its diagnostic (docs/results/v1-diagnostic, v2-diagnostic); a test
# checks these against the committed files
LRS = {BASE: 8e-3, V1: 4e-3, "no_norm": 8e-3, V2: 8e-3, "v2_headwise_norm": 4e-3}
ARM_OF = {"no_norm": V1, "v2_headwise_norm": V2}  # an arm -> its variant (C)


class LongJob(NamedTuple):
    name: str
    steps: int
    seed: int
    lr: float


STUDY: FollowUp[LongJob] = FollowUp("language-model longer training", "lm_longer", VERSION, JOURNAL, RESULTS, LongJob,
                                    (str, int, int, float), validate_lm_arm_run, validate_longer)


def run_longer_job(cfg_d: dict, data_dir: str, width: int, name: str, steps: int, seed: int, lr: float,
                   device: str = "cpu") -> dict[str, Any]:
    """One job: the name's variant with its change, trained ``steps`` steps and measured as a sweep job."""
    from .job import _run
    out = _run(LMSweepConfig.from_dict({**cfg_d, "steps": steps}), data_dir, width, NAMES[name].variant, seed, lr,
               device, model_overrides=NAMES[name].change)
    out["arm"] = name
    return out


def _interval(base: list[float], other: list[float]) -> dict[str, Any]:
    return paired(base, other, higher_is_better=False)


reading = loss_reading  # the V2 language-model rule on C


def assess(cfg: LMSweepConfig, steps: int, done: dict[LongJob, dict[str, Any]], cap: float) -> dict[str, Any]:
    """Per name at ``steps``: the test-half losses, D and (arms) C with the reading; None while jobs are missing."""
    jobs = {n: [LongJob(n, steps, s, LRS[n]) for s in cfg.test_seeds] for n in NAMES}
    if not all(j in done for js in jobs.values() for j in js):
        return {}
    runs = {n: [done[j] for j in js] for n, js in jobs.items()}
    loss = {n: [loss_of(r, "test_loss", cap) for r in rs] for n, rs in runs.items()}
    rows: dict[str, Any] = {}
    for n in NAMES:
        bad = not all(passed(r) for r in runs[n] + runs[BASE])
        row: dict[str, Any] = {"lr": LRS[n], "test_loss": loss[n], "mean": statistics.fmean(loss[n]),
                               "failed": sum(not passed(r) for r in runs[n])}
        if n != BASE:
            row["D"] = _interval(loss[BASE], loss[n])
            row["reading_D"] = reading(row["D"], bad)
        if n in ARM_OF:
            row["C"] = _interval(loss[ARM_OF[n]], loss[n])
            row["reading"] = reading(row["C"], bad or not all(passed(r) for r in runs[ARM_OF[n]]))
        rows[n] = row
    return rows


def run_longer(ref_dir: str | Path, out_dir: str | Path, options: Optional[RunOptions] = None) -> dict[str, Any]:
    """Run (or resume) every job of the addition and read them."""
    options = options or RunOptions(workers=2)
    cfg, fp, _ = reference(Path(ref_dir))
    width, steps = cfg.largest, FACTOR * cfg.steps
    out = Path(out_dir)
    t0 = time.perf_counter()
    cfg_d = cfg.to_dict()
    header = STUDY.header(config=cfg_d, data=fp, width=width, steps=steps)
    journal = STUDY.open_journal(out, header)  # a journal of another shape: refused before tokens
    ex = open_executor(cfg.cpu_code_path, options)
    try:
        with out_removed_on_refusal(out):
            data, vocab = prepare_reference_tokens(cfg, fp, out, ref_dir, options.progress)
        dev, data_dir = options.device, str(data.directory)
        todo = [LongJob(n, steps, s, LRS[n]) for s in cfg.test_seeds for n in NAMES]
        spec: JobSpec[LongJob] = JobSpec(
            needed=lambda d: (todo, True), run=run_longer_job,
            args=lambda j: (cfg_d, data_dir, width, j.name, j.steps, j.seed, j.lr, dev),
            key=lambda j: job_key({"lm_longer_version": VERSION, "config": {**cfg_d, "steps": j.steps}, "data": fp,
                                   "width": width, "job": list(j), "overrides": NAMES[j.name].change,
                                   **device_key(dev)}),
            code_path=cfg.cpu_code_path, desc="language model at 2x the tokens (jobs)")
        done, ran = STUDY.journaled(spec, out, header, options, ex, journal)
    finally:
        ex.close()
    return STUDY.write(out, {"reference": str(ref_dir), "width": width, "steps": steps,
                             "rows": assess(cfg, steps, done, cap_of(vocab))}, done, ran, t0, options)


def format_longer(res: dict[str, Any]) -> str:
    lines = [f"language model at {res['steps']} steps (2x the sweep's tokens), d_model {res['width']}: test-half "
             "loss, D = minus the baseline, C = the arm minus its variant (95% paired t)"]
    for n, r in res["rows"].items():
        d = f"  D {interval(r['D'])}" if "D" in r else ""
        c = f"  C {interval(r['C'])}: {r['reading']}" if "C" in r else ""
        lines.append(f"  {n:18s} lr {r['lr']:<6g} loss {r['mean']:.4f}{d}{c}" + ("" if math.isfinite(r["mean"])
                                                                                    else "  (diverged)"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the classing
def first_d(results: Path) -> dict[str, dict[str, Any]]:
    """Each name's D (minus the baseline) at 1x from the committed diagnostics (``docs/results``)."""
    from ..fileio import read_json
    v1 = read_json(results / "v1-diagnostic" / "diagnostic.json")["arms"]
    v2 = read_json(results / "v2-diagnostic" / "diagnostic.json")["arms"]
    return {V1: v1[V1]["D"], "no_norm": v1["no_norm"]["D"], V2: v2[V2]["D"], "v2_headwise_norm":
            v2["v2_headwise_norm"]["D"]}


def classing_table(results: Path, out: Path) -> str:
    """docs/lm-sweep.md's table: each name's D at 1x (the committed diagnostics) and at 2x the tokens, and whether
    the verdict survives, vanishes or reverses (retrieval/LONGER.md's rule on the test-half loss); "running" while
    the committed re-reading is not finished (no OUT/lm-longer.json)."""
    first = first_d(results)
    path = out / RESULTS
    from .schema import read
    res = read(path, validate_longer) if path.is_file() else None  # another shape: one error, never "running"
    rows = (res or {}).get("rows") or {}
    n = sum(1 for _ in (out / JOURNAL).open()) - 1 if (out / JOURNAL).is_file() else 0

    lines = ["| name | D at 1x (300 steps) | D at 2x (600 steps) | the verdict at 2x |", "| --- | --- | --- | --- |"]
    for name, d1 in first.items():
        if name not in rows:
            lines.append(f"| `{name}` | {interval(d1)} | running | |")
            continue
        d2, side = rows[name]["D"], sign_of(d1)
        now = sign_of(d2)
        status = ("survives" if now == side and side else "vanishes" if now == 0 else "reverses" if side else
                  "appears")
        lines.append(f"| `{name}` | {interval(d1)} | {interval(d2)} | {status} |")
    if not rows:
        lines += ["", f"Running: {n} of {len(NAMES) * 5} jobs in the committed journal."]
    return "\n".join(lines)
