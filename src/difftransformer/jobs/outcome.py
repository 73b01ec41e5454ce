"""How a run of jobs that did not finish ends: failed jobs, or the time limit.

**A failing job** does not stop the others. Its exception crosses back to the driver as a ``JobError`` (its one
line and the worker's whole traceback, as text: the original exception may not pickle, and a traceback never does),
whatever the executor; the runner writes ``OUT/failed/KEY.txt`` (the job, its key, the line, the traceback), logs
one line, and runs every other job it can. A failed job is not journaled, so a rerun runs it again (and removes its
file once it succeeds).

**The time limit** (``RunOptions.time_limit``): no job starts after it; the running ones finish and are journaled.

Either way ``run_jobs`` then raises ``Incomplete`` instead of returning, so that nothing is computed from a partial
set of jobs; a study's command prints ``str(Incomplete)`` as its last line and exits with ``exit_code``:
``EXIT_FAILED`` where a job failed, else ``EXIT_TIME_LIMIT``. Rerunning the same command resumes.

The tests' hook: ``DIFFTRANSFORMER_FAIL_JOB=LABEL`` in the driver's environment makes the job of that label (its
fields joined by spaces, as the failure line prints it) run ``injected_failure`` in its worker instead of its own
function.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import traceback
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

EXIT_FAILED = 3  # a job raised (or its worker died): the others ran; rerun to retry it
EXIT_TIME_LIMIT = 75  # sysexits' EX_TEMPFAIL, "try again later": the time limit stopped the run; rerun to resume
FAILED_DIR = "failed"
FAIL_ENV = "DIFFTRANSFORMER_FAIL_JOB"
EXIT_CODES_HELP = (f"exit codes: 0 done; 2 bad input (one error line, nothing run); {EXIT_FAILED} a job failed (the "
                   "others ran and are journaled; OUT/failed/KEY.txt holds each one's traceback; no results are "
                   f"computed; rerun to retry); {EXIT_TIME_LIMIT} incomplete, --time-limit reached (rerun the same "
                   "command to resume)")
log = logging.getLogger(__name__)


class JobError(Exception):
    """A job's exception as the driver receives it: ``line`` ("Type: message", its first line) and ``trace`` (the
    worker's whole traceback)."""

    def __init__(self, line: str, trace: str) -> None:
        super().__init__(line, trace)
        self.line, self.trace = line, trace

    def __str__(self) -> str:
        return self.line

    @classmethod
    def of(cls, e: BaseException) -> JobError:
        """``e`` as a ``JobError`` (itself when it is one), its traceback formatted where it was raised."""
        if isinstance(e, JobError):
            return e
        text = f"{type(e).__name__}: {e}".strip().splitlines()
        return cls(text[0] if text else type(e).__name__, "".join(traceback.format_exception(e)))


def injected_failure(label: str) -> dict:
    """The job ``DIFFTRANSFORMER_FAIL_JOB`` names runs this in its worker instead of its own function."""
    raise RuntimeError(f"injected failure: {FAIL_ENV}={label!r}")


def label(job: Hashable) -> str:
    """A job as the failure line names it: its fields joined by spaces."""
    return " ".join(map(str, job)) if isinstance(job, (tuple, list)) else str(job)


def fails_by_injection(job_label: str) -> bool:
    return os.environ.get(FAIL_ENV) == job_label


@dataclass(frozen=True)
class Failure:
    key: str
    label: str
    error: str  # the error's line
    traceback: Path  # OUT/failed/KEY.txt


def _file_name(key: str) -> str:
    """The key itself where it makes a plain file name (a study's keys are sha256 hex digests), else its hash."""
    return key if re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", key) and not key.startswith(".") else \
        hashlib.sha256(key.encode()).hexdigest()


def failure_path(out: Path, key: str) -> Path:
    return out / FAILED_DIR / f"{_file_name(key)}.txt"


def record_failure(out: Path, key: str, job_label: str, e: BaseException) -> Failure:
    """Write ``OUT/failed/KEY.txt`` for a job that raised ``e``; log one line."""
    from ..fileio import atomic_write
    err = JobError.of(e)
    path = failure_path(out, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, f"job: {job_label}\nkey: {key}\nerror: {err.line}\n\n{err.trace}")
    log.warning("job %s failed: %s (traceback: %s)", job_label, err.line, path)
    return Failure(key, job_label, err.line, path)


def clear_failure(out: Path, key: str) -> None:
    """A job that succeeded: its file from an earlier failure goes (and the directory, when that was the last)."""
    path = failure_path(out, key)
    if path.is_file():
        path.unlink()
        with contextlib.suppress(OSError):  # other jobs' files are still there
            path.parent.rmdir()


class Incomplete(Exception):
    """``run_jobs`` ended without every job done: ``failures`` (in the order they happened), or ``time_limit``
    (seconds) reached. ``done``: the jobs finished (run now or read back), ``total``: the jobs declared, ``final``:
    whether that list was final (else more may follow), ``ran``: the jobs run now."""

    def __init__(self, failures: list[Failure], done: int, total: int, final: bool, ran: int,
                 time_limit: Optional[float]) -> None:
        self.failures, self.done, self.total, self.final, self.ran = failures, done, total, final, ran
        self.time_limit = time_limit
        super().__init__(self.line())

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.failures else EXIT_TIME_LIMIT

    def line(self) -> str:
        m = f"{self.total}{'' if self.final else '+'}"
        if self.failures:
            f = self.failures[0]
            return (f"{len(self.failures)} of {m} jobs failed; first: {f.label} [key {f.key[:12]}]: {f.error} "
                    f"(traceback: {f.traceback})")
        return (f"incomplete: rerun the same command to resume (--time-limit {self.time_limit:g} s reached: "
                f"{self.done} of {m} jobs done, {self.ran} run now)")
