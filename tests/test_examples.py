"""The runnable examples (examples/): each runs at a tiny size as a user runs it; a bad flag is one error line.

The GPT example runs in a process of its own, as ``python examples/gpt.py`` (its exit code and streams are the
process's); the others run as ``__main__`` in this process (``runpy``, with the same ``sys.argv`` and working
directory), which spares each a start of Python, torch and scikit-learn of its own (about 2-5 s of CPU each)."""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"([-+]?\d+\.\d+)"


def run_example(script: str, *flags: str) -> subprocess.CompletedProcess:
    """``python examples/<script> <flags>`` from the repository root, one thread (a tiny model runs fastest on one)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, f"examples/{script}", *flags], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def run_example_here(monkeypatch, script: str, *flags: str) -> SimpleNamespace:
    """The same run as ``run_example``'s, as ``__main__`` in this process: ``returncode`` (0, or ``SystemExit``'s
    code), ``stdout`` and ``stderr``. Torch's global generator is given back as it was (the examples seed it)."""
    import torch

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [f"examples/{script}", *flags])
    out, err = io.StringIO(), io.StringIO()
    rc = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), torch.random.fork_rng(devices=[]):
        try:
            runpy.run_path(f"examples/{script}", run_name="__main__")
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


def test_gpt_trains_reports_and_generates():
    r = run_example("gpt.py", "--variant", "diff_v1", "--steps", "4", "--d-model", "32", "--layers", "1")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^diff_v1: [\d,]+ parameters", r.stdout, re.M), r.stdout
    losses = [float(x) for x in re.findall(rf"^step +\d+  train loss {NUMBER}$", r.stdout, re.M)]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses), r.stdout
    val = re.search(rf"^final val loss {NUMBER}$", r.stdout, re.M)
    assert val and math.isfinite(float(val.group(1))), r.stdout
    sample = re.search(r"^sample: '(.*)'$", r.stdout, re.M)
    assert sample and sample.group(1).startswith("And God said") and len(sample.group(1)) == 12 + 200, r.stdout


def test_vit_prints_the_table_and_the_paired_differences(monkeypatch):
    r = run_example_here(monkeypatch, "vit_digits.py", "--seeds", "2", "--epochs", "1", "--d-model", "16", "--depth",
                         "1")
    assert r.returncode == 0, r.stderr
    assert "An example, not a claim" in r.stdout
    for variant in ("baseline", "diff_v1", "diff_v2"):
        row = re.search(rf"^{variant} +[\d,]+ +{NUMBER} \+- +{NUMBER}$", r.stdout, re.M)
        assert row, r.stdout
        assert 0 <= float(row.group(1)) <= 100 and math.isfinite(float(row.group(2))), row.group(0)
    for variant in ("diff_v1", "diff_v2"):
        assert re.search(rf"^{variant} - baseline \(paired by seed\): +{NUMBER} \+- +{NUMBER} points$", r.stdout,
                         re.M), r.stdout


def test_vit_without_the_baseline_prints_no_difference(monkeypatch):
    r = run_example_here(monkeypatch, "vit_digits.py", "--seeds", "1", "--epochs", "1", "--d-model", "16", "--depth",
                         "1", "--variants", "diff_v2")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^diff_v2 +[\d,]+ +\d+\.\d+ \(one seed: no interval\)$", r.stdout, re.M), r.stdout
    assert "baseline" not in r.stdout


@pytest.mark.parametrize(("script", "flags", "expected"), [
    ("gpt.py", ["--variant", "diff_v3"], "invalid choice: 'diff_v3'"),
    ("gpt.py", ["--d-model", "30"], "--d-model 30: DiffAttention: d_model=30 is not divisible by n_heads=4"),
    ("gpt.py", ["--d-model", "28"], "--d-model 28: DiffAttention: head_dim=7 must be even"),
    ("vit_digits.py", ["--seeds", "0"], "--seeds, --epochs and --depth must be at least 1"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_bad_flag_is_one_error_line(monkeypatch, script, flags, expected):
    r = run_example_here(monkeypatch, script, *flags)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"{script}: error: ") and expected in lines[0], lines[0]
    assert r.stdout == ""
