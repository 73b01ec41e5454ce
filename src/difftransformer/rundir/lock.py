"""The writer's lock of a run directory (``run.lock``, ``flock``): one writer at a time, readers take none."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .files import LOCK_NAME, PathLike

__all__ = ["RunLocked", "lock_run"]


class RunLocked(FileExistsError):
    """Another live process is writing the run directory."""


@contextmanager
def lock_run(run_dir: PathLike) -> Iterator[Path]:
    """Hold the run directory's writer lock (creating the directory) for the ``with`` block.

    ``flock`` on ``run.lock``: the kernel drops it when the holder exits, however it dies, so a killed run never
    blocks its resume. A second writer is refused at once with the holder's PID. Readers take no lock.
    """
    d = Path(run_dir)
    created = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    path = d / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    failed = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RunLocked(f"{d} is being written by another process (PID {holder}, holding {path}); wait for "
                            "it to finish or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield path
        except BaseException:
            failed = True
            raise
    finally:
        if failed and created and [p.name for p in d.iterdir()] == [LOCK_NAME]:
            path.unlink()  # a run refused before writing anything leaves no directory behind
            d.rmdir()
        os.close(fd)  # releases the lock
