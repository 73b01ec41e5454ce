"""The job journal (``OUT/jobs.jsonl`` and its kin): what a run has finished, so that a killed run resumes.

A header line naming what the journal belongs to (a study's configuration), then one line per finished job:
``{"key": sha256 of everything that determines the job, "job": [...], "result": {...}}``. Only the driver writes it
(whatever executor ran the job): a line is written with one ``write`` and flushed to disk, so a kill leaves every line
whole except, at worst, the last. JSON floats round-trip exactly, so a result read back equals the one computed.

**One rule for a bad line** (``parse``, the only reader): a line that is not a record is dropped when it is the last
line (a kill mid-write), and is an error anywhere else (the file was edited or damaged: delete it to start over).
A journal whose header differs from the command's is refused in one line (delete it or pass another ``--out``).

**The records' shape** is the study's: a study passes ``check`` (a callable ``(result, where) -> result`` raising a
one-line ValueError: its job result's schema validator, ``studies/schema.py``'s ``checker`` over the study's own
schema; this module imports none) to ``Journal`` and ``read_journal``, and every record's ``result`` is checked as
the journal is read (on open, before any job runs; ``reuse_from``'s other journal, before anything is copied) and as
it is written, the error naming the file and line ("OUT/jobs.jsonl, line 7, result: val_loss is a JSON string, not
a number").
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Optional

# A study's check of a record's result: (result, where) -> result, or a one-line ValueError that begins with ``where``
Check = Callable[[Any, str], Any]


def job_key(what: dict[str, Any]) -> str:
    """SHA-256 of a job's full description (its configuration, its own fields, the code path), canonical JSON."""
    return hashlib.sha256(json.dumps(what, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Parsed(NamedTuple):
    header: Optional[dict[str, Any]]  # None: the first line is not a journal header
    records: dict[str, dict[str, Any]]  # key -> {"key", "job", "result"}, in file order
    lines: list[str]  # the header and the good records, as written
    dropped: bool  # a torn or bad last line was left out
    line_of: dict[str, int]  # key -> the line (from 1) its record was read from


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
    line_of: dict[str, int] = {}
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
        line_of[rec["key"]] = i
        good.append(line)
    return Parsed(header, records, good, dropped, line_of)


def check_records(path: Path, parsed: Parsed, check: Optional[Check]) -> None:
    """Every record's result by the study's ``check`` (in file order): the first that fails is its ValueError,
    which names the file and the line."""
    if check is not None:
        for key, rec in parsed.records.items():
            check(rec["result"], f"{path}, line {parsed.line_of[key]}, result")


def read_journal(path: Path, check: Optional[Check] = None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(header, {key: record}) of a journal, finished or not, read only; each record's result checked by ``check``
    (the study's schema) when given."""
    p = parse(path)
    if p.header is None:
        raise ValueError(f"{path} is not a job journal (its first line is no header)")
    check_records(Path(path), p, check)
    return p.header, p.records


class Journal:
    """A study's journal, opened for appending (the module docstring); ``check``: the study's check of a record's
    result, applied to every record read (here, on open) or copied (``reuse_from``) and to every one written."""

    def __init__(self, path: Path, header: dict[str, Any], check: Optional[Check] = None) -> None:
        self.path, self.header, self.check = Path(path), header, check
        self.records: dict[str, dict[str, Any]] = {}
        self.new = not self.path.is_file()  # written with the first job: a refusal before any job leaves no file
        if self.new:
            return
        p = parse(self.path)
        if p.header != self.header:
            raise ValueError(f"{self.path} holds jobs of another configuration than this command's; delete it (or "
                             "pass another --out) to start over")
        try:
            check_records(self.path, p, check)
        except ValueError as e:
            raise ValueError(f"{e} (a record this code does not write: delete the file, or pass another --out, to "
                             "start over)") from None
        self.records = p.records
        if p.dropped or not self.path.read_bytes().endswith(b"\n"):
            self._write_lines(p.lines)  # drop the torn line before appending after it

    def _write_lines(self, lines: list[str]) -> None:
        from ..fileio import atomic_write
        atomic_write(self.path, "".join(line + "\n" for line in lines))

    def reuse_from(self, other: Path) -> int:
        """Copy into this journal every finished job of another run's journal that this one lacks (the keys are
        hashes of everything that determines a job, so a job found under its key is this job); returns how many.
        Every record of ``other`` is checked first (this journal's ``check``): one that fails copies nothing."""
        n = 0
        for key, rec in read_journal(Path(other), self.check)[1].items():
            if key not in self.records:
                self.append(key, rec["job"], rec["result"])
                n += 1
        return n

    def get(self, key: str) -> Optional[dict[str, Any]]:
        rec = self.records.get(key)
        return None if rec is None else rec["result"]

    def append(self, key: str, job: Sequence[Any], result: dict[str, Any]) -> None:
        rec = {"key": key, "job": list(job), "result": result}
        text = json.dumps(rec, sort_keys=True)
        if self.check is not None:  # the writer's side of the schema: the result as it will read back
            self.check(json.loads(text)["result"], f"{self.path} (as written), job {list(job)}, result")
        if self.new:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write_lines([json.dumps({"journal": self.header}, sort_keys=True)])
            self.new = False
        line = (text + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line)  # one write: a kill leaves the line whole or torn at the end, never interleaved
            os.fsync(fd)
        finally:
            os.close(fd)
        self.records[key] = rec
