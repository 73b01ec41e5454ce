"""The DIFF V1 loss diagnostic (DIAGNOSTIC.md beside this file, read side by side with it).

"Arms": DIFF V1 with one ``ModelConfig`` change each (``ARMS``), trained as the sweep's jobs at its primary width.
The baseline's and DIFF V1's lr choices are the reference sweep's, read from its journal (``reference``); their runs
at those lrs are run again here (``RERUNS``; "Deviations": another machine's runs round differently), so every
comparison is between runs of one machine, and the reference's own runs give a sensitivity row.
"Learning rates, seeds, the choice": the sweep's own ``analysis.lr_choice`` with the arm as the variant.
"Endpoints and statistics": ``assess`` (D, C, share, reading). "The implementation checked once more":
``v1_scales`` (per layer: lambda, lambda_init, head-output RMS before and after the norm and the multiplier),
recorded by every DIFF V1 job; ``rerun_check``.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..jobs import JobSpec, RunOptions, device_key, job_key, open_executor, read_journal
from ..rundir.files import DIAGNOSTIC_RESULTS_NAME
from ..studies.followup import Arm, FollowUp, loss_reading
from .analysis import Job, _compare, loss_of, lr_choice, lr_scores, passed, unresolved_edge
from .config import LMSweepConfig
from .sweep_schema import validate_diagnostic, validate_lm_arm_run, validate_lm_run

VERSION = 1  # DIAGNOSTIC.md's version: in every job key and the journal header
JOURNAL = "diag-jobs.jsonl"
RESULTS = DIAGNOSTIC_RESULTS_NAME
PLOT = "diagnostic-curves.png"
# DIAGNOSTIC.md "Arms": the one change of DIFF V1 each arm makes (ModelConfig fields).
BASE, V1, V2 = "baseline", "diff_v1", "diff_v2"
ARMS: dict[str, Arm] = {
    "per_head": Arm(V1, {"v1_layout": "per_head"}),
    "no_norm": Arm(V1, {"headwise_norm": False, "headwise_norm_weight": False}),
    "lambda_08": Arm(V1, {"lambda_init": 0.8}),
    "lambda_05": Arm(V1, {"lambda_init": 0.5}),
}
# The baseline and DIFF V1 unchanged, at the reference's chosen lrs on every seed, run here ("Deviations").
RERUNS = {"baseline_rerun": BASE, "diff_v1_rerun": V1}
READINGS = ("closes the gap", "closes part of the gap", "no detectable effect", "widens the gap", "inconclusive")

# The cross-study check of the retrieval diagnostic (retrieval/DIAGNOSTIC.md, "The cross-study check"): DIFF V2 arms
# at the sweep's primary width, the baseline and DIFF V2 rerun here. The arms run are chosen by --arms (the
# pre-registered rule names v2_headwise_norm and at most one more).
V2_ARMS: dict[str, Arm] = {
    "v2_headwise_norm": Arm(V2, {"v2_headwise_norm": True}),
    "v2_lambda_scalar": Arm(V2, {"v2_lambda": "scalar"}),
    "v2_separate_keys": Arm(V2, {"v2_keys": "separate"}),
    "v2_headwise_norm_after_first": Arm(V2, {"v2_headwise_norm": True, "v2_headwise_norm_layers": "after_first"}),
}
V2_READINGS = ("costs loss", "lowers the loss", "no detectable effect", "inconclusive")


@dataclass(frozen=True)
class Spec:
    """One language-model diagnostic: the variant its arms change, the arms, the runs made again here (name ->
    variant), its version and journal name, and the per-layer measure its variant's jobs record."""

    name: str
    variant: str
    arms: dict[str, Arm]
    reruns: dict[str, str]
    version: int
    title: str
    measure: bool

    def change(self, name: str) -> dict[str, Any]:
        """A job name's ModelConfig change: an arm's, a rerun's none."""
        return self.arms[name].change if name in self.arms else {}

    @property
    def study(self) -> FollowUp[Job]:
        return FollowUp(self.title, f"{self.name}_diagnostic", self.version, JOURNAL, RESULTS, Job,
                        (int, str, int, float), validate_lm_arm_run, validate_diagnostic)


