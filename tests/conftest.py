"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os

import pytest

# The processes the tests start (training runs, job workers, torchrun's ranks, the GPU check's dry steps, the Triton
# interpreter's fresh process) inherit one OpenMP thread, as this process's tests run (``one_thread`` below): `make
# test` runs a test per core already, and a second OpenMP thread per process only spins on a loaded machine (the dry
# GPU-check plan: 46 -> 37 s of CPU, 2026-12-07). A value set by the caller stands; a test that needs more threads
# sets them itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and a shared, loaded machine punishes spinning OpenMP workers."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_config():
    """A factory of ``tiny``-flavour model configs: ``tiny_config("diff_v2", max_seq_len=32)``."""
    from suite_helpers import tiny_model_config

    return tiny_model_config


@pytest.fixture
def assert_cli_error(capsys):
    """``assert_cli_error(argv, *expected)``: the one-error-line, exit-2 check of ``suite_helpers.cli_fails``."""
    from suite_helpers import cli_fails

    return lambda argv, *expected, **kw: cli_fails(capsys, argv, *expected, **kw)


# ---------------------------------------------------------------------------------------------- markers
# `make test-fast` runs `-m fast`: the core promises in under a minute on 2 CPU cores. `make test` runs everything
# but `serial` on every core (pytest-xdist), then `-m serial` on two workers with nothing else beside them. The
# markers are given here, by file or test, so the test files stay as they are; a file not listed runs in the
# parallel pass.

# Whole files in the fast set: every attention variant and backend against the float64 reference, the rows-only
# forward, the model's save/load round trips and config validation, the KV cache, Hugging Face round trips (ours ->
# HF -> ours bitwise, logits equal), every kind of model directory the loader opens, checkpoints that resume skips.
FAST_FILES = {
    "tests/model/test_attention.py",
    "tests/model/test_logits_at_rows.py",
    "tests/model/test_model.py",
    "tests/model/test_config.py",
    "tests/inference/test_kv_cache_bytes.py",
    "tests/interop/test_hf.py",
    "tests/test_loading.py",
    "tests/train/test_checkpoints.py",
}
# Single tests (node ids without the parameters) in the fast set: cached decode vs the full forward, greedy
# generation vs the full argmax, the checkpoint and format round trips.
FAST_TESTS = {
    "tests/inference/test_generate.py::test_cached_decode_equals_full_forward",
    "tests/inference/test_generate.py::test_cached_decode_with_left_padded_batch",
    "tests/inference/test_generate.py::test_greedy_generate_equals_repeated_full_argmax",
    "tests/inference/test_generate.py::test_sampling_config_rejects_bad_values",
}
# One bad-input call per command (its first row in the table of test_bad_input_fuzz.py: `bench` and `eval` by
# subcommand): exit 2, one error line, nothing changed.
FUZZ = "tests/test_bad_input_fuzz.py::test_bad_input_is_one_line_and_changes_nothing"

# Files whose clocks a training neighbour would skew: they run after the parallel pass, in a pass of their own on two
# workers (`make test`), the Ray cluster's file on one and the short timed files on the other. The gpu-check steps
# are killed at time limits and one kill is timed against the clock; a pool's driver killed under running jobs must
# leave no worker alive 5 s later; the Ray cluster's processes (GCS, two raylets, a worker per job) answer health
# checks and a node is removed mid-run. Beside each other they are safe: the timed files' processes sleep or wait
# while they are timed, and the one local Ray instance among them is started apart from the cluster (RAY_ADDRESS=local,
# test_no_orphans.py). Tests that start process pools, torchrun or Chromium, or kill a process with SIGKILL at a point
# the test waits for (a journal's line count, a checkpoint), time nothing against the wall and run in the parallel
# pass: there they overlap the rest (measured: 106 s alone, 142 s of CPU).
SERIAL_FILES = {
    "tests/gpucheck/test_gpu_check.py",  # steps under time limits, and a kill timed against the clock
    "tests/jobs/test_no_orphans.py",  # a pool's driver killed (SIGKILL, SIGTERM): no worker alive 5 s later
    "tests/jobs/test_ray_cluster.py",  # a two-node Ray cluster on this machine, a node removed mid-run
}
SERIAL_TESTS: set[str] = set()

