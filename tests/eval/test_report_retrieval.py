"""The report's retrieval section and verdicts: known inputs with known verdicts, and a tiny end-to-end run."""

from __future__ import annotations

import json

from report_page import check_page

from difftransformer.report import HELD, INCONCLUSIVE, NOT_HELD, SMOKE, write_report
from difftransformer.retrieval.page import TABLES, failures, section, sensitivity_table
from difftransformer.retrieval.statistics import verdicts as retrieval_verdicts
from difftransformer.retrieval.statistics import verdicts_by_policy

N = 1024  # queries per condition
PRIMARY, EXTRA = "p32c32", "p16c128"
CLAIM = {"acc": "retrieves better among distractors (primary)", "att": "more attention on the answer",
         "ext": "retrieves better beyond the trained length", "quant": "more robust to quantised attention logits",
         "lr": "stable across learning rates"}


def _run(seed: int, acc: float, answer: float, q4: float, ext: float, failed: bool = False, lr: float = 2e-3) -> dict:
    return {"seed": seed, "lr": lr, "failed": failed, "training_distribution": {"accuracy": 0.5 if failed else 0.99,
                                                                               "n_queries": N},
            "conditions": {PRIMARY: {"accuracy": acc, "n_queries": N, "seq_len": 48, "attention_endpoint": answer,
                                     "best_head_share_per_layer": [0.05, 2 * answer - 0.05],
                                     "attention": [{"answer_share": 0.03}, {"answer_share": answer}]},
                           EXTRA: {"accuracy": ext, "n_queries": N, "seq_len": 144}},
            "quantized": {PRIMARY: [{"bits": None, "accuracy": acc}, {"bits": 4, "accuracy": acc - q4}]}}


def _results(base: list[float], diff: list[float], quick: bool = False, base_answer: float = 0.15,
             diff_answer: float = 0.40, base_q4: float = 0.01, diff_q4: float = 0.01, base_ext=None, diff_ext=None,
             matched_diff=None, diff_failed=(), base_lr=None, diff_lr=None) -> dict:
    base_ext, diff_ext = base_ext or base, diff_ext or diff

    def runs(accs, ans, q4, ext, failed=()):
        return [_run(s, a, ans + 0.01 * s, q4, e, s in failed) for s, (a, e) in enumerate(zip(accs, ext))]

    b = runs(base, base_answer, base_q4, base_ext)
    d = runs(diff, diff_answer, diff_q4, diff_ext, diff_failed)
    md = runs(matched_diff, diff_answer, diff_q4, diff_ext) if matched_diff else d
    cfg = {"primary": PRIMARY, "extrapolation": EXTRA, "steps": 600, "floor": 0.9, "train_pairs": [8, 16],
           "train_context": [16, 64], "queries": 8, "tuning_seeds": [100, 101], "seeds": len(base),
           "matched_lr": "baseline"}
    grid = [{"lr": 2e-3, "val_accuracy": 0.8, "val_loss": 0.5, "min_training_distribution": 0.99, "seeds": [100]}]
    res = {"quick": quick, "chance": 1 / 16, "config": cfg, "matched_lr": 2e-3,
            "conditions": [{"name": PRIMARY, "pairs": 32, "context": 32}, {"name": EXTRA, "pairs": 16, "context": 128}],
            "variants": {"baseline": {"params": 1000, "tuned_lr": 2e-3, "widened": [], "at_edge": False,
                                      "lr_grid": grid, "runs": b, "matched_runs": b, "tuning_runs": []},
                         "diff_v1": {"params": 1000, "tuned_lr": 4e-3, "widened": [], "at_edge": False,
                                     "lr_grid": grid,
                                     "runs": d, "matched_runs": md, "tuning_runs": []}}}
    if base_lr is not None:  # a version-3 results.json: the lr-robustness endpoint's per-seed values
        for v, accs in (("baseline", base_lr), ("diff_v1", diff_lr)):
            res["variants"][v]["lr_robustness"] = [{"seed": s, "failed": False, "conditions": {
                PRIMARY: {"accuracy": a, "n_queries": N}}} for s, a in enumerate(accs)]
    res["verdicts"] = verdicts_by_policy(res)  # what the benchmark writes to its results.json
    return res


def _verdicts(results: dict, policy: str = "runs") -> dict[str, str]:
    names = {v: k for k, v in CLAIM.items()}
    return {names[r["claim"]]: r["verdict"] for r in retrieval_verdicts(results, policy)}


B8 = [0.58, 0.62, 0.60, 0.61, 0.59, 0.63, 0.57, 0.60]
D8 = [0.80, 0.83, 0.79, 0.81, 0.78, 0.84, 0.80, 0.82]


