"""Small timing helpers shared by the benchmarks: warm-up, then the median of repeated runs."""

from __future__ import annotations

import statistics
import time
from typing import Callable

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
