"""The report's run loop: load the runs, run every analysis spec on them, plot, judge, write the page."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch

from ..eval.analyses import MULTI_RUN, PER_RUN
from ..eval.loading import EvalModel, load_for_eval
from ..eval.spec import AnalysisSpec
from ..fileio import atomic_write
from ..log import progress_bar
from ..rundir import RESULTS_NAME
from ..rundir.studies import read_lm_sweep, read_retrieval
from .html import analysis_section, image, render_html, table
from .results import RunResults, Settings
from .retrieval import retrieval_verdicts
from .retrieval import section as retrieval_section
from .training import TRAINING_HEADER, plot_training, training_summary, training_table
from .verdicts import verdicts

# An analysis that raises one of these on one model is recorded on the page ("not measured because"), not fatal:
# e.g. a context too short for the task.
ANALYSIS_ERRORS = (ImportError, ValueError, RuntimeError)


def run_analysis(spec: AnalysisSpec, ev: EvalModel | Sequence[EvalModel], settings: Settings) -> dict[str, Any]:
    """One analysis with the report's quick or full settings."""
    return spec.run(ev, spec.settings(settings.quick), settings.seed, progress=settings.progress)


def evaluate_runs(evs: Sequence[EvalModel], settings: Settings) -> list[RunResults]:
    """Every per-run analysis on every model. An analysis that fails on one model is recorded, not fatal."""
    out = []
    bar = progress_bar(total=len(evs) * len(PER_RUN), desc="report", disable=not settings.progress, unit="analysis")
    for ev in evs:
        rr = RunResults(ev, training_summary(ev))
        for spec in PER_RUN:
            bar.set_postfix_str(f"{ev.label}: {spec.name}")
            try:
                rr.results[spec.name] = run_analysis(spec, ev, settings)
            except ANALYSIS_ERRORS as e:
                rr.errors[spec.name] = f"{type(e).__name__}: {e}"
            bar.update()
        out.append(rr)
    bar.close()
    return out


def _multi_run(runs: Sequence[RunResults], settings: Settings, out: Path,
               figures: dict[str, Path]) -> dict[str, Any]:
    """The multi-run analyses (attnmap) over the first run of each variant; a failure is noted on the first run."""
    first: dict[str, EvalModel] = {}
    for r in runs:
        first.setdefault(r.attention, r.ev)
    results: dict[str, Any] = {}
    for spec in MULTI_RUN:
        results[spec.name] = None
        try:
            res = run_analysis(spec, list(first.values()), settings)
            results[spec.name] = res
            if spec.plot is not None:
                spec.plot(res, out / f"{spec.name}.png")
                figures[spec.name] = out / f"{spec.name}.png"
        except ANALYSIS_ERRORS as e:
            if runs:
                runs[0].errors[spec.name] = f"{type(e).__name__}: {e}"
    return results


def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path, quick: bool = True, seed: int = 0,
                 progress: bool = True, preface: str = "", retrieval_dir: Optional[str | Path] = None,
                 lm_sweep_dir: Optional[str | Path] = None,
                 lm_sweep_provenance: Optional[dict[str, Any]] = None, answer: Optional[str] = None,
                 device: str | torch.device = "cpu") -> Path:
    """Evaluate ``run_dirs`` and write ``out_dir/report.html`` (returned) and ``out_dir/results.json``.

    ``retrieval_dir``: the output directory of ``difftransformer retrieval`` (its ``results.json`` and plots), shown
    first on the page with its own verdicts. ``lm_sweep_dir``: the output directory of ``difftransformer lm-sweep``
    (its ``sweep.json`` and plots), shown after it with its own verdicts; ``lm_sweep_provenance``: where that sweep's
    results come from when they are committed ones, not measured by this run (``lmsweep.committed.provenance``): the
    section then says so first. ``preface``: a paragraph of text (`code` spans allowed) under the title. ``answer``:
    the HTML of the committed answer table (``report.answer.section``), shown first. ``device``: where the models
    run (the CLI's ``--device``, checked by ``loading.device_arg``)."""
    from .. import __version__

    if not run_dirs:
        raise ValueError("report: give at least one RUN_DIR")
    # the studies' outputs first: a file of the wrong shape is one line before any model is read
    bench = read_retrieval(retrieval_dir, "--retrieval") if retrieval_dir is not None else None
    sweep = read_lm_sweep(lm_sweep_dir, "--lm-sweep") if lm_sweep_dir is not None else None
    evs = [load_for_eval(p, device) for p in run_dirs]
    vocab = {ev.tokenizer.get_vocab_size() for ev in evs}
    if len(vocab) > 1:
        raise ValueError(f"report: the runs use different tokenizers (vocabulary sizes {sorted(vocab)}); "
                         "compare runs trained on the same tokens")
    labels = [ev.label for ev in evs]
    for ev in evs:  # two runs of one variant and seed: name them by directory
        if labels.count(ev.label) > 1:
            ev.label = f"{ev.label} ({Path(ev.source).name})"
    settings = Settings(quick, seed, progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = evaluate_runs(evs, settings)

    figures: dict[str, Path] = {}
    plot_training(runs, out / "training.png")
    figures["training"] = out / "training.png"
    for spec in PER_RUN:
        res = [r.results[spec.name] for r in runs if spec.name in r.results]
        if res and spec.plot is not None:
            spec.plot(res, out / f"{spec.name}.png")
            figures[spec.name] = out / f"{spec.name}.png"
    multi = _multi_run(runs, settings, out, figures)

    rows = verdicts(runs)
    sections = {spec.name: analysis_section(runs, spec.name) for spec in PER_RUN}
    sections["training"] = table(TRAINING_HEADER, training_table(runs))
    extra: dict[str, Any] = {"version": __version__, "sections": sections, "preface": preface}
    if answer is not None:
        extra["answer"] = answer
    if bench is not None and retrieval_dir is not None:  # one is None only when the other is
        extra["retrieval_rows"] = retrieval_verdicts(bench)
        extra["retrieval"] = retrieval_section(bench, Path(retrieval_dir), table, image)
    if sweep is not None and lm_sweep_dir is not None:
        from .html import _slug
        from .lmsweep import section as lm_sweep_section
        extra["lm_sweep"] = lm_sweep_section(sweep, Path(lm_sweep_dir), table, image, _slug, lm_sweep_provenance)
        extra["lm_sweep_committed"] = lm_sweep_provenance is not None
    page = render_html(runs, rows, figures, settings, extra)
    results = {"settings": vars(settings), "verdicts": rows, "retrieval_verdicts": extra.get("retrieval_rows", []),
               "runs": [{"model": r.ev.describe(), "training": r.training, "results": r.results,
                         "errors": r.errors} for r in runs],
               **multi}
    if lm_sweep_provenance is not None:
        results["lm_sweep_provenance"] = lm_sweep_provenance
    atomic_write(out / RESULTS_NAME, json.dumps(results, indent=1, default=float) + "\n")
    atomic_write(out / "report.html", page)
    return out / "report.html"
