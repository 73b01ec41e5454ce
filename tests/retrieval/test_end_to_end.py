import json
from pathlib import Path

import pytest

from difftransformer.cli import main
from difftransformer.retrieval.benchmark import PROTOCOL, run_benchmark, seed_values
from difftransformer.studies.report import protocol_deviations
from difftransformer.retrieval.cli import format_table
from difftransformer.retrieval.config import Condition, RetrievalConfig
from difftransformer.retrieval.protocol import Job, choose_lr, lr_choice, lr_scores, needed_jobs
from difftransformer.studies.lr import next_lr


def tiny(**kw):
    d = dict(d_model=16, n_heads=2, n_layers=1, steps=3, batch=4, warmup=1, seeds=2, seed_base=10,
             lr_grid=(1e-3, 2e-3, 4e-3), lr_widen=1, eval_contexts=4, val_contexts=4, train_pairs=(2, 3),
             train_context=(4, 8), queries=2, cpu_code_path="machine",
             conditions=(Condition("p2c6", 2, 6), Condition("p3c8", 3, 8), Condition("p3c12", 3, 12)),
             primary="p3c8", extrapolation="p3c12", quant_bits=(8, 4))
    d.update(kw)
    return RetrievalConfig(**d)


def test_tiny_benchmark_structure(tmp_path):
    r = run_benchmark(tiny(), tmp_path, workers=1, progress=False)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(r))
    assert saved["primary_endpoint"]["condition"] == "p3c8"
    assert saved["deviations"] == protocol_deviations(PROTOCOL) and all(d.startswith("20") for d in saved["deviations"])
    for name in ("accuracy_heatmap", "accuracy_vs_difficulty", "attention_shares", "quantization", "attention_row",
                 "accuracy_vs_lr"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert set(saved["variants"]) == {"baseline", "diff_v1", "diff_v2"}
    matched = saved["variants"]["baseline"]["tuned_lr"]
    assert saved["matched_lr"] == matched
    for v, d in saved["variants"].items():
        grid = [g["lr"] for g in d["lr_grid"]]
        assert d["tuned_lr"] in grid and set(grid) >= {1e-3, 2e-3, 4e-3} and len(grid) <= 4
        assert all(g["seeds"] == [10, 11] for g in d["lr_grid"])  # every lr of the grid on every test seed
        assert {(r["lr"], r["seed"]) for r in d["grid_runs"]} >= {(lr, s) for lr in grid for s in (10, 11)}
        assert [r["seed"] for r in d["runs"]] == [r["seed"] for r in d["matched_runs"]] == [10, 11]
        assert [r["seed"] for r in d["lr_robustness"]] == [10, 11] and 0 <= d["floor_pass_share"] <= 1
        rob = d["lr_robustness"][0]["conditions"]["p3c8"]["accuracy"]  # the mean over the pre-registered grid
        assert rob == pytest.approx(sum(r["conditions"]["p3c8"]["accuracy"] for r in d["grid_runs"]
                                        if r["seed"] == 10 and r["lr"] in (1e-3, 2e-3, 4e-3)) / 3)
        assert all(0 <= r["val_accuracy"] <= 1 for r in d["grid_runs"])  # validation and test measures per job
        assert all(r["lr"] == d["tuned_lr"] for r in d["runs"]) and all(r["lr"] == matched for r in d["matched_runs"])
        run = d["runs"][0]
        assert set(run["conditions"]) == {"p2c6", "p3c8", "p3c12"}
        assert [q["bits"] for q in run["quantized"]["p3c8"]] == [None, 8, 4]
        assert set(run["outliers"]) == {"attention_logits", "hidden_states"}
        prim = run["conditions"]["p3c8"]
        assert len(prim["attention"]) == len(prim["best_head_share_per_layer"]) == 1
        assert isinstance(run["failed"], bool) and 0 <= run["training_distribution"]["accuracy"] <= 1
        assert 0 <= seed_values(saved, v, "p3c8")[0] <= 1
        ex = run["example_row"]  # Fig. 1 row: the other 2 facts of a 3-pair context are its distractors
        assert len(ex["distractor_fact_pos"]) == 2 and ex["answer_pos"] not in ex["distractor_fact_pos"]
    # every job once: the grid and the widened values on both seeds, the matched lr where a variant lacks it
    grids = {v: {g["lr"] for g in d["lr_grid"]} for v, d in saved["variants"].items()}
    missing = sum(matched not in g for g in grids.values())
    assert saved["timings"]["jobs"] == 2 * sum(len(g) for g in grids.values()) + 2 * missing
    assert saved["timings"]["jobs_run"] == saved["timings"]["jobs"]  # nothing to read back in a fresh directory
    table = format_table(saved)
    assert "p3c8*" in table and "p3c12+" in table and "matched lr" in table and "QUICK" not in table
    assert "QUICK SMOKE RUN" in format_table({**saved, "quick": True})


def test_lr_choice_rule_and_widening():
    runs = [{"lr": lr, "seed": s, "val_accuracy": acc, "val_loss": loss, "val_training_distribution": 1.0,
             "failed": False} for lr, acc, loss in ((1e-3, 0.5, 0.9), (2e-3, 0.7, 0.8), (4e-3, 0.7, 0.6))
            for s in (100, 101)]
    scores = lr_scores(runs)
    assert [s["lr"] for s in scores] == [1e-3, 2e-3, 4e-3] and scores[1]["seeds"] == [100, 101]
    assert choose_lr(scores) == 4e-3  # accuracy tie: the lower answer loss
    assert next_lr([1e-3, 2e-3, 4e-3], 4e-3) == pytest.approx(8e-3)
    assert next_lr([1e-3, 2e-3, 4e-3], 1e-3) == pytest.approx(5e-4)
    assert next_lr([1e-3, 2e-3, 4e-3], 2e-3) is None


def _fake(cfg, accs: dict) -> dict:
    """Finished jobs with the validation accuracy ``accs[(variant, lr)]`` (seed-independent)."""
    return {Job(v, s, lr): {"lr": lr, "seed": s, "val_accuracy": a, "val_loss": 1 - a, "val_training_distribution": 1,
                            "failed": False}
            for (v, lr), a in accs.items() for s in cfg.test_seeds}


def test_needed_jobs_follow_the_protocol():
    """The grid on every test seed first; a variant chosen at an edge adds one value past it on every seed; the
    matched lr (the baseline's choice) is added for every variant that lacks it; then the list is final."""
    cfg = tiny(variants=("baseline", "diff_v1"), lr_grid=(1e-3, 2e-3), seeds=3)
    jobs, final = needed_jobs(cfg, {})
    assert not final and set(jobs) == {Job(v, s, lr) for v in ("baseline", "diff_v1") for lr in (1e-3, 2e-3)
                                       for s in (10, 11, 12)}
    # the baseline prefers the largest lr (an edge: widened to 4e-3), DIFF V1 the smallest (widened to 5e-4)
    done = _fake(cfg, {("baseline", 1e-3): 0.5, ("baseline", 2e-3): 0.8, ("diff_v1", 1e-3): 0.9,
                       ("diff_v1", 2e-3): 0.7})
    jobs, final = needed_jobs(cfg, done)
    assert not final and Job("baseline", 11, 4e-3) in jobs and Job("diff_v1", 12, 5e-4) in jobs
    assert lr_choice(cfg, "baseline", done).lr is None
    done.update(_fake(cfg, {("baseline", 4e-3): 0.6, ("diff_v1", 5e-4): 0.95}))
    jobs, final = needed_jobs(cfg, done)
    assert lr_choice(cfg, "baseline", done) == (2e-3, [1e-3, 2e-3, 4e-3], [4e-3])
    assert lr_choice(cfg, "diff_v1", done).lr == 5e-4  # still at an edge, widened once (lr_widen=1)
    assert final and set(jobs) - set(done) == set()  # DIFF V1 has the matched 2e-3 in its grid
    cfg2 = tiny(variants=("baseline", "diff_v1"), lr_grid=(1e-3, 2e-3), seeds=3, lr_widen=0)
    done2 = _fake(cfg2, {("baseline", 1e-3): 0.5, ("baseline", 2e-3): 0.8, ("diff_v1", 1e-3): 0.9,
                         ("diff_v1", 2e-3): 0.7})
    assert needed_jobs(cfg2, done2)[1] and lr_choice(cfg2, "baseline", done2).lr == 2e-3


def test_reproducible_across_process_layouts(tmp_path):
    """One job in this process, at 3 torch threads outside the job, and in a 2-worker spawn pool (whose processes
    start at the machine's default): bitwise equal. DIFF V1's training is not bitwise the same at 1, 2 and 3 threads
    (measured), so without the job's one thread this fails."""
    import torch
    cfg = tiny(variants=("baseline", "diff_v1"), lr_grid=(2e-3,), lr_widen=0, seeds=1, steps=8, d_model=32)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        a = run_benchmark(cfg, None, workers=1, progress=False)
        assert torch.get_num_threads() == 3  # the job's one thread is restored
    finally:
        torch.set_num_threads(threads)
    b = run_benchmark(cfg, None, workers=2, progress=False)
    strip = lambda r: {v: [{k: x for k, x in run.items() if not k.endswith("_s")} for run in d["runs"]]  # noqa: E731
                       for v, d in r["variants"].items()}
    assert strip(a) == strip(b)


@pytest.mark.parametrize("argv", [["--lr-grid", "x"], ["--distractors", "far"], ["--seeds", "0"], ["--workers", "0"],
                                  ["--train-pairs", "4"], ["--seed-base", "-1"], ["--primary", "p16c128"],
                                  ["--sweep-width", "64"]])
def test_cli_bad_input_one_line(tmp_path, capsys, argv):
    try:
        rc = main(["retrieval", "--out", str(tmp_path / "o"), "--no-progress", *argv])
    except SystemExit as e:  # a flag's type or choices: argparse's own one line
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("difftransformer retrieval: error:")
    assert not (tmp_path / "o").exists()


def test_cli_a_failed_job_and_the_time_limit_are_one_line_each_and_a_rerun_finishes(tmp_path, capsys, monkeypatch):
    """Through `difftransformer retrieval`: a job that fails (the tests' hook) is recorded, the others run, exit code
    3 and one line, no results; a rerun stopped by --time-limit before any job starts says so (exit code 75); a rerun
    without it runs the failed job alone and writes the results."""
    import re

    from difftransformer.jobs import EXIT_FAILED, EXIT_TIME_LIMIT
    from difftransformer.jobs.outcome import FAIL_ENV
    from difftransformer.retrieval.benchmark import JOURNAL
    out = tmp_path / "o"
    argv = ["retrieval", "--d-model", "16", "--n-layers", "1", "--steps", "3", "--batch", "4", "--seeds", "2",
            "--lr-grid", "2e-3", "--lr-widen", "0", "--eval-contexts", "4", "--train-pairs", "8,10",
            "--train-context", "40,48", "--queries", "2", "--variants", "baseline,diff_v2", "--workers", "1",
            "--no-progress", "--out", str(out)]  # 4 jobs
    monkeypatch.setenv(FAIL_ENV, "diff_v2 3001 0.002")
    capsys.readouterr()
    assert main(argv) == EXIT_FAILED
    last = capsys.readouterr().err.strip().splitlines()[-1]
    m = re.fullmatch(r"difftransformer retrieval: 1 of 4\+? jobs failed; first: diff_v2 3001 0\.002 \[key "
                     r"[0-9a-f]{12}\]: RuntimeError: injected failure: .+? \(traceback: (.+)\)", last)
    assert m, last
    assert "in injected_failure" in Path(m.group(1)).read_text() and Path(m.group(1)).parent == out / "failed"
    assert (out / JOURNAL).read_text().count("\n") == 1 + 3 and not (out / "results.json").exists()
    monkeypatch.delenv(FAIL_ENV)
    assert main([*argv, "--time-limit", "0.001"]) == EXIT_TIME_LIMIT
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "difftransformer retrieval: incomplete: rerun the same command to resume (--time-limit 0.001 s reached: "
        "3 of 4+ jobs done, 0 run now)")
    assert main(argv) == 0
    assert "4 jobs (1 run now" in capsys.readouterr().out and not (out / "failed").exists()
    assert json.loads((out / "results.json").read_text())["timings"]["jobs_run"] == 1
