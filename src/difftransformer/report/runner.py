"""The report's run loop: load the runs, run every analysis spec on them, plot, judge, write the page."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import torch

from ..eval.analyses import MULTI_RUN, PER_RUN
from ..eval.loading import EvalModel, load_for_eval
from ..eval.spec import AnalysisSpec
from ..fileio import atomic_write
from ..log import progress_bar
from ..rundir import RESULTS_NAME
from ..studies.page import table
from .html import analysis_section, render_html
from .results import RunResults, Settings
from .studies import STUDIES
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
                 progress: bool = True, preface: str = "", studies: Optional[Mapping[str, Optional[str | Path]]] = None,
                 provenance: Optional[Mapping[str, dict[str, Any]]] = None, answer: Optional[str] = None,
                 device: str | torch.device = "cpu") -> Path:
    """Evaluate ``run_dirs`` and write ``out_dir/report.html`` (returned) and ``out_dir/results.json``.

    ``studies``: {a registered study's name (``studies.registry.STUDIES``: "retrieval", "lm-sweep"): its command's
    output directory (its result file and plots)}, each shown with its own verdicts, in the registry's order, before
    the language models. ``provenance``: {a study's name: where its results come from when they are committed ones,
    not measured by this run (e.g. ``lmsweep.committed.provenance``)}: its section then says so first. ``preface``:
    a paragraph of text (`code` spans allowed) under the title. ``answer``: the HTML of the committed answer table
    (``report.answer.section``), shown first. ``device``: where the models run (the CLI's ``--device``, checked by
    ``loading.device_arg``)."""
    from .. import __version__

    if not run_dirs:
        raise ValueError("report: give at least one RUN_DIR")
    # the studies' outputs first: a file of the wrong shape is one line before any model is read
    dirs = {k: Path(v) for k, v in (studies or {}).items() if v is not None}
    provenance = dict(provenance or {})
    known = {s.name for s in STUDIES}
    for name in [*dirs, *provenance]:
        if name not in known:
            raise ValueError(f"report: no study named {name!r}; the studies are {', '.join(sorted(known))}")
    shown = [(s, s.read(dirs[s.name], f"--{s.name}"), dirs[s.name]) for s in STUDIES if s.name in dirs]
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
    # each study's section, its counted verdict rows (None: its own family) and whether its results are committed
    extra["studies"] = [(s, s.section(res, d, provenance.get(s.name)), s.verdicts(res) if s.verdicts else None,
                         s.name in provenance) for s, res, d in shown]
    page = render_html(runs, rows, figures, settings, extra)
    # e.g. "retrieval_verdicts": [] where the study is not shown
    counted: dict[str, list] = {f"{s.name}_verdicts": [] for s in STUDIES if s.verdicts}
    counted.update({f"{s.name}_verdicts": v for s, _, v, _ in extra["studies"] if v is not None})
    results = {"settings": vars(settings), "verdicts": rows, **counted,
               "runs": [{"model": r.ev.describe(), "training": r.training, "results": r.results,
                         "errors": r.errors} for r in runs],
               **multi}
    if provenance:
        results["provenance"] = provenance
    atomic_write(out / RESULTS_NAME, json.dumps(results, indent=1, default=float) + "\n")
    atomic_write(out / "report.html", page)
    return out / "report.html"
