"""The Ray executor (``--executor ray``): each job a Ray task with the resources it asks for.

``ray.init`` joins the cluster at ``--ray-address`` (``auto``: the one this node belongs to; none: a local instance
on this machine, stopped again at the end, and ended with the driver if it is killed: ``ray_watch``). Before any
job: a missing Ray, an address that does not answer, or a cluster with no node offering one job's CPUs and GPUs is
one ``ValueError`` (never a hang). A task is ``local.call`` (the driver's variant registry, one torch thread, the
device) under the CPU code path's variables as its runtime environment (set before its worker process loads torch);
Ray gives it ``--gpus-per-job`` of a GPU (``CUDA_VISIBLE_DEVICES``) and retries it when its worker or node is lost
(``MAX_RETRIES``). Only the driver writes the journal: a result travels back to it as the task's return value, a
job's exception as its ``JobError`` (the worker's traceback; ``outcome``), a task Ray gave up on as Ray's error.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Optional

from . import ray_watch
from .codepath import code_path_env
from .local import call
from .outcome import JobError

MAX_RETRIES = 3  # times Ray reruns a task whose worker process or node died (an exception in a job is not retried)
CONNECT_TIMEOUT_S = 5.0
AUTH_HINT = (" (a cluster with token authentication takes only a driver that has its token: RAY_AUTH_MODE=token, and "
             "the token in ~/.ray/auth_token, $RAY_AUTH_TOKEN_PATH or $RAY_AUTH_TOKEN; docs/cluster.md)")


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


def _resolve(address: str) -> str:
    """``host:port`` of the cluster ``address`` names ("auto": the one this node's ``ray start`` recorded)."""
    if address != "auto":
        return address
    from ray._private import services  # no public call resolves "auto" without connecting
    try:
        return str(services.canonicalize_bootstrap_address_or_die("auto"))
    except ConnectionError as e:
        raise ValueError(f"--ray-address auto: no Ray cluster runs on this node ({e}); start one with "
                         "`ray start --head` or name its address") from None


def slots(nodes: list[dict[str, Any]], cpus: float, gpus: float) -> int:
    """How many jobs of ``cpus`` CPUs and ``gpus`` GPUs the alive nodes run at once."""
    total = 0
    for n in nodes:
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        fits = [math.floor(res.get(name, 0.0) / need + 1e-9) for name, need in (("CPU", cpus), ("GPU", gpus))
                if need > 0]
        total += min(fits)
    return total


class RayExecutor:
    """``address``, ``cpus``, ``gpus``, ``device``: ``RunOptions``' ray_address, cpus_per_job, gpus_per_job, device."""

    def __init__(self, address: Optional[str], cpus: float, gpus: float, device: str, code_path: str,
                 variants: Any) -> None:
        from ..extras import require
        ray = require("ray", "ray", "--executor ray")
        self.ray, self.variants, self.device = ray, variants, device
        self.started = not ray.is_initialized()
        self.watcher = None
        if self.started:
            named = address
            if address is not None and not address.startswith("ray://"):
                address = _resolve(address)
                if not _answers(address):
                    raise ValueError(f"--ray-address {named}: nothing answers at {address} (is the head node up? "
                                     "`ray status --address ...` says)")
            try:
                ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR,
                         log_to_driver=False, configure_logging=True)
            except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as e:
                where = named or "a new local instance"
                auth = getattr(ray.exceptions, "AuthenticationError", ConnectionError)
                hint = AUTH_HINT if isinstance(e, (ConnectionError, auth)) else ""
                raise ValueError(f"--executor ray: could not join the Ray cluster at {where}: "
                                 f"{' '.join(str(e).split())}{hint}") from None
            self.watcher = ray_watch.start(os.getpid(), _own_processes(ray))  # a local instance: it ends with us
        try:
            nodes = ray.nodes()
            self.slots = slots(nodes, cpus, gpus)
            if self.slots < 1:
                have = "; ".join(f"{n.get('NodeManagerAddress')}: CPU {n['Resources'].get('CPU', 0):g}, GPU "
                                 f"{n['Resources'].get('GPU', 0):g}" for n in nodes if n.get("Alive"))
                raise ValueError(f"--executor ray: no node of the cluster offers one job's {cpus:g} CPU and "
                                 f"{gpus:g} GPU (--cpus-per-job, --gpus-per-job); its nodes: {have or 'none alive'}")
        except BaseException:
            self.close()
            raise
        env = code_path_env(code_path)
        self.task = ray.remote(call).options(
            num_cpus=cpus, num_gpus=gpus, max_retries=MAX_RETRIES,
            retry_exceptions=False, runtime_env={"env_vars": env} if env else None)

    def submit(self, fn: Callable[..., dict], args: Sequence[Any]) -> Future:
        ref = self.task.remote(fn, tuple(args), self.variants, self.device)
        out: Future = Future()

        def done(f: Future) -> None:
            e = f.exception()
            if e is None:
                out.set_result(f.result())
            else:  # the job's JobError (local.call), not Ray's wrapper of it; a lost task: Ray's error
                cause = getattr(e, "cause", None)
                out.set_exception(JobError.of(cause if isinstance(cause, BaseException) else e))
        ref.future().add_done_callback(done)
        return out

    def close(self) -> None:
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
        if self.watcher is not None:  # the instance is down: its watcher has nothing left to end
            self.watcher.kill()
            self.watcher.wait(timeout=10)
            self.watcher = None


def _own_processes(ray: Any) -> list[int]:
    """The pids of the Ray processes this driver's ``ray.init`` started (a new local instance: GCS, raylet, monitor,
    dashboard, log monitor), none when it joined a running cluster. Read from Ray's private ``Node``; a Ray whose
    internals differ gives none (no watcher, the 60-90 s of ``ray_watch``'s docstring)."""
    try:
        node = ray._private.worker._global_node
        return sorted(p.process.pid for procs in node.all_processes.values() for p in procs if p.process is not None)
    except (AttributeError, TypeError):
        return []
