"""The retrieval benchmark's own result schemas, beside its code: results.json (``RetrievalResults``), its jobs'
records (``RetrievalRun``, the diagnostic's and follow-ups' ``RetrievalArmRun``) and the diagnostic's diagnostic.json
(``RetrievalDiagnostic``), with their validators (``studies.schema.checker``); the follow-ups' files are in
``schema.py``."""

# no ``from __future__ import annotations``: TypedDict reads NotRequired from evaluated annotations only

import collections.abc
import typing
from typing import Any, Literal, Optional, Union

# typing_extensions (torch's own dependency): NotRequired and a TypedDict that reads it on Python 3.10 too
from typing_extensions import NotRequired, TypedDict

from ..studies.schema import ReadingRow, checker, validate

# =========================================================================== the retrieval benchmark's results.json
RETRIEVAL_BENCHMARK = "kv_retrieval"  # results.json's "benchmark"

# results.json's verdict policies (PROTOCOL.md, "Statistics"): the tuned lr (the only rows counted as verdicts), every
# variant at the matched lr, the tuned runs without the seeds where either variant failed its floor
Policy = Literal["runs", "matched_runs", "no_failures"]
POLICIES: tuple[Policy, ...] = typing.get_args(Policy)
COUNTED_POLICY: Policy = POLICIES[0]
# A variant's lists of per-seed runs, one per lr policy ("no_failures" reads the tuned runs)
RunsKey = Literal["runs", "matched_runs"]
RUNS_OF: dict[Policy, RunsKey] = {"runs": "runs", "matched_runs": "matched_runs", "no_failures": "runs"}


class ConditionSpec(TypedDict):
    """config.conditions[i]: a test condition (``retrieval.config.Condition``)."""
    name: str
    pairs: int
    context: int
    distractors: str


class TestCondition(ConditionSpec):
    """results.json's conditions[i]: the condition and whether it lies inside the trained context lengths."""
    inside_trained_lengths: bool


class RetrievalConfigDict(TypedDict):
    """results.json's config: ``RetrievalConfig.to_dict()`` (the keys every reader needs; a version-2 file had tuning
    seeds instead of the lr grid on the test seeds)."""
    train_pairs: list[int]
    train_context: list[int]
    queries: int
    n_values: int
    steps: int
    matched_lr: str
    floor: float
    conditions: list[ConditionSpec]
    primary: str
    extrapolation: str
    lr_grid: NotRequired[list[float]]
    tuning_seeds: NotRequired[list[int]]
    seeds: NotRequired[int]
    variants: NotRequired[list[str]]
    cpu_code_path: NotRequired[str]


class Measured(TypedDict):
    """One accuracy at one condition: the per-seed value every accuracy endpoint is judged on."""
    accuracy: float
    n_queries: int


class AttentionShare(TypedDict):
    """One layer's scale-free answer share of the answering query (``eval/attention_mass.py``), head mean."""
    answer_share: float


class ConditionMeasures(Measured):
    """A run's measures at one test condition (``retrieval/evaluate.py``); the attention at the primary one only."""
    seq_len: NotRequired[int]
    attention_endpoint: NotRequired[float]
    best_head_share_per_layer: NotRequired[list[float]]
    attention: NotRequired[list[AttentionShare]]


class QuantRow(TypedDict):
    """Accuracy with the attention logits quantised to ``bits`` (None: full precision)."""
    bits: Optional[int]
    accuracy: float


class ExampleRow(TypedDict):
    """One query's head-mean attention row per layer (the Fig. 1 plot)."""
    rows: list[list[float]]
    answer_pos: int
    context_end: int
    distractor_fact_pos: NotRequired[list[int]]
    correct: NotRequired[bool]


class RetrievalRun(TypedDict):
    """One job: a model trained on a seed at an lr and measured (``retrieval.benchmark._job``): each record's
    ``result`` in the benchmark's and the width sweep's journals, and each run of results.json."""
    variant: str
    seed: int
    lr: float
    params: int
    losses: list[list[float]]
    final_window_loss: float
    train_s: float
    cpu_capability: str
    val_accuracy: float
    val_loss: float
    val_training_distribution: float
    conditions: dict[str, ConditionMeasures]
    training_distribution: Measured
    failed: bool
    quantized: dict[str, list[QuantRow]]
    example_row: ExampleRow
    device: NotRequired[str]  # a GPU job's device
    loss_thresholds: NotRequired[dict[str, Optional[int]]]
    dynamics: NotRequired[list[dict[str, Any]]]
    outliers: NotRequired[dict[str, Any]]
    train_cpu_s: NotRequired[float]  # the job's bookkeeping (every journal holds it; older results.json lack it)
    eval_s: NotRequired[float]
    paired_tensors: NotRequired[int]


