"""Retrieval protocol version 4 as the study registry sees it (``studies.registry.Study``): its results
(``protocol4.json``, which ``retrieval --protocol 4 --out DIR`` writes) and reader, and its section of the report
page (``report --retrieval-v4 DIR``; ``demo`` runs its ``--quick`` form, a smoke run the section says is one). Its
command is the retrieval benchmark's (``--protocol 4``), so it registers none of its own; its ``make docs`` block is
the retrieval study's (``retrieval-v4``)."""

from __future__ import annotations

import argparse
import html
from pathlib import Path
from typing import Any, Optional

from ..jobs.codepath import Device
from ..studies.page import provenance_note, table
from ..studies.registry import Study, result_reader
from .protocol4 import RESULTS
from .protocol4 import STUDY as FOLLOWUP
from .protocol4_text import standing, table_rows
from .schema import validate_protocol4

SMOKE = ("A smoke run (<code>--quick</code>): one validation seed, two test seeds, one learning rate, the three "
         "variants only, 100 and 200 steps at the quick benchmark's sizes. It shows that the protocol's phases run "
         "and are read: endpoint 1, the length and the conditions. At these sizes no model learns the lookup, so no "
         "condition is kept and endpoint 2 is not read (the test suite runs it on a toy plan). Its numbers measure "
         "nothing and it gives no verdict. PROTOCOL4.md's run is <code>difftransformer retrieval --protocol 4 --out "
         "DIR</code> (about 27 core-hours when L is 4,800, on a 2-core AVX2 machine); docs/retrieval.md shows the "
         "committed one.")


def _no_command(sub: argparse._SubParsersAction) -> None:
    """Nothing: version 4 runs as ``difftransformer retrieval --protocol 4`` (the retrieval study's command)."""


def section(results: dict[str, Any], directory: Path, provenance: Optional[dict[str, Any]] = None) -> str:
    """The HTML of version 4's section: what it asks, the smoke-run box for ``--quick``, the table of both
    endpoints (``protocol4_text.table_rows``) and where the run stands."""
    head, rows = table_rows(results)
    parts = ["<h2>Retrieval protocol version 4: speed and capability as separate endpoints</h2>",
             provenance_note(provenance) if provenance else "",
             f"<div class='provenance'><p><b>Smoke run.</b> {SMOKE}</p></div>" if results.get("quick") else "",
             "<p>Speed (endpoint 1): the first step at which each name's training loss falls below 1.0 nats, minus "
             "the baseline's. Capability (endpoint 2): the accuracy after L steps at a condition harder than "
             "training that the trained baseline solves only in part (chosen on validation seeds, below the "
             "ceiling), minus the baseline's (D) and, for an arm, minus its variant's (C).</p>",
             table([h.replace("`", "") for h in head], rows, left=len(head)),
             f"<p class='note'>{html.escape(standing(results, 'its journal'))}</p>"]
    t = results.get("timings", {})
    if t:
        parts.append(f"<p class='note'>{t['jobs']} jobs, {t['job_cpu_s'] / 60:.1f} min of CPU in training "
                     f"({t['jobs_run']} run by the last call, in {t['wall_s'] / 60:.1f} min).</p>")
    return "".join(parts)


STUDY = Study(name="retrieval-v4", what="retrieval protocol version 4", results=RESULTS,
              read=result_reader("retrieval --protocol 4", RESULTS, FOLLOWUP.name, validate_protocol4),
              register=_no_command, section=section, command="retrieval --protocol 4")


def smoke_run(out: Path, progress: bool, device: Device = "cpu") -> Path:
    """``demo``'s stage: version 4's ``--quick`` form (``protocol4.quick_plan``) into ``out/retrieval-v4``, run or
    resumed from its journal (a finished one runs nothing); its summary printed; returns the directory."""
    from ..jobs import RunOptions
    from .protocol4 import quick_plan, run_protocol4
    from .protocol4_text import format_protocol4
    folder = out / "retrieval-v4"
    print("retrieval protocol 4, quick: a smoke run of its phases (speed, L, the conditions; both endpoints where a "
          "condition is kept); "
          f"finished jobs are kept in {folder / FOLLOWUP.journal}")
    res = run_protocol4(folder, quick_plan(), RunOptions(workers=2, progress=progress, device=device))
    print(format_protocol4(res))
    return folder
