"""The head-wise norm's mechanism arms in the language model (retrieval/LONGER.md, its dated addition of 2026-12-02
00:04 UTC): ``v2_gain``, ``v2_gain_one`` and ``v1_gain`` (``ModelConfig.head_gain``) as one-change arms at the
reference sweep's largest width, each with its lr chosen over the sweep's grid by the sweep's own rule (as the
diagnostics chose their arms'), on the sweep's test seeds; journaled in OUT/lm-mechanism-jobs.jsonl.

``assess`` reads each arm against the committed diagnostics' own runs (``--diagnostics DIR``: its v1-diagnostic/ and
v2-diagnostic/), as the retrieval arms read against the committed retrieval diagnostic: D (minus that diagnostic's
baseline rerun), C (minus its variant's rerun: DIFF V2 or DIFF V1) with the V2 rule's reading (costs loss, lowers the
loss, no detectable effect), and C' (minus the variant's other form: ``v2_headwise_norm`` or ``no_norm``, each at its
chosen lr; descriptive). Lower loss is better.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from ..jobs import JobSpec, RunOptions, device_key, job_key, open_executor, read_journal
from ..rundir.files import DIAGNOSTIC_RESULTS_NAME
from ..studies.followup import Arm, FollowUp, interval
from .analysis import Job, _compare, loss_of, lr_choice, lr_scores, passed, unresolved_edge
from .config import LMSweepConfig
from .diagnostic import (
    BASE,
    V1,
    V2,
    _interval,
    cap_of,
    out_removed_on_refusal,
    prepare_reference_tokens,
    reference,
    v2_reading,
)
from .diagnostic import JOURNAL as DIAG_JOURNAL
from .schema import validate_mechanism
from .sweep_schema import validate_lm_arm_run

VERSION = 1
JOURNAL = "lm-mechanism-jobs.jsonl"
RESULTS = "lm-mechanism.json"
# arm -> its variant, its one change, C's rerun and C''s arm in the committed diagnostic it reads against
ARMS: dict[str, Arm] = {
    "v2_gain": Arm(V2, {"head_gain": "norm_start"}, "diff_v2_rerun", "v2_headwise_norm", "v2-diagnostic"),
    "v2_gain_one": Arm(V2, {"head_gain": "one"}, "diff_v2_rerun", "v2_headwise_norm", "v2-diagnostic"),
    "v1_gain": Arm(V1, {"headwise_norm": False, "headwise_norm_weight": False, "head_gain": "norm_start"},
                   "diff_v1_rerun", "no_norm", "v1-diagnostic"),
}
STUDY: FollowUp[Job] = FollowUp("language-model mechanism arms", "lm_mechanism", VERSION, JOURNAL, RESULTS, Job,
                                (int, str, int, float), validate_lm_arm_run, validate_mechanism)
# the committed diagnostics' names of what each comparison reads (their diagnostic.json "arms" keys)
CHOSEN = {"baseline_rerun": BASE, "diff_v2_rerun": V2, "diff_v1_rerun": V1}


def run_mechanism_job(cfg_d: dict, data_dir: str, width: int, arm: str, seed: int, lr: float,
                      device: str = "cpu") -> dict[str, Any]:
    """One job: the arm's variant with its change, trained and measured as a sweep job."""
    from .job import _run
    out = _run(LMSweepConfig.from_dict(cfg_d), data_dir, width, ARMS[arm].variant, seed, lr, device,
               model_overrides=ARMS[arm].change)
    out["arm"] = arm
    return out


