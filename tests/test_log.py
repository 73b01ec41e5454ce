"""Messages go through logging: the CLI prints one line per record on stderr; as a library the package adds no
handler (information is silent, a warning reaches stderr through Python's last-resort handler)."""

from __future__ import annotations

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
