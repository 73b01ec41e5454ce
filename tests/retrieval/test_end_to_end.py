import json

import pytest

from difftransformer.cli import main
from difftransformer.retrieval.benchmark import run_benchmark, seed_values
from difftransformer.retrieval.cli import format_table
from difftransformer.retrieval.config import Condition, RetrievalConfig


def tiny():
    return RetrievalConfig(d_model=16, n_heads=2, n_layers=1, steps=3, batch=4, warmup=1, seeds=1,
                           lr_grid=(1e-3, 2e-3), eval_contexts=2, val_contexts=2, n_pairs=2, filler=4,
                           conditions=(Condition("p1f1"), Condition("p2f2", 2, 2), Condition("near", 1, 1, "near")),
                           primary="p2f2", quant_bits=(8, 4), quant_conditions=("p1f1",))


def test_tiny_benchmark_structure(tmp_path):
    r = run_benchmark(tiny(), tmp_path, workers=1, progress=False)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["primary_endpoint"]["condition"] == "p2f2"
    for name in ("accuracy_heatmap", "accuracy_vs_difficulty", "attention_shares", "quantization", "attention_row"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert set(saved["variants"]) == {"baseline", "diff_v1", "diff_v2"}
    for v, d in saved["variants"].items():
        assert d["chosen_lr"] in (1e-3, 2e-3) and len(d["lr_grid"]) == 2
        assert d["params"] > 0 and len(d["runs"]) == 1
        run = d["runs"][0]
        assert set(run["conditions"]) == {"p1f1", "p2f2", "near"}
        assert [q["bits"] for q in run["quantized"]["p1f1"]] == [None, 8, 4]
        assert set(run["outliers"]) == {"attention_logits", "hidden_states"}
        assert len(run["conditions"]["p2f2"]["attention"]) == 1
        assert 0 <= seed_values(saved, v, "p2f2")[0] <= 1
        assert "state" not in run
        ex = run["example_row"]  # Fig. 1 row: the other 3 facts of a 4-pair p2f2 context are its distractors
        assert len(ex["distractor_fact_pos"]) == 3 and ex["answer_pos"] not in ex["distractor_fact_pos"]
        assert isinstance(ex["correct"], bool) and len(ex["rows"][0]) == ex["query_pos"] + 1
    assert r["variants"]["baseline"]["params"] == saved["variants"]["baseline"]["params"]
    table = format_table(saved)
    assert "p2f2*" in table and "diff_v2" in table and "QUICK" not in table
    assert "QUICK SMOKE RUN" in format_table({**saved, "quick": True})


@pytest.mark.parametrize("argv", [["--lr-grid", "x"], ["--distractors", "far"], ["--seeds", "0"], ["--workers", "0"]])
def test_cli_bad_input_one_line(tmp_path, capsys, argv):
    rc = main(["retrieval", "--out", str(tmp_path / "o"), "--no-progress", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("difftransformer retrieval: error:")
    assert not (tmp_path / "o").exists()
