"""Resume is exact: 20 steps straight == 10 steps, SIGKILL, resume for 10 more (fp32, CPU)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import torch

from difftransformer.train.checkpoint import STATE_TENSORS, step_dir
from difftransformer.model.pretrained import load_state_dict
from difftransformer.train.trainer import train
from train_helpers import child_env, metric_records, tiny_config, weights

# The child trains the same config and kills itself (SIGKILL: no cleanup, no atexit) right after the step-10
# checkpoint is complete, as a crash or a pre-empted job would.
KILLED_CHILD = """
import json, os, signal, sys
from difftransformer.train.config import TrainConfig
from difftransformer.train.trainer import train

def hook(step, path):
    if step == 10:
        os.kill(os.getpid(), signal.SIGKILL)

train(TrainConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], on_checkpoint=hook)
"""


def test_sigkill_then_resume_equals_straight_run(tmp_path, prepared_dir):
    # V2 so that the per-token lambda projection is covered; eval and checkpoint at 10 and 20; log every step.
    cfg = tiny_config(model={"attention": "diff_v2"}, data={"prepared_dir": prepared_dir},
                      log={"every": 1}, checkpoint={"every": 5, "keep_last": 2})
    killed, straight = tmp_path / "killed", tmp_path / "straight"

    child = subprocess.run([sys.executable, "-c", KILLED_CHILD, json.dumps(cfg.to_dict()), str(killed)],
                           capture_output=True, text=True, env=child_env(), timeout=240)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert step_dir(killed, 10).is_dir() and not step_dir(killed, 15).exists()
    assert max(metric_records(killed, "loss")) == 10

    resumed = train(cfg, killed, resume=True)
    assert resumed.steps == 20 and len(resumed.losses) == 10  # this process ran steps 11..20 only
    reference = train(cfg, straight)

    w_res, w_ref = weights(step_dir(killed, 20)), weights(step_dir(straight, 20))
    assert w_res.keys() == w_ref.keys()
    for k in w_ref:
        torch.testing.assert_close(w_res[k], w_ref[k], rtol=0, atol=1e-6, msg=k)
    # Optimizer moments and the sampler position too, so that a further resume would also continue exactly.
    s_res, s_ref = (load_state_dict(step_dir(d, 20) / STATE_TENSORS) for d in (killed, straight))
    for k in s_ref:
        if not k.startswith("rng."):
            torch.testing.assert_close(s_res[k], s_ref[k], rtol=0, atol=1e-6, msg=k)

    # The resumed metrics.jsonl reads as one run: every step once, with the straight run's losses.
    loss_res, loss_ref = metric_records(killed, "loss"), metric_records(straight, "loss")
    assert sorted(loss_res) == list(range(1, 21))
    for step in loss_ref:
        assert abs(loss_res[step] - loss_ref[step]) <= 1e-6, step
    assert abs(resumed.final_val_loss - reference.final_val_loss) <= 1e-6
    assert metric_records(killed, "val_loss").keys() == {10, 20}
    # keep_last=2: only the two newest checkpoints remain, and no temporary directory is left behind.
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step_00000015", "step_00000020"]
