"""A sweep job trains exactly as ``difftransformer train`` does with the same settings: both run the trainer's one
loop (``train.steps.optimizer_steps``), so the job's training losses are the trainer's, bit for bit, and its
divergence rule is the trainer's."""

import math

import pytest

from difftransformer.data.shards import prepare_data
from difftransformer.jobs.codepath import cpu_model
from difftransformer.lmsweep.config import quick_config
from difftransformer.lmsweep.job import run_job, train_config
from difftransformer.train.trainer import TrainingDiverged, train


@pytest.mark.parametrize("variant", ["baseline", "diff_v1"])
def test_a_sweep_job_trains_as_train_does(tmp_path, variant):
    # the tiny preset (vocab 512): the same loop bit for bit on any data, at a fraction of the demo preset's cost
    cfg = quick_config().replace(preset="tiny", steps=20, warmup_steps=3, batch=4, seq_len=32, eval_every=10)
    data = tmp_path / "data"
    tc = train_config(cfg, 16, variant, 11, 8e-3, str(data))
    prepare_data(tc.data, data, False)
    job = run_job(cfg.to_dict(), str(data), 16, variant, 11, 8e-3)
    res = train(tc, tmp_path / "run", progress=False)
    assert job["train_loss"] == [res.losses[9], res.losses[19]]  # the job keeps every 10th step's loss
    assert not job["diverged"] and math.isfinite(job["test_loss"])
    assert job["cpu_model"] == cpu_model() and job["cpu_model"] != ""  # which CPU rounded it (not only its ISA)


def test_a_diverging_job_stops_where_train_stops(tmp_path):
    cfg = quick_config().replace(preset="tiny", steps=20, warmup_steps=1, batch=4, seq_len=32, eval_every=10)
    data = tmp_path / "data"
    tc = train_config(cfg, 16, "baseline", 11, 1e30, str(data))
    prepare_data(tc.data, data, False)
    job = run_job(cfg.to_dict(), str(data), 16, "baseline", 11, 1e30)
    assert job["diverged"] and job["test_loss"] is None and job["skipped_steps"] >= 5
    with pytest.raises(TrainingDiverged, match="diverged"):
        train(tc, tmp_path / "run", progress=False)
