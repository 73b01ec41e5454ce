"""`difftransformer eval <analysis> --run RUN_DIR` (one JSON result per analysis) and `difftransformer report`.

Each analysis module defines ``HELP``, ``add_arguments(parser)`` and ``run_cli(args)``; the options every analysis
shares (``--run``, ``--out``, ``--seed``) are added here.
"""

from __future__ import annotations

import argparse
import importlib

# In the order of the paper's claims (SPEC.md); attnmap takes several runs.
ANALYSES: tuple[str, ...] = ("needles", "noise", "outliers", "quantized", "positions", "icl", "attnmap")
MULTI_RUN = ("attnmap",)


def _add_analysis(esub, name: str) -> None:
    mod = importlib.import_module(f"{__package__}.{name}")
    p = esub.add_parser(name, help=mod.HELP, description=mod.__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    if name in MULTI_RUN:
        p.add_argument("--run", action="append", required=True, metavar="RUN_DIR",
                       help="a run or model directory; repeat for several models (e.g. baseline, V1, V2)")
    else:
        p.add_argument("--run", required=True, metavar="RUN_DIR",
                       help="a run directory (its newest complete checkpoint) or a model directory")
    p.add_argument("--out", metavar="FILE", help="write the result here (JSON; attnmap: PNG) instead of only printing")
    p.add_argument("--seed", type=int, default=0, help="seed of the evaluation samples (not of the model)")
    mod.add_arguments(p)
    p.set_defaults(func=mod.run_cli)


def register(sub) -> None:
    p = sub.add_parser("eval", help="re-measure one of the paper's claims on a trained run (JSON results)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    esub = p.add_subparsers(dest="analysis", metavar="ANALYSIS")
    esub.required = True
    for name in ANALYSES:
        _add_analysis(esub, name)
    from . import report
    report.register(sub)
