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


def test_not_measurable_reaches_the_text_and_the_page(tmp_path):
    # a baseline whose loss barely falls with width (version 1's case): Fig. 3a reads "not measurable at this scale"
    # in sweep.json's rows, the printed summary and the page's section
    import math

    from difftransformer.eval.report.lmsweep import section
    from difftransformer.lmsweep.analysis import NOT_MEASURABLE, Job, assemble
    from difftransformer.lmsweep.sweep import format_sweep, sensitivity_rows
    c = LMSweepConfig(widths=(16, 32), seeds=3, seed_base=0, lr_grid=(2e-3, 4e-3, 8e-3), lr_widen=0,
                      variants=("baseline", "diff_v2"))
    done = {}
    for w in c.widths:
        for v in c.variants:
            for lr in c.lr_grid:
                for s in c.test_seeds:
                    loss = 4.0 - 0.001 * w + math.log2(lr / 4e-3) ** 2 + 0.01 * s - (0.1 if v == "diff_v2" else 0)
                    done[Job(w, v, s, lr)] = {
                        "width": w, "variant": v, "seed": s, "lr": lr, "diverged": False, "tune_loss": loss,
                        "test_loss": loss, "floor": 6.0, "params": 1000 * w, "params_non_embedding": 100 * w,
                        "curve": {"steps": [100, 200, 300], "test_loss": [loss + 0.5 + 0.01 * s, loss + 0.3, loss]},
                        "outliers": {"attention_logit_top1": 5.0 + s, "hidden_state_top1": 9.0 + s}}
    res = {"protocol_version": 2, "config": c.to_dict(), "tokens_per_run": 614_400,
           **assemble(c, done, math.log(4096)),
           "timings": {"wall_s": 60.0, "jobs": len(done), "jobs_run": len(done), "workers": 1}}
    assert res["endpoints"]["diff_v2"]["param_ratio"]["verdict"] == NOT_MEASURABLE
    assert not res["applicability"]["param_ratio"]["measurable"] and res["applicability"]["token_ratio"]["measurable"]
    res["verdict_rows"], res["sensitivity_rows"] = verdict_rows(res), sensitivity_rows(res)
    row = next(r for r in res["verdict_rows"] if r[0].startswith("(b)"))
    assert row[4] == NOT_MEASURABLE
    text = format_sweep(res)
    assert NOT_MEASURABLE in text and "Fig. 3a premise" in text and "NOT MEASURABLE" in text
    page = section(json.loads(json.dumps(res)), tmp_path, lambda head, rows, **kw: repr(rows), lambda *a: "",
                   lambda s: s)
    assert NOT_MEASURABLE in page and "Fig. 3a's premise" in page and "Scale: cpu" in page
