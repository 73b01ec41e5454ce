"""What every study's result schema is built from, below the studies (each study's own schemas sit beside its code:
``retrieval/benchmark_schema.py``, ``lmsweep/sweep_schema.py`` and the follow-ups' ``schema.py`` in each).

The schemas are ``TypedDict``s: the JSON on disk is exactly what the writers build, the readers index it with keys
mypy checks. A field is required (total) where today's writer always writes it and no reader accepts it missing;
``NotRequired`` where an older version of the file lacks it and the readers already say so (``.get``, ``in``). Extra
keys are allowed (a newer writer's).

``validate(obj, schema, where)`` checks any JSON value against a schema type (TypedDicts, ``list``, ``dict``,
``Sequence``, ``Literal``, ``Optional``, the JSON scalars; ``Any`` is not looked into), so each file's validator is one
call (``checker(schema)``); ``read_checked`` and ``write_checked`` check a file when it is read and when it is
written, one ValueError naming the file and the field. Here too: the schemas both studies' follow-ups share (a paired
``Interval``, a reading's row, the readings' rounding.json ``ReadingsCheck``) and both studies' rounding check of
their verdicts (``RoundingCheck``, ``compare_verdicts``).

The job journals' records are schemas too: each study passes its record's validator to
``jobs.Journal``/``read_journal`` as ``check`` (``jobs/`` sits below and imports no schema): every record written,
resumed, reused or read."""

# no ``from __future__ import annotations``: TypedDict reads NotRequired from evaluated annotations only

import collections.abc
import json
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, Optional, Union

# typing_extensions (torch's own dependency): NotRequired and a TypedDict that reads it on Python 3.10 too
from typing_extensions import NotRequired, TypedDict, is_typeddict

from ..fileio import atomic_write, read_json


# ================================================================= what the follow-ups share: intervals, readings
class Interval(TypedDict):
    """A paired comparison over the test seeds: D (arm minus baseline), C (arm minus its variant); ``ci`` is
    [null, null] where no interval exists."""
    estimate: float
    ci: list[Optional[float]]
    n: int
    method: str


class ReadingRow(TypedDict):
    """What every diagnostic's row carries and the rounding check and the answer table read: the chosen lr, D (all
    but the baseline), C and the reading (the arms)."""
    lr: float
    D: NotRequired[Interval]
    C: NotRequired[Interval]
    reading: NotRequired[str]


class ReadingsRow(TypedDict):
    """rows[name] of a diagnostic's rounding.json: the row under both code paths and whether its reading is the
    same."""
    first: ReadingRow
    second: ReadingRow
    equal_runs: list[int]  # [runs whose endpoint is bitwise equal under both, runs]
    survives: bool


class ReadingsCheck(TypedDict):
    """A diagnostic's rounding.json, either study's (``studies.rounding.compare_readings`` and the command's
    additions): each reading again under another CPU code path, at the first run's chosen lrs."""
    scope: str
    rows: dict[str, ReadingsRow]
    differ: list[str]
    equal_runs: list[int]
    study: str
    code_paths: list[str]
    timings: NotRequired[dict[str, Any]]



# ==================================================================== both studies' rounding check: rounding.json
class RoundingRow(NamedTuple):
    """One verdict under two CPU code paths, as rounding.json's ``rows`` holds it (a list when read back)."""
    endpoint: str  # the claim or endpoint, in the study's words
    variant: str
    estimate: str  # the first (reference) code path's, in words: "+0.063 [+0.032, +0.093]"
    verdict: str
    other_estimate: str
    other_verdict: str
    same: str  # "yes" | "NO" | "not run"


NOT_RUN = "not run"


class VerdictCells(NamedTuple):
    """What the rounding check compares of one verdict row of either study."""
    endpoint: str
    variant: str
    estimate: str
    verdict: str


class RoundingCounts(TypedDict):
    verdicts_same: int
    verdicts: int
    not_run: NotRequired[int]  # rows the other run lacks


