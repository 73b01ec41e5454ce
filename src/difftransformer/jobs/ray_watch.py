"""The local Ray instance ends with its driver (issue 70 item 7): ``python -m difftransformer.jobs.ray_watch DRIVER
ROOT...``.

``--executor ray`` without ``--ray-address`` starts a Ray instance of its own on this machine (GCS, raylet, monitor,
dashboard, log monitor: the ROOT pids; the raylet starts the DashboardAgent, the RuntimeEnvAgent and the job
workers). ``ray.shutdown`` ends them when the driver closes, but a driver killed by SIGKILL runs nothing: GCS and
the raylet notice and exit, while the raylet's agents, no longer anyone's, ran on for 60-90 s (measured 2026-12-01).
``RayExecutor`` therefore starts this watcher, in a session of its own, beside the instance it started: every
``WATCH_S`` seconds it notes the ROOTs and every process descended from one (found through ``/proc``: each process's
parent); once the driver is gone it SIGKILLs every noted process still running, then exits. A process started
less than ``WATCH_S`` before the driver's death may not have been noted yet: that is the bound. It exits alone when
every ROOT has ended (a normal ``ray.shutdown``), and does nothing where there is no ``/proc``. A cluster the driver
only joins (``--ray-address``) is the cluster's: no watcher, nothing ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

WATCH_S = 0.5


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (state, parent, ...), None when it has gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited and not yet reaped, does not)."""
    f = _stat(pid)
    return f is not None and f[0] != "Z"


def started(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot): with the pid, it names one process, whatever reuses the pid."""
    f = _stat(pid)
    return None if f is None else f[19]


def parents() -> dict[int, int]:
    """{pid: its parent's pid} for every process ``/proc`` lists now."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (f := _stat(int(d.name))) is not None:
            out[int(d.name)] = int(f[1])
    return out


def tree(roots: Iterable[int]) -> set[int]:
    """``roots`` and every process descended from one (``parents``)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def watch(driver: int, roots: Sequence[int], every: float = WATCH_S) -> None:
    """Until ``driver`` ends: every ``every`` seconds, note ``roots`` and every process descended from them (with
    its start time). When the GCS and the raylet exit on the driver's death, their agents are reparented and no
    tree reaches them any more; the note does. Then SIGKILL every noted process still running (the same process:
    its start time unchanged), and anything descended from one. Returns at once when every root ends first (the
    driver's own ``ray.shutdown``)."""
    known: dict[int, str] = {}
    while alive(driver):
        if not any(alive(r) for r in roots):
            return
        for pid in tree([*roots, *known]):
            if pid not in known and (t := started(pid)) is not None:
                known[pid] = t
        time.sleep(every)
    for pid in tree([p for p, t in known.items() if started(p) == t]):
        if pid in known and started(pid) != known[pid]:
            continue  # the pid now names another process
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def start(driver: int, roots: Sequence[int]) -> subprocess.Popen | None:
    """The watcher of ``roots`` (a local Ray instance's processes) for ``driver``, or None without ``/proc``."""
    if not Path("/proc").is_dir() or not roots:
        return None
    return subprocess.Popen([sys.executable, "-m", "difftransformer.jobs.ray_watch", str(driver),
                             *(str(r) for r in roots)], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    watch(int(sys.argv[1]), [int(x) for x in sys.argv[2:]])