def test_clear_win_holds_and_clear_loss_does_not():
    win = _verdicts(_results(B8, D8))
    assert win["acc"] == win["att"] == win["ext"] == HELD
    assert "lr" not in win  # a version-2 results.json has no lr-robustness endpoint: no row
    v3 = _verdicts(_results(B8, D8, base_lr=D8, diff_lr=B8))  # the grid mean judged on its own values
    assert v3["acc"] == HELD and v3["lr"] == NOT_HELD
    assert _verdicts(_results(B8, D8, base_lr=B8, diff_lr=B8))["lr"] == INCONCLUSIVE
    assert win["quant"] == INCONCLUSIVE  # equal 4-bit drops
    loss = _verdicts(_results(D8, B8, base_answer=0.4, diff_answer=0.15))
    assert loss["acc"] == loss["att"] == NOT_HELD
    fragile = _verdicts(_results([0.6] * 8, [0.6] * 8, base_q4=0.01, diff_q4=0.20))
    assert fragile["quant"] == NOT_HELD


def test_one_attention_verdict_no_noise_twin():
    rows = retrieval_verdicts(_results(B8, D8))
    assert len(rows) == 4 and not any("noise" in r["claim"] for r in rows)


def test_extrapolation_is_judged_apart_from_the_primary():
    v = _verdicts(_results(B8, B8, base_ext=[0.3] * 4 + [0.31] * 4, diff_ext=[0.5] * 4 + [0.52] * 4))
    assert v["acc"] == INCONCLUSIVE and v["ext"] == HELD


def test_noise_chance_and_smoke_are_not_coloured():
    noisy = _verdicts(_results([0.58, 0.80, 0.62, 0.7], [0.72, 0.60, 0.70, 0.69]))  # seeds disagree
    assert noisy["acc"] == INCONCLUSIVE
    at_chance = _verdicts(_results([0.06, 0.07, 0.05], [0.07, 0.06, 0.06]))
    assert set(at_chance.values()) == {INCONCLUSIVE}  # nothing is judged on queries no model answers
    assert set(_verdicts(_results(B8, D8, quick=True)).values()) == {SMOKE}


def test_sensitivity_rows_can_disagree_and_say_so():
    r = _results(B8, D8, matched_diff=B8)  # DIFF ahead only at its own lr
    assert _verdicts(r)["acc"] == HELD and _verdicts(r, "matched_runs")["acc"] == INCONCLUSIVE
    _head, rows = sensitivity_table(r)
    acc_row = next(x for x in rows if x[0] == CLAIM["acc"])
    assert acc_row[-1] == "NO" and acc_row[2].startswith(HELD)
    agree = sensitivity_table(_results(B8, D8))[1]
    assert all(x[-1] == "yes" for x in agree)


def test_failures_counted_and_dropped_in_the_sensitivity_row():
    r = _results(B8, [*D8[:6], 0.1, 0.1], diff_failed=(6, 7))
    f = failures(r)
    assert f["diff_v1"]["tuned"] == [6, 7] and f["baseline"]["tuned"] == []
    kept = retrieval_verdicts(r, "no_failures")
    assert all(x["stats"]["n_seeds"] == [6, 6] or x["stats"]["n_seeds"] == (6, 6) for x in kept)
    page = section(r, __import__("pathlib").Path("/nonexistent"))
    assert "DIFF V1 2 of 8 (tuned lr)" in page and "Caution" not in page
    half = _results(B8, D8[:4] + [0.1] * 4, diff_failed=(4, 5, 6, 7))
    assert "Caution:</b> DIFF V1 failed the floor" in section(half, __import__("pathlib").Path("/x"))
    # one pair left: no interval over seeds, whatever the within-seed binomial interval would say
    one = _results(B8, D8[:1] + [0.1] * 7, diff_failed=tuple(range(1, 8)))
    assert {x["verdict"] for x in retrieval_verdicts(one, "no_failures")} == {INCONCLUSIVE}
    assert retrieval_verdicts(_results(B8[:1], D8[:1]))[0]["verdict"] == INCONCLUSIVE


