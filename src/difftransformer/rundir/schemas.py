"""The two studies' main result files and their jobs' records, as TypedDicts: the retrieval benchmark's
results.json (``RetrievalResults``, ``RetrievalRun``, ``RetrievalArmRun``) and the language-model sweep's sweep.json
(``LmSweepResults``, ``LmSweepRun``, ``LmArmRun``). ``rundir.studies`` re-exports every name and holds the validator
(``validate``), the rounding check's and the diagnostics' schemas and the readers."""

# no ``from __future__ import annotations``: TypedDict reads NotRequired from evaluated annotations only

import collections.abc
import typing
from typing import Any, Literal, Optional, Union

# typing_extensions (torch's own dependency): NotRequired and a TypedDict that reads it on Python 3.10 too
from typing_extensions import NotRequired, TypedDict

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


# ==================================================================================== the lm-sweep's sweep.json
LM_SWEEP_BENCHMARK = "lm_sweep"  # sweep.json's "benchmark"


class LmSweepConfigDict(TypedDict):
    """sweep.json's config: ``LMSweepConfig.to_dict()`` (the keys the readers need)."""
    widths: list[int]
    n_layers: int
    seq_len: int
    lr_grid: list[float]
    variants: list[str]
    cpu_code_path: str
    lr_widen: NotRequired[int]
    scale: NotRequired[str]


class LmLrScore(TypedDict):
    """table[v][i].grid[j]: one lr's scores at one width (``lmsweep.analysis``)."""
    lr: float
    seeds: list[int]


class LmWidthRow(TypedDict):
    """table[v][i]: a variant at one width, at its chosen lr (``lmsweep.analysis``)."""
    width: int
    lr: float
    widened: list[float]
    params: int
    params_non_embedding: int
    test_loss: list[float]
    diverged: list[Any]
    floor: float
    grid: list[LmLrScore]
    edge: NotRequired[str]


class Applicability(TypedDict):
    """applicability[ratio] (version 2): whether a Fig. 3 ratio's premise holds, and why."""
    measurable: bool
    why: str


class LmTimings(TypedDict):
    wall_s: float
    workers: int
    jobs: int


class LmSweepResults(TypedDict):
    """The language-model sweep's sweep.json (``lmsweep.sweep``). Its endpoints and curves are the analysis' own
    (``lmsweep.analysis``, ``lmsweep.fits``), kept as JSON objects here; the report draws the verdict rows the
    sweep wrote (endpoint, variant, estimate, n, verdict, paper; the sensitivity rows without n and paper)."""
    benchmark: str
    protocol_version: int
    config: LmSweepConfigDict
    tokens_per_run: int
    widths: list[int]
    seeds: list[int]
    chosen_lr: dict[str, list[float]]
    table: dict[str, list[LmWidthRow]]
    endpoints: dict[str, dict[str, Any]]
    curves: dict[str, Any]
    diverged_runs: dict[str, int]
    runs_total: dict[str, int]
    timings: LmTimings
    failed_floor_runs: NotRequired[dict[str, int]]
    applicability: NotRequired[dict[str, Applicability]]  # version 2
    unresolved_edges: NotRequired[list[dict[str, Any]]]
    rounding_scope: NotRequired[str]
    deviations: NotRequired[list[str]]
    verdict_rows: NotRequired[list[list[str]]]
    sensitivity_rows: NotRequired[list[list[str]]]


class LmCurve(TypedDict):
    """A job's test-half loss every ``eval_every`` steps (Fig. 3b)."""
    steps: list[int]
    test_loss: list[float]


class LmOutliers(TypedDict):
    """A job's largest |attention logit| and |hidden state| over its outlier windows (Table 5), and their medians."""
    attention_logit_top1: float
    hidden_state_top1: float
    attention_logit_median: NotRequired[float]
    hidden_state_median: NotRequired[float]


class LmSweepRun(TypedDict):
    """One job of the language-model sweep (``lmsweep.job.run_job``): each record's ``result`` in its journal
    (OUT/lm-jobs.jsonl). Required: what the protocol's analysis, the rounding check and the diagnostics read (the
    job, its losses, floor, divergence, parameter counts, curve and outliers; a diverged job's losses and outliers
    are null); ``NotRequired``: the job's bookkeeping, which run_job always writes but no decision reads (times, the
    machine, the training loss every 10th step; ``eval_s`` is absent from a diverged job's)."""
    width: int
    variant: str
    seed: int
    lr: float
    params: int
    params_non_embedding: int
    floor: float
    diverged: bool
    tune_loss: Optional[float]
    test_loss: Optional[float]
    curve: LmCurve
    outliers: Optional[LmOutliers]
    tokens_per_step: NotRequired[int]
    skipped_steps: NotRequired[int]
    cpu_capability: NotRequired[str]
    cpu_model: NotRequired[str]
    train_s: NotRequired[float]
    train_cpu_s: NotRequired[float]
    eval_s: NotRequired[float]
    train_loss: NotRequired[list[float]]


# One DIFF V1 layer's scales (``lmsweep.diagnostic.v1_scales``; "lambda" is a keyword, hence the call form); the RMS
# before and after the head-wise norm only where the layer has one
V1Scale = TypedDict("V1Scale", {
    "layer": int, "lambda": float, "lambda_init": float, "weight_rms": Optional[float], "after_multiplier": float,
    "before_norm": NotRequired[float], "after_norm": NotRequired[float]})


class LmArmRun(LmSweepRun):
    """One job of a language-model diagnostic (``lmsweep.diagnostic.run_arm_job``): a sweep job of an arm or a
    rerun, the result of each record of its journals; ``v1_scales`` for the V1 diagnostic's finished DIFF V1 jobs."""
    arm: str
    v1_scales: NotRequired[list[V1Scale]]
