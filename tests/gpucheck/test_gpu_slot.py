"""`make gpu-slot` (src/difftransformer/gpucheck/slot.sh): bad settings and a missing sweep are refused with one line
and exit code 2 before any step runs or any output folder is made. The plumbing itself (`SLOT_DRY=1`, 91 s) is
run by hand: docs/gpu.md."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOT = ROOT / "src" / "difftransformer" / "gpucheck" / "slot.sh"


def slot(tmp_path, **env):
    return subprocess.run(["bash", str(SLOT)], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "SLOT_OUT": str(tmp_path / "out"), **env})


@pytest.mark.parametrize("env, says", [
    ({"SLOT_S": "9m"}, "SLOT_S must be a whole number of seconds, got '9m'"),
    ({"SLOT_WORKERS": "0"}, "SLOT_WORKERS must be a positive whole number, got '0'"),
    ({"SLOT_DRY": "yes"}, "SLOT_DRY must be 0 or 1, got 'yes'"),
    ({}, "runs/lm-sweep-gpu/data/meta.json is missing"),
])
def test_bad_settings_are_refused_before_any_step(tmp_path, env, says):
    r = slot(tmp_path, **env)
    assert r.returncode == 2
    assert r.stderr.startswith("gpu-slot: error: ") and says in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs" / "gpu").exists()
