"""The `difftransformer` command line. Each subcommand lives beside the code it drives and registers itself
through a ``register(subparsers)`` function; this file only dispatches and turns user errors into one line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional, Sequence

# Modules that contribute subcommands, in the order `--help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "difftransformer.demo",
    "difftransformer.train.cli",
    "difftransformer.bench.cli",
    "difftransformer.inference.cli",
    "difftransformer.interop.cli",
    "difftransformer.eval.cli",
    "difftransformer.retrieval.cli",
)

# Errors that mean "the input was wrong": one line, exit code 2. Anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
               PermissionError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="difftransformer",
        description="Differential Transformer (DIFF V1, DIFF V2) and a parameter-matched baseline: "
                    "train, evaluate, generate, convert, report.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"difftransformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except USER_ERRORS as e:
        if os.environ.get("DIFFTRANSFORMER_DEBUG"):
            raise
        print(f"difftransformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"difftransformer {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
