"""Multi-node torchrun, on one machine: two launchers ("nodes") of one process each meet at a c10d rendezvous on
127.0.0.1 and train with gloo on CPU; their losses follow a one-process run of the same global batch.

This is the command docs/training.md gives for a cluster, with 127.0.0.1 as the rendezvous host:

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m difftransformer train ...

(`--node-rank` is read by torchrun's static rendezvous only; under c10d the rendezvous numbers the nodes itself,
and passing it is harmless.) The run directory is shared, as it must be on a cluster: rank 0 writes the shards and
every rank reads them. The global batch (the tiny preset's 4) is split as 2 nodes x 2 sequences; the reference is
one process taking the 4 sequences in one micro-batch, so only the order of float sums differs: per-step losses,
the validation loss and the final weights agree within 1e-5 (as in test_distributed.py).
"""

from __future__ import annotations

import socket
import subprocess
import sys

import torch
from train_helpers import child_env, metric_records, weights

from difftransformer.train.checkpoint import step_dir

STEPS = 4
TIMEOUT = 240


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_args(run_dir, prepared_dir) -> list[str]:
    return ["train", "--config", "tiny", "--out", str(run_dir), "--no-progress",
            "--train.steps", str(STEPS), "--log.every", "1", "--checkpoint.every", str(STEPS),
            "--log.tensorboard", "false", "--data.prepared_dir", str(prepared_dir)]


def _env() -> dict[str, str]:
    env = child_env()
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_two_nodes_on_localhost_match_one_process(tmp_path, prepared_dir):
    # the reference first, in this process (the CLI's code path, on one thread as the nodes' OMP_NUM_THREADS=1): it
    # also tokenises into the shared prepared_dir, which the nodes' rank 0 then links
    from difftransformer.cli import main

    torch.set_num_threads(1)
    assert main(_train_args(tmp_path / "one", prepared_dir)) == 0

    port = _free_port()
    run = tmp_path / "two_nodes"
    nodes = []
    for node_rank in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--node-rank", str(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "multinode-test", "--rdzv-conf", "join_timeout=120", "--local-addr", "127.0.0.1",
               "-m", "difftransformer", *_train_args(run, prepared_dir)]
        nodes.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()))
    outputs = []
    try:
        for p in nodes:
            outputs.append(p.communicate(timeout=TIMEOUT))
    finally:
        for p in nodes:  # a node left waiting at the rendezvous (the other failed) is ended here
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (_, err) in zip(nodes, outputs):
        assert p.returncode == 0, err[-3000:]
    stdout = "".join(out for out, _ in outputs)
    stderr = "".join(err for _, err in outputs)
    assert stdout.count("parameters") == 1, stdout  # rank 0 alone prints the summary, on whichever node it is
    assert "global batch 4 = 2 processes x 2 sequences x 1 micro-step(s)" in stderr, stderr[-3000:]

    losses, ref = metric_records(run, "loss"), metric_records(tmp_path / "one", "loss")
    assert sorted(losses) == sorted(ref) == list(range(1, STEPS + 1))
    for step in ref:
        assert abs(losses[step] - ref[step]) <= 1e-5, (step, losses[step], ref[step])
    assert abs(metric_records(run, "val_loss")[STEPS] - metric_records(tmp_path / "one", "val_loss")[STEPS]) <= 1e-5
    w, w_ref = weights(step_dir(run, STEPS)), weights(step_dir(tmp_path / "one", STEPS))
    assert w.keys() == w_ref.keys()
    for k in w_ref:
        torch.testing.assert_close(w[k], w_ref[k], rtol=0, atol=1e-5, msg=k)
