"""Non-finite training: a step whose loss or gradient norm is not finite makes no update and is counted; a run of
them stops the run with one error line; no checkpoint ever holds a NaN; and a one-step run reports a sane
throughput."""

from __future__ import annotations

import math

import torch
from train_helpers import tiny_config

from difftransformer import rundir
from difftransformer.cli import main
from difftransformer.model.pretrained import load_state_dict
from difftransformer.train.steps import MAX_NONFINITE_STREAK
from difftransformer.train.trainer import train


def test_a_diverging_run_stops_with_one_line_and_saves_no_nan(tmp_path, prepared_dir, capsys, monkeypatch):
    monkeypatch.delenv("DIFFTRANSFORMER_DEBUG", raising=False)
    run = tmp_path / "run"
    # lr 1e30 is finite (accepted) but blows the weights up after one update: every later loss is inf/nan
    argv = ["train", "--config", "tiny", "--out", str(run), "--no-progress", "--data.prepared_dir", prepared_dir,
            "--train.lr", "1e30", "--train.min_lr", "0", "--train.warmup_steps", "0", "--train.grad_clip", "0",
            "--train.steps", "20", "--checkpoint.every", "1", "--log.every", "1", "--checkpoint.keep_last", "20"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("difftransformer train: error: training diverged"), err
    for ckpt in rundir.list_checkpoints(run):
        for name, t in load_state_dict(ckpt / rundir.WEIGHTS_NAME).items():
            assert torch.isfinite(t).all(), (ckpt, name)
    records = [r for r in rundir.read_metric_records(run) if "loss" in r]
    skipped = [r["skipped_steps"] for r in records]
    assert skipped[-1] == MAX_NONFINITE_STREAK - 1  # the stopping step itself is not logged
    assert any(not math.isfinite(r["loss"]) for r in records)


def test_finite_steps_skip_nothing_and_one_step_throughput_is_sane(tmp_path, prepared_dir):
    cfg = tiny_config(data={"prepared_dir": prepared_dir}, train={"steps": 1}, log={"every": 1})
    res = train(cfg, tmp_path / "one")
    assert res.skipped_steps == 0
    assert math.isfinite(res.tokens_per_s) and 0 < res.tokens_per_s < 1e8, res.tokens_per_s
