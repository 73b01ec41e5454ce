"""The diagnostics' diagnostic.json and the readings' rounding.json, as TypedDicts (re-exported by ``rundir.studies``,
which validates them: ``validate_diagnostic``, ``validate_readings``)."""

# no ``from __future__ import annotations``: TypedDict reads NotRequired from evaluated annotations only

from typing import Any, Literal, Optional

# typing_extensions (torch's own dependency): NotRequired and a TypedDict that reads it on Python 3.10 too
from typing_extensions import NotRequired, TypedDict

from .schemas import LmLrScore, LmSweepConfigDict, LrScore, RetrievalConfigDict

# ============================================================ the diagnostics' diagnostic.json and their rounding.json
RETRIEVAL_DIAGNOSTIC = "retrieval_diagnostic"  # the retrieval diagnostic's "benchmark"
LM_DIAGNOSTICS = ("v1_diagnostic", "v2_diagnostic")  # the language-model diagnostics' "benchmark"


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


class RetrievalDiagnosticRow(ReadingRow):
    """rows[name] of the retrieval diagnostic (``retrieval.diagnostic.assess``): the baseline, both variants and
    every arm at its chosen lr, the 12 test seeds' accuracies and the job dynamics."""
    grid: list[LrScore]
    widened: list[float]
    at_edge: bool
    params: int
    accuracy: list[float]
    above_chance: bool
    extrapolation: list[float]
    grid_mean: list[float]
    grid_below_floor: int
    dynamics: dict[str, Any]
    variant: NotRequired[str]  # an arm's variant and its one change
    overrides: NotRequired[dict[str, Any]]
    share: NotRequired[Optional[float]]


class RetrievalDiagnostic(TypedDict):
    """The retrieval diagnostic's diagnostic.json (``retrieval.diagnostic.run_diagnostic``)."""
    benchmark: Literal["retrieval_diagnostic"]
    version: int
    reference: str
    config: RetrievalConfigDict
    primary: str
    extrapolation: str
    chance: float
    loss_thresholds: list[float]
    rows: dict[str, RetrievalDiagnosticRow]
    summary: str
    timings: dict[str, Any]


class LmDiagnosticRow(ReadingRow):
    """arms[name] of a language-model diagnostic (``lmsweep.diagnostic``): the reruns and the arms at their chosen
    lrs, the test-half losses of the 5 seeds."""
    params_non_embedding: int
    test_loss: list[float]
    grid: NotRequired[list[LmLrScore]]  # the arms' (and V1's reruns') lr grid
    widened: NotRequired[list[float]]
    unresolved_edge: NotRequired[bool]
    overrides: NotRequired[dict[str, Any]]


class RerunCheck(TypedDict):
    """Whether the reruns of the reference's runs (the baseline and the variant) reproduce them."""
    runs: list[dict[str, Any]]
    bitwise_equal: int
    of: int
    largest_difference: float
    verdict: str


class LmDiagnostic(TypedDict):
    """A language-model diagnostic's diagnostic.json, DIFF V1's or DIFF V2's (``lmsweep.diagnostic``)."""
    benchmark: Literal["v1_diagnostic", "v2_diagnostic"]
    version: int
    width: int
    reference: str
    config: LmSweepConfigDict
    arms: dict[str, LmDiagnosticRow]
    rerun: RerunCheck
    timings: dict[str, Any]


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