V1_SPEC = Spec("v1", V1, ARMS, RERUNS, VERSION, "DIFF V1 diagnostic", True)


def v2_spec(arms: Sequence[str] = ("v2_headwise_norm",)) -> Spec:
    """The DIFF V2 diagnostic with ``arms`` (names of ``V2_ARMS``)."""
    bad = [a for a in arms if a not in V2_ARMS]
    if bad or not arms or len(set(arms)) != len(arms):
        raise ValueError(f"--arms {','.join(arms)}: choose distinct ones of {', '.join(V2_ARMS)}")
    return Spec("v2", V2, {a: V2_ARMS[a] for a in arms}, {"baseline_rerun": BASE, "diff_v2_rerun": V2}, 1,
                "DIFF V2 diagnostic", False)


v2_reading = loss_reading  # retrieval/DIAGNOSTIC.md "The cross-study check": a V2 arm's reading from C (V2_READINGS)


# ---------------------------------------------------------------------------------------------- the reference
def reference(ref_dir: Path) -> tuple[LMSweepConfig, str, dict[Job, dict[str, Any]]]:
    """The reference sweep's configuration, data fingerprint and finished jobs (its journal, read only)."""
    from .sweep import JOURNAL as SWEEP_JOURNAL
    from .sweep import PROTOCOL_VERSION
    path = Path(ref_dir) / SWEEP_JOURNAL
    if not path.is_file():
        raise ValueError(f"--reference {ref_dir}: no {SWEEP_JOURNAL} there (give a finished lm-sweep directory)")
    try:
        header, records = read_journal(path, validate_lm_run)  # every record a sweep job's result
    except ValueError as e:
        raise ValueError(f"--reference {ref_dir}: {e}") from None
    if header.get("protocol_version") != PROTOCOL_VERSION or header.get("benchmark") != "language-model sweep":
        raise ValueError(f"--reference {ref_dir}: not a protocol version {PROTOCOL_VERSION} language-model sweep")
    cfg = LMSweepConfig.from_dict(header["config"])
    done = {Job(int(r["job"][0]), str(r["job"][1]), int(r["job"][2]), float(r["job"][3])): r["result"]
            for r in records.values()}
    return cfg, header["data"], done


def cap_of(vocab: int) -> float:
    return math.log(vocab)


# ---------------------------------------------------------------------------------------------- the jobs
def v1_scales(model, x) -> dict[str, Any]:
    """Per DIFF V1 layer on the windows ``x``: lambda (Eq. (2)), lambda_init, and the mean over tokens and heads of
    each head's output RMS over its channels before the head-wise norm, after it, and after the (1 - lambda_init)
    multiplier (what ``wo`` reads), with the RMS of the norm's weight (Eq. (3))."""
    import torch
    layers: list[dict[str, Any]] = []
    seen: dict[int, dict[str, float]] = {}
    handles = []

    def rms(t: torch.Tensor) -> float:  # per token and head over the last dim, then the mean
        return float(t.float().pow(2).mean(-1).sqrt().mean())

    for i, block in enumerate(model.layers):
        attn, rec = block.attn, seen.setdefault(i, {})
        if attn.subln is not None:
            handles.append(attn.subln.register_forward_hook(
                lambda m, a, o, rec=rec: rec.update(before_norm=rms(a[0]), after_norm=rms(o))))
        handles.append(attn.wo.register_forward_pre_hook(
            lambda m, a, attn=attn, rec=rec: rec.update(after_multiplier=rms(
                a[0].view(*a[0].shape[:-1], attn.n_heads, attn.value_dim)))))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        for i, block in enumerate(model.layers):
            attn = block.attn
            w = getattr(attn.subln, "weight", None) if attn.subln is not None else None
            layers.append({"layer": i, "lambda": float(attn.lambda_full()), "lambda_init": float(attn.lambda_init),
                           "weight_rms": None if w is None else float(w.float().pow(2).mean().sqrt()), **seen[i]})
    return {"v1_scales": layers}