class RoundingCheck(RoundingCounts):
    """rounding.json of either study (``compare_verdicts``): both code paths' verdicts side by side (``rows``: each a
    ``RoundingRow``, a list of its seven strings when read back), how many are the same, and the lr choices that
    differ (per variant, lists ending [reference lr, other lr]; the sweep's begin with the width). The retrieval
    benchmark adds its CPU kernels, its chosen lrs and how many grid runs kept bitwise the same primary accuracy."""
    code_paths: list[str]
    rows: list[Sequence[str]]
    lr_choices_differ: dict[str, list[list[float]]]
    torch_kernels: NotRequired[list[list[str]]]  # retrieval: the kernels torch ran under each code path
    chosen_lr: NotRequired[dict[str, list[float]]]  # retrieval: per variant [reference lr, other lr]
    grid_runs_equal_at_primary: NotRequired[list[int]]  # retrieval: [bitwise equal, grid runs]


def rounding_counts(rows: Sequence[Sequence[str]]) -> RoundingCounts:
    """rounding.json's counts over its rows: verdicts the same, verdicts compared, rows not run."""
    same = [RoundingRow._make(r).same for r in rows]
    return {"verdicts_same": same.count("yes"), "verdicts": sum(x != NOT_RUN for x in same),
            "not_run": same.count(NOT_RUN)}


def compare_verdicts(first: Sequence[VerdictCells], second: Sequence[VerdictCells], code_paths: Sequence[str],
                     lr_choices_differ: dict[str, list[list[float]]]) -> RoundingCheck:
    """The rounding check of either study: ``first`` (the reference code path's verdict rows) and ``second`` (the same
    study under the other code path) matched by (endpoint, variant), in ``first``'s order; a row the second run lacks
    reads "not run"."""
    by = {(y.endpoint, y.variant): y for y in second}
    rows: list[Sequence[str]] = [
        RoundingRow(x.endpoint, x.variant, x.estimate, x.verdict, y.estimate, y.verdict,
                    "yes" if x.verdict == y.verdict else "NO")
        if (y := by.get((x.endpoint, x.variant))) is not None else
        RoundingRow(x.endpoint, x.variant, x.estimate, x.verdict, NOT_RUN, NOT_RUN, NOT_RUN) for x in first]
    return {"code_paths": list(code_paths), "rows": rows, **rounding_counts(rows),
            "lr_choices_differ": lr_choices_differ}


def validate_rounding(obj: Any, where: str) -> RoundingCheck:
    """Either study's rounding.json, checked against ``RoundingCheck`` (each row its seven strings)."""
    check = validate(obj, RoundingCheck, where)
    for i, r in enumerate(check["rows"]):
        if len(r) != len(RoundingRow._fields):
            raise ValueError(f"{where}: rows[{i}] holds {len(r)} values, not {len(RoundingRow._fields)} "
                             f"({', '.join(RoundingRow._fields)})")
    return check


# ==================================================================================== validation
_JSON_NAMES = {dict: "object", list: "list", str: "string", int: "integer", float: "number", bool: "boolean",
               type(None): "null"}