def comparison_runs(diag_root: str | Path, cfg: LMSweepConfig, width: int) -> dict[str, dict[str, list[dict]]]:
    """Per committed diagnostic, the runs each arm is read against (the baseline rerun, the variant's rerun and the
    other form's arm, each at its chosen lr, on every test seed), from its journal; one ValueError naming
    --diagnostics when a diagnostic is missing or is not on this sweep's configuration and width."""
    from ..fileio import read_json
    out: dict[str, dict[str, list[dict]]] = {}
    for name in sorted({str(a.reads) for a in ARMS.values()}):
        d = Path(diag_root) / name
        if not (d / DIAGNOSTIC_RESULTS_NAME).is_file() or not (d / DIAG_JOURNAL).is_file():
            raise ValueError(f"--diagnostics {diag_root}: no finished {name} there (its {DIAGNOSTIC_RESULTS_NAME} and "
                             f"{DIAG_JOURNAL}; e.g. docs/results)")
        res = read_json(d / DIAGNOSTIC_RESULTS_NAME, "--diagnostics")
        if res.get("config") != cfg.to_dict() or res.get("width") != width:
            raise ValueError(f"--diagnostics {diag_root}: {name} is not on the reference sweep's configuration at "
                             f"d_model {width}")
        _, records = read_journal(d / DIAG_JOURNAL, validate_lm_arm_run)
        done = {Job(int(r["job"][0]), str(r["job"][1]), int(r["job"][2]), float(r["job"][3])): r["result"]
                for r in records.values()}
        names = {"baseline_rerun", *(a.c_name for a in ARMS.values() if a.reads == name),
                 *(str(a.other) for a in ARMS.values() if a.reads == name)}
        runs: dict[str, list[dict]] = {}
        for n in sorted(names):
            lr = float(res["arms"][CHOSEN.get(n, n)]["lr"])
            missing = [s for s in cfg.test_seeds if Job(width, n, s, lr) not in done]
            if missing:
                raise ValueError(f"--diagnostics {diag_root}: {name}'s journal lacks {n} at lr {lr:g} (seeds "
                                 f"{missing})")
            runs[n] = [done[Job(width, n, s, lr)] for s in cfg.test_seeds]
        out[name] = runs
    return out


def needed_jobs(cfg: LMSweepConfig, width: int, done: dict[Job, dict[str, Any]], cap: float) -> tuple[list[Job], bool]:
    jobs, final = [], True
    for arm in ARMS:
        c = lr_choice(cfg, width, arm, done, cap)
        jobs += [Job(width, arm, s, lr) for lr in c.grid for s in cfg.test_seeds]
        final = final and c.lr is not None
    return list(dict.fromkeys(jobs)), final


def assess(cfg: LMSweepConfig, width: int, runs_of: dict[str, dict[str, list[dict]]], done: dict[Job, dict],
           cap: float) -> dict[str, Any]:
    """Per arm whose lr choice is final: its lr, the grid's scores, D, C with the reading, C' (descriptive)."""
    def loss(r: dict[str, Any]) -> float:
        return loss_of(r, "test_loss", cap)

    rows: dict[str, Any] = {}
    for arm, a in ARMS.items():
        variant, overrides, diag, c_name, c2_name = a.variant, a.change, str(a.reads), a.c_name, str(a.other)
        c = lr_choice(cfg, width, arm, done, cap)
        if c.lr is None:
            continue
        runs = [done[Job(width, arm, s, c.lr)] for s in cfg.test_seeds]
        ref = runs_of[diag]
        base, var, other = ref["baseline_rerun"], ref[c_name], ref[c2_name]
        cc = _compare(var, runs, loss)
        bad = not all(passed(r) for r in base + var + runs)
        rows[arm] = {"lr": c.lr, "variant": variant, "overrides": overrides, "against": diag,
                     "grid": lr_scores([done[Job(width, arm, s, lr)] for lr in c.grid for s in cfg.test_seeds], cap),
                     "widened": c.widened, "unresolved_edge": unresolved_edge(cfg, c),
                     "test_loss": [loss(r) for r in runs], "failed": sum(not passed(r) for r in runs),
                     "D": _interval(_compare(base, runs, loss)), "C": _interval(cc), "C_against": CHOSEN[c_name],
                     "reading": v2_reading(cc, bad), "C2": _interval(_compare(other, runs, loss)),
                     "C2_against": c2_name}
    return rows


