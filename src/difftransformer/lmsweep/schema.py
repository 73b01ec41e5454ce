"""The language-model follow-ups' result files, beside their code: the 2x-tokens re-reading (``lm-longer.json``) and
the mechanism arms (``lm-mechanism.json``), checked when written and when read (one ValueError naming the file and
the field); the sweep's and the diagnostics' own schemas are in ``sweep_schema.py``."""

# no ``from __future__ import annotations``: TypedDict reads NotRequired from evaluated annotations only
import typing
from typing import Any

from typing_extensions import NotRequired, TypedDict

from ..rundir.files import SWEEP_RESULTS_NAME
from ..studies.registry import result_reader
from ..studies.schema import Interval, checker, read_checked
from .sweep_schema import LM_SWEEP_BENCHMARK, LmLrScore, LmSweepResults, validate_lm_sweep

_read_sweep = result_reader("lm-sweep", SWEEP_RESULTS_NAME, LM_SWEEP_BENCHMARK, validate_lm_sweep)


def read_sweep(directory: Any, flag: str) -> LmSweepResults:
    """A language-model sweep's output directory's sweep.json, validated: one ValueError naming ``flag``, the file
    and the field (its ``Study.read``)."""
    return typing.cast(LmSweepResults, _read_sweep(directory, flag))


class LongerRow(TypedDict):
    lr: float
    test_loss: list[float]
    mean: float
    failed: int
    D: NotRequired[Interval]
    reading_D: NotRequired[str]
    C: NotRequired[Interval]
    reading: NotRequired[str]


class LongerResults(TypedDict):
    benchmark: str
    version: int
    reference: str
    width: int
    steps: int
    rows: dict[str, LongerRow]
    timings: dict[str, Any]


class MechanismRow(TypedDict):
    lr: float
    variant: str
    overrides: dict[str, Any]
    against: str
    grid: list[LmLrScore]
    widened: list[float]
    unresolved_edge: bool
    test_loss: list[float]
    failed: int
    D: Interval
    C: Interval
    C_against: str
    reading: str
    C2: Interval
    C2_against: str


class MechanismResults(TypedDict):
    benchmark: str
    version: int
    reference: str
    diagnostics: str
    width: int
    rows: dict[str, MechanismRow]
    timings: dict[str, Any]


validate_longer = checker(LongerResults)
validate_mechanism = checker(MechanismResults)

read = read_checked  # a follow-up's result file, read and checked