# Both passes hand out whole files (`--dist loadfile`) in this order (`--no-loadscope-reorder`; xdist's own
# order is by the number of tests, which put the long one-test files last, alone at the end): the longest first, so
# that the short ones fill in around them. Each file's seconds in one parallel pass on 2 idle cores (2026-12-06, an
# AVX-512 machine, `--durations=0` summed per file); the files under 5 s follow in collection order.
LONG_FILES = (
    "tests/jobs/test_ray_cluster.py",  # the serial pass's longest file, 60-84 s (the other two: 30-60 s together)
    "tests/model/test_triton_aot.py",  # 75 s with an empty Triton cache, a fresh machine's (10 s warm: both checks in
    #                                     one process, 2026-12-07; 18 s before)
    "tests/train/test_distributed.py",  # 49 s (51 s before its ranks ran without torchrun's launcher)
    "tests/gpucheck/test_gpu_check_dry.py",  # 38 s (47 s with the tests step's 2 shards; 46 -> 37 s CPU with one
    #                                           OpenMP thread per step, 2026-12-07)
    "tests/model/test_triton_diff.py",  # 33 s
    "tests/lmsweep/test_diagnostic.py",  # 32 s
    "tests/lmsweep/test_resume_and_cli.py",  # 31 s
    "tests/interop/test_smollm2.py",  # 30 s
    "tests/test_readme_commands.py",  # 28 s
    "tests/retrieval/test_protocol4.py",  # 16 s (21 s before 2026-12-06's cut)
    "tests/model/test_layer.py",  # 17 s
    "tests/test_device_placement.py",  # 17 s
    "tests/test_lean_install.py",  # 16 s
    "tests/eval/test_report_lmsweep.py",  # 16 s
    "tests/lmsweep/test_rounding_scope.py",  # 13 s
    "tests/retrieval/test_journal_resume.py",  # 13 s
    "tests/jobs/test_runner.py",  # 12 s
    "tests/eval/test_report.py",  # 12 s
    "tests/retrieval/test_retrieval_diagnostic.py",  # 11 s
    "tests/test_bad_input_fuzz.py",  # 11 s
    "tests/retrieval/test_end_to_end.py",  # 9 s
    "tests/train/test_multinode.py",  # 9 s
    "tests/model/test_layer_conventions.py",  # 9 s
    "tests/lmsweep/test_committed_results.py",  # 9 s
    "tests/train/test_fault_injection.py",  # 8 s
    "tests/interop/test_remote_code.py",  # 7 s
    "tests/model/test_compile.py",  # 7 s
    "tests/bench/test_bench_shape.py",  # 7 s
    "tests/test_architecture.py",  # 6 s
    "tests/test_fourth_variant.py",  # 6 s
    "tests/eval/test_report_retrieval.py",  # 6 s
    "tests/test_examples.py",  # 7 s (22 s before its runs moved into the pytest process)
)


def _files_of(marker: str) -> set[str]:
    if marker == "fast":
        return FAST_FILES | {t.split("::")[0] for t in (*FAST_TESTS, FUZZ)}
    return SERIAL_FILES | {t.split("::")[0] for t in SERIAL_TESTS}


def pytest_ignore_collect(collection_path, config):
    """``-m fast`` or ``-m serial`` alone does not import the test files that hold none of its tests (collecting
    every file takes longer than the fast tests run); ``-m "not serial"`` does not import the serial files, whose
    every test it would deselect (Ray's import, in each worker)."""
    marker = config.option.markexpr
    if marker not in ("fast", "serial", "not serial") or collection_path.suffix != ".py" or \
            not collection_path.name.startswith("test_"):
        return None
    path = collection_path.relative_to(config.rootpath).as_posix()
    if marker == "not serial":
        return True if path in SERIAL_FILES else None
    return True if path not in _files_of(marker) else None


def _fuzz_command(argv: list[str]) -> tuple[str, ...]:
    return tuple(argv[:2]) if argv[0] in ("bench", "eval") else (argv[0],)


def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    rank = {path: i for i, path in enumerate(LONG_FILES)}
    items[:] = sorted(items, key=lambda item: rank.get(item.path.relative_to(root).as_posix()
                                                       if item.path.is_relative_to(root) else "", len(rank)))
    seen_commands: set[tuple[str, ...]] = set()
    for item in items:
        path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else str(item.path)
        test = f"{path}::{item.originalname}"
        if path in SERIAL_FILES or test in SERIAL_TESTS:
            item.add_marker(pytest.mark.serial)
        if path in FAST_FILES or test in FAST_TESTS:
            item.add_marker(pytest.mark.fast)
        elif test == FUZZ and hasattr(item, "callspec"):
            command = _fuzz_command(item.callspec.params["argv"])
            if command not in seen_commands:
                seen_commands.add(command)
                item.add_marker(pytest.mark.fast)


def pytest_configure(config):
    """Under pytest-xdist, each worker gets its own transformers remote-code module cache: two workers loading the
    same remote code at once would otherwise write the same files."""
    import os
    import tempfile

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and "HF_MODULES_CACHE" not in os.environ:
        os.environ["HF_MODULES_CACHE"] = config._hf_modules_cache = tempfile.mkdtemp(prefix=f"hf-modules-{worker}-")


def pytest_unconfigure(config):
    import shutil

    if getattr(config, "_hf_modules_cache", None):
        shutil.rmtree(config._hf_modules_cache, ignore_errors=True)
