"""The Triton kernels compiled ahead of time for an A100 (sm_80) and an H100 (sm_90), with no GPU here.

``triton_launches.py`` (beside this file) records the launches the wrappers make (DIFF V1 and V2 at head_dim 64 and
128, V1's per_head layout at 128; bf16 and fp32; the forward, the three backward kernels, the decode split and its
merge; the forward is also what a prefill launches) with the tiles they choose for each GPU, compiles each with
``triton.compile`` for ``GPUTarget("cuda", arch, 32)`` (Triton's bundled ptxas) and reads the shared memory and the
stack frame (where ptxas puts spilled registers) of each. A launch over its GPU's per-block shared memory would fail
with OutOfResources at its first call; this test catches that without the GPU. The bf16 launches are also compiled
for sm_86 against a consumer GPU's 99 KB. It runs in a subprocess: the kernels must be compiled, not interpreted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent
# Bytes of stack frame per thread (spill slots) a launch may use: the choices in default_config spill at most a few
# dozen bytes; before them fp32 spilled up to 11 KB per thread and the merge kernel 5 KB.
MAX_SPILL_BYTES = 128
LIMITS = {80: 166_912, 90: 232_448, 86: 101_376}  # bytes per block: A100, H100, RTX 30xx
KERNELS = {"fwd", "bwd_pre", "bwd_dkdv", "bwd_dq", "decode", "merge"}


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(HERE / "triton_launches.py"), "--json"], cwd=HERE.parents[1],
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_every_launch_fits_shared_memory_and_barely_spills(compiled):
    rows = compiled["rows"]
    over = [r for r in rows if r["shared"] > LIMITS[r["arch"]]]
    spills = [r for r in rows if r["stack"] > MAX_SPILL_BYTES]
    assert not over, "over the GPU's shared memory per block:\n" + "\n".join(
        f"sm_{r['arch']} {r['case']} {r['kernel']}: {r['shared']} B > {LIMITS[r['arch']]} B, {r['config']}"
        for r in over)
    assert not spills, f"more than {MAX_SPILL_BYTES} B of spills per thread:\n" + "\n".join(
        f"sm_{r['arch']} {r['case']} {r['kernel']}: {r['stack']} B, {r['config']}" for r in spills)


def test_the_compiled_set_is_representative(compiled):
    """Every kernel, both layouts of V1 and V2, both widths and dtypes, on both GPUs (and bf16 on the consumer one)."""
    seen = {(r["arch"], r["case"].split("/")[0], r["case"].split("/")[1], r["case"].split("/")[2], r["kernel"])
            for r in compiled["rows"]}
    for arch in (80, 90):
        for variant, d in (("v1", "d64"), ("v1", "d128"), ("v1_per_head", "d128"), ("v2", "d64"), ("v2", "d128")):
            for dtype in ("bf16", "fp32"):
                kernels = {k for a, v, t, dd, k in seen if (a, v, t, dd) == (arch, variant, dtype, d)}
                # identical launches compile once: preprocess and merge are shared by cases of one value width
                assert {"fwd", "bwd_dkdv", "bwd_dq", "decode"} <= kernels, (arch, variant, dtype, d, kernels)
        assert {k for a, *_, k in seen if a == arch} == KERNELS
    assert {r["arch"] for r in compiled["rows"]} == {80, 90, 86}
    assert all(r["case"].split("/")[1] == "bf16" for r in compiled["rows"] if r["arch"] == 86)
    # the wrappers chose per GPU: the 16-bit decode runs 3 stages on sm_80/sm_90 and 2 in a consumer GPU's 99 KB
    stages = {(r["arch"], r["config"]["num_stages"]) for r in compiled["rows"] if r["kernel"] == "decode"
              and r["case"].split("/")[1] == "bf16"}
    assert stages == {(80, 3), (90, 3), (86, 2)}
