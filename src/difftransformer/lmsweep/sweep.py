"""``run_lm_sweep``: the pre-registered language-model sweep (PROTOCOL.md) into OUT/sweep.json and three plots.

The tokens are prepared once into OUT/data (the preset's [data] section); ``analysis.needed_jobs`` declares the jobs,
the job runner (``difftransformer.jobs``: local worker processes or a Ray cluster, one torch thread each) runs them
and journals each one in OUT/lm-jobs.jsonl, so a killed sweep resumes with its unfinished jobs only and ends with the
same results. A failed job (OUT/failed/KEY.txt) or ``--time-limit`` ends the run with ``jobs.Incomplete`` once the
other jobs are journaled, before any analysis: no sweep.json is computed from a partial set.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np

from ..jobs import JobSpec, Journal, RunOptions, device_key, job_key, open_executor, run_jobs
from ..model import variants as registry
from ..rundir.files import (
    LM_SWEEP_JOURNAL,
    LM_SWEEP_LR_PNG,
    LM_SWEEP_PARAMS_PNG,
    LM_SWEEP_TOKENS_PNG,
    SWEEP_RESULTS_NAME,
)
from ..studies.schema import write_checked
from .analysis import Choices, Job, assemble, needed_jobs, rounding_jobs
from .config import LMSweepConfig
from .sweep_schema import LM_SWEEP_BENCHMARK, validate_lm_run, validate_lm_sweep

PROTOCOL_VERSION = 2  # in every job key and the journal header: a journal of another version is refused
JOURNAL = LM_SWEEP_JOURNAL


def job_description(cfg: LMSweepConfig, data_fingerprint: str, job: Job, device: str = "cpu") -> dict[str, Any]:
    """Everything that determines a job's result (its journal key is this, hashed); on a GPU the device and its
    precision too (``jobs.device_key``: nothing for the CPU, whose keys are those of before)."""
    return {"protocol_version": PROTOCOL_VERSION, "config": cfg.to_dict(), "data": data_fingerprint, "job": list(job),
            **device_key(device)}


def refuse_other_version(path: Path) -> None:
    """A journal written under another protocol version is refused in one line (its jobs answer other rules; the
    job keys differ too, so nothing would be reused): before the runner's own "another configuration" check."""
    if not path.is_file():
        return
    from ..jobs import read_journal as read
    try:
        header, _ = read(path)
    except ValueError:
        return  # not a journal: the runner's own check refuses it
    if header.get("benchmark") == "language-model sweep" and header.get("protocol_version") != PROTOCOL_VERSION:
        raise ValueError(f"{path} is a protocol version {header.get('protocol_version')} journal; this is version "
                         f"{PROTOCOL_VERSION}, whose jobs do not mix with it: give another --out")


def prepare(cfg: LMSweepConfig, out: Path, progress: bool):
    """The preset's tokens in OUT/data (reused when already there) and their fingerprint. Windows the tokens cannot
    hold (``job.check_windows``: every job would fail on them) are refused here, before any job."""
    from ..data.shards import prepare_data
    from .job import check_windows
    tc = _first_job_config(cfg, out)
    data = prepare_data(tc.data, out / "data", progress)
    check_windows(cfg, data.num_tokens)
    return data, *identity(cfg, out)


def identity(cfg: LMSweepConfig, out: Path) -> tuple[str, int]:
    """What ``prepare`` returns but the tokens: their fingerprint and the vocabulary size, both from the
    configuration (a rebuild from a whole journal needs no tokens; a reference's fingerprint is checked before they
    are made)."""
    from ..data.shards import fingerprint
    tc = _first_job_config(cfg, out)
    return fingerprint(tc.data), tc.model.vocab_size


def _first_job_config(cfg: LMSweepConfig, out: Path):
    """The training config of the sweep's first job, its data in OUT/data: what every job's tokens are."""
    from .job import train_config
    return train_config(cfg, cfg.widths[0], cfg.variants[0], cfg.seed_base, cfg.lr_grid[0], str(out / "data"))


