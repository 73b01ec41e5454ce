"""Helpers of the training tests: the tiny preset with overrides, subprocess runs, run-directory reading."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from difftransformer.model.pretrained import load_state_dict
from difftransformer.train.config import TrainConfig, load_config


def tiny_config(**sections) -> TrainConfig:
    """The tiny preset with ``section={key: value}`` changes, quiet (no bar, no TensorBoard)."""
    changes = {"log": {"progress": False, "tensorboard": False}}
    for section, values in sections.items():
        changes.setdefault(section, {}).update(values)
    return load_config("tiny", changes)


def child_env() -> dict[str, str]:
    """The environment of a child process: this process's thread count, so float results compare exactly."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    env.pop("DIFFTRANSFORMER_DEBUG", None)
    return env


def two_ranks(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``difftransformer <args>`` as 2 ranks on this machine, started as torchrun starts its workers (the variables
    it sets, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; one
    thread each), without torchrun's launcher process, which would load torch a third time. The result's
    ``returncode`` is the first non-zero rank's (else 0), ``stdout`` and ``stderr`` the ranks' in rank order. The
    tests of torchrun itself (a refusal seen through its launcher, `test_readme_commands.py`, two nodes in
    `test_multinode.py`) keep the launcher."""
    import socket

    with socket.socket() as s:  # a free port for rank 0's store, as `torchrun --standalone` picks one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = child_env() | {"OMP_NUM_THREADS": "1", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                             "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "difftransformer", *args], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env))
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    rc = next((p.returncode for p in procs if p.returncode), 0)
    return subprocess.CompletedProcess(args, rc, "".join(o for o, _ in outs), "".join(e for _, e in outs))


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "difftransformer", *args], capture_output=True, text=True,
                          env=child_env(), timeout=timeout)


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's weights, copied (safetensors may map the file: a later write to it would show through)."""
    return {k: v.clone() for k, v in load_state_dict(Path(ckpt) / "model.safetensors").items()}


def metric_records(run_dir: Path, key: str) -> dict[int, float]:
    """``{step: value}`` of one metric in ``run_dir/metrics.jsonl``."""
    out = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if key in rec:
            out[rec["step"]] = rec[key]
    return out


def snapshot(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` (to prove that a refused command changed nothing)."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(directory).rglob("*")) if p.is_file()}
