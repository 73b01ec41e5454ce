"""A run's metrics (``metrics.jsonl``): the record format, appending, the resume marker, and reading the records
and curves back (a line cut by a kill is skipped by every reader).

The file is only ever appended to. The lambda keys are the variants' own (``Attention.lambda_summary_name``, read
from the registry when the records are read, so a variant registered later counts too), so the trainer that
writes them and the report that reads them agree.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from typing import Any, Optional, TypedDict

from ..fileio import FAULT_ENV, fault_point
from ..model.variants import variant, variants
from .files import PathLike, metrics_path

__all__ = ["RESUMED_KEY", "lambda_keys", "LAMBDA_KEYS", "LAMBDA_V1", "LAMBDA_V2", "MetricsRecord", "MetricsCurves",
           "parse_metrics", "read_metric_records", "append_metrics", "truncate_metrics_after", "read_metrics"]

# A metrics record a resumed run appends first: readers drop the records logged past this step before it (what a
# killed run wrote after its last checkpoint), so the file is never rewritten.
RESUMED_KEY = "resumed_from_step"

# The per-layer lambda of each variant that has one, logged with each evaluation (DIFF V1's learned scalar of
# eq. (2), DIFF V2's mean sigmoid(lambda) over batch, heads and tokens), under the variant's own key.
def lambda_keys() -> tuple[str, ...]:
    """Every registered variant's lambda key, each once."""
    return tuple(dict.fromkeys(v.cls.lambda_summary_name for v in variants() if v.cls.lambda_summary_name))


def _lambda_key(name: str) -> str:
    key = variant(name).cls.lambda_summary_name
    assert key is not None, f"{name} logs no lambda"
    return key


LAMBDA_KEYS = lambda_keys()  # the built-in variants' (MetricsRecord's keys)
LAMBDA_V1 = _lambda_key("diff_v1")
LAMBDA_V2 = _lambda_key("diff_v2")


# One line of metrics.jsonl: a training record (step: int, loss, lr, grad_norm: float, tokens: int, tokens_per_s:
# float, skipped_steps: int, the steps so far in this process whose loss or gradient was not finite and made no
# update) or an evaluation record (step, val_loss: float and the variant's lambda per layer, a list of floats under
# its key in LAMBDA_KEYS). A plain dict: the lambda keys come from the registry, which no TypedDict can list.
MetricsRecord = dict[str, Any]


def parse_metrics(lines: Iterable[str]) -> list[MetricsRecord]:
    """Records of metrics.jsonl lines as one run: a line cut by a kill (or blank) is skipped, and a resume marker
    drops the records logged before it past its step (the killed run's tail, logged again after the resume)."""
    out: list[MetricsRecord] = []
    for line in lines:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(rec, dict):
            continue
        if RESUMED_KEY in rec:
            at = rec[RESUMED_KEY]
            out = [r for r in out if not isinstance(r.get("step"), (int, float)) or r["step"] <= at]
        else:
            out.append(rec)
    return out


def read_metric_records(run_dir: Optional[PathLike]) -> list[MetricsRecord]:
    """Every readable record of the run's metrics.jsonl, in order ([] without one)."""
    p = metrics_path(run_dir) if run_dir is not None else None
    if p is None or not p.is_file():
        return []
    return parse_metrics(p.read_text().splitlines())


def append_metrics(run_dir: PathLike, record: dict) -> None:
    line = json.dumps(record) + "\n"
    with open(metrics_path(run_dir), "a") as f:
        if os.environ.get(FAULT_ENV):  # the tests' kill lands inside the line: cut it in two
            f.write(line[:len(line) // 2])
            f.flush()
            fault_point(metrics_path(run_dir))
            f.write(line[len(line) // 2:])
        else:
            f.write(line)


def truncate_metrics_after(run_dir: PathLike, step: int) -> None:
    """Make a resumed run's metrics read as one run without rewriting the file: cut away only a last line a
    kill left unfinished (no newline), then append a resume marker (``RESUMED_KEY``) telling readers to drop
    the records past ``step`` logged before it."""
    p = metrics_path(run_dir)
    if not p.is_file():
        return
    with open(p, "rb+") as f:
        end = pos = f.seek(0, os.SEEK_END)
        while pos > 0:  # back from the end to the last newline: the file may be long, a line is short
            pos = max(0, pos - 4096)
            f.seek(pos)
            nl = f.read(end - pos).rfind(b"\n")
            if nl >= 0:
                pos += nl + 1
                break
        if pos < end:
            f.truncate(pos)  # the cut line only; 0 when it was the only line
    append_metrics(run_dir, {RESUMED_KEY: step})


# The training curves of one run, as the report and the demo table read them ("lambda" is a keyword, hence the
# functional form). grad_norm is nan where a record has none; "lambda" is the last evaluation's
# {"name": one of LAMBDA_KEYS, "step": int, "values": [per layer]}, or {} for a variant without lambda.
MetricsCurves = TypedDict("MetricsCurves", {
    "step": list, "loss": list, "grad_norm": list, "tokens_per_s": list, "val_step": list, "val_loss": list,
    "lambda": dict})


def read_metrics(run_dir: Optional[PathLike]) -> MetricsCurves:
    """The run's curves (``MetricsCurves`` keys, with the lambda under "lambda"); empty lists when the run has
    no metrics.jsonl or ``run_dir`` is None (a bare model directory)."""
    out: MetricsCurves = {"step": [], "loss": [], "grad_norm": [], "tokens_per_s": [], "val_step": [], "val_loss": [],
                          "lambda": {}}
    for rec in read_metric_records(run_dir):
        if "loss" in rec:
            out["step"].append(rec["step"])
            out["loss"].append(rec["loss"])
            out["grad_norm"].append(rec.get("grad_norm", math.nan))
        if "tokens_per_s" in rec:
            out["tokens_per_s"].append(rec["tokens_per_s"])
        if "val_loss" in rec:
            out["val_step"].append(rec["step"])
            out["val_loss"].append(rec["val_loss"])
            for k in lambda_keys():
                if k in rec:
                    out["lambda"] = {"name": k, "step": rec["step"], "values": rec[k]}
    return out