class RetrievalArmRun(RetrievalRun):
    """One job of the retrieval diagnostic (``retrieval.diagnostic.run_arm_job``): a benchmark job of an arm (or of
    the baseline or a variant, rerun by the rounding check), the result of each record of its journals."""
    arm: str


class LrScore(TypedDict):
    """variants.*.lr_grid[i]: one lr's validation scores over the seeds (the lr choice)."""
    lr: float
    seeds: list[int]
    val_accuracy: float
    val_loss: float
    min_training_distribution: float
    passed_floor: NotRequired[int]


class LrRobustnessRow(TypedDict):
    """variants.*.lr_robustness[i]: secondary endpoint 4 for one seed, shaped like a run (seed, conditions)."""
    seed: int
    lrs: list[float]
    conditions: dict[str, Measured]
    passed_floor: int
    failed: bool


class TuningRun(TypedDict):
    """A version-2 results.json's tuning runs (what the report reads of them)."""
    seed: int
    lr: float
    val_training_distribution: float


class VariantResult(TypedDict):
    """results.json's variants[v] (``retrieval.protocol.assemble``)."""
    params: int
    tuned_lr: float
    lr_grid: list[LrScore]
    widened: list[float]
    at_edge: bool
    runs: list[RetrievalRun]
    matched_runs: list[RetrievalRun]
    chosen_lr: NotRequired[float]
    lr_robustness: NotRequired[list[LrRobustnessRow]]  # version 3
    floor_pass_share: NotRequired[float]
    grid_runs: NotRequired[list[RetrievalRun]]  # version 3: every job of the variant
    tuning_runs: NotRequired[list[TuningRun]]  # version 2


# A run of either kind that the accuracy endpoints judge: a job, or the lr-robustness endpoint's per-seed row
SeedRow = Union[RetrievalRun, LrRobustnessRow]


class VerdictStats(TypedDict):
    """A verdict's statistics (``eval.stats.Verdict`` as a dict; NaN where there is no interval)."""
    verdict: str
    estimate: float
    ci: collections.abc.Sequence[float]
    n_seeds: collections.abc.Sequence[int]
    method: str
    reason: str


class VerdictRow(TypedDict):
    """One verdict row (``eval.stats.verdict_row``)."""
    claim: str
    paper: str
    variant: str
    measure: str
    verdict: str
    why: str
    stats: VerdictStats


class CpuInfo(TypedDict):
    code_path: str
    torch_kernels: list[str]


class PrimaryEndpoint(TypedDict):
    condition: str
    metric: str
    note: NotRequired[str]


class RetrievalResults(TypedDict):
    """The retrieval benchmark's results.json (``retrieval.benchmark.run_benchmark``)."""
    benchmark: str
    config: RetrievalConfigDict
    variants: dict[str, VariantResult]
    conditions: list[TestCondition]
    chance: float
    matched_lr: float
    protocol: NotRequired[str]
    quick: NotRequired[bool]
    primary_endpoint: NotRequired[PrimaryEndpoint]
    deviations: NotRequired[list[str]]
    cpu: NotRequired[CpuInfo]
    timings: NotRequired[dict[str, Any]]  # wall time, workers, load: shown, never judged
    verdicts: NotRequired[dict[Policy, list[VerdictRow]]]  # the benchmark's own rows, one list per policy



# ======================================================================= the retrieval diagnostic's diagnostic.json
RETRIEVAL_DIAGNOSTIC = "retrieval_diagnostic"  # the retrieval diagnostic's "benchmark"


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



validate_retrieval_results = checker(RetrievalResults)  # a retrieval benchmark's results.json, whole
# The job journals' results: the study passes its check to ``jobs.Journal``/``read_journal``
validate_retrieval_run = checker(RetrievalRun)  # a retrieval benchmark or width-sweep job's result
validate_retrieval_arm_run = checker(RetrievalArmRun)  # a retrieval diagnostic job's result


def validate_diagnostic(obj: Any, where: str) -> RetrievalDiagnostic:
    """The retrieval diagnostic's diagnostic.json, checked whole against ``RetrievalDiagnostic``: one ValueError
    naming ``where`` and the field (another "benchmark" names the ones allowed)."""
    kinds = (RETRIEVAL_DIAGNOSTIC,)
    if not isinstance(obj, dict) or obj.get("benchmark") not in kinds:
        got = obj.get("benchmark") if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
        raise ValueError(f"{where}: its \"benchmark\" is {got!r}, not one of {', '.join(map(repr, kinds))}")
    return validate(obj, RetrievalDiagnostic, where)