def run_arm_job(cfg_d: dict, data_dir: str, width: int, arm: str, seed: int, lr: float,
                device: str = "cpu", diagnostic: str = "v1") -> dict[str, Any]:
    """One job: the diagnostic's variant with its arm's change (or a rerun's variant unchanged) trained and measured
    as a sweep job, plus ``v1_scales`` for every DIFF V1 model of the V1 diagnostic."""
    from .job import _run
    spec = V1_SPEC if diagnostic == "v1" else v2_spec(tuple(V2_ARMS))
    variant = spec.reruns.get(arm, spec.variant)
    out = _run(LMSweepConfig.from_dict(cfg_d), data_dir, width, variant, seed, lr, device,
               model_overrides=spec.change(arm), measure=v1_scales if spec.measure and variant == V1 else None)
    out["arm"] = arm
    return out


def needed_jobs(cfg: LMSweepConfig, width: int, reruns: list[Job], done: dict[Job, dict[str, Any]],
                cap: float, spec: Spec = V1_SPEC) -> tuple[list[Job], bool]:
    """The reruns, then each arm's grid on every seed, widened as the sweep's rule says; final when every choice
    is."""
    jobs, final = list(reruns), True
    for arm in spec.arms:
        c = lr_choice(cfg, width, arm, done, cap)
        jobs += [Job(width, arm, s, lr) for lr in c.grid for s in cfg.test_seeds]
        final = final and c.lr is not None
    return list(dict.fromkeys(jobs)), final


# ---------------------------------------------------------------------------------------------- endpoints
def reading(d: dict[str, Any], c: dict[str, Any], inconclusive: bool) -> str:
    """DIAGNOSTIC.md "Endpoints and statistics": the arm's reading from D's and C's intervals."""
    if inconclusive or None in c["ci"] or None in d["ci"]:
        return "inconclusive"
    c_lo, c_hi = c["ci"]
    if c_hi < 0:
        return "closes part of the gap" if d["ci"][0] > 0 else "closes the gap"
    return "widens the gap" if c_lo > 0 else "no detectable effect"


def _interval(x: dict[str, Any]) -> dict[str, Any]:
    return {k: x[k] for k in ("estimate", "ci", "n", "method")}


