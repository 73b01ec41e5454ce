"""The `difftransformer` command line. Each subcommand lives beside the code it drives and registers itself
through a ``register(subparsers)`` function; ``COMMANDS`` below imports them all, so the import graph shows every
command. This file only dispatches and turns user errors into one line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Optional

from . import demo, extras
from .bench import cli as bench_cli
from .eval import cli as eval_cli
from .eval import lm_eval_cli
from .inference import cli as inference_cli
from .interop import cli as interop_cli
from .log import setup_cli_logging
from .report import cli as report_cli
from .report.studies import STUDIES
from .train import cli as train_cli

# The subcommands, in the order `--help` lists them; each registered study's command (``report/studies.py``) after
# them.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    demo.register,
    train_cli.register,
    bench_cli.register,
    inference_cli.register,
    interop_cli.register,
    lm_eval_cli.register,
    eval_cli.register,
    report_cli.register_report,
)

# Errors that mean "the input was wrong": one line, exit code 2. Anything else is a bug and keeps its traceback
# (TypeError included: the library raises it for a wrong Python type passed by code, never for a user's input).
# OSError covers a missing or read-only path, a full disk and a run directory locked by another writer.
# MissingExtra: an optional package the command needs is not installed (the line names the pip install).
USER_ERRORS = (ValueError, OSError, extras.MissingExtra)


class _Parser(argparse.ArgumentParser):
    """argparse with the house's error form: one ``difftransformer COMMAND: error:`` line, exit code 2 (no usage
    block; ``--help`` has it). Subcommand parsers inherit the class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _deepest_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub)command parser that ``argv`` ends in: ``difftransformer eval needles ...`` -> the needles one."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for i, tok in enumerate(argv):
                if tok in action.choices:
                    return _deepest_parser(action.choices[tok], argv[i + 1:])
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="difftransformer", allow_abbrev=False,
        description="Differential Transformer (DIFF V1, DIFF V2) and a parameter-matched baseline: "
                    "train, evaluate, generate, convert, report.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"difftransformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for register in (*COMMANDS, *(s.register for s in STUDIES)):
        register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    setup_cli_logging()  # the package's log records as one stderr line each (difftransformer/log.py)
    if extra:  # named by the subcommand that refused them, not by the top-level parser
        _deepest_parser(parser, argv).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        rc = extras.call(args.func, args)  # an optional package missing anywhere: the extra to install
    except USER_ERRORS as e:
        if os.environ.get("DIFFTRANSFORMER_DEBUG"):
            raise
        if not getattr(e, "quiet", False):  # quiet: a refusal every rank makes alike, said by rank 0 only
            print(f"difftransformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"difftransformer {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
