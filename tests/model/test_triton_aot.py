"""The Triton kernels compiled ahead of time for an A100 (sm_80) and an H100 (sm_90), with no GPU here.

``triton_launches.py`` (beside this file) records the launches the wrappers make (DIFF V1 and V2 at head_dim 64 and
128, V1's per_head layout at 128; bf16 and fp32; the forward, the three backward kernels, the decode split and its
merge; the forward is also what a prefill launches) with the tiles they choose for each GPU, compiles each with
``triton.compile`` for ``GPUTarget("cuda", arch, 32)`` (Triton's bundled ptxas) and reads the shared memory and the
stack frame (where ptxas puts spilled registers) of each. A launch over its GPU's per-block shared memory would fail
with OutOfResources at its first call; this test catches that without the GPU. The bf16 launches are also compiled
for sm_86 against a consumer GPU's 99 KB. It runs in a subprocess: the kernels must be compiled, not interpreted.
Compiling all 124 default launches took 298 s of the suite's CPU on a fresh machine (2026-12-02: Triton's cache
empty), so ``python tests/model/triton_launches.py --defaults --write`` compiles them once into the committed
``triton_default_launches.json`` (with the sha256 of the kernels' source), and this file checks that the table is
this code's (the same source, the same launches recorded from the wrappers) and recompiles a sample of 9 of them
against its rows.

The autotune candidates (``triton_tuning.CANDIDATES_16BIT``): ``python tests/model/triton_launches.py --candidates
--write`` compiles every one of them for sm_80 and sm_90 (246 compilations: 883 s for 240 on 2 cores at load 11,
so not here) into the committed table ``triton_fits.py``; this file checks that the table lists exactly the candidates the
script would compile now and recompiles a sample of 8 of them (one per arch and kernel) against the table's rows
(40 s; the representative set above 278 s and the lowest Triton's check 65 s, at the same load, 2026-11-26).

The lowest Triton the kernels support (``TRITON_MIN``, what ``[triton]`` in pyproject.toml says) compiles the
default launches too when it is installed beside the repository (``make triton-min``: pip installs it into
build/triton-MIN without dependencies; it needs no torch of its own); without it that test skips and says how.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from difftransformer.kernels import triton_tuning as tuning  # noqa: E402
from difftransformer.kernels.triton_fits import FITS, TRITON_VERSION  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TRITON_MIN = "3.6.0"  # the oldest Triton the kernels are checked with (it ran them on an H200 on 2026-11-26)
MIN_DIR = Path(os.environ.get("DIFFTRANSFORMER_TRITON_MIN_DIR", ROOT / "build" / f"triton-{TRITON_MIN}"))
# Bytes of stack frame per thread (spill slots) a launch may use: the choices in default_config spill at most a few
# dozen bytes; before them fp32 spilled up to 11 KB per thread and the merge kernel 5 KB. The same bound prunes the
# autotune candidates (triton_tuning.MAX_SPILL_BYTES).
MAX_SPILL_BYTES = 128
assert MAX_SPILL_BYTES == tuning.MAX_SPILL_BYTES
LIMITS = {80: 166_912, 90: 232_448, 86: 101_376}  # bytes per block: A100, H100, RTX 30xx
KERNELS = {"fwd", "bwd_pre", "bwd_dkdv", "bwd_dq", "decode", "merge"}


def launches(*flags: str, pythonpath: str = "") -> dict:
    """The JSON that ``triton_launches.py FLAGS`` prints, run in a subprocess (compiled, not interpreted)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, str(HERE / "triton_launches.py"), *flags], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


DEFAULTS = json.loads((HERE / "triton_default_launches.json").read_text())


@pytest.fixture(scope="module")
def both_checks() -> dict:
    """Both checks of ``triton_launches.py`` in one process (one import of torch and Triton, one pool of compilers)."""
    return launches("--check-both")


@pytest.fixture(scope="module")
def defaults_check(both_checks) -> dict:
    """The default launches the wrappers make now (recorded, not compiled) and a recompiled sample of them."""
    return both_checks["defaults"]


@pytest.fixture(scope="module")
def compiled(defaults_check) -> dict:
    """The default launches' resources: the committed table (``triton_default_launches.json``), once it is checked
    to be this code's (``test_the_default_launch_table_is_this_codes``)."""
    check_default_table(defaults_check)
    return DEFAULTS


def check_default_table(check: dict) -> None:
    stale = "triton_default_launches.json is stale: rerun `python tests/model/triton_launches.py --defaults --write`"
    assert DEFAULTS["sources"] == check["sources"], f"{stale} (the kernels' source changed)"
    have = [[r["kernel"], r["case"], r["arch"], r["config"]] for r in DEFAULTS["rows"]]
    assert have == check["launches"], f"{stale} (the wrappers launch another set)"


@pytest.fixture(scope="module")
def table_check(both_checks) -> dict:
    """The candidate set (every fit key and config) and a recompiled sample of it."""
    return both_checks["table"]


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


