"""One writer per run directory: a second train / --resume is refused at once naming the holder's PID, and a
holder killed with SIGKILL does not block the resume (the kernel drops an flock with its process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from difftransformer import rundir
from difftransformer.cli import main
from train_helpers import child_env


def _wait_for(cond, proc, what: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, f"the holder exited ({proc.returncode}) before {what}: {proc.stderr.read()}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_second_writer_refused_and_killed_holder_does_not_block(tmp_path, prepared_dir, capsys, monkeypatch):
    monkeypatch.delenv("DIFFTRANSFORMER_DEBUG", raising=False)
    run = tmp_path / "run"
    flags = ["--no-progress", "--data.prepared_dir", prepared_dir, "--checkpoint.every", "1",
             "--checkpoint.keep_last", "2", "--log.every", "1"]
    # The first writer: a real `train` process with far more steps than it will be given time for.
    holder = subprocess.Popen([sys.executable, "-m", "difftransformer", "train", "--config", "tiny", "--out",
                               str(run), "--train.steps", "100000", *flags],
                              env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: rundir.list_checkpoints(run), holder, "its first checkpoint")
        # The second writer, started while the first trains: --resume, as the hostile user did.
        capsys.readouterr()
        assert main(["train", "--out", str(run), "--resume", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("difftransformer train: error: ") and str(run) in err[0], err
        assert f"PID {holder.pid}" in err[0], err
        assert holder.poll() is None  # the holder was not disturbed
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert holder.returncode == -signal.SIGKILL
    done = int(rundir.list_checkpoints(run)[-1].name[len(rundir.STEP_PREFIX):])
    # The holder died holding the lock (run.lock still names it); the resume goes ahead all the same.
    assert (run / rundir.LOCK_NAME).read_text().strip() == str(holder.pid)
    assert main(["train", "--out", str(run), "--resume", "--train.steps", str(done + 1), *flags]) == 0
    assert rundir.list_checkpoints(run)[-1].name == f"{rundir.STEP_PREFIX}{done + 1:08d}"


def test_lock_refuses_a_second_holder_in_the_same_process(tmp_path):
    # flock belongs to the open file: a second open in the same process conflicts too, so this runs in-process
    with rundir.lock_run(tmp_path / "r"):
        with pytest.raises(rundir.RunLocked, match=f"PID {os.getpid()}"):
            with rundir.lock_run(tmp_path / "r"):
                pass
    with rundir.lock_run(tmp_path / "r"):  # released on exit
        pass
