"""The report's retrieval section and verdicts: known inputs with known verdicts, and a tiny end-to-end run."""

from __future__ import annotations

import json

from difftransformer.eval.report import HELD, INCONCLUSIVE, NOT_HELD, SMOKE, write_report
from difftransformer.eval.report.retrieval import baseline_floor, retrieval_verdicts

N = 512  # queries per condition


def _run(seed: int, train_acc: float, acc: float, answer: float, q4: float) -> dict:
    cond = lambda a: {"accuracy": a, "n_queries": N,  # noqa: E731
                      "attention": [{"answer_share": 0.01, "noise_share": 0.99},  # a uniform layer
                                    {"answer_share": answer, "noise_share": 1 - answer}]}
    return {"seed": seed, "conditions": {"p1f1": cond(train_acc), "p2f4": cond(acc)},
            "quantized": {"p2f4": [{"bits": None, "accuracy": acc}, {"bits": 4, "accuracy": acc - q4}]}}


def _results(base: list[float], diff: list[float], quick: bool = False, base_answer: float = 0.15,
             diff_answer: float = 0.40, base_q4: float = 0.01, diff_q4: float = 0.01) -> dict:
    runs = {"baseline": [_run(s, 0.99, a, base_answer + 0.01 * s, base_q4) for s, a in enumerate(base)],
            "diff_v1": [_run(s, 0.99, a, diff_answer + 0.01 * s, diff_q4) for s, a in enumerate(diff)]}
    return {"quick": quick, "chance": 1 / 16, "config": {"primary": "p2f4", "n_pairs": 8, "filler": 32, "steps": 600},
            "conditions": [{"name": "p1f1"}, {"name": "p2f4"}],
            "variants": {v: {"params": 1000, "chosen_lr": 3e-3, "lr_grid": [{"lr": 3e-3, "val_loss": 0.1}],
                             "runs": rs} for v, rs in runs.items()}}


def _verdicts(results: dict) -> dict[str, str]:
    return {r["claim"]: r["verdict"] for r in retrieval_verdicts(results)}


def test_clear_win_holds_and_clear_loss_does_not():
    win = _verdicts(_results([0.58, 0.62, 0.60], [0.80, 0.83, 0.79]))
    assert win["retrieves better among distractors"] == HELD
    assert win["more attention on the answer (retrieval)"] == HELD
    assert win["less attention noise (retrieval)"] == HELD
    assert win["more robust to quantised attention logits"] == INCONCLUSIVE  # equal 4-bit drops
    loss = _verdicts(_results([0.80, 0.83, 0.79], [0.58, 0.62, 0.60], base_answer=0.4, diff_answer=0.15))
    assert loss["retrieves better among distractors"] == NOT_HELD
    assert loss["less attention noise (retrieval)"] == NOT_HELD
    fragile = _verdicts(_results([0.6, 0.6, 0.6], [0.6, 0.6, 0.6], base_q4=0.01, diff_q4=0.20))
    assert fragile["more robust to quantised attention logits"] == NOT_HELD


def test_noise_chance_and_smoke_are_not_coloured():
    noisy = _verdicts(_results([0.58, 0.80, 0.62], [0.72, 0.60, 0.70]))  # DIFF ahead on average, seeds disagree
    assert noisy["retrieves better among distractors"] == INCONCLUSIVE
    at_chance = _verdicts(_results([0.06, 0.07, 0.05], [0.07, 0.06, 0.06]))
    assert set(at_chance.values()) == {INCONCLUSIVE}  # nothing is judged on queries no model answers
    assert set(_verdicts(_results([0.58, 0.62, 0.60], [0.80, 0.83, 0.79], quick=True)).values()) == {SMOKE}


def test_baseline_floor():
    ok, accs = baseline_floor(_results([0.5], [0.5]))
    assert ok and accs == [0.99]
    r = _results([0.5, 0.5], [0.5, 0.5])
    r["variants"]["baseline"]["runs"][1]["conditions"]["p1f1"]["accuracy"] = 0.7
    assert baseline_floor(r) == (False, [0.99, 0.7])


def test_report_leads_with_a_real_benchmark(runs, tmp_path):
    """A tiny benchmark through the report: its section comes first and its verdict rows land in results.json."""
    from difftransformer.retrieval.benchmark import run_benchmark
    from difftransformer.retrieval.config import Condition, RetrievalConfig

    cfg = RetrievalConfig(d_model=16, n_heads=2, n_layers=1, steps=3, batch=4, warmup=1, seeds=1, lr_grid=(1e-3,),
                          eval_contexts=2, val_contexts=2, n_pairs=2, filler=4,
                          conditions=(Condition("p1f1"), Condition("p2f4", 2, 4)), primary="p2f4",
                          quant_bits=(8, 4), quant_conditions=("p2f4",))
    run_benchmark(cfg, tmp_path / "bench", workers=1, progress=False)
    page = write_report([runs[v] for v in ("baseline", "diff_v1", "diff_v2")], tmp_path / "report", quick=True,
                        progress=False, retrieval_dir=tmp_path / "bench").read_text()
    assert page.index("Retrieval among distractors") < page.index("<h2>Models</h2>")
    rows = json.loads((tmp_path / "report" / "results.json").read_text())["retrieval_verdicts"]
    assert {(r["claim"], r["variant"]) for r in rows} >= {("retrieves better among distractors", "diff_v2")}
    assert {r["verdict"] for r in rows} == {SMOKE}  # 3 training steps
    # the multiplicity note counts every verdict on the page, the benchmark's included
    lm_rows = json.loads((tmp_path / "report" / "results.json").read_text())["verdicts"]
    assert f"makes {len(rows) + len(lm_rows)} verdicts" in page
    assert f"({len(rows)} of them in the retrieval benchmark above, {len(lm_rows)} here.)" in page