def assess(cfg: LMSweepConfig, width: int, ref: dict[Job, dict[str, Any]], arms: dict[Job, dict[str, Any]],
           cap: float) -> dict[str, Any]:
    """Per arm: its lr choice, D (arm - baseline), C (arm - DIFF V1), the share closed, the reading, and the
    seed-mean per-layer scales at the chosen lr, from the reruns (``RERUNS``), and the same from the reference's own
    runs (``*_reference``, the sensitivity row); the baseline's and DIFF V1's choices and D."""
    def loss(r: dict[str, Any]) -> float:
        return loss_of(r, "test_loss", cap)

    def chosen(done: dict[Job, dict[str, Any]], name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        c = lr_choice(cfg, width, name, done, cap)
        runs = [done[Job(width, name, s, c.lr)] for s in cfg.test_seeds]  # type: ignore[arg-type]
        scores = lr_scores([done[Job(width, name, s, lr)] for lr in c.grid for s in cfg.test_seeds], cap)
        return {"lr": c.lr, "grid": scores, "widened": c.widened, "unresolved_edge": unresolved_edge(cfg, c)}, runs

    def rerun(name: str, lr: float) -> list[dict[str, Any]]:
        return [arms[Job(width, name, s, lr)] for s in cfg.test_seeds]

    out: dict[str, Any] = {}
    info_b, base_ref = chosen(ref, BASE)
    info_v, v1_ref = chosen(ref, V1)
    base, v1 = rerun("baseline_rerun", info_b["lr"]), rerun("diff_v1_rerun", info_v["lr"])
    d_v1, d_v1_ref = _compare(base, v1, loss), _compare(base_ref, v1_ref, loss)
    out[BASE] = {**info_b, "params_non_embedding": base[0]["params_non_embedding"],
                 "test_loss": [loss(r) for r in base], "test_loss_reference": [loss(r) for r in base_ref]}
    out[V1] = {**info_v, "params_non_embedding": v1[0]["params_non_embedding"], "test_loss": [loss(r) for r in v1],
               "test_loss_reference": [loss(r) for r in v1_ref], "D": _interval(d_v1),
               "D_reference": _interval(d_v1_ref), "v1_scales": mean_scales(v1)}
    for arm in ARMS:
        info, runs = chosen(arms, arm)
        d, c = _compare(base, runs, loss), _compare(v1, runs, loss)
        d_ref, c_ref = _compare(base_ref, runs, loss), _compare(v1_ref, runs, loss)
        bad = not all(passed(r) for r in base + v1 + runs)
        bad_ref = not all(passed(r) for r in base_ref + v1_ref + runs)
        out[arm] = {**info, "overrides": ARMS[arm].change, "params_non_embedding": runs[0]["params_non_embedding"],
                    "test_loss": [loss(r) for r in runs], "D": _interval(d), "C": _interval(c),
                    "share_closed": (-c["estimate"] / d_v1["estimate"]) if d_v1["estimate"] else None,
                    "reading": reading(d, c, bad), "v1_scales": mean_scales(runs),
                    "D_reference": _interval(d_ref), "C_reference": _interval(c_ref),
                    "reading_reference": reading(d_ref, c_ref, bad_ref)}
    return out


def mean_scales(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The seed means of each layer's ``v1_scales`` entries, and the multiplier check's ratio."""
    per = [r["v1_scales"] for r in runs if r.get("v1_scales")]
    if not per:
        return []
    out = []
    for i, first in enumerate(per[0]):
        row: dict[str, Any] = {"layer": first["layer"], "lambda_init": first["lambda_init"]}
        for k in ("lambda", "weight_rms", "before_norm", "after_norm", "after_multiplier"):
            xs = [p[i].get(k) for p in per]
            row[k] = statistics.fmean(xs) if all(x is not None for x in xs) else None
        if row["after_norm"]:
            row["multiplier_ratio"] = row["after_multiplier"] / row["after_norm"]
        out.append(row)
    return out


def rerun_check(ref: dict[Job, dict[str, Any]], reruns: list[Job], done: dict[Job, dict[str, Any]],
                names: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Each rerun's test-half loss against the reference's run of the same job: how many are bitwise equal, the
    differences (another machine rounds differently: DIAGNOSTIC.md "Deviations"). ``names``: rerun -> variant."""
    rows = []
    for j in reruns:
        want, got = ref[Job(j.width, (names or RERUNS)[j.variant], j.seed, j.lr)], done[j]
        rows.append({"job": list(j), "reference_test_loss": want["test_loss"], "rerun_test_loss": got["test_loss"],
                     "difference": None if None in (got["test_loss"], want["test_loss"])
                     else got["test_loss"] - want["test_loss"], "bitwise_equal": want["test_loss"] == got["test_loss"],
                     "cpu_capability": [want.get("cpu_capability"), got.get("cpu_capability")]})
    diffs = [abs(r["difference"]) for r in rows if r["difference"] is not None]
    equal = sum(r["bitwise_equal"] for r in rows)
    return {"runs": rows, "bitwise_equal": equal, "of": len(rows), "largest_difference": max(diffs, default=None),
            "verdict": "reproduced bit for bit" if equal == len(rows) else
            f"{len(rows) - equal} of {len(rows)} differ from the reference (largest {max(diffs, default=0):.4f} nats)"}


# ---------------------------------------------------------------------------------------------- the run
@contextlib.contextmanager
def out_removed_on_refusal(out: Path) -> Iterator[None]:
    """OUT made (with its parents) for the block; a refusal (ValueError) inside removes it again when the block made
    it, so that a refused command leaves no directory (the refusals that need the tokens prepared in OUT)."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except ValueError:
        if made:
            shutil.rmtree(out, ignore_errors=True)
        raise


def prepare_reference_tokens(cfg: LMSweepConfig, fp: str, out: Path, ref_dir: str | Path,
                             progress: bool) -> tuple[Any, int]:
    """The reference sweep's tokens prepared in OUT (its data and vocabulary size), refused in one line, before
    they are made, when their fingerprint is not the reference's: runs on other tokens would not be comparable."""
    from .sweep import identity, prepare
    fp_here, _ = identity(cfg, out)
    if fp_here != fp:
        raise ValueError(f"--reference {ref_dir}: its data fingerprint {fp} is not this preset's tokens' "
                         f"({fp_here}); the reused runs would not be comparable")
    data, _, vocab = prepare(cfg, out, progress)
    return data, vocab


def run_diagnostic(ref_dir: str | Path, out_dir: str | Path, options: Optional[RunOptions] = None,
                   width: Optional[int] = None, spec: Spec = V1_SPEC) -> dict[str, Any]:
    """Run (or resume) every job DIAGNOSTIC.md asks for (``spec``: the V1 diagnostic, or the DIFF V2 one of
    retrieval/DIAGNOSTIC.md), decide, and write OUT/diagnostic.json (and, for V1, the plot)."""
    options = options or RunOptions(workers=2)
    cfg, fp, ref = reference(Path(ref_dir))
    width = width or cfg.largest
    out, study = Path(out_dir), spec.study
    t0 = time.perf_counter()
    ex = open_executor(cfg.cpu_code_path, options)
    try:
        with out_removed_on_refusal(out):
            data, vocab = prepare_reference_tokens(cfg, fp, out, ref_dir, options.progress)
            cap = cap_of(vocab)
            lrs = {name: lr_choice(cfg, width, variant, ref, cap).lr for name, variant in spec.reruns.items()}
            if None in lrs.values():
                raise ValueError(f"--reference {ref_dir}: the lr choice of {' or '.join(spec.reruns.values())} at "
                                 f"d_model {width} is not finished there")
        reruns = [Job(width, name, s, lr) for name, lr in lrs.items() if lr is not None for s in cfg.test_seeds]
        dev, cfg_d, data_dir = options.device, cfg.to_dict(), str(data.directory)
        header = study.header(config=cfg_d, data=fp, width=width)
        which = {} if spec.name == "v1" else {"diagnostic": spec.name}  # V1's keys as they were before V2 came
        job_spec: JobSpec[Job] = JobSpec(
            needed=lambda d: needed_jobs(cfg, width, reruns, d, cap, spec), run=run_arm_job,
            args=lambda j: (cfg_d, data_dir, j.width, j.variant, j.seed, j.lr, dev, spec.name),
            key=lambda j: job_key({"diagnostic_version": spec.version, **which, "config": cfg_d, "data": fp,
                                   "job": list(j), "overrides": spec.change(j.variant), **device_key(dev)}),
            code_path=cfg.cpu_code_path, desc=f"{spec.title} (jobs)")
        done, ran = study.journaled(job_spec, out, header, options, ex)
    finally:
        ex.close()
    arms = (assess(cfg, width, ref, done, cap) if spec.name == "v1" else
            assess_v2(cfg, width, ref, done, cap, spec))
    res = study.write(out, {"width": width, "reference": str(ref_dir), "config": cfg.to_dict(), "arms": arms,
                            "rerun": rerun_check(ref, reruns, done, spec.reruns)}, done, ran, t0, options,
                      job_cpu_s=sum(r.get("train_cpu_s", 0.0) for r in done.values()))
    if spec.name == "v1":
        plot_curves(cfg, width, done, res, out / PLOT)
    return res


def assess_v2(cfg: LMSweepConfig, width: int, ref: dict[Job, dict[str, Any]], arms: dict[Job, dict[str, Any]],
              cap: float, spec: Spec) -> dict[str, Any]:
    """retrieval/DIAGNOSTIC.md "The cross-study check": per DIFF V2 arm its lr choice, D (arm - baseline), C (arm -
    DIFF V2) and reading, from the runs made here; the baseline's and DIFF V2's (reference) choices and D."""
    def loss(r: dict[str, Any]) -> float:
        return loss_of(r, "test_loss", cap)

    def rerun(name: str, lr: float) -> list[dict[str, Any]]:
        return [arms[Job(width, name, s, lr)] for s in cfg.test_seeds]

    out: dict[str, Any] = {}
    lr_b, lr_v = lr_choice(cfg, width, BASE, ref, cap).lr, lr_choice(cfg, width, V2, ref, cap).lr
    base, v2 = rerun("baseline_rerun", lr_b), rerun("diff_v2_rerun", lr_v)  # type: ignore[arg-type]
    out[BASE] = {"lr": lr_b, "params_non_embedding": base[0]["params_non_embedding"],
                 "test_loss": [loss(r) for r in base]}
    out[V2] = {"lr": lr_v, "params_non_embedding": v2[0]["params_non_embedding"], "test_loss": [loss(r) for r in v2],
               "D": _interval(_compare(base, v2, loss))}
    for arm in spec.arms:
        c = lr_choice(cfg, width, arm, arms, cap)
        runs = [arms[Job(width, arm, s, c.lr)] for s in cfg.test_seeds]  # type: ignore[arg-type]
        scores = lr_scores([arms[Job(width, arm, s, lr)] for lr in c.grid for s in cfg.test_seeds], cap)
        d, cc = _compare(base, runs, loss), _compare(v2, runs, loss)
        bad = not all(passed(r) for r in base + v2 + runs)
        out[arm] = {"lr": c.lr, "grid": scores, "widened": c.widened, "unresolved_edge": unresolved_edge(cfg, c),
                    "overrides": spec.arms[arm].change, "params_non_embedding": runs[0]["params_non_embedding"],
                    "test_loss": [loss(r) for r in runs], "D": _interval(d), "C": _interval(cc),
                    "reading": v2_reading(cc, bad)}
    return out


def plot_curves(cfg: LMSweepConfig, width: int, arms: dict[Job, dict[str, Any]],
                res: dict[str, Any], path: Path) -> Path:
    """The seed-mean test-half curves of the baseline and DIFF V1 (their runs on this machine, ``RERUNS``: the runs D
    and C are computed from) and the arm with the lowest mean test loss."""
    import numpy as np

    from ..eval.plotting import color, pyplot, save_figure
    plt = pyplot()
    best = min(ARMS, key=lambda a: statistics.fmean(res["arms"][a]["test_loss"]))
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    for name, job_name, col, style, label in (
            (BASE, "baseline_rerun", color(BASE), "-", "baseline"), (V1, "diff_v1_rerun", color(V1), "-", "DIFF V1"),
            (best, best, color(V1), "--", f"DIFF V1, {best} (best arm)")):
        lr = res["arms"][name]["lr"]
        runs = [arms[Job(width, job_name, s, lr)] for s in cfg.test_seeds]
        steps = runs[0]["curve"]["steps"]
        mean = np.mean([r["curve"]["test_loss"] for r in runs], axis=0)
        tokens = [s * cfg.batch * cfg.seq_len for s in steps]
        ax.plot(tokens, mean, style, color=col, label=f"{label}, lr {lr:g}")
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss (test half)")
    ax.set_title(f"DIFF V1 diagnostic, d_model {width}: seed means at each one's chosen lr", fontsize=9)
    save_figure(fig, [ax], path)
    return path
