"""A study's output directory as every reader takes it (the report, ``demo --lm-sweep``, ``lm-sweep --rounding-of``):
the schema of each study's result file, written once here, and ``read_study``, which checks a file against it before
any long work, in one line that names the flag, the file and the field it lacks or mistypes.

The schemas are ``TypedDict``s: the JSON on disk is exactly what the writers build (``retrieval/benchmark.py``'s
results.json, ``lmsweep/sweep.py``'s sweep.json), the readers index it with keys mypy checks. A field is required
(total) where today's writer always writes it and no reader accepts it missing; ``NotRequired`` where an older
version of the file lacks it and the readers already say so (``.get``, ``in``). Extra keys are allowed (a newer
writer's). The schema sits in ``rundir`` (not ``studies/``) because the report, which once sat below the studies in
``eval/report`` and could import no study, reads it too; the report is now ``report/``, above the studies, so the
schemas can move to their studies (issue 66 item 2, not done yet).

``validate(obj, schema, where)`` checks any JSON value against a schema type (TypedDicts, ``list``, ``dict``,
``Sequence``, ``Literal``, ``Optional``, the JSON scalars; ``Any`` is not looked into), so each file's validator is one
call (``validate_retrieval_results``, ``validate_lm_sweep``).

The job journals' records are schemas here too: each study's per-job result (``RetrievalRun``, ``RetrievalArmRun``,
``LmSweepRun``, ``LmArmRun``), whose validator the study passes to ``jobs.Journal``/``read_journal`` as ``check``
(``jobs/`` sits below this package and imports no schema): every record written, resumed, reused or read."""

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
from .files import RESULTS_NAME, SWEEP_RESULTS_NAME

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


validate_retrieval_results = checker(RetrievalResults)  # a retrieval benchmark's results.json, whole
validate_lm_sweep = checker(LmSweepResults)  # a language-model sweep's sweep.json
# The job journals' results: each study passes its check to ``jobs.Journal``/``read_journal`` (``jobs/`` imports no
# study and no schema), which checks every record read, reused or written
validate_retrieval_run = checker(RetrievalRun)  # a retrieval benchmark or width-sweep job's result
validate_retrieval_arm_run = checker(RetrievalArmRun)  # a retrieval diagnostic job's result
validate_lm_run = checker(LmSweepRun)  # a language-model sweep job's result
validate_lm_arm_run = checker(LmArmRun)  # a language-model diagnostic job's result


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


def validate_diagnostic(obj: Any, where: str) -> Union[RetrievalDiagnostic, LmDiagnostic]:
    """A diagnostic.json of either study, checked whole against the schema its "benchmark" names; one ValueError
    naming ``where`` and the field."""
    kinds = (RETRIEVAL_DIAGNOSTIC, *LM_DIAGNOSTICS)
    if not isinstance(obj, dict) or obj.get("benchmark") not in kinds:
        got = obj.get("benchmark") if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
        raise ValueError(f"{where}: its \"benchmark\" is {got!r}, not one of {', '.join(map(repr, kinds))}")
    if obj["benchmark"] == RETRIEVAL_DIAGNOSTIC:
        return validate(obj, RetrievalDiagnostic, where)
    return validate(obj, LmDiagnostic, where)


def validate_readings(obj: Any, where: str) -> ReadingsCheck:
    """A diagnostic's rounding.json, checked against ``ReadingsCheck``."""
    return validate(obj, ReadingsCheck, where)


def write_checked(path: Path, obj: Any, check: typing.Callable[[Any, str], Any]) -> None:
    """``obj`` written as the JSON file ``path`` (atomically) once ``check``, its schema's validator, takes it as it
    reads back: a writer that departs from what the readers take fails here, naming the field."""
    text = json.dumps(obj, indent=1) + "\n"
    check(json.loads(text), f"{path} (as written)")
    atomic_write(path, text)


# What each study's output directory holds: its result file, the "benchmark" that file names, its validator
STUDIES: dict[str, tuple[str, str, Any]] = {
    "retrieval": (RESULTS_NAME, RETRIEVAL_BENCHMARK, validate_retrieval_results),
    "lm-sweep": (SWEEP_RESULTS_NAME, LM_SWEEP_BENCHMARK, validate_lm_sweep),
}


def _read(directory: str | Path, kind: str, flag: str) -> Any:
    name, benchmark, check = STUDIES[kind]
    path = Path(directory) / name
    if not path.is_file():
        raise ValueError(f"{flag} {directory}: holds no {name} (run `difftransformer {kind} --out {directory}` "
                         "first)")
    res = read_json(path)
    where = f"{flag}: {path} is not a {kind} result"
    if not isinstance(res, dict):
        raise ValueError(f"{where}: a JSON {type(res).__name__}, not an object")
    if res.get("benchmark") != benchmark:
        raise ValueError(f"{where}: its \"benchmark\" is {res.get('benchmark')!r}, not {benchmark!r}")
    return check(res, where)


def read_retrieval(directory: str | Path, flag: str) -> RetrievalResults:
    """A retrieval benchmark's output directory's results.json, validated (``read_study``)."""
    return typing.cast(RetrievalResults, _read(directory, "retrieval", flag))


def read_lm_sweep(directory: str | Path, flag: str) -> LmSweepResults:
    """A language-model sweep's output directory's sweep.json, validated (``read_study``)."""
    return typing.cast(LmSweepResults, _read(directory, "lm-sweep", flag))


def read_study(directory: str | Path, kind: str, flag: str) -> Any:
    """A study's output as every reader takes it: ``kind`` "retrieval" (``difftransformer retrieval``'s results.json,
    a ``RetrievalResults``) or "lm-sweep" (``difftransformer lm-sweep``'s sweep.json, a ``LmSweepResults``) in
    ``directory``. A missing file, bad JSON, or JSON of another shape is one ValueError naming ``flag``, the file
    and the field it lacks or mistypes (``read_retrieval``/``read_lm_sweep`` give the typed result)."""
    return _read(directory, kind, flag)
