"""`make gpu-check`'s whole dry plan run once on the CPU at toy size: every step a process under its limit, steps
with parts in one process, the summary from their outputs. Apart from test_gpu_check.py, which runs alone (its
kills are timed against the clock), because this test times nothing: each dry step gets its whole limit (the
longest, the smoke, takes about 30 s of its 300 s), so it runs in the parallel pass."""

from __future__ import annotations

import json

from difftransformer.gpucheck import gpu_check, gpu_plan


def test_the_whole_dry_plan_runs_on_the_cpu_and_writes_the_summary(tmp_path, monkeypatch):
    """Every step of the dry plan once, as `make gpu-check-dry` runs it, but the smoke cut to one analysis (and the
    training it reads), the candidates to one and the tests step to one shard (the smoke's commands run at toy size
    in test_readme_commands.py and `make gpu-check-dry`; the candidates, one per kernel and form, in the candidates
    test of test_gpu_check.py; the tests step's 2 shards, stopped mid-way, there too)."""
    def cut(step):
        if step.name == "cuda-smoke":
            return gpu_check.Step(**{**step.__dict__, "args": (*step.args, "--only", "eval-outliers")})
        if step.name == "candidates":
            return gpu_check.Step(**{**step.__dict__, "args": (*step.args, "--limit", "1")})
        if step.name == "tests":
            i = step.args.index("--shards")
            return gpu_check.Step(**{**step.__dict__, "args": (*step.args[:i + 1], "1", *step.args[i + 2:])})
        return step

    plan = [cut(s) for s in gpu_plan.dry_plan()]
    monkeypatch.setattr(gpu_check, "dry_plan", lambda: plan)
    assert gpu_check.main(["run", "--dry-run", "--out", str(tmp_path), "--commit", "abc"]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert [(x["name"], x["status"]) for x in s["steps"]] == [
        ("env", "ok"), ("cuda-smoke", "ok"), ("candidates", "ok"), ("tests", "ok"), ("attention", "ok"),
        ("attention-3b", "ok"), ("attention-bench", "ok"), ("kernels-3b", "ok"), ("decode", "ok"),
        ("decode-sdpa", "ok"), ("train", "ok"), ("train-bench", "ok"), ("small-jobs", "ok")]
    assert s["commit"] == "abc" and s["source_digest"] == gpu_check.source_digest()
    assert s["env"]["cuda_available"] is False
    r = s["results"]
    assert [(x["name"], x["status"]) for x in r["cuda-smoke"]["rows"]] == [("train-v1", "ok"), ("eval-outliers", "ok")]
    assert r["cuda-smoke"]["finished"]
    assert r["candidates"]["finished"] and r["candidates"]["counts"] == {"ok": 1, "wrong": 0, "failed": 0}
    assert (r["candidates"]["arch"], r["candidates"]["dtype"]) == ("sm_90", "float32")
    assert json.loads((tmp_path / gpu_check.SKIP_FILE).read_text())["skip"] == []
    assert r["tests"]["finished"] and r["tests"]["shards"] == 1 and r["tests"]["counts"] == {"skipped": 30}
    for name in ("attention-3b", "attention-bench", "train-bench"):
        assert r[name]["rows"] and r[name]["labels"] == ["V1 sdpa", "V1 blocked", "V2 sdpa", "V2 blocked"], name
    assert r["decode-sdpa"]["rows"] and r["decode-sdpa"]["labels"] == ["V1", "V2"]
    kernel_rows = {(x["case"], x["what"]) for x in r["kernels-3b"]["rows"]}
    assert {("V1 triton", "dK/dV kernel"), ("V2 triton", "dQ kernel"), ("baseline sdpa", "bwd")} <= kernel_rows
    assert len(kernel_rows) == 2 + 2 + 5 + 2 + 5
    assert [x["processes"] for x in r["small-jobs"]["rows"]] == [1, 1, 1, 2]
    md = (tmp_path / "summary.md").read_text()
    assert "dry (CPU, toy sizes)" in md and "| attention / kernels-3b | ok |" in md
    assert "## Every command on the device (`cuda-smoke`)" in md and "## Where the fused kernel loses" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["env.txt", "cuda-smoke.txt", "candidates.txt", "candidates-skip.json", "tests.txt", "attention.txt",
         "decode.txt", "train.txt", "small-jobs.txt", "summary.json", "summary.md"])
