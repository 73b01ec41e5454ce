"""The flags of every command that runs jobs (``retrieval``, ``lm-sweep``; ``demo`` takes ``--device``), parsed into
one ``RunOptions`` (validated there, once), and how such a command ends when its jobs did not all finish
(``incomplete``: one line, an exit code; ``outcome``)."""

from __future__ import annotations

import argparse
import sys

from .codepath import DEVICES
from .outcome import EXIT_TIME_LIMIT, Incomplete
from .runner import EXECUTORS, RunOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..fileio import text_arg
    p.add_argument("--workers", type=int, default=2,
                   help="local worker processes, one torch thread each (default 2; --executor local); the numbers "
                        "do not depend on it")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="'local' (default): worker processes here; 'ray': one Ray task per job on a cluster "
                        "(docs/cluster.md); the same results and journal")
    p.add_argument("--ray-address", type=text_arg, metavar="HOST:PORT",
                   help="with --executor ray: the cluster's head, or 'auto' (default: Ray's own rule, "
                        "docs/cluster.md)")
    p.add_argument("--cpus-per-job", type=float, default=1,
                   help="with --executor ray: CPUs each job's task asks for (default 1; a job uses one thread)")
    p.add_argument("--gpus-per-job", type=float, default=0,
                   help="with --executor ray: GPUs each job asks for (default 0; 0.125 shares one GPU by 8)")
    p.add_argument("--device", choices=DEVICES, default="cpu",
                   help="where each job trains (default cpu); GPU results are journaled apart (the device and "
                        "precision are in the job's key)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help=f"no job starts after SECONDS; the running ones finish, then exit code {EXIT_TIME_LIMIT} "
                        "(rerun the same command to resume)")


def options_from_args(args: argparse.Namespace) -> RunOptions:
    return RunOptions(workers=args.workers, executor=args.executor, ray_address=args.ray_address,
                      cpus_per_job=args.cpus_per_job, gpus_per_job=args.gpus_per_job, device=args.device,
                      progress=not getattr(args, "no_progress", False), time_limit=args.time_limit)


def incomplete(e: Incomplete, command: str) -> int:
    """A run whose jobs did not all finish: its one line on stderr (the command's last), and its exit code."""
    print(f"difftransformer {command}: {e}", file=sys.stderr)
    return e.exit_code
