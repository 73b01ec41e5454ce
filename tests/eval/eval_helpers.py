"""Helpers of the evaluation tests."""

from __future__ import annotations

import copy
import dataclasses
import json

from difftransformer.cli import main


def fresh(ev):
    """``ev`` with its own copy of the model, free to be changed."""
    return dataclasses.replace(ev, model=copy.deepcopy(ev.model))


def roundtrip(result: dict) -> dict:
    """The result through strict JSON (no NaN, no objects), as written to a result file."""
    return json.loads(json.dumps(result, allow_nan=False))


def cli_fails(capsys, argv: list[str], *expected: str) -> str:
    """``difftransformer <argv>`` exits 2 with one error line holding every ``expected`` text, no traceback."""
    capsys.readouterr()
    assert main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith(f"difftransformer {argv[0]}: error: "), lines[0]
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in out.err + out.out
    return lines[0]
