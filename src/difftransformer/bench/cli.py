"""`difftransformer bench <what>`: scripts that print measured ratios (ours vs the baseline in the same run)."""

from __future__ import annotations

from . import attention, decode, kernels, layer, ops, pretrained, retrieval, train

# Each module defines ``register(subparsers)`` adding one `bench` subcommand, in this order in --help.
BENCH_MODULES = (attention, layer, train, ops, decode, pretrained, retrieval, kernels)


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks that print speed/memory ratios vs the baseline",
                       description=__doc__,
                       allow_abbrev=False)
    bsub = p.add_subparsers(dest="bench", metavar="WHAT")
    bsub.required = True
    for module in BENCH_MODULES:
        module.register(bsub)
