"""The report page's language-model sweep section: a tiny sweep end to end into write_report."""

from __future__ import annotations

import json

import pytest
from report_page import check_page

from difftransformer.report import SMOKE, write_report
from difftransformer.lmsweep.config import LMSweepConfig
from difftransformer.lmsweep.sweep import run_lm_sweep, verdict_rows

PROVENANCE = {"what": "a tiny sweep for this test", "commit": "abc1234", "date": "2026-01-02",
              "machine": "the test's machine", "command": "difftransformer lm-sweep --out runs/tiny-sweep",
              "timings": {"wall_s": 5400.0, "jobs": 16, "workers": 2}, "cpu_kernels": ["AVX2"], "folder": "x/y"}


def test_report_shows_the_sweep_after_the_retrieval_slot_and_before_the_models(runs, tmp_path):
    """The sweep's section after the retrieval slot; the short-trained language models after it, folded into one
    collapsed section with no verdict table (a smoke run judges nothing); committed results say so first."""
    cfg = LMSweepConfig(preset="tiny", widths=(16, 32), steps=6, warmup_steps=1, batch=2, seq_len=32, seeds=2,
                        seed_base=5,
                        lr_grid=(4e-3, 8e-3), lr_widen=0, eval_every=3, outlier_windows=1,
                        variants=("baseline", "diff_v2"))
    res = run_lm_sweep(cfg, tmp_path / "sweep", workers=1, progress=False)
    rows = verdict_rows(res)
    assert {r[4] for r in rows} == {SMOKE}  # 6 steps: no verdict
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["timings"]["jobs"] == 16
    page = write_report([runs[v] for v in ("baseline", "diff_v1", "diff_v2")], tmp_path / "report", quick=True,
                        progress=False, studies={"lm-sweep": tmp_path / "sweep"},
                        provenance={"lm-sweep": PROVENANCE},
                        preface="Made by `difftransformer demo`.").read_text()
    i = page.index("Language-model sweep: loss against parameters")
    assert i < page.index("<b>Not measured in this run.</b>") < page.index("Pre-registered in the sweep")
    assert "commit abc1234 on 2026-01-02" in page and "90 min on 2 worker" in page and "AVX2" in page
    assert "<code>difftransformer lm-sweep --out runs/tiny-sweep</code>" in page
    assert "Wall time 90 min for 16 jobs" in page  # the committed run's time, not the rebuild's
    assert "Fig. 3a parameter ratio" in page and "Fig. 3b token ratio" in page and "unigram floor" in page
    assert page.count("data:image/png;base64") >= 3 + 1  # the sweep's three plots and the page's own
    folded = page.index("<details class='smoke'>")
    assert i < page.index("10 training steps each (a smoke run)") < folded < page.index("<h3>Models</h3>")
    # no verdict table of the models' 28 "smoke run" rows (the tiny sweep's own rows are smoke runs too)
    assert "<h2>Verdicts</h2>" not in page and "more accurate many-shot in-context learning" not in page
    assert "<code>difftransformer demo</code>" in page
    check_page(page)
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["provenance"]["lm-sweep"]["commit"] == "abc1234"


def test_the_committed_sweep_is_rebuilt_not_trained(tmp_path):
    """The demo's default sweep: the committed journal rebuilt by this code (no job trained), its section opened
    by where the numbers come from; a journal whose keys this code does not compute is refused before anything
    runs, never trained again."""
    import shutil

    from difftransformer.lmsweep.page import section
    from difftransformer.lmsweep import committed
    from difftransformer.lmsweep.sweep import JOURNAL

    prov = committed.rebuild(tmp_path / "sweep")
    rebuilt = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert rebuilt["timings"]["jobs_run"] == 0 and prov["timings"]["jobs_run"] == rebuilt["timings"]["jobs"] == 160
    assert prov["commit"] == "028510b" and prov["cpu_kernels"] == ["AVX512"]
    assert all((tmp_path / "sweep" / f"lm-sweep-{k}.png").is_file() for k in ("params", "tokens", "lr"))
    page = section(rebuilt, tmp_path / "sweep", prov)
    assert "Not measured in this run" in page and "commit 028510b on 2026-11-26" in page
    assert "99 min on 2 worker" in page and "Wall time 99 min for 160 jobs" in page
    bad = tmp_path / "bad"
    shutil.copytree(committed.RESULTS, bad)
    lines = (bad / JOURNAL).read_text().splitlines(keepends=True)
    lines[5] = lines[5].replace('"key": "', '"key": "0', 1)
    (bad / JOURNAL).write_text("".join(lines))
    with pytest.raises(ValueError, match="keys this code does not compute"):
        committed.rebuild(tmp_path / "again", bad)
    assert not (tmp_path / "again" / "sweep.json").exists()
    assert not (tmp_path / "sweep" / "data").exists()  # a rebuild makes no tokens (4.6 s of the demo's report)
    lines = (committed.RESULTS / JOURNAL).read_text().splitlines(keepends=True)
    (bad / JOURNAL).write_text("".join(lines[:7] + lines[8:]))  # one job short
    with pytest.raises(ValueError, match="lacks the job .*: a rebuild trains nothing"):
        committed.rebuild(tmp_path / "short", bad)
    assert not (tmp_path / "short" / "sweep.json").exists() and not (tmp_path / "short" / "data").exists()


def test_not_measurable_reaches_the_text_and_the_page(tmp_path):
    # a baseline whose loss barely falls with width (version 1's case): Fig. 3a reads "not measurable at this scale"
    # in sweep.json's rows, the printed summary and the page's section
    import math

    from difftransformer.lmsweep.page import section
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
    page = section(json.loads(json.dumps(res)), tmp_path)
    assert NOT_MEASURABLE in page and "Fig. 3a's premise" in page and "Scale: cpu" in page
