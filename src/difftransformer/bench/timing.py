"""Small timing helpers shared by the benchmarks: warm-up, then the median of repeated runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time in seconds of ``fn()`` after ``warmup`` untimed calls (CUDA-synchronised when used)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired_times(fns: Mapping[str, Callable[[], object]], repeats: int = 5, warmup: int = 1) -> dict[str, list[float]]:
    """Wall times of several functions measured round-robin: repeat ``i`` runs every function once, in turn.

    Ratios taken within one round (``times[x][i] / times[ref][i]``) cancel slow drifts of machine load, which
    sequential measurements (all of A, then all of B) do not.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return times


def median_ratio(times: dict[str, list[float]], name: str, ref: str) -> float:
    """Median over rounds of ``times[name][i] / times[ref][i]`` (see :func:`paired_times`)."""
    return statistics.median(a / b for a, b in zip(times[name], times[ref]))