def run_lm_sweep(cfg: LMSweepConfig, out_dir: str | Path, workers: int = 2, progress: bool = True,
                 options: Optional[RunOptions] = None, choices: Optional[Choices] = None,
                 rebuild_only: bool = False) -> dict[str, Any]:
    """Run (or resume) every job of the protocol, decide, and write OUT/sweep.json and the plots. ``options``: how
    the jobs run (default: ``workers`` local processes, ``progress``). ``choices``: a reference run's lr choices
    (``reference_choices``): only the rounding check's chosen scope runs (``analysis.rounding_jobs``), decided at
    those lrs; the same journal keys as the whole sweep's, so a later run without them completes it.
    ``rebuild_only``: OUT's journal holds every job (a committed sweep): read it, prepare no tokens, and raise a
    ValueError, before training anything, at the first job it lacks."""
    options = options or RunOptions(workers=workers, progress=progress)
    refuse_other_version(Path(out_dir) / JOURNAL)  # before the executor starts and the tokens are prepared
    from ..data.corpus import check_sources
    check_sources(list(cfg.data), "--data")  # your own corpus: every path there, before OUT is made
    ex = open_executor(cfg.cpu_code_path, options)  # a refusal (no GPU, no cluster) before the tokens are prepared
    try:
        return _run(cfg, Path(out_dir), options, ex, choices, rebuild_only)
    finally:
        ex.close()


def _run(cfg: LMSweepConfig, out: Path, options: RunOptions, ex: Any, choices: Optional[Choices],
         rebuild_only: bool = False) -> dict[str, Any]:
    """``run_lm_sweep`` on the opened executor ``ex``."""
    from .job import run_job
    dev = options.device
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if rebuild_only:
        (fp, vocab), data_dir = identity(cfg, out), ""
    else:
        data, fp, vocab = prepare(cfg, out, options.progress)
        data_dir = str(data.directory)
    cap = math.log(vocab)
    header = {"benchmark": "language-model sweep", "protocol_version": PROTOCOL_VERSION, "config": cfg.to_dict(),
              "data": fp}
    journal = Journal(out / JOURNAL, header, validate_lm_run)  # every record an LmSweepRun
    cfg_d = cfg.to_dict()
    scoped = None if choices is None else rounding_jobs(cfg, choices)

    def args(j: Job) -> tuple:
        if rebuild_only:
            raise ValueError(f"{out / JOURNAL} lacks the job {' '.join(map(str, j))}: a rebuild trains nothing")
        return (cfg_d, data_dir, *j, dev)
    spec: JobSpec[Job] = JobSpec(needed=lambda d: needed_jobs(cfg, d, cap) if scoped is None else (scoped, True),
                                 run=run_job,
                                 args=args,
                                 key=lambda j: job_key(job_description(cfg, fp, j, dev)), code_path=cfg.cpu_code_path,
                                 desc="language-model sweep (jobs)")
    done, ran = run_jobs(spec, journal, options, ex)
    res: dict[str, Any] = {"benchmark": LM_SWEEP_BENCHMARK, "protocol_version": PROTOCOL_VERSION,
                           "config": cfg.to_dict(), "tokens_per_run": cfg.steps * cfg.batch * cfg.seq_len,
                           **assemble(cfg, done, cap, choices=choices)}
    if choices is not None:
        res["rounding_scope"] = "chosen: the reference run's lr choices, not replayed (PROTOCOL.md, Clarifications)"
    res["timings"] = {"wall_s": time.perf_counter() - t0, "workers": options.workers, **options.describe(),
                      "jobs": len(done), "jobs_run": ran,
                      "job_cpu_s": sum(r.get("train_cpu_s", 0.0) for r in done.values())}
    from ..studies.report import protocol_deviations
    res["deviations"] = protocol_deviations(Path(__file__).with_name("PROTOCOL.md"))
    res["verdict_rows"], res["sensitivity_rows"] = verdict_rows(res), sensitivity_rows(res)  # what the report draws
    write_checked(out / SWEEP_RESULTS_NAME, res, validate_lm_sweep)  # the schema the readers take
    plot_all(res, out)
    return res


