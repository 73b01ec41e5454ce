"""The report page's language-model sweep section: a tiny sweep end to end into write_report."""

from __future__ import annotations

import json

from difftransformer.eval.report import SMOKE, write_report
from difftransformer.lmsweep.config import LMSweepConfig
from difftransformer.lmsweep.sweep import run_lm_sweep, verdict_rows


def test_report_shows_the_sweep_after_the_retrieval_slot_and_before_the_models(runs, tmp_path):
    cfg = LMSweepConfig(widths=(16, 32), steps=6, warmup_steps=1, batch=2, seq_len=32, seeds=2, seed_base=5,
                        lr_grid=(4e-3, 8e-3), lr_widen=0, eval_every=3, outlier_windows=1,
                        variants=("baseline", "diff_v2"))
    res = run_lm_sweep(cfg, tmp_path / "sweep", workers=1, progress=False)
    rows = verdict_rows(res)
    assert {r[4] for r in rows} == {SMOKE}  # 6 steps: no verdict
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["timings"]["jobs"] == 16
    page = write_report([runs[v] for v in ("baseline", "diff_v1", "diff_v2")], tmp_path / "report", quick=True,
                        progress=False, lm_sweep_dir=tmp_path / "sweep").read_text()
    i = page.index("Language-model sweep: loss against parameters")
    assert i < page.index("<h2>Language models on the embedded corpus</h2>") < page.index("<h2>Models</h2>")
    assert "Fig. 3a parameter ratio" in page and "Fig. 3b token ratio" in page and "unigram floor" in page
    assert page.count("data:image/png;base64") >= 3 + 1  # the sweep's three plots and the page's own
