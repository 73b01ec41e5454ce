"""The local executor: worker processes on this machine, each started with the job's environment.

A worker is ``python -m difftransformer.jobs.worker`` started by ``subprocess`` with its own environment (the CPU code
path's variables among it, in place before torch loads: the parent's ``os.environ`` is never edited), talking with
the driver over two pipes of its own (``multiprocessing.connection``: pickled, framed; stdout and stderr stay the
job's). It runs one job at a time: (function, arguments) in, ("ok", result) or ("error", ``JobError``) out. A worker
whose driver dies (SIGKILL, SIGTERM) exits within a second, mid-job too (it watches its driver's pid:
``worker.exit_with_driver``; a driver that closes the pipe is heard between jobs); one that dies under a job fails
that job and is replaced for the next. ``Inline`` runs a job in this process instead (one worker, already in the
code path asked for).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any, Optional


def call(fn: Callable[..., dict], args: Sequence[Any], variants: Any = None, device: str = "cpu") -> dict:
    """One job, wherever it runs: the driver's variant registry, one torch thread, the device. Its exception
    leaves as a ``JobError`` carrying the traceback of here (the worker's)."""
    from ..model import variants as registry
    from .codepath import check_device, one_thread
    from .outcome import JobError
    try:
        if variants is not None:
            registry.adopt(variants)
        check_device(device)
        with one_thread():
            return fn(*args)
    except Exception as e:
        raise JobError.of(e) from None


class Inline:
    """One worker in this process (it already runs the code path asked for)."""

    slots = 1

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def submit(self, fn: Callable[..., dict], args: Sequence[Any]) -> Future:
        f: Future = Future()
        try:
            f.set_result(call(fn, args, None, self.device))
        except Exception as e:  # a JobError: the runner records it, the other jobs run
            f.set_exception(e)
        return f

    def close(self) -> None:
        pass


class _Worker:
    def __init__(self, env: dict[str, str], variants: Any) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-m", "difftransformer.jobs.worker", str(to_child_r),
                                      str(from_child_w), str(os.getpid())], env=env,
                                     pass_fds=(to_child_r, from_child_w))
        os.close(to_child_r)
        os.close(from_child_w)
        self.send, self.recv = Connection(to_child_w, readable=False), Connection(from_child_r, writable=False)
        self.send.send((variants, list(sys.path)))
        self.future: Optional[Future[dict]] = None

    def run(self, fn: Callable[..., dict], args: Sequence[Any], device: str) -> Future:
        self.future = f = Future[dict]()
        self.send.send((fn, tuple(args), device))

        def wait() -> None:
            try:
                status, value = self.recv.recv()
            except (EOFError, OSError):
                f.set_exception(RuntimeError(f"its worker process died (exit code {self.proc.wait()}) while it ran "
                                             "the job"))
                return
            if status == "ok":
                f.set_result(value)
            else:
                f.set_exception(value)
        threading.Thread(target=wait, daemon=True).start()
        return f

    def close(self) -> None:
        self.send.close()  # the worker reads the end and exits
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.recv.close()


class LocalPool:
    """``workers`` processes started with ``env`` (the whole environment; ``codepath.process_env``)."""

    def __init__(self, workers: int, env: dict[str, str], variants: Any, device: str = "cpu") -> None:
        self.slots, self.env, self.variants, self.device = workers, env, variants, device
        self.workers: list[_Worker] = []

    def submit(self, fn: Callable[..., dict], args: Sequence[Any]) -> Future:
        dead = [w for w in self.workers if w.proc.poll() is not None]  # died under a job, which failed
        for w in dead:
            self.workers.remove(w)
            w.close()
        free = [w for w in self.workers if w.future is None or w.future.done()]
        if not free:
            if len(self.workers) >= self.slots:
                raise RuntimeError("every worker is busy")  # the runner submits one job per free worker
            self.workers.append(_Worker(self.env, self.variants))
            free = self.workers[-1:]
        return free[0].run(fn, args, self.device)

    def close(self) -> None:
        for w in self.workers:
            w.close()
