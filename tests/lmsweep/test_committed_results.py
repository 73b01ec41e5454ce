"""The README's language-model numbers are what this code computes from the committed journal: the protocol-v2 `cpu`
run's journal (docs/results/lm-sweep-v2/) rebuilt by ``lm-sweep`` without training anything gives the committed
sweep.json (timings aside). A change to the analysis that moves any number fails here, until the results are
rebuilt and the README and docs/lm-sweep.md say the new numbers."""

import json
import shutil
from pathlib import Path

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
    assert rebuilt == committed
    v2 = {r[0]: r[4] for r in rebuilt["verdict_rows"] if r[1] == "diff_v2"}
    assert v2["(a) loss, d=96 (primary)"] == "held"
    assert v2["(b) Fig. 3a parameter ratio"] == "not measurable at this scale"
