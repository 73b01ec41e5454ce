"""How the package speaks: ``logging`` for what it reports, ``warnings`` for a call the caller should change.

Every module logs to a child of the ``difftransformer`` logger (``logging.getLogger(__name__)``). As a library it
adds no handler: warnings reach stderr through Python's last-resort handler and information stays silent unless
the application configures logging. The CLI calls ``setup_cli_logging()``: one line per record on stderr,
``difftransformer: MESSAGE`` for information and ``difftransformer: warning: MESSAGE`` for warnings, written
through ``tqdm.write`` so that a progress bar on the terminal is not torn. ``warnings.warn`` is kept for advice
about code (a kernel that fell back to another path: ``kernels/launches.py``), so that tests and callers
can filter it or turn it into an error.

Progress bars are tqdm's, made by ``progress_bar``: on a terminal tqdm redraws the bar in place; where stderr is not
a terminal (``make demo > demo.log 2>&1``, a CI log, a job's captured stderr) every redraw would be one more
``\\r`` frame in the file, so there a bar writes one plain line at most every ``LINE_EVERY_S`` seconds and its last
state when it closes (``LineProgress``), and a transient bar (``leave=False``, erased on a terminal when done)
writes nothing.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional

from tqdm import tqdm

ROOT = "difftransformer"
LINE_EVERY_S = 30.0  # at most one progress line per bar this often in a log file


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


class _Discard:
    """Where a ``LineProgress`` sends tqdm's own terminal output (``\\r`` frames, the closing newline)."""

    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass


class LineProgress(tqdm):
    """A tqdm bar for a log file: its usual one-line text (tqdm's ``format_meter``) written as a line of its own at
    most every ``every_s`` seconds once something was done, and once more when it closes; no ``\\r``."""

    def __init__(self, *args: Any, every_s: float = LINE_EVERY_S, **kwargs: Any) -> None:
        self._out = kwargs.pop("file", None)  # None: the sys.stderr of the moment (a redirect or capture sees it)
        self._every_s, self._last_line = every_s, -float("inf")
        kwargs.update(file=_Discard(), dynamic_ncols=False, ascii=True,
                      mininterval=every_s, maxinterval=max(every_s, kwargs.get("maxinterval", 10.0)))
        super().__init__(*args, **kwargs)

    def display(self, msg: Optional[str] = None, pos: Optional[int] = None) -> bool:
        closing = self.disable  # tqdm.close() sets it before its last display
        if msg is not None or self.n == self.initial:  # a terminal's clear; nothing done yet
            return True
        now = self._time()
        if not closing and (now - self._last_line < self._every_s  # refresh() and set_postfix() come every step
                            or (self.total and self.n >= self.total)):  # the closing line says it
            return True
        self._last_line = now
        out = self._out or sys.stderr
        out.write(str(self) + "\n")
        out.flush()
        return True


def progress_bar(iterable: Any = None, **kwargs: Any) -> tqdm:
    """``tqdm(iterable, **kwargs)`` where the stream is a terminal; else a ``LineProgress``, or a disabled bar for a
    transient one (``leave=False``). Every progress bar of the package is made here."""
    stream = kwargs.get("file") or sys.stderr
    terminal = getattr(stream, "isatty", lambda: False)()
    if kwargs.get("disable") or terminal:
        return tqdm(iterable, **kwargs)
    if kwargs.get("leave", True) is False:
        return tqdm(iterable, **{**kwargs, "disable": True})
    return LineProgress(iterable, **kwargs)
