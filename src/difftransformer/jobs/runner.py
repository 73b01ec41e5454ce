"""Running a study's declared jobs: what runs where, journaled, resumable; the study decides what runs.

A study hands ``run_jobs`` a ``JobSpec`` (what its jobs are: ``needed(done) -> (jobs, final)``, the job function and
its arguments, the key) and ``RunOptions`` (how to run them: the executor and its resources, the device). The runner
runs every needed job the journal does not hold, appends each result as it finishes, and asks again until the list is
final and all of it is done. A job is handed out only when a worker (a local process, or a slot of the Ray cluster)
is free, in the order the list declares them, so a job declared once results are in (a widened lr) runs next rather
than after every job already listed. The results are the same whatever the order, the number of workers, the
executor or the interruptions: every job runs at one torch thread from its own seed under the CPU code path, and a
finished job is read back from the journal instead of run again.

A job that raises does not stop the others, and a time limit stops handing out jobs; either way ``run_jobs`` ends
with ``outcome.Incomplete`` once every job it can run is done (``outcome``'s docstring).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Hashable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Optional, TypeVar, get_args

from .codepath import (
    CODE_PATHS,
    DEVICES,
    Device,
    check_device,
    in_code_path,
    process_env,
    refuse_unsupported_code_path,
)
from .journal import Journal
from .outcome import Failure, Incomplete, clear_failure, fails_by_injection, injected_failure, label, record_failure

J = TypeVar("J", bound=Hashable)
Executor = Literal["local", "ray"]
EXECUTORS: tuple[Executor, ...] = get_args(Executor)


@dataclass(frozen=True)
class JobSpec(Generic[J]):
    """What a study declares about its jobs.

    ``needed(done)``: the jobs the protocol asks for given the finished ones ({job: result}), and whether that list
    is final; ``run(*args(job))``: one job, a function at the top of an importable module (it is pickled to a
    worker by name; not the driver script's ``__main__``) returning a JSON-serialisable dict; ``key(job)``: the
    journal key (a hash of everything that determines the job's numbers); ``code_path``: the CPU code path every
    job runs; ``desc``: the progress bar's label."""
    needed: Callable[[dict[J, dict]], tuple[list[J], bool]]
    run: Callable[..., dict]
    args: Callable[[J], tuple]
    key: Callable[[J], str]
    code_path: str = "machine"
    desc: str = "jobs"

    def __post_init__(self) -> None:
        if self.code_path not in CODE_PATHS:
            raise ValueError(f"code_path must be one of {', '.join(CODE_PATHS)}, got {self.code_path!r}")


def max_workers() -> int:
    """The most local workers a run may ask for: 4 per CPU core, at least 8 (more only compete for the cores, and
    each holds its own torch; a larger number is a typo)."""
    import os
    return max(8, 4 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class RunOptions:
    """How jobs run (``jobs.cli.add_arguments`` gives every command the same flags): ``workers`` local processes
    (the local executor), or ``executor="ray"`` on the cluster at ``ray_address`` (None: a local Ray instance;
    "auto": the cluster this node belongs to) with ``cpus_per_job``/``gpus_per_job`` per task; ``device`` where
    each job trains ("cpu" or "cuda"); ``progress`` a progress bar; ``time_limit`` seconds after ``start`` (when
    these options were made: the command's start) no job starts (None: no limit)."""
    workers: int = 2
    executor: Executor = "local"
    ray_address: Optional[str] = None
    cpus_per_job: float = 1
    gpus_per_job: float = 0
    device: Device = "cpu"
    progress: bool = True
    time_limit: Optional[float] = None
    start: float = field(default_factory=time.monotonic, compare=False, repr=False)

    def __post_init__(self) -> None:
        top = max_workers()
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 1 <= self.workers <= top:
            raise ValueError(f"--workers must be an integer from 1 to {top} (4 per CPU core of this machine, at least "
                             f"8: each worker is a process holding torch, one thread each), got {self.workers!r}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        for name, lo in (("cpus_per_job", 0.0), ("gpus_per_job", 0.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
                raise ValueError(f"--{name.replace('_', '-')} must be a number >= {lo:g}, got {v!r}")
        if self.cpus_per_job == 0 and self.gpus_per_job == 0:
            raise ValueError("--cpus-per-job and --gpus-per-job cannot both be 0 (a job needs somewhere to run)")
        if self.executor == "local" and (self.ray_address is not None or self.gpus_per_job or self.cpus_per_job != 1):
            raise ValueError("--ray-address, --cpus-per-job and --gpus-per-job need --executor ray")
        if self.executor == "ray" and self.device == "cuda" and not self.gpus_per_job > 0:
            raise ValueError("--device cuda with --executor ray needs --gpus-per-job > 0 (a fraction shares a GPU)")
        if self.gpus_per_job > 1 and self.gpus_per_job != int(self.gpus_per_job):
            raise ValueError(f"--gpus-per-job above 1 must be a whole number, got {self.gpus_per_job!r}")
        t = self.time_limit
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
            raise ValueError(f"--time-limit must be a number of seconds > 0, got {t!r}")

    def replace(self, **changes: Any) -> RunOptions:
        return dataclasses.replace(self, **changes)

    def deadline(self) -> float:
        """``time.monotonic()`` after which no job starts."""
        return math.inf if self.time_limit is None else self.start + self.time_limit

    def describe(self) -> dict[str, Any]:
        """What a results file records about how its jobs ran (not part of any job's key)."""
        d: dict[str, Any] = {"executor": self.executor, "device": self.device}
        if self.executor == "ray":
            d.update(ray_address=self.ray_address, cpus_per_job=self.cpus_per_job, gpus_per_job=self.gpus_per_job)
        return d


def open_executor(code_path: str, options: RunOptions):
    """The executor ``options`` name, ready: a refusal (no Ray, no answer, too few resources, no CUDA) comes here,
    before any job. ``run_jobs`` opens one itself; a study that has work to do before its jobs (the language-model
    sweep prepares its tokens) opens it first and passes it (then closes it: ``.close()``)."""
    from ..model import variants as registry
    if options.executor == "ray":
        from .ray_executor import RayExecutor
        return RayExecutor(options.ray_address, options.cpus_per_job, options.gpus_per_job, options.device,
                           code_path, registry.variants())
    from .local import Inline, LocalPool
    check_device(options.device)  # the driver sees the local workers' GPUs: refuse before any job starts
    refuse_unsupported_code_path(code_path)  # the driver's CPU is the workers': refuse before any job starts
    if options.workers == 1 and in_code_path(code_path):
        return Inline(device=options.device)
    return LocalPool(options.workers, process_env(code_path), registry.variants(), options.device)


def run_jobs(spec: JobSpec[J], journal: Journal, options: Optional[RunOptions] = None,
             executor: Any = None) -> tuple[dict[J, dict], int]:
    """Run every job ``spec.needed`` declares that the journal does not hold, until the list is final and done,
    on ``executor`` (default: one opened, and closed, here). Returns ({job: result}, the number of jobs run now, not
    read back). Raises ``Incomplete`` where a job failed (the others all ran: see ``OUT/failed/``) or the time
    limit stopped the run; the finished jobs are journaled either way."""
    from ..log import progress_bar
    options = options or RunOptions()
    out = journal.path.parent
    done: dict[J, dict] = {}
    pending: dict[Future, J] = {}
    failures: dict[J, Failure] = {}
    ran = 0
    stopped = False  # the time limit passed: no job starts any more
    ex = executor or open_executor(spec.code_path, options)
    bar = progress_bar(total=0, desc=spec.desc, disable=not options.progress)
    try:
        while True:
            jobs, final = spec.needed(done)
            bar.total = len(jobs)
            new = 0
            for j in jobs:
                if j in done or j in failures or j in pending.values():
                    continue
                old = journal.get(spec.key(j))
                if old is not None:
                    new += 1
                    done[j] = old
                    bar.update(1)
                    continue
                if stopped or len(pending) >= ex.slots:
                    continue  # every worker busy: submitted when one frees, in the declared order
                if time.monotonic() >= options.deadline():
                    stopped = True
                    continue
                new += 1
                pending[_submit(ex, spec, j)] = j
            bar.refresh()
            if all(j in done for j in jobs) and final:
                break
            if not pending:
                if new:
                    continue  # read back from the journal only: ask again with the new results
                if failures or stopped:
                    raise Incomplete(list(failures.values()), len(done), len(jobs), final, ran, options.time_limit)
                raise RuntimeError("the job list is not final, yet every job it names is done")
            finished = [f for f in pending if f.done()] or list(wait(list(pending), return_when=FIRST_COMPLETED)[0])
            for f in finished:
                j = pending.pop(f)
                key = spec.key(j)
                e = f.exception()
                if e is not None:
                    failures[j] = record_failure(out, key, label(j), e)
                    continue
                journal.append(key, list(j) if isinstance(j, (tuple, list)) else [j], f.result())
                clear_failure(out, key)
                done[j] = f.result()
                ran += 1
                bar.update(1)
    finally:
        bar.close()
        if executor is None:
            ex.close()
    return done, ran


def run_jobs_into(spec: JobSpec[J], path: Path, header: dict[str, Any], check: Any,
                  options: Optional[RunOptions] = None) -> tuple[dict[J, dict], int]:
    """``run_jobs`` into the journal at ``path``, whose directory (a study's OUT) is made only once the executor is
    open: a refusal of the device, the CPU code path or the cluster leaves no directory behind."""
    options = options or RunOptions()
    ex = open_executor(spec.code_path, options)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return run_jobs(spec, Journal(path, header, check), options, executor=ex)
    finally:
        ex.close()


def _submit(ex: Any, spec: JobSpec[J], job: J) -> Future:
    """``job`` on ``ex``; the tests' injected failure in its place where ``DIFFTRANSFORMER_FAIL_JOB`` names it."""
    if fails_by_injection(label(job)):
        return ex.submit(injected_failure, (label(job),))
    return ex.submit(spec.run, spec.args(job))
