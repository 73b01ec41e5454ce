"""The job journal (``OUT/jobs.jsonl`` and its kin): what a run has finished, so that a killed run resumes.

A header line naming what the journal belongs to (a study's configuration), then one line per finished job:
``{"key": sha256 of everything that determines the job, "job": [...], "result": {...}}``. Only the driver writes it
(whatever executor ran the job): a line is written with one ``write`` and flushed to disk, so a kill leaves every line
whole except, at worst, the last. JSON floats round-trip exactly, so a result read back equals the one computed.

**One rule for a bad line** (``parse``, the only reader): a line that is not a record is dropped when it is the last
line (a kill mid-write), and is an error anywhere else (the file was edited or damaged: delete it to start over).
A journal whose header differs from the command's is refused in one line (delete it or pass another ``--out``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, Optional


def job_key(what: dict[str, Any]) -> str:
    """SHA-256 of a job's full description (its configuration, its own fields, the code path), canonical JSON."""
    return hashlib.sha256(json.dumps(what, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Parsed(NamedTuple):
    header: Optional[dict[str, Any]]  # None: the first line is not a journal header
    records: dict[str, dict[str, Any]]  # key -> {"key", "job", "result"}, in file order
    lines: list[str]  # the header and the good records, as written
    dropped: bool  # a torn or bad last line was left out


def _record(line: str) -> Optional[dict[str, Any]]:
    try:
        rec = json.loads(line)
        if isinstance(rec, dict) and isinstance(rec["key"], str) and "job" in rec and "result" in rec:
            return rec
    except (ValueError, KeyError, TypeError):
        pass
    return None


def parse(path: Path) -> Parsed:
    """Read a journal by the module's rule (a bad last line dropped, a bad line elsewhere a ValueError)."""
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()  # the file ends with a newline: no text after it
    try:
        header = json.loads(lines[0])["journal"] if lines else None
    except (ValueError, KeyError, TypeError):
        header = None
    records: dict[str, dict[str, Any]] = {}
    good = lines[:1]
    dropped = False
    for i, line in enumerate(lines[1:], 2):
        rec = _record(line)
        if rec is None:
            if i != len(lines):
                raise ValueError(f"{path}, line {i}: not a journal record (only the last line may be cut by a "
                                 "kill); delete the file to start over")
            dropped = True
            continue
        records[rec["key"]] = rec
        good.append(line)
    return Parsed(header, records, good, dropped)


def read_journal(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(header, {key: record}) of a journal, finished or not, read only."""
    p = parse(path)
    if p.header is None:
        raise ValueError(f"{path} is not a job journal (its first line is no header)")
    return p.header, p.records


class Journal:
    """A study's journal, opened for appending (the module docstring)."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path, self.header = Path(path), header
        self.records: dict[str, dict[str, Any]] = {}
        self.new = not self.path.is_file()  # written with the first job: a refusal before any job leaves no file
        if self.new:
            return
        p = parse(self.path)
        if p.header != self.header:
            raise ValueError(f"{self.path} holds jobs of another configuration than this command's; delete it (or "
                             "pass another --out) to start over")
        self.records = p.records
        if p.dropped or not self.path.read_bytes().endswith(b"\n"):
            self._write_lines(p.lines)  # drop the torn line before appending after it

    def _write_lines(self, lines: list[str]) -> None:
        from ..fileio import atomic_write
        atomic_write(self.path, "".join(line + "\n" for line in lines))

    def reuse_from(self, other: Path) -> int:
        """Copy into this journal every finished job of another run's journal that this one lacks (the keys are
        hashes of everything that determines a job, so a job found under its key is this job); returns how many."""
        n = 0
        for key, rec in read_journal(Path(other))[1].items():
            if key not in self.records:
                self.append(key, rec["job"], rec["result"])
                n += 1
        return n

    def get(self, key: str) -> Optional[dict[str, Any]]:
        rec = self.records.get(key)
        return None if rec is None else rec["result"]

    def append(self, key: str, job: Sequence[Any], result: dict[str, Any]) -> None:
        if self.new:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write_lines([json.dumps({"journal": self.header}, sort_keys=True)])
            self.new = False
        rec = {"key": key, "job": list(job), "result": result}
        line = (json.dumps(rec, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line)  # one write: a kill leaves the line whole or torn at the end, never interleaved
            os.fsync(fd)
        finally:
            os.close(fd)
        self.records[key] = rec
