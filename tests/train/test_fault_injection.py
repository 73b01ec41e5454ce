"""A kill at every distinct file write of a training run, then recovery, ends bitwise equal to a straight run.

``DIFFTRANSFORMER_FAULT_AT=k`` makes a process exit (``os._exit``, like SIGKILL: no cleanup) at its k-th write:
each atomic file (tokenizer, shards, meta.json, run_config.json), each metrics line (cut in the middle) and each
checkpoint directory. One driver process trains the reference, then for k = 1, 2, ... forks a child that trains
into its own directory and dies at write k, and recovers the run the way a user would: ``--resume`` once the
run has its run_config.json, the same command again before that. It stops at the first k the child survives.
Forking keeps the whole test to one interpreter start (the driver never starts an OpenMP pool before forking).
"""

from __future__ import annotations

import json
import subprocess
import sys

from train_helpers import child_env, tiny_config

DRIVER = r"""
import json, os, sys
import torch
torch.set_num_threads(1)  # before any torch op: no OpenMP pool exists when the children are forked
from difftransformer import fileio, rundir
from difftransformer.model.pretrained import load_state_dict
from difftransformer.train.config import TrainConfig
from difftransformer.train.trainer import train

cfg = TrainConfig.from_dict(json.loads(sys.argv[1]))
root = sys.argv[2]
STEPS = cfg.train.steps

def final_state(d):
    ck = rundir.step_dir(d, STEPS)
    out = load_state_dict(ck / rundir.WEIGHTS_NAME)
    out.update({k: v for k, v in load_state_dict(ck / rundir.STATE_TENSORS).items() if not k.startswith("rng.")})
    return out

def losses(d):
    return [(r["step"], r["loss"]) for r in rundir.read_metric_records(d) if "loss" in r]  # in order, once each

train(cfg, f"{root}/reference")
ref, ref_losses = final_state(f"{root}/reference"), losses(f"{root}/reference")
report = []
for k in range(1, 60):
    d = f"{root}/killed-{k}"
    pid = os.fork()
    if pid == 0:
        os.environ[fileio.FAULT_ENV] = str(k)
        fileio._writes = 0
        try:
            train(cfg, d)
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:  # no k-th write: every write point has been killed at
        report.append({"k": k, "survived": True})
        break
    resumable = rundir.run_config_path(d).is_file()
    train(cfg, d, resume=resumable)
    state = final_state(d)
    report.append({"k": k, "code": code, "resumed": resumable,
                   "equal": state.keys() == ref.keys() and all(torch.equal(state[n], ref[n]) for n in ref),
                   "losses_equal": losses(d) == ref_losses,
                   "leftovers": [p.name for p in rundir.leftover_temp_checkpoints(d)]})
print(json.dumps(report))
"""


def test_a_kill_at_every_write_then_recovery_equals_a_straight_run(tmp_path):
    # 2 steps, a checkpoint after each, metrics every step: 11 write points. Own data (no prepared_dir), so the
    # tokenizer, shard and meta.json writes are killed at too.
    cfg = tiny_config(data={"max_chars": 30000}, train={"steps": 2, "eval_every": 2, "warmup_steps": 1},
                      checkpoint={"every": 1, "keep_last": 2}, log={"every": 1})
    res = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cfg.to_dict()), str(tmp_path)],
                         capture_output=True, text=True, env=child_env(), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    killed, last = report[:-1], report[-1]
    assert last["survived"] and len(killed) >= 10, report
    from difftransformer.fileio import FAULT_EXIT_CODE

    for r in killed:
        assert r["code"] == FAULT_EXIT_CODE, r
        assert r["equal"] and r["losses_equal"], r
    # both recoveries were exercised: a rerun before run_config.json existed, a --resume after
    assert {r["resumed"] for r in killed} == {True, False}, report


def test_files_left_empty_by_an_older_version(tmp_path, capsys, monkeypatch):
    """What a kill mid-write left before writes were atomic: an empty data/meta.json is prepared again on resume,
    an empty run_config.json is one error line naming it (it was "Expecting value", naming no file)."""
    from difftransformer import rundir
    from difftransformer.cli import main
    from difftransformer.train.trainer import train

    monkeypatch.delenv("DIFFTRANSFORMER_DEBUG", raising=False)
    cfg = tiny_config(data={"max_chars": 30000}, train={"steps": 2, "eval_every": 2}, checkpoint={"every": 1})
    run = tmp_path / "run"
    train(cfg, run)
    (rundir.data_dir(run) / "meta.json").write_text("")
    res = train(tiny_config(data={"max_chars": 30000}, train={"steps": 3, "eval_every": 2},
                            checkpoint={"every": 1}), run, resume=True)
    assert len(res.losses) == 1 and (rundir.data_dir(run) / "meta.json").stat().st_size > 0
    rundir.run_config_path(run).write_text("")
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--train.steps", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{rundir.run_config_path(run)} is not valid JSON" in err[0], err