def _key(cfg_d: dict[str, Any], fp: str, dev: str):
    def key(j: Job) -> str:
        return job_key({"lm_mechanism_version": VERSION, "config": cfg_d, "data": fp, "job": list(j),
                        "overrides": ARMS[j.variant].change, **device_key(dev)})
    return key


def run_mechanism(ref_dir: str | Path, diag_root: str | Path, out_dir: str | Path,
                  options: Optional[RunOptions] = None) -> dict[str, Any]:
    """Run (or resume) every job of the addition and read the arms."""
    options = options or RunOptions(workers=2)
    cfg, fp, _ = reference(Path(ref_dir))
    width = cfg.largest
    runs_of = comparison_runs(diag_root, cfg, width)  # before OUT is made
    out = Path(out_dir)
    t0 = time.perf_counter()
    ex = open_executor(cfg.cpu_code_path, options)
    try:
        with out_removed_on_refusal(out):
            data, vocab = prepare_reference_tokens(cfg, fp, out, ref_dir, options.progress)
        cap = cap_of(vocab)
        dev, cfg_d, data_dir = options.device, cfg.to_dict(), str(data.directory)
        header = STUDY.header(config=cfg_d, data=fp, width=width, vocab=vocab)
        spec: JobSpec[Job] = JobSpec(
            needed=lambda d: needed_jobs(cfg, width, d, cap), run=run_mechanism_job,
            args=lambda j: (cfg_d, data_dir, j.width, j.variant, j.seed, j.lr, dev), key=_key(cfg_d, fp, dev),
            code_path=cfg.cpu_code_path, desc="language-model mechanism arms (jobs)")
        done, ran = STUDY.journaled(spec, out, header, options, ex)
    finally:
        ex.close()
    return STUDY.write(out, {"reference": str(ref_dir), "diagnostics": str(diag_root), "width": width,
                             "rows": assess(cfg, width, runs_of, done, cap)}, done, ran, t0, options)


def rebuild(ref_dir: str | Path, diag_root: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """OUT's journal read back (nothing trained, finished or not), with how many of the jobs asked for are in."""
    cfg, _fp, _ = reference(Path(ref_dir))
    width = cfg.largest
    header, done = STUDY.read_back(out_dir, lambda h: h.get("config") == cfg.to_dict(),
                                   f"the language-model mechanism arms' on {ref_dir}")
    cap = cap_of(int(header["vocab"]))
    return STUDY.rebuilt(done, needed_jobs(cfg, width, done, cap)[0], {"width": width},
                         rows=assess(cfg, width, comparison_runs(diag_root, cfg, width), done, cap))


def format_mechanism(res: dict[str, Any]) -> str:
    lines = [f"language-model mechanism arms (LONGER.md), d_model {res['width']}: test-half loss; D = minus the "
             "baseline, C = minus the variant (reading), C' = minus the variant's other form (lower is better)"]
    for arm, r in res["rows"].items():
        lines.append(f"  {arm:12s} lr {r['lr']:<6g} D {interval(r['D'])}  C ({r['C_against']}) {interval(r['C'])}: "
                     f"{r['reading']}  C' ({r['C2_against']}) {interval(r['C2'])}")
    return "\n".join(lines)


def markdown_table(res: dict[str, Any]) -> str:
    lines = ["| arm | lr | D (minus baseline) | C (minus its variant): reading | C' (minus the variant's other form) | "
             "runs below the floor |", "| --- | --- | --- | --- | --- | --- |"]
    for arm, r in res["rows"].items():
        lines.append(f"| `{arm}` | {r['lr']:g} | {interval(r['D'])} | {interval(r['C'])} against `{r['C_against']}`: "
                     f"{r['reading']} | {interval(r['C2'])} against `{r['C2_against']}` | {r['failed']} of "
                     f"{len(r['test_loss'])} |")
    done, total = res.get("complete", [None, None])
    if done is not None and done < total:
        lines += ["", f"Incomplete: {done} of {total} jobs are in the committed journal; an arm is shown once its lr "
                      "choice is final."]
    elif not res["rows"]:
        lines += ["", "Not yet run."]
    return "\n".join(lines)
