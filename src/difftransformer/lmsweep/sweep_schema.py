"""The language-model sweep's own result schemas, beside its code: sweep.json (``LmSweepResults``), its jobs' records
(``LmSweepRun``, the diagnostics' and follow-ups' ``LmArmRun``) and the diagnostics' diagnostic.json
(``LmDiagnostic``), with their validators (``studies.schema.checker``); the follow-ups' files are in ``schema.py``."""

# no ``from __future__ import annotations``: TypedDict reads NotRequired from evaluated annotations only

from typing import Any, Literal, Optional

# typing_extensions (torch's own dependency): NotRequired and a TypedDict that reads it on Python 3.10 too
from typing_extensions import NotRequired, TypedDict

from ..studies.schema import ReadingRow, checker, validate

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

# ========================================================================= the diagnostics' diagnostic.json
LM_DIAGNOSTICS = ("v1_diagnostic", "v2_diagnostic")  # the language-model diagnostics' "benchmark"


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



validate_lm_sweep = checker(LmSweepResults)  # a language-model sweep's sweep.json
# The job journals' results: the study passes its check to ``jobs.Journal``/``read_journal``
validate_lm_run = checker(LmSweepRun)  # a language-model sweep job's result
validate_lm_arm_run = checker(LmArmRun)  # a language-model diagnostic job's result


def validate_diagnostic(obj: Any, where: str) -> LmDiagnostic:
    """A language-model diagnostic's diagnostic.json, DIFF V1's or DIFF V2's, checked whole against
    ``LmDiagnostic``: one ValueError naming ``where`` and the field (another "benchmark" names the ones allowed)."""
    kinds = LM_DIAGNOSTICS
    if not isinstance(obj, dict) or obj.get("benchmark") not in kinds:
        got = obj.get("benchmark") if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
        raise ValueError(f"{where}: its \"benchmark\" is {got!r}, not one of {', '.join(map(repr, kinds))}")
    return validate(obj, LmDiagnostic, where)
