"""Messages go through logging: the CLI prints one line per record on stderr; as a library the package adds no
handler (information is silent, a warning reaches stderr through Python's last-resort handler)."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

from difftransformer.log import ROOT, setup_cli_logging


def test_cli_lines(capsys):
    setup_cli_logging()
    setup_cli_logging()  # twice: still one handler, one line per record
    log = logging.getLogger("difftransformer.some.module")
    log.info("resuming from x")
    log.warning("skipping checkpoint y")
    log.debug("not shown")
    err = capsys.readouterr().err
    assert err == "difftransformer: resuming from x\ndifftransformer: warning: skipping checkpoint y\n"
    assert len([h for h in logging.getLogger(ROOT).handlers if type(h).__name__ == "_StderrLine"]) == 1


def test_library_adds_no_handler():
    code = ("import logging, difftransformer.train.trainer, difftransformer.data.shards\n"
            "assert logging.getLogger('difftransformer').handlers == []\n"
            "log = logging.getLogger('difftransformer.train.trainer')\n"
            "log.info('quiet'); log.warning('loud')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "quiet" not in res.stderr and "loud" in res.stderr


class _Log(io.StringIO):
    """A stream that is not a terminal (a log file, a CI job's output)."""

    def isatty(self) -> bool:
        return False


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_file_is_lines_not_frames(monkeypatch):
    """Where the stream is not a terminal a bar writes whole lines, no '\\r' frames: one when the interval has passed
    (however often the caller refreshes), the last state at close; a transient bar writes nothing; on a terminal
    it stays tqdm's own bar."""
    from difftransformer import log

    clock = [0.0]
    monkeypatch.setattr("tqdm.std.time", lambda: clock[0])  # tqdm reads its clock through this name
    out = _Log()
    bar = log.progress_bar(total=100, desc="jobs", file=out, every_s=30.0)
    assert isinstance(bar, log.LineProgress)
    for i in range(100):
        clock[0] = i * 1.0  # one job a second: lines at the first job (0 s), 30 s, 60 s, 90 s, then the close
        bar.update(1)
        bar.refresh()
        bar.set_postfix(loss=1.0 / (i + 1))
    bar.close()
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n")
    assert len(lines) == 5, lines
    assert all(line.startswith("jobs:") for line in lines)
    assert "1/100" in lines[0] and "31/100" in lines[1] and "91/100" in lines[3] and "100/100" in lines[-1]
    quiet = _Log()
    for _ in log.progress_bar(range(50), desc="inner", file=quiet, leave=False):
        pass
    assert quiet.getvalue() == ""
    term = _Terminal()
    bar = log.progress_bar(total=3, desc="t", file=term)
    assert not isinstance(bar, log.LineProgress)
    bar.update(3)
    bar.close()
    assert "\r" in term.getvalue()


def test_nothing_done_writes_no_progress_line():
    from difftransformer import log

    out = _Log()
    log.progress_bar(total=0, desc="jobs", file=out).close()
    assert out.getvalue() == ""
