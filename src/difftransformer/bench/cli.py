"""`difftransformer bench <what>`: scripts that print measured ratios (ours vs the baseline in the same run)."""

from __future__ import annotations

import argparse
import importlib

# Each module defines ``register(subparsers)`` adding one `bench` subcommand.
BENCH_MODULES: tuple[str, ...] = (
    "difftransformer.bench.attention",
    "difftransformer.bench.train",
    "difftransformer.bench.decode",
)


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks that print speed/memory ratios vs the baseline",
                       description=__doc__)
    bsub = p.add_subparsers(dest="bench", metavar="WHAT")
    bsub.required = True
    for name in BENCH_MODULES:
        importlib.import_module(name).register(bsub)