def _describe(tp: Any) -> str:
    """A schema type in words (the error's "a JSON ...")."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return "anything"
    if is_typeddict(tp) or origin in (dict, collections.abc.Mapping):
        return "object"
    if origin in (list, tuple, collections.abc.Sequence):
        return "list"
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    return _JSON_NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def _problem(obj: Any, tp: Any, where: str) -> Optional[str]:
    """The first place ``obj`` departs from ``tp``, in words ("variants.baseline.runs[0] lacks "seed""); None if
    it does not."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return None
    if origin in (Union, types.UnionType):
        problems = [_problem(obj, a, where) for a in typing.get_args(tp)]
        if any(p is None for p in problems):
            return None
        matching = [p for a, p in zip(typing.get_args(tp), problems) if _problem(obj, _outer(a), where) is None]
        return matching[0] if len(matching) == 1 else f"{where} is not a JSON {_describe(tp)}"
    if origin is Literal:
        return None if obj in typing.get_args(tp) else f"{where} is {obj!r}, not {_describe(tp)}"
    if is_typeddict(tp):
        if not isinstance(obj, dict):
            return f"{where} is a JSON {_JSON_NAMES.get(type(obj), type(obj).__name__)}, not an object"
        hints = typing.get_type_hints(tp)
        for key in hints:  # presence first, in the schema's order: the line names what is missing
            if key in tp.__required_keys__ and key not in obj:
                return f"{where} lacks \"{key}\""
        for key, sub in hints.items():
            if key in obj:
                p = _problem(obj[key], sub, f"{where}.{key}" if where else key)
                if p:
                    return p
        return None
    if origin in (dict, collections.abc.Mapping):
        if not isinstance(obj, dict):
            return f"{where} is not a JSON object"
        kt, vt = typing.get_args(tp)
        for k, v in obj.items():
            if typing.get_origin(kt) is Literal and k not in typing.get_args(kt):
                return f"{where} has the key {k!r}, not {_describe(kt)}"
            p = _problem(v, vt, f"{where}.{k}")
            if p:
                return p
        return None
    if origin in (list, tuple, collections.abc.Sequence):
        if not isinstance(obj, (list, tuple)):
            return f"{where} is a JSON {_JSON_NAMES.get(type(obj), type(obj).__name__)}, not a list"
        (it,) = typing.get_args(tp)[:1]
        for i, x in enumerate(obj):
            p = _problem(x, it, f"{where}[{i}]")
            if p:
                return p
        return None
    ok = (isinstance(obj, tp) and not (tp is int and isinstance(obj, bool))) or (
        tp is float and isinstance(obj, int) and not isinstance(obj, bool))
    return None if ok else (f"{where} is a JSON {_JSON_NAMES.get(type(obj), type(obj).__name__)}, not "
                            f"{'an' if _describe(tp)[0] in 'aeiou' else 'a'} {_describe(tp)}")


def _outer(tp: Any) -> Any:
    """The JSON kind of a schema type alone (a TypedDict's or list's outside, not its inside)."""
    origin = typing.get_origin(tp)
    if is_typeddict(tp) or origin in (dict, collections.abc.Mapping):
        return dict[str, Any]
    if origin in (list, tuple, collections.abc.Sequence):
        return list[Any]
    return tp


T = typing.TypeVar("T")


def validate(obj: Any, schema: type[T], where: str) -> T:
    """``obj`` as ``schema`` (a TypedDict or other schema type), or one ValueError: "``where``: ``field`` lacks
    "key"" (or is of another JSON type). ``where`` names the file (and the flag that gave it)."""
    p = _problem(obj, schema, "")
    if p is not None:
        # a missing or mistyped top-level key reads "it lacks "variants"", a nested one names its place
        p = "it " + p[1:] if p.startswith(" ") else p
        raise ValueError(f"{where}: {p}")
    return typing.cast(T, obj)


def checker(schema: type[T]) -> typing.Callable[[Any, str], T]:
    """``validate`` against one schema, as the ``(obj, where) -> obj`` check that ``write_checked`` and the job
    journals (``jobs.Journal``, ``read_journal``) take."""
    return lambda obj, where: validate(obj, schema, where)


def validate_readings(obj: Any, where: str) -> ReadingsCheck:
    """A diagnostic's rounding.json, checked against ``ReadingsCheck``."""
    return validate(obj, ReadingsCheck, where)


def read_checked(path: str | Path, check: typing.Callable[[Any, str], Any]) -> Any:
    """A result file read and checked by its schema's validator (one ValueError naming the file and the field)."""
    return check(read_json(Path(path)), str(path))


def write_checked(path: Path, obj: Any, check: typing.Callable[[Any, str], Any]) -> None:
    """``obj`` written as the JSON file ``path`` (atomically) once ``check``, its schema's validator, takes it as it
    reads back: a writer that departs from what the readers take fails here, naming the field."""
    text = json.dumps(obj, indent=1) + "\n"
    check(json.loads(text), f"{path} (as written)")
    atomic_write(path, text)
