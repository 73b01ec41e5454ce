"""The retrieval follow-ups' result files, beside their code: the re-reading at longer training (``longer.json``), the
mechanism arms (``mechanism.json``, ``mechanism-longer.json``), protocol version 4 (its jobs' results and
``protocol4.json``). Each is checked when written (``write_checked``) and
when read (``read``), one ValueError naming the file and the field; the benchmark's and the diagnostic's own schemas
are in ``benchmark_schema.py``."""

# no ``from __future__ import annotations``: TypedDict reads NotRequired from evaluated annotations only
import typing
from typing import Any, Optional

from typing_extensions import NotRequired, TypedDict

from ..rundir.files import RESULTS_NAME
from ..studies.registry import result_reader
from ..studies.schema import Interval, checker, read_checked
from .benchmark_schema import RETRIEVAL_BENCHMARK, RetrievalArmRun, RetrievalResults, validate_retrieval_results

_read_results = result_reader("retrieval", RESULTS_NAME, RETRIEVAL_BENCHMARK, validate_retrieval_results)


def read_results(directory: Any, flag: str) -> RetrievalResults:
    """A retrieval benchmark's output directory's results.json, validated: one ValueError naming ``flag``, the file
    and the field (its ``Study.read``)."""
    return typing.cast(RetrievalResults, _read_results(directory, flag))


class Speed(TypedDict):
    """The speed endpoint (``longer.crossing``): median paired difference of the first step below a loss threshold,
    its sign-test interval and coverage, per seed, and how many runs never crossed."""
    estimate: Optional[float]
    ci: list[Optional[float]]
    method: str
    coverage: float
    per_seed: list[float]
    never: list[int]


class LongerRow(TypedDict):
    accuracy: list[float]
    mean: float
    extrapolation: list[float]
    below_floor: int
    first_step_below: dict[str, list[Optional[int]]]
    D: NotRequired[Interval]
    D_extrapolation: NotRequired[Interval]
    speed: NotRequired[dict[str, Speed]]
    C: NotRequired[Interval]
    speed_C: NotRequired[dict[str, Speed]]
    reading: NotRequired[str]


class LongerResults(TypedDict):
    benchmark: str
    version: int
    reference: str
    lengths: dict[str, dict[str, LongerRow]]
    timings: dict[str, Any]


class MechanismRow(TypedDict):
    lr: float
    overrides: dict[str, Any]
    accuracy: list[float]
    mean: float
    below_floor: int
    D: Interval
    C: Interval
    C_against: str
    reading: str
    C2: Interval
    C2_against: str
    speed: dict[str, Speed]
    speed_C: dict[str, Speed]


class MechanismResults(TypedDict):
    benchmark: str
    version: int
    reference: str
    rows: dict[str, MechanismRow]
    timings: dict[str, Any]
    steps: NotRequired[int]
    longer_reference: NotRequired[str]


class V4Run(RetrievalArmRun):
    """One job of protocol version 4 (``protocol4.run_v4_job``): a benchmark job of a name, plus PROTOCOL4.md's
    validation measures."""
    val_training_loss: float
    val_conditions: dict[str, float]


class Protocol4Results(TypedDict):
    """protocol4.json: the plan, how many of the asked jobs are in, every choice made so far, and each endpoint once
    its test jobs are in (None before)."""
    benchmark: str
    version: int
    quick: bool
    plan: dict[str, Any]
    complete: list[int]
    speed_lrs: dict[str, dict[str, Any]]
    length: Optional[dict[str, Any]]
    conditions: Optional[dict[str, Any]]
    capability_lrs: Optional[dict[str, dict[str, Any]]]
    speed: Optional[dict[str, dict[str, Any]]]
    capability: Optional[dict[str, dict[str, Any]]]
    timings: dict[str, Any]


class V4EndpointCheck(TypedDict):
    """One endpoint of protocol version 4's rounding check (``studies.rounding.compare_readings``): each name's row
    under both code paths, the readings that differ, the runs bitwise equal, and the kernel families of each pair."""
    scope: str
    rows: dict[str, dict[str, Any]]
    differ: list[str]
    equal_runs: list[int]
    kernels: dict[str, int]


class Protocol4Rounding(TypedDict):
    """OUT/rounding-CODE_PATH/rounding.json of protocol version 4 (``protocol4_rounding.rounding_check``)."""
    benchmark: str
    version: int
    study: str
    code_paths: list[str]
    speed: V4EndpointCheck
    capability: Optional[V4EndpointCheck]
    differ: list[str]
    timings: dict[str, Any]


validate_v4_run = checker(V4Run)
validate_protocol4_rounding = checker(Protocol4Rounding)
validate_protocol4 = checker(Protocol4Results)
validate_longer = checker(LongerResults)
validate_mechanism = checker(MechanismResults)

read = read_checked  # a follow-up's result file, read and checked
