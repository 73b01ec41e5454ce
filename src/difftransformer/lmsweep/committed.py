"""The committed language-model sweep (protocol version 2, ``cpu`` scale), for the demo's page.

The repository keeps that sweep's journal and sweep.json in docs/results/lm-sweep-v2/ (with provenance.json: the
commit, date, machine and command of the run). ``rebuild`` copies the journal into a directory of the demo's output
and runs ``run_lm_sweep`` there: every job is read back from the journal, none is trained, and this code writes
sweep.json and the plots again (seconds: the tokens are prepared, then the analysis). ``provenance`` is what the
page says about where those numbers come from: they were not measured by the run that shows them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional

from ..fileio import read_json
from ..jobs import job_key, read_journal
from ..rundir import SWEEP_RESULTS_NAME
from .config import LMSweepConfig
from .sweep import JOURNAL, job_description, run_lm_sweep
from .sweep_schema import LmSweepResults, validate_lm_run, validate_lm_sweep

# src/difftransformer/lmsweep/ -> the repository root; an installed package has no docs/ (see ``available``).
RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results" / "lm-sweep-v2"
PROVENANCE = "provenance.json"
REPO_PATH = "docs/results/lm-sweep-v2"  # how the page names the folder: relative to the repository


def available(source: Path = RESULTS) -> bool:
    """Whether ``source`` holds the committed journal, sweep.json and provenance (a clone does; a wheel does not)."""
    return all((source / name).is_file() for name in (JOURNAL, SWEEP_RESULTS_NAME, PROVENANCE))


def _check_keys(journal: Path) -> None:
    """Every journaled job's key must be the one this code computes for it (same protocol, configuration and data
    fingerprint), so ``run_lm_sweep`` finds every job and trains none; else a ValueError, never a 100-minute run."""

    header, records = read_journal(journal, validate_lm_run)
    cfg = LMSweepConfig.from_dict(header["config"])
    stale = [r["job"] for k, r in records.items() if job_key(job_description(cfg, header["data"], r["job"])) != k]
    if stale:
        raise ValueError(f"{journal}: {len(stale)} of {len(records)} journaled jobs have keys this code does not "
                         f"compute (first: {stale[0]}); rebuilding would train them")


def _committed(source: Path) -> LmSweepResults:
    """The committed sweep.json, checked against the schema every reader takes."""
    path = source / SWEEP_RESULTS_NAME
    return validate_lm_sweep(read_json(path), f"{path} is not a lm-sweep result")


def provenance(source: Path = RESULTS) -> dict[str, Any]:
    """Where the committed results come from: provenance.json, the original run's timings (the rebuilt sweep.json
    has the rebuild's) and the CPU kernels its jobs ran (as each job recorded them)."""

    _, records = read_journal(source / JOURNAL, validate_lm_run)
    kernels = sorted({str(r["result"].get("cpu_capability", "unknown")) for r in records.values()})
    return {**read_json(source / PROVENANCE), "timings": _committed(source)["timings"],
            "cpu_kernels": kernels, "folder": REPO_PATH}


def rebuild(out: Path, source: Path = RESULTS) -> dict[str, Any]:
    """Rebuild the committed sweep into ``out`` (sweep.json and the plots, from the committed journal, training
    nothing) and return its ``provenance``. A ValueError when the journal does not fit this code."""

    if not available(source):
        raise ValueError(f"{source} does not hold the committed sweep (it ships with the repository, not the "
                         "package)")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / JOURNAL, out / JOURNAL)
    _check_keys(out / JOURNAL)
    cfg = LMSweepConfig.from_dict(dict(_committed(source)["config"]))
    run_lm_sweep(cfg, out, workers=1, progress=False, rebuild_only=True)  # no tokens made, no job trained
    return provenance(source)


def committed_sweep(out: Path) -> tuple[Optional[Path], Optional[dict[str, Any]]]:
    """(the rebuilt directory, its provenance) for the demo, or (None, None) with one line saying why not."""
    if not available():
        print(f"language-model sweep: the committed results ({REPO_PATH}) are not here (they ship with the "
              "repository, not the package): the page goes without them")
        return None, None
    try:
        return out, rebuild(out)
    except ValueError as e:
        print(f"language-model sweep: the committed results could not be rebuilt ({e}): the page goes without them")
        return None, None
