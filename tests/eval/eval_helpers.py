"""Helpers of the evaluation tests."""

from __future__ import annotations

import copy
import dataclasses
import json

from suite_helpers import cli_fails  # noqa: F401  (the suite's one CLI-error check, re-exported)


def fresh(ev):
    """``ev`` with its own copy of the model, free to be changed."""
    return dataclasses.replace(ev, model=copy.deepcopy(ev.model))


def roundtrip(result: dict) -> dict:
    """The result through strict JSON (no NaN, no objects), as written to a result file."""
    return json.loads(json.dumps(result, allow_nan=False))