# ---------------------------------------------------------------------------------------------- plots
def plot_all(res: dict[str, Any], out: Path) -> list[Path]:
    return [plot_params(res, out / LM_SWEEP_PARAMS_PNG), plot_tokens(res, out / LM_SWEEP_TOKENS_PNG),
            plot_lr(res, out / LM_SWEEP_LR_PNG)]


def plot_params(res: dict[str, Any], path: Path) -> Path:
    """Fig. 3a: test-half loss against non-embedding parameters (seed mean +- sd at each variant's lr), the fits."""
    from ..eval.plotting import color, label
    from ..studies.report import plt, save
    from .fits import fit_loglinear
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for v, rows in res["table"].items():
        n = [r["params_non_embedding"] for r in rows]
        loss = np.array([r["test_loss"] for r in rows], dtype=float)
        ax.errorbar(n, loss.mean(1), yerr=loss.std(1, ddof=1) if loss.shape[1] > 1 else None, marker="o", capsize=3,
                    ls="none", label=label(v), color=color(v))
        a, b = fit_loglinear(n, loss.mean(1))
        xs = np.geomspace(min(n), max(n), 50)
        ax.plot(xs, a + b * np.log(xs), color=color(v), lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters")
    ax.set_ylabel("validation loss (test half)")
    ax.set_title("Fig. 3a at CPU scale: each variant at its lr per width, seed mean +- sd", fontsize=9)
    ax.legend(fontsize=8)
    return save(fig, path)


def plot_tokens(res: dict[str, Any], path: Path) -> Path:
    """Fig. 3b: the largest width's test-half loss curves against training tokens (seed mean, band: min-max)."""
    from ..eval.plotting import color, label
    from ..studies.report import plt, save
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    base = registry.reference().name
    for v, c in res["curves"].items():
        y = np.array(c["test_loss"], dtype=float)
        ax.plot(c["tokens"], y.mean(0), color=color(v), label=label(v), marker=".")
        ax.fill_between(c["tokens"], y.min(0), y.max(0), color=color(v), alpha=0.15)
    ax.axhline(float(np.mean([c[-1] for c in res["curves"][base]["test_loss"]])), color="k", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss (test half)")
    ax.set_title(f"Fig. 3b at CPU scale: d_model {max(res['widths'])}, dotted: the baseline's final loss", fontsize=9)
    ax.legend(fontsize=8)
    return save(fig, path)


def plot_lr(res: dict[str, Any], path: Path) -> Path:
    """Loss against learning rate at every width (seed mean of the test half; diverged runs at the cap)."""
    from ..eval.plotting import color, label
    from ..studies.report import plt, save
    ws = res["widths"]
    fig, axes = plt.subplots(1, len(ws), figsize=(2.6 * len(ws), 3.0), sharey=False)
    for ax, (i, w) in zip(np.atleast_1d(axes), enumerate(ws)):
        for v, rows in res["table"].items():
            g = rows[i]["grid"]
            ax.plot([s["lr"] for s in g], [s["test_loss"] for s in g], marker="o", color=color(v), label=label(v))
            ax.plot([rows[i]["lr"]], [min(s["test_loss"] for s in g if s["lr"] == rows[i]["lr"])], marker="*",
                    ms=11, color=color(v), ls="none")
        ax.set_xscale("log", base=2)
        lrs = sorted({s["lr"] for v in res["table"] for s in res["table"][v][i]["grid"]})
        ax.set_xticks(lrs, [f"{x:g}" for x in lrs], fontsize=7)
        ax.minorticks_off()
        ax.set_title(f"d_model {w}", fontsize=9)
        ax.set_xlabel("peak lr")
    np.atleast_1d(axes)[0].set_ylabel("validation loss (test half)")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.suptitle("loss against learning rate (star: the lr chosen on the tuning half)", fontsize=9)
    return save(fig, path)


# ---------------------------------------------------------------------------------------------- text
def _fmt(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    return f"{x:+.3f}" if abs(x) < 10 else f"{x:.3g}"


def _ratio(x: Any) -> str:
    if x is None:
        return "n/a"
    return ">1 (not reached)" if x == "inf" else (f"{x:.3f}" if abs(x) < 1e6 else f"{x:.3g}")  # a flat fit: 1e+17


class VerdictRow(NamedTuple):
    """One counted verdict as sweep.json's ``verdict_rows`` holds it (a list there, in this order)."""

    endpoint: str
    variant: str
    estimate: str  # "estimate [95% interval]"
    n: str
    verdict: str
    paper: str  # the paper's value or claim


class SensitivityRow(NamedTuple):
    """One sensitivity row (not a verdict) as sweep.json's ``sensitivity_rows`` holds it."""

    endpoint: str
    variant: str
    estimate: str
    verdict: str


def verdict_rows(res: dict[str, Any]) -> list[VerdictRow]:
    """Every pre-registered endpoint's row, (a) at the largest width first."""
    big = str(max(res["widths"]))
    rows = []
    for v, e in res["endpoints"].items():
        def diffrow(name: str, d: dict[str, Any], ref: str, v: str = v) -> None:
            rows.append(VerdictRow(name, v, f"{_fmt(d['estimate'])} [{_fmt(d['ci'][0])}, {_fmt(d['ci'][1])}]",
                                   str(d.get("n", len(res["seeds"]))), d["verdict"], ref))

        def ratiorow(name: str, d: dict[str, Any], ref: str, v: str = v) -> None:
            rows.append(VerdictRow(name, v, f"{_ratio(d['estimate'])} [{_ratio(d['ci'][0])}, {_ratio(d['ci'][1])}]",
                                   str(len(res["seeds"])), d["verdict"], ref))
        diffrow(f"(a) loss, d={big} (primary)", e["loss"][big], "lower (V2: -0.02 to -0.03)")
        for w in res["widths"][:-1]:
            diffrow(f"(a) loss, d={w}", e["loss"][str(w)], "lower")
        if "param_ratio" in e:  # absent from a partial rounding check's single width
            ratiorow("(b) Fig. 3a parameter ratio", e["param_ratio"], "0.62")
        ratiorow("(c) Fig. 3b token ratio", e["token_ratio"], "0.64")
        for key, name, ref in (("outliers_attention_logit", "(d) top |attention logit| ratio", "0.12"),
                               ("outliers_hidden_state", "(d) top |hidden state| ratio", "0.47")):
            d = e[key]
            rows.append(VerdictRow(name, v, "n/a" if d["estimate"] is None else
                                   f"{d['estimate']:.3f} [{d['ci'][0]:.3f}, {d['ci'][1]:.3f}]", str(d.get("n", "")),
                                   d["verdict"], ref))
        if big in e["lr_robustness"]:  # absent where its grid did not run (a rounding check's chosen scope, cut short)
            diffrow(f"(e) lr robustness, d={big}", e["lr_robustness"][big], "V2: stable at high lr")
    return rows


def sensitivity_rows(res: dict[str, Any]) -> list[SensitivityRow]:
    rows = []
    for v, e in res["endpoints"].items():
        for w in res["widths"]:
            if str(w) not in e["loss_matched_lr"]:  # its jobs did not run (a rounding check's chosen scope)
                continue
            d = e["loss_matched_lr"][str(w)]
            rows.append(SensitivityRow(f"(a) loss at the baseline's lr, d={w}", v,
                                       f"{_fmt(d['estimate'])} [{_fmt(d['ci'][0])}, {_fmt(d['ci'][1])}]", d["verdict"]))
        if "param_ratio_total" in e:
            d = e["param_ratio_total"]
            rows.append(SensitivityRow("(b) parameter ratio, total parameters", v,
                                       f"{_ratio(d['estimate'])} [{_ratio(d['ci'][0])}, {_ratio(d['ci'][1])}]",
                                       d["verdict"]))
        for w in res["widths"][:-1]:
            if str(w) not in e["lr_robustness"]:
                continue
            d = e["lr_robustness"][str(w)]
            rows.append(SensitivityRow(f"(e) lr robustness, d={w}", v, f"{_fmt(d['estimate'])} [{_fmt(d['ci'][0])}, "
                                       f"{_fmt(d['ci'][1])}]", d["verdict"]))
    return rows


def corpus(cfg_d: dict[str, Any]) -> str:
    """Which text a sweep trained on: the user's files (``--data``) or the preset's own sources."""
    if cfg_d.get("data"):
        return "your own (--data): " + ", ".join(cfg_d["data"])
    return f"the {cfg_d.get('preset', 'demo')} preset's (the embedded King James Bible unless the preset says other)"


def format_sweep(res: dict[str, Any]) -> str:
    from ..eval.plotting import label
    lines = [f"language-model sweep (protocol v{res['protocol_version']}): {len(res['seeds'])} seeds, "
             f"{res['tokens_per_run']:,} training tokens per run; test-half loss at each variant's lr (seed mean)",
             f"corpus: {corpus(res.get('config', {}))}"]
    ws = res["widths"]
    lines.append(f"{'variant':<10}" + "".join(f"{'d=' + str(w):>26}" for w in ws))
    for v, rows in res["table"].items():
        lines.append(f"{label(v):<10}" + "".join(
            f"{r['params_non_embedding']:>9,} {np.mean(r['test_loss']):.3f} lr {r['lr']:<6g}"
            + ("!" if r.get("edge") else " ") for r in rows))
    if res.get("unresolved_edges"):
        lines.append("!: unresolved edge (the lr still at an edge of its grid after the last widening): "
                     + ", ".join(f"{label(e['variant'])} d={e['width']} lr {e['lr']:g}"
                                 for e in res["unresolved_edges"]))
    for key, name in (("param_ratio", "Fig. 3a premise (baseline loss vs log non-embedding parameters)"),
                      ("token_ratio", "Fig. 3b premise (baseline loss vs log tokens, second half of the run)")):
        if key in res.get("applicability", {}):
            a = res["applicability"][key]
            lines.append(f"{name}: {'measurable' if a['measurable'] else 'NOT MEASURABLE'}; {a['why']}")
    lines.append("")
    lines.append(f"{'endpoint':<36} {'variant':<8} {'estimate [95% interval]':<34} {'n':>2}  {'verdict':<26} paper")
    for r in verdict_rows(res):
        lines.append(f"{r.endpoint:<36} {r.variant:<8} {r.estimate:<34} {r.n:>2}  {r.verdict:<26} {r.paper}")
    lines.append("")
    lines.append("sensitivity:")
    for s in sensitivity_rows(res):
        lines.append(f"  {s.endpoint:<40} {s.variant:<8} {s.estimate:<34} {s.verdict}")
    lines.append("diverged runs: " + ", ".join(f"{label(v)} {n} of {res['runs_total'][v]}"
                                               for v, n in res["diverged_runs"].items())
                 + "; above the unigram floor: " + ", ".join(f"{label(v)} {n}"
                                                             for v, n in res["failed_floor_runs"].items()))
    t = res["timings"]
    lines.append(f"{t['jobs']} jobs ({t['jobs_run']} run now), wall {t['wall_s'] / 60:.1f} min on {t['workers']} "
                 "workers")
    return "\n".join(lines)
