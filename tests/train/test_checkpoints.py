"""Checkpoints: a truncated or corrupted newest checkpoint is reported and --resume falls back to an older one."""

from __future__ import annotations

import shutil

import torch

from difftransformer.cli import main
from difftransformer.train.checkpoint import find_resumable, step_dir
from difftransformer.train.trainer import train
from train_helpers import tiny_config, weights


def _break(run_dir):
    """Truncate step 20's weights and flip one byte (same size) of step 15's optimizer state."""
    w = step_dir(run_dir, 20) / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    s = step_dir(run_dir, 15) / "training_state.safetensors"
    raw = bytearray(s.read_bytes())
    raw[-1] ^= 0xFF
    s.write_bytes(bytes(raw))


def test_resume_skips_truncated_and_corrupted_checkpoints(tmp_path, prepared_dir, capsys):
    cfg = tiny_config(data={"prepared_dir": prepared_dir}, checkpoint={"every": 5, "keep_last": 3})
    run = tmp_path / "run"
    train(cfg, run)
    reference = weights(step_dir(run, 20))  # this run is the uninterrupted reference
    _break(run)
    # An incomplete checkpoint (a directory without manifest, as a crash before the rename could not leave, but a
    # hand copy could) is skipped too.
    (step_dir(run, 25)).mkdir()

    warnings = []
    assert find_resumable(run, warn=warnings.append) == step_dir(run, 10)
    assert len(warnings) == 3
    assert "step_00000025" in warnings[0] and "incomplete" in warnings[0]
    assert "step_00000020" in warnings[1] and "model.safetensors is truncated" in warnings[1]
    assert "step_00000015" in warnings[2] and "training_state.safetensors is corrupted" in warnings[2]

    # --resume through the CLI: it says what it skipped, continues from step 10 and ends where the straight run did.
    shutil.rmtree(step_dir(run, 25))
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "skipping checkpoint step_00000020" in err and "truncated" in err
    assert "skipping checkpoint step_00000015" in err and "corrupted" in err
    assert "resuming from" in err and "step 10" in err
    resumed = weights(step_dir(run, 20))
    for k in reference:
        torch.testing.assert_close(resumed[k], reference[k], rtol=0, atol=1e-6, msg=k)


def test_resume_with_no_complete_checkpoint_is_one_error_line(tmp_path, prepared_dir, capsys):
    cfg = tiny_config(data={"prepared_dir": prepared_dir}, train={"steps": 2}, checkpoint={"every": 1})
    run = tmp_path / "run"
    train(cfg, run)
    for step in (1, 2):
        (step_dir(run, step) / "manifest.json").write_text("{not json")
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--train.steps", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("difftransformer train: error: --resume: no complete checkpoint")