def test_the_default_launch_table_is_this_codes(defaults_check):
    """The committed resources of the default launches are those of the kernels and wrappers here: the same kernel
    source, the same launches (tiles, warps, stages per GPU), and a recompiled sample of 9 (per arch four kernels;
    the consumer GPU's decode) gives its rows: the same resources under the Triton that wrote the table, the same
    verdict (fits, within the spill bound) under another."""
    check_default_table(defaults_check)
    rows = {(r["kernel"], r["case"], r["arch"], json.dumps(r["config"])): r for r in DEFAULTS["rows"]}
    assert len(defaults_check["sample"]) == 9
    assert {r["kernel"] for r in defaults_check["sample"]} == {"fwd", "bwd_dkdv", "bwd_dq", "decode"}
    for got in defaults_check["sample"]:
        want = rows[(got["kernel"], got["case"], got["arch"], json.dumps(got["config"]))]
        fits = [(r["shared"] <= LIMITS[r["arch"]], r["stack"] <= MAX_SPILL_BYTES) for r in (got, want)]
        assert fits[0] == fits[1], (got, want)
        if defaults_check["triton"] == DEFAULTS["triton"]:
            assert (got["shared"], got["regs"], got["stack"]) == (want["shared"], want["regs"], want["stack"])


def test_the_fit_table_is_the_scripts_output(table_check):
    """triton_fits.py lists exactly the candidates the script compiles now (same keys, configs and order), and a
    recompiled sample gives its rows: the same resources under the Triton that wrote it, the same verdict under
    another (a newer ptxas may move a few bytes)."""
    committed = [[key, list(r["config"])] for key, rows in FITS.items() for r in rows]
    assert committed == table_check["candidates"], ("triton_fits.py is stale: rerun `python "
                                                    "tests/model/triton_launches.py --candidates --write`")
    assert len(table_check["sample"]) == 8
    for key, row in table_check["sample"]:
        want = next(r for r in FITS[key] if list(r["config"]) == row["config"])
        assert row["fits"] == want["fits"], (key, row, want)
        if table_check["triton"] == TRITON_VERSION:
            assert (row["shared"], row["regs"], row["stack"]) == (want["shared"], want["regs"], want["stack"])


def test_every_tuned_launch_keeps_a_fitting_default_and_a_choice():
    """The default (first row of each key) fits wherever the tuner runs; on sm_90 most kernels have a larger
    candidate that fits too (else the tables would tune nothing there)."""
    assert {key.split("/")[0] for key in FITS} == {"sm_80", "sm_90"}
    for key, rows in FITS.items():
        assert rows[0]["fits"], f"{key}: the default config {rows[0]['config']} does not fit"
        assert all(r["shared"] <= LIMITS[int(key[3:5])] for r in rows if r["fits"])
    tunable = [key for key, rows in FITS.items() if key.startswith("sm_90") and sum(r["fits"] for r in rows) > 1]
    assert len(tunable) >= len([k for k in FITS if k.startswith("sm_90")]) // 2, tunable


def test_pyproject_triton_extra_names_the_supported_versions():
    text = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r'^triton = \["triton([^"]*)"\]', text, re.M)
    major_minor = ".".join(TRITON_MIN.split(".")[:2])
    assert extra and extra.group(1).startswith(f">={major_minor}"), extra


def test_the_lowest_supported_triton_compiles_the_default_launches():
    """Triton TRITON_MIN (the GPU machine's, with torch 2.11) compiles the default launches of V1 at d 128 and V2 at
    d 64 for sm_80 and sm_90 in bf16 and fp32: every one within its GPU's shared memory (else it could not launch),
    and the bf16 ones within the spill bound. Its ptxas spills more in one float32 launch, V1's forward at d 128 on
    sm_80 (480 B per thread under 3.6.0, within the bound under 3.9.0; 2026-11-26): slower, not failing. It uses the
    repository's torch: Triton itself needs none."""
    if not (MIN_DIR / "triton").is_dir():
        pytest.skip(f"Triton {TRITON_MIN} is not installed at {MIN_DIR}: `make triton-min` "
                    f"(pip install --no-deps --target {MIN_DIR} triton=={TRITON_MIN})")
    got = launches("--json", "--quick", pythonpath=str(MIN_DIR))
    assert got["triton"] == TRITON_MIN
    assert {(r["arch"], r["kernel"]) for r in got["rows"]} >= {(a, k) for a in (80, 90) for k in KERNELS}
    over = [r for r in got["rows"] if r["shared"] > LIMITS[r["arch"]]]
    spills = [r for r in got["rows"] if r["case"].split("/")[1] == "bf16" and r["stack"] > MAX_SPILL_BYTES]
    assert not over and not spills, [(r["arch"], r["case"], r["kernel"], r["shared"], r["stack"]) for r in over + spills]
