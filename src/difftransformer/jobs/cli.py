"""The flags of every command that runs jobs (``retrieval``, ``lm-sweep``; ``demo`` takes ``--device``), parsed into
one ``RunOptions`` (validated there, once), and how such a command ends when its jobs did not all finish
(``incomplete``: one line, an exit code; ``outcome``)."""

from __future__ import annotations

import argparse
import sys

from .codepath import DEVICES
from .outcome import EXIT_FAILED, EXIT_TIME_LIMIT, Incomplete
from .runner import EXECUTORS, RunOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..fileio import text_arg
    p.add_argument("--workers", type=int, default=2,
                   help="local worker processes, one torch thread each (default 2; --executor local); the numbers "
                        "do not depend on it")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="where jobs run: 'local' (default) worker processes on this machine; 'ray' one Ray task per "
                        "job on a Ray cluster (pip install 'difftransformer[ray]'; docs/cluster.md); the results are "
                        "the same, the journal the same (a run may move between them and resume)")
    p.add_argument("--ray-address", type=text_arg, metavar="HOST:PORT",
                   help="with --executor ray: the cluster to join (its head's HOST:PORT, or 'auto' for the one this "
                        "node belongs to); without it, Ray's own rule: $RAY_ADDRESS, else a cluster `ray start` "
                        "runs on this node, else a new local instance on this machine, stopped at the end")
    p.add_argument("--cpus-per-job", type=float, default=1,
                   help="with --executor ray: CPUs each job's task asks for (default 1; a job uses one thread)")
    p.add_argument("--gpus-per-job", type=float, default=0,
                   help="with --executor ray: GPUs each job's task asks for (default 0; a fraction such as 0.125 "
                        "runs several small jobs on one GPU; needed with --device cuda)")
    p.add_argument("--device", choices=DEVICES, default="cpu",
                   help="where each job trains: 'cpu' (default) or 'cuda' (the GPU its process was given); GPU "
                        "results differ from CPU ones and are journaled apart (the device and precision are part "
                        "of the job's key)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="no job starts later than SECONDS after the command started; the running ones finish and are "
                        "journaled, then the command prints 'incomplete: rerun the same command to resume' and exits "
                        f"with code {EXIT_TIME_LIMIT} (for a machine held for a fixed time: leave the longest job's "
                        f"time to spare). A job that fails does not stop the others: exit code {EXIT_FAILED}, "
                        "OUT/failed/KEY.txt holds its traceback, a rerun retries it")


def options_from_args(args: argparse.Namespace) -> RunOptions:
    return RunOptions(workers=args.workers, executor=args.executor, ray_address=args.ray_address,
                      cpus_per_job=args.cpus_per_job, gpus_per_job=args.gpus_per_job, device=args.device,
                      progress=not getattr(args, "no_progress", False), time_limit=args.time_limit)


def incomplete(e: Incomplete, command: str) -> int:
    """A run whose jobs did not all finish: its one line on stderr (the command's last), and its exit code."""
    print(f"difftransformer {command}: {e}", file=sys.stderr)
    return e.exit_code
