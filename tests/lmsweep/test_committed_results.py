"""The README's language-model numbers are what this code computes from the committed journal: the protocol-v2 `cpu`
run's journal (docs/results/lm-sweep-v2/) rebuilt by ``lm-sweep`` without training anything gives the committed
sweep.json (timings aside). Numbers are compared to ``suite_helpers.REBUILT_REL_TOL`` (1e-9 relative: another CPU's
BLAS sums in another order; the last digits moved by up to 2e-13 on an AMD EPYC), verdicts and texts exactly. A change
to the analysis that moves any number fails here, until the results are rebuilt and the README and docs/lm-sweep.md
say the new numbers."""

import json
import shutil
from pathlib import Path

from suite_helpers import assert_results_close, results_differences

from difftransformer.lmsweep.config import LMSweepConfig
from difftransformer.lmsweep.sweep import JOURNAL, run_lm_sweep
from difftransformer.rundir import SWEEP_RESULTS_NAME

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "lm-sweep-v2"


def test_the_committed_journal_rebuilds_the_committed_results(tmp_path):
    shutil.copy(RESULTS / JOURNAL, tmp_path / JOURNAL)
    committed = json.loads((RESULTS / SWEEP_RESULTS_NAME).read_text())
    res = run_lm_sweep(LMSweepConfig.from_dict(committed["config"]), tmp_path, workers=1, progress=False)
    assert res["timings"]["jobs"] == 160 and res["timings"]["jobs_run"] == 0
    rebuilt = json.loads((tmp_path / SWEEP_RESULTS_NAME).read_text())
    committed.pop("timings"), rebuilt.pop("timings")
    assert_results_close(rebuilt, committed)
    v2 = {r[0]: r[4] for r in rebuilt["verdict_rows"] if r[1] == "diff_v2"}
    assert v2["(a) loss, d=96 (primary)"] == "held"
    assert v2["(b) Fig. 3a parameter ratio"] == "not measurable at this scale"


def test_the_comparison_tolerates_rounding_and_nothing_more():
    """The tolerance is a tolerance for the last bits, not for a changed number, verdict or text."""
    committed = json.loads((RESULTS / SWEEP_RESULTS_NAME).read_text())
    rounded = json.loads(json.dumps(committed))
    moved = json.loads(json.dumps(committed))
    nudged = 0

    def walk(x, y, scale):
        nonlocal nudged
        for k in (range(len(x)) if isinstance(x, list) else list(x)):
            if isinstance(x[k], float) and x[k] != 0.0:
                x[k] *= 1 + 2e-13
                y[k] *= 1 + scale
                nudged += 1
            elif isinstance(x[k], (dict, list)):
                walk(x[k], y[k], scale)

    walk(rounded, moved, 1e-6)
    assert nudged > 100
    assert results_differences(rounded, committed) == []
    assert len(results_differences(moved, committed)) == nudged
    flipped = json.loads(json.dumps(committed))
    row = next(r for r in flipped["verdict_rows"] if r[4] == "held")
    row[4] = "did not hold"
    assert len(results_differences(flipped, committed)) == 1
