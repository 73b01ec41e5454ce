"""The follow-up skeleton: what every study that reads a finished study again is made of, in both studies (the
diagnostics, the re-readings at longer training, the mechanism arms; protocol version 4 next).

- **Arms as data** (``Arm``): a variant, its one ``ModelConfig`` change, and the names its comparisons read
  against (C's, and C''s where the study reads one), with the committed study those runs come from.
- **Jobs, keys, journal** (``FollowUp``): the study's fixed names (its journal header's, its results', its version,
  its journal and results files) and its job's fields; ``journaled`` runs (or resumes) the jobs a ``JobSpec``
  declares into OUT's journal and returns them typed; ``read_back`` reads the journal again, training nothing, and
  refuses another study's.
- **Assessment**: the study's own (``assess``); ``paired`` is the one paired interval every reading is made of.
- **Results**: ``write`` adds the name, version and timings and writes the results file once its schema takes it;
  ``rebuilt`` is the same reading from ``read_back``, with how many of the asked jobs are in.
- **Formatting**: ``interval`` is the one "estimate [lo, hi]" every text and table prints.

A study module declares its ``FollowUp`` and arms, and keeps only what is its own: which jobs, which reading.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NamedTuple, Optional, TypeVar

from ..jobs import JobSpec, Journal, RunOptions, read_journal, run_jobs, run_jobs_into
from .schema import write_checked

J = TypeVar("J", bound=tuple)
Check = Callable[[Any, str], Any]


class Arm(NamedTuple):
    """One arm: ``variant`` with its one change (``ModelConfig`` fields); ``against``: the name C reads against
    (None: the variant itself); ``other``: the name C' reads against (the variant's other form; descriptive), where
    the study reads one; ``reads``: the committed study whose runs those comparisons take (None: this study's own)."""

    variant: str
    change: dict[str, Any]
    against: Optional[str] = None
    other: Optional[str] = None
    reads: Optional[str] = None

    @property
    def c_name(self) -> str:
        return self.against or self.variant


@dataclass(frozen=True)
class FollowUp(Generic[J]):
    """One follow-up's fixed parts. ``title``: its journal header's "benchmark" (and its journal's identity);
    ``name``: its results file's "benchmark"; ``fields``: each job field's type (a journal holds JSON: a record's job
    list is typed back through them into ``job``); ``validate_run``: a job result's schema; ``validate``: the
    results file's."""

    title: str
    name: str
    version: int
    journal: str
    results: str
    job: Callable[..., J]
    fields: tuple[Callable[[Any], Any], ...]
    validate_run: Check
    validate: Check

    def job_of(self, rec: Sequence[Any]) -> J:
        return self.job(*(t(x) for t, x in zip(self.fields, rec)))

    def header(self, **fields: Any) -> dict[str, Any]:
        """The journal header: the study's title and version, then ``fields`` (its configuration, in order)."""
        return {"benchmark": self.title, "version": self.version, **fields}

    def open_journal(self, out: Path, header: dict[str, Any]) -> Journal:
        """OUT's journal opened (a journal of another shape is refused here, before anything is prepared)."""
        return Journal(Path(out) / self.journal, header, self.validate_run)

    def journaled(self, spec: JobSpec[J], out: Path, header: dict[str, Any], options: RunOptions,
                  executor: Any = None, journal: Optional[Journal] = None) -> tuple[dict[J, dict[str, Any]], int]:
        """Every job ``spec`` declares, run or read back from OUT's journal: ({job: result}, jobs run now). Without
        ``executor``, one is opened before OUT is made (a refused device leaves no OUT)."""
        if executor is None:
            done, ran = run_jobs_into(spec, Path(out) / self.journal, header, self.validate_run, options)
        else:
            done, ran = run_jobs(spec, journal or self.open_journal(out, header), options, executor)
        return {self.job_of(j): r for j, r in done.items()}, ran

    def write(self, out: Path, fields: dict[str, Any], done: dict[J, Any], ran: int, t0: float,
              options: RunOptions, **timings: Any) -> dict[str, Any]:
        """The results: the name, the version, ``fields`` (in order) and the timings (``timings`` added), written to
        OUT's results file once its schema takes them as they read back."""
        res = {"benchmark": self.name, "version": self.version, **fields,
               "timings": {"wall_s": time.perf_counter() - t0, **options.describe(), "jobs": len(done),
                           "jobs_run": ran, **timings}}
        write_checked(Path(out) / self.results, res, self.validate)
        return res

    def read_back(self, out: str | Path, matches: Callable[[dict[str, Any]], bool],
                  what: str) -> tuple[dict[str, Any], dict[J, dict[str, Any]]]:
        """OUT's journal read back (nothing trained, finished or not): its header and {job: result}; a ValueError
        "OUT: its journal is not ``what``" when its title is another study's or ``matches(header)`` is false."""
        header, records = read_journal(Path(out) / self.journal, self.validate_run)
        if header.get("benchmark") != self.title or not matches(header):
            raise ValueError(f"{out}: its journal is not {what}")
        return header, {self.job_of(r["job"]): r["result"] for r in records.values()}

    def rebuilt(self, done: dict[J, Any], needed: Iterable[J], before: dict[str, Any],
                **after: Any) -> dict[str, Any]:
        """A reading rebuilt from ``read_back``: the name, the version, ``before``, ``complete`` (the asked jobs that
        are in, of those asked) and ``after``."""
        needed = list(needed)
        return {"benchmark": self.name, "version": self.version, **before,
                "complete": [sum(j in done for j in needed), len(needed)], **after}


# ---------------------------------------------------------------------------------------------- intervals
def paired(base: Sequence[float], other: Sequence[float], higher_is_better: bool) -> dict[str, Any]:
    """``other`` minus ``base``, paired by seed: the estimate, the 95% t interval, n and the method."""
    from ..eval import stats
    v = stats.compare_seeds(base, other, higher_is_better=higher_is_better, min_effect=0.0)
    return {"estimate": v.estimate, "ci": list(v.ci), "n": v.n_seeds[0], "method": v.method}


def interval(x: Optional[dict[str, Any]], spec: str = "+.3f", empty: str = "", bare: str = "") -> str:
    """"estimate [lo, hi]" in ``spec``; ``empty`` where there is no interval dict or no estimate; the estimate
    followed by ``bare`` where the interval has no bounds (too few seeds)."""
    if not x or x["estimate"] is None:
        return empty
    lo, hi = x["ci"]
    if lo is None:
        return f"{x['estimate']:{spec}}{bare}"
    return f"{x['estimate']:{spec}} [{lo:{spec}}, {hi:{spec}}]"


def sign_of(x: dict[str, Any]) -> int:
    """+1: the interval wholly above 0; -1: wholly below; 0: it contains 0 (or there is none)."""
    lo, hi = x["ci"]
    if lo is None:
        return 0
    return 1 if lo > 0 else -1 if hi < 0 else 0


def loss_reading(c: dict[str, Any], inconclusive: bool) -> str:
    """The language-model rule on C (lower loss is better): costs loss, lowers the loss, no detectable effect."""
    lo, hi = c["ci"]
    if inconclusive or lo is None or hi is None:
        return "inconclusive"
    return "costs loss" if lo > 0 else "lowers the loss" if hi < 0 else "no detectable effect"