def test_report_leads_with_a_real_benchmark(runs, tmp_path):
    """A tiny benchmark through the report: its section comes first and its verdict rows land in results.json."""
    from difftransformer.retrieval.benchmark import run_benchmark
    from difftransformer.retrieval.config import Condition, RetrievalConfig

    cfg = RetrievalConfig(d_model=16, n_heads=2, n_layers=1, steps=3, batch=4, warmup=1, seeds=1, lr_grid=(1e-3,),
                          cpu_code_path="machine", eval_contexts=2, val_contexts=2, train_pairs=(2, 3),
                          train_context=(4, 6), queries=2,
                          conditions=(Condition("p3c6", 3, 6), Condition("p3c9", 3, 9)),
                          primary="p3c6", extrapolation="p3c9", quant_bits=(4,))
    run_benchmark(cfg, tmp_path / "bench", workers=1, progress=False)
    page = write_report([runs[v] for v in ("baseline", "diff_v1", "diff_v2")], tmp_path / "report", quick=True,
                        progress=False, studies={"retrieval": tmp_path / "bench"}).read_text()
    # the smoke-run language models come after it, folded: no verdict table of their own
    assert page.index("Retrieval among distractors") < page.index("<details class='smoke'>")
    assert page.index("<details class='smoke'>") < page.index("<h3>Models</h3>")
    from difftransformer.retrieval.benchmark import PROTOCOL
    from difftransformer.studies.report import protocol_deviations
    assert ("Deviations from the protocol:</p><ul class='note'><li>2026-11-25" in page) == bool(
        protocol_deviations(PROTOCOL))
    rows = json.loads((tmp_path / "report" / "results.json").read_text())["retrieval_verdicts"]
    assert {(r["claim"], r["variant"]) for r in rows} >= {(CLAIM["acc"], "diff_v2")}
    assert {r["verdict"] for r in rows} == {SMOKE}  # 3 training steps
    assert "makes" not in page  # smoke rows judge nothing: no multiplicity note counts them
    for title, _ in TABLES:  # every table of the section under its heading
        assert f"<h3>{title}</h3><table>" in page
    assert "p3c9 (extrapolation; longer than trained)" in page
    check_page(page)


def test_multiplicity_note_counts_verdicts_not_smoke_rows():
    """The note counts the retrieval benchmark's verdicts and the language models', never a smoke run's rows; it
    says how many are the benchmark's unless the models' part is folded (then it sits under the benchmark)."""
    from difftransformer.report.html import multiplicity_note
    from difftransformer.report.verdicts import verdicts
    from difftransformer.eval.stats import smoke_run, verdict_row

    rrows = retrieval_verdicts(_results(B8, D8))
    smoke = [verdict_row("a claim", "Fig. 1", "diff_v1", "a measure", smoke_run(10))] * 3
    assert "makes 4 verdicts" in multiplicity_note(rrows, smoke, True)
    assert "of them in" not in multiplicity_note(rrows, smoke, True)
    assert multiplicity_note([], smoke, False) == ""
    lm = verdicts(_fake_lm_runs())
    note = multiplicity_note(rrows, lm, False)
    assert f"makes {4 + len(lm)} verdicts" in note
    assert f"(4 of them in the retrieval benchmark above, {len(lm)} here.)" in note


def _fake_lm_runs() -> list:
    from types import SimpleNamespace

    from difftransformer.report.results import RunResults
    return [RunResults(SimpleNamespace(attention=v, seed=s, label=f"{v} {s}"),
                       {"step": [500], "final_val_loss": 3.5 - 0.1 * (v == "diff_v1") + 0.01 * s, "spikes": [],
                        "grad_norm_max": 1.0}) for v in ("baseline", "diff_v1") for s in range(3)]


def test_one_number_format_and_layers_named():
    """Integers with separators, decimals to 3 places everywhere (an interval's ends too), no Markdown backticks
    left in a cell, and the attention table names each layer."""
    from difftransformer.studies.page import fmt as _fmt, table
    from difftransformer.retrieval.page import _interval, shares_table

    assert _fmt(189888) == "189,888" and _fmt(5.06) == "5.060" and _fmt(5.024) == "5.024"
    assert _fmt(1688.3) == "1,688" and _fmt(0.0) == "0.000" and _fmt(1.5e-5) == "1.50e-05" and _fmt(True) == "yes"
    assert _interval([1.0, 1.0], 1024) == "1.000 [1.000, 1.000]"
    assert "<code>x</code>" in table(["a"], [["run `x` now"]]) and "`" not in table(["a"], [["run `x` now"]])
    head, rows = shares_table(_results(B8, D8))
    assert head[-2:] == ["layer 0: best head's answer share", "layer 1: best head's answer share"]
    assert all(len(r) == len(head) for r in rows)


def test_accuracy_plots_show_whole_error_bars_and_name_chance(tmp_path, monkeypatch):
    """Accuracy vs lr: an error bar above 1 is drawn whole (the axis grows), and the chance line is in the legend."""
    from difftransformer.retrieval import plots

    saved = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.setdefault("fig", fig))
    r = _results(B8, D8)
    for v, x in r["variants"].items():
        x["grid_runs"] = [{**run, "lr": lr, "conditions": {PRIMARY: {"accuracy": acc}}}
                          for lr in (2e-3, 4e-3) for run, acc in zip(x["runs"], [0.8, 1.0] * 4 if v == "diff_v1"
                                                                     else [0.5] * 8)]
    plots.plot_accuracy_vs_lr(r, tmp_path / "lr.png")
    ax = saved["fig"].axes[0]
    top = 0.9 + __import__("statistics").stdev([0.8, 1.0] * 4)  # diff_v1's bar: mean 0.9 + sd 0.107
    assert ax.get_ylim()[1] > top > 1.0
    assert "chance" in [t.get_text() for t in ax.get_legend().get_texts()]
