"""Running declared jobs: worker processes, the CPU code path, the job journal and resuming after a kill.

What runs is not decided here: a caller passes ``needed(done) -> (jobs, final)`` (``protocol.needed_jobs`` for the
benchmark, the width sweep's list for the sweep) and a job function; this module runs every needed job not yet
done, appends each result to the journal as it finishes, and asks again until the list is final and all of it is
done. A worker is handed one job at a time, in the order the list declares them, so a job declared once results
are in (a widened lr) runs next rather than after every job already listed. The results are the same whatever the
order, the number of workers or the interruptions: every job runs at one torch thread from its own seed, and a
finished job is read back from the journal instead of run again.

**The journal** (``OUT/jobs.jsonl``): a header line naming what the journal belongs to (the configuration), then one
line per finished job: ``{"key": sha256 of everything that determines the job, "job": [...], "result": {...}}``.
A line is written with one ``write`` and flushed to disk; a kill mid-line leaves a torn last line, which the next
run drops. A journal whose header differs from the command's is refused in one line (delete it or pass another
``--out``). JSON floats round-trip exactly, so a result read back equals the one computed.

**The CPU code path** (``CODE_PATHS``): "machine" leaves every library to pick its kernels for this CPU; "avx2" /
"avx512" pin PyTorch's kernels (``ATEN_CPU_CAPABILITY``), MKL's (``MKL_CBWR``, conditional numerical
reproducibility) and oneDNN's (``ONEDNN_MAX_CPU_ISA``) to one instruction set. They are read when a process loads
torch, so pinned jobs run in spawned worker processes whose environment holds them; each job checks that torch
runs the kernels asked for and refuses otherwise (a CPU without that instruction set).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from ..model import variants as registry

JOURNAL = "jobs.jsonl"
CODE_PATHS = ("machine", "avx2", "avx512")
_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
        "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}
_TORCH_NAME = {"avx2": "AVX2", "avx512": "AVX512"}  # torch.backends.cpu.get_cpu_capability() under each


def code_path_env(path: str) -> dict[str, str]:
    """The environment variables that pin ``path`` (none for "machine")."""
    if path not in CODE_PATHS:
        raise ValueError(f"CPU code path {path!r} is not allowed; choose one of {', '.join(CODE_PATHS)}")
    return dict(_ENV.get(path, {}))


def in_code_path(path: str) -> bool:
    """Whether THIS process runs ``path``: its torch kernels and the MKL setting it loaded with."""
    if path == "machine":
        return not any(k in os.environ for e in _ENV.values() for k in e)
    import torch
    return (torch.backends.cpu.get_cpu_capability() == _TORCH_NAME[path]
            and all(os.environ.get(k) == v for k, v in _ENV[path].items()))


def check_code_path(path: str) -> str:
    """In a job's process: the kernels torch runs; refuses when they are not the pinned ones."""
    import torch
    cap = torch.backends.cpu.get_cpu_capability()
    if path != "machine" and cap != _TORCH_NAME[path]:
        raise ValueError(f"the CPU code path {path!r} was asked for, but torch runs {cap} kernels on this CPU (it "
                         "lacks that instruction set, or the variables were set too late); use --cpu-code-path machine")
    return cap


@contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    """``extra`` set in os.environ while the pool lives (spawned workers inherit it), restored after."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def job_key(what: dict[str, Any]) -> str:
    """SHA-256 of a job's full description (its configuration, its own fields, the code path), canonical JSON."""
    return hashlib.sha256(json.dumps(what, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Journal:
    """``OUT/jobs.jsonl``: the finished jobs of one configuration (module docstring)."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path, self.header = Path(path), header
        self.records: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            self._read()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write_lines([json.dumps({"journal": header}, sort_keys=True)])

    def _read(self) -> None:
        raw = self.path.read_text(encoding="utf-8")
        lines = raw.split("\n")
        complete, torn = lines[:-1], lines[-1]  # text after the last newline: a line cut by a kill
        try:
            head = json.loads(complete[0])["journal"] if complete else None
        except (ValueError, KeyError, TypeError):
            head = None
        if head != self.header:
            raise ValueError(f"{self.path} holds jobs of another configuration than this command's; delete it (or "
                             "pass another --out) to start over")
        good = complete[:1]
        for i, line in enumerate(complete[1:], 2):
            try:
                rec = json.loads(line)
                self.records[rec["key"]] = rec
                good.append(line)
            except (ValueError, KeyError, TypeError):
                if i != len(complete):  # only the last line may be torn
                    raise ValueError(f"{self.path}, line {i}: not a journal record; delete the file to start "
                                     "over") from None
        if torn or len(good) != len(complete):
            self._write_lines(good)  # drop the torn line before appending after it

    def _write_lines(self, lines: list[str]) -> None:
        from ..fileio import atomic_write
        atomic_write(self.path, "".join(line + "\n" for line in lines))

    def adopt(self, other: Path) -> int:
        """Copy into this journal every finished job of another run's journal that this one lacks (the keys are
        hashes of everything that determines a job, so a job found under its key is this job); returns how many."""
        n = 0
        for line in Path(other).read_text(encoding="utf-8").split("\n")[1:]:
            try:
                rec = json.loads(line)
                key = rec["key"]
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line
            if key not in self.records:
                self.append(key, rec["job"], rec["result"])
                n += 1
        return n

    def get(self, key: str) -> Optional[dict[str, Any]]:
        rec = self.records.get(key)
        return None if rec is None else rec["result"]

    def append(self, key: str, job: Sequence[Any], result: dict[str, Any]) -> None:
        rec = {"key": key, "job": list(job), "result": result}
        line = (json.dumps(rec, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line)  # one write: a kill leaves the line whole or torn at the end, never interleaved
            os.fsync(fd)
        finally:
            os.close(fd)
        self.records[key] = rec


class _Inline:
    """One worker in this process (it already runs the code path asked for): the executor's interface."""

    def submit(self, fn, *a):
        f: Future = Future()
        f.set_result(fn(*a))
        return f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_jobs(needed: Callable[[dict[Any, dict]], tuple[list, bool]], job_fn: Callable[..., dict],
             job_args: Callable[[Any], tuple], key_of: Callable[[Any], str], journal: Journal, workers: int,
             code_path: str, progress: bool = True, desc: str = "jobs") -> tuple[dict[Any, dict], int]:
    """Run every job ``needed`` declares that the journal does not hold, until the list is final and done.

    ``job_fn(*job_args(job))`` runs one job in a worker; ``key_of(job)`` is its journal key. Returns ({job:
    result}, the number of jobs run now, not read back)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    from tqdm import tqdm
    env = code_path_env(code_path)
    done: dict[Any, dict] = {}
    pending: dict[Future, Any] = {}
    ran = 0
    inline = workers == 1 and in_code_path(code_path)
    bar = tqdm(total=0, desc=desc, disable=not progress)
    with _environment(env):
        pool = (_Inline() if inline else
                ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=registry.adopt,
                                    initargs=(registry.variants(),)))
        with pool as ex:
            while True:
                jobs, final = needed(done)
                bar.total = len(jobs)
                new = 0
                for j in jobs:
                    if j in done or j in pending.values():
                        continue
                    old = journal.get(key_of(j))
                    if old is not None:
                        new += 1
                        done[j] = old
                        bar.update(1)
                        continue
                    if len(pending) >= workers:  # every worker busy: submitted when one frees, so that a job
                        continue                 # declared later (a widened lr) runs in the declared order
                    new += 1
                    pending[ex.submit(job_fn, *job_args(j))] = j
                bar.refresh()
                if all(j in done for j in jobs) and final:
                    break
                if not pending:
                    if not new:
                        raise RuntimeError("the job list is not final, yet every job it names is done")
                    continue  # read back from the journal only: ask again with the new results
                finished = ([f for f in pending if f.done()]
                            or list(wait(list(pending), return_when=FIRST_COMPLETED)[0]))
                for f in finished:
                    j = pending.pop(f)
                    r = f.result()
                    journal.append(key_of(j), list(j), r)
                    done[j] = r
                    ran += 1
                    bar.update(1)
    bar.close()
    return done, ran
