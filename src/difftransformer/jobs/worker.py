"""A local worker process (``local.LocalPool``): ``python -m difftransformer.jobs.worker READ_FD WRITE_FD``.

First message: (the driver's variant registry, its ``sys.path``: a job function from a script or a test imports
here as there); then one (function, arguments, device) per job, answered ("ok", result) or ("error", ``JobError``:
the job's error line and this process's traceback, ``local.call``). A third argument, the driver's pid: the worker
exits within ``WATCH_S`` seconds of its driver's death, mid-job too (``exit_with_driver``).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from multiprocessing.connection import Connection

WATCH_S = 0.5  # how often a worker checks that its driver is alive


def exit_with_driver(driver: int, every: float = WATCH_S) -> threading.Thread:
    """A daemon thread that ends this process (exit code 1, at once: the job it runs included) when its driver
    ``driver`` (the pid that started it) is gone, i.e. when it is no longer this process's parent: a driver killed
    by SIGKILL or SIGTERM leaves no worker computing a job nobody will read. (The pipe's end is read only between
    jobs; this notices within ``every`` seconds.)"""
    def watch() -> None:
        while os.getppid() == driver:
            threading.Event().wait(every)
        os._exit(1)
    t = threading.Thread(target=watch, name="driver-watch", daemon=True)
    t.start()
    return t


def main(read_fd: int, write_fd: int, driver: int | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle: it closes (then kills) us
    exit_with_driver(os.getppid() if driver is None else driver)
    recv, send = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    variants, path = pickle.loads(recv.recv_bytes())
    sys.path[:0] = [p for p in path if p not in sys.path]
    from .local import call
    while True:
        try:
            message = recv.recv_bytes()
        except EOFError:  # the driver closed the pipe (done, or gone)
            return
        try:
            fn, args, device = pickle.loads(message)
            send.send(("ok", call(fn, args, variants, device)))
        except Exception as e:  # the driver records it (a JobError, strings only: it pickles)
            from .outcome import JobError
            send.send(("error", JobError.of(e)))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
