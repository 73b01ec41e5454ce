"""`difftransformer report RUN_DIR [RUN_DIR ...]`: every analysis on every run, one self-contained HTML page.

For each run (baseline, DIFF V1, DIFF V2; several seeds of each when given) the report reads the training metrics
(`metrics.jsonl`: loss, validation loss, gradient norm, lambda) and runs the analyses of `difftransformer eval`
(needles, noise, outliers, quantized, positions, icl, and the attention-map figure over one run per variant). It
writes ``OUT/report.html`` (plots embedded as base64 PNGs, so the page is one file), ``OUT/results.json`` (every
number the page shows) and the PNGs beside them.

Each of the paper's claims gets a verdict per DIFF variant; the rule is `verdicts.RULE` (printed below in
`report --help` and above the verdict table of the page).

This package stands above both studies (it may import ``retrieval/``, ``lmsweep/`` and ``studies/``): the page, the
answer table of the studies' committed results (``answer.py``) and ``make docs`` (``docs.py``: the README's and
docs' tables generated from ``docs/results/``).
"""

from __future__ import annotations

from ..rundir import read_metrics
from .results import RunResults, Settings
from .runner import evaluate_runs, run_analysis, write_report

# The verdict entry point is ``verdicts.verdicts(runs)``; the module (not the function) is this package's
# ``verdicts`` attribute, so the statistics can be swapped by replacing one module.
from .verdicts import HELD, INCONCLUSIVE, NOT_HELD, SMOKE

__all__ = ["HELD", "INCONCLUSIVE", "NOT_HELD", "SMOKE", "RunResults", "Settings",
           "evaluate_runs", "read_metrics", "run_analysis", "write_report"]
