"""A local worker process (``local.LocalPool``): ``python -m difftransformer.jobs.worker READ_FD WRITE_FD``.

First message: (the driver's variant registry, its ``sys.path``: a job function from a script or a test imports
here as there); then one (function, arguments, device) per job, answered ("ok", result) or ("error", ``JobError``:
the job's error line and this process's traceback, ``local.call``).
"""

from __future__ import annotations

import pickle
import signal
import sys
from multiprocessing.connection import Connection


def main(read_fd: int, write_fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle: it closes (then kills) us
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
    main(int(sys.argv[1]), int(sys.argv[2]))
