"""gpu-check's ``tests`` step (``python -m difftransformer.gpucheck.gpu_tests``): the GPU test files as ``--shards``
pytest processes at once, each running every ``--shards``-th test of the files (round-robin in collection order), then
one count over all of them.

On a fresh GPU machine Triton's on-disk cache is empty and each test case compiles its own kernels (its dtype, head
width, tiles, padding): the whole files took 63 s on an H100 with the cache warm and did not finish in 75 s with it
cold (51 passed, 15 skipped of 178 cases). The compiles are single-threaded, so the shards run them on several CPUs
at once. Each shard is ``python -m pytest -q -p no:cacheprovider -p difftransformer.gpucheck.gpu_tests --durations N
FILES`` with ``DIFFTRANSFORMER_TEST_SHARD=K/N`` (this module is also the pytest plugin that keeps the shard's tests:
``pytest_collection_modifyitems``), its output in a file; when all have ended, each shard's output is printed,
then one ``# gpu-tests: {json}`` line (counts summed, the failed test ids, finished) and a pytest-style count line.
Stopped by a signal (the step's time limit), it prints the same from what each shard had printed so far (a
shard's progress characters), ``finished`` false. Its exit status is 1 where a test failed or a shard did not end
with pytest's status 0 or 5 (no tests).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

SHARD_ENV = "DIFFTRANSFORMER_TEST_SHARD"
PLUGIN = "difftransformer.gpucheck.gpu_tests"  # this module's import name (``__name__`` is "__main__" under -m)
LINE = "# gpu-tests: "


# ---------------------------------------------------------------------------------------------- the pytest plugin
def pytest_collection_modifyitems(config, items) -> None:
    """In a shard (``$DIFFTRANSFORMER_TEST_SHARD`` = "K/N"): keep items K, K + N, K + 2N, ... (deselect the rest)."""
    spec = os.environ.get(SHARD_ENV)
    if not spec:
        return
    k, n = (int(x) for x in spec.split("/"))
    keep = [item for i, item in enumerate(items) if i % n == k]
    drop = [item for i, item in enumerate(items) if i % n != k]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


# ---------------------------------------------------------------------------------------------- the runner
def shard_command(files: list[str], durations: int, python: str = sys.executable) -> list[str]:
    return [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN, f"--durations={durations}",
            *files]


def combine(texts: list[str], codes: list[Optional[int]]) -> dict[str, Any]:
    """One count over the shards' outputs (``gpu_readers.read_pytest`` of each): counts summed, failed ids, and
    finished where every shard ended (pytest's status 0, 1 or 5)."""
    from .gpu_readers import read_pytest

    total: dict[str, int] = {}
    failed: list[str] = []
    for text in texts:
        r = read_pytest(text)
        for k, v in r["counts"].items():
            if k != "deselected":
                total[k] = total.get(k, 0) + v
        failed += r["failed"]
    finished = all(c in (0, 1, 5) for c in codes)
    return {"counts": total, "failed": failed, "finished": finished, "shards": len(texts),
            "unfinished": [i for i, c in enumerate(codes) if c is None]}


def report(paths: list[Path], codes: list[Optional[int]], seconds: float) -> dict[str, Any]:
    """Print each shard's output, the ``# gpu-tests:`` line and a pytest-style count line; return the count."""
    texts = [p.read_text(errors="replace") if p.exists() else "" for p in paths]
    for i, (text, code) in enumerate(zip(texts, codes)):
        print(f"# shard {i}/{len(paths)}: " + ("did not end" if code is None else f"pytest exit status {code}"))
        print(text.rstrip(), flush=True)
    result = combine(texts, codes)
    print(LINE + json.dumps(result, sort_keys=True), flush=True)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(result["counts"].items()))
    if result["finished"]:
        print(f"{counts or 'no tests ran'} in {seconds:.2f}s ({len(paths)} shards)", flush=True)
    return result


def run(files: list[str], shards: int, durations: int) -> int:
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-tests-"))
    paths = [tmp / f"shard{i}.txt" for i in range(shards)]
    procs = []
    for i, path in enumerate(paths):
        with open(path, "w") as f:
            procs.append(subprocess.Popen(shard_command(files, durations), stdout=f, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL,
                                          env={**os.environ, SHARD_ENV: f"{i}/{shards}", "PYTHONUNBUFFERED": "1"}))

    def stopped(signum, _frame) -> None:  # the step's time limit: what the shards got to, then out
        codes = [p.poll() for p in procs]  # read first: a shard the signal ends now did not end by itself
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        report(paths, [c if c is not None and c >= 0 else None for c in codes], time.monotonic() - t0)
        sys.stdout.flush()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    while any(p.poll() is None for p in procs):  # polled, not p.wait(): the handler's poll() needs Popen's lock
        time.sleep(0.2)
    codes: list[Optional[int]] = [p.returncode for p in procs]
    result = report(paths, codes, time.monotonic() - t0)
    bad = result["counts"].get("failed", 0) or result["counts"].get("errors", 0) or not result["finished"]
    return 1 if bad else 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m difftransformer.gpucheck.gpu_tests", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("files", nargs="+", help="test files (or node ids)")
    p.add_argument("--shards", type=int, default=8, help="pytest processes at once (default 8)")
    p.add_argument("--durations", type=int, default=5, help="each shard's slowest tests to print (default 5)")
    args = p.parse_args(argv)
    if args.shards < 1 or args.durations < 0:
        print("gpu_tests: error: --shards must be >= 1 and --durations >= 0", file=sys.stderr)
        return 2
    return run(args.files, args.shards, args.durations)


if __name__ == "__main__":
    raise SystemExit(main())
