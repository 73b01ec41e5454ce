"""How the package speaks: ``logging`` for what it reports, ``warnings`` for a call the caller should change.

Every module logs to a child of the ``difftransformer`` logger (``logging.getLogger(__name__)``). As a library it
adds no handler: warnings reach stderr through Python's last-resort handler and information stays silent unless
the application configures logging. The CLI calls ``setup_cli_logging()``: one line per record on stderr,
``difftransformer: MESSAGE`` for information and ``difftransformer: warning: MESSAGE`` for warnings, written
through ``tqdm.write`` so that a progress bar on the terminal is not torn. ``warnings.warn`` is kept for advice
about code (a kernel that fell back to another path: ``model/attention/launches.py``), so that tests and callers
can filter it or turn it into an error.
"""

from __future__ import annotations

import logging
import sys

ROOT = "difftransformer"


class _StderrLine(logging.Handler):
    """One line per record on the ``sys.stderr`` of the moment (so capture by pytest or a redirect sees it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
            sys.stderr.flush()
        except Exception:  # a closed stream must not turn a message into a crash
            self.handleError(record)


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        return f"{ROOT}: {level}{record.getMessage()}"


def setup_cli_logging(level: int = logging.INFO) -> None:
    """The command line's handler on the package logger (added once; the level set each call)."""
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, _StderrLine) for h in logger.handlers):
        handler = _StderrLine()
        handler.setFormatter(_Format())
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # the CLI owns the process: no second copy through a root handler

