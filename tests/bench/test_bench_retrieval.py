"""`bench retrieval`: one short round prints every row and the ratios it promises; bad counts are refused."""

from __future__ import annotations

import functools
import re

import pytest

from difftransformer.cli import main


def test_bench_retrieval_prints_paths_and_ratios(capsys, monkeypatch):
    """Every job evaluated on 8 contexts per condition, not the benchmark's 128: the evaluation (timed whole) was
    nearly all of this test's time, and the rows and ratios printed do not depend on its size."""
    from difftransformer.retrieval import config

    small = functools.partial(config.RetrievalConfig, eval_contexts=8)
    monkeypatch.setattr(config, "RetrievalConfig", small)  # what the bench builds its jobs' config from
    assert main(["bench", "retrieval", "--steps", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for v in ("baseline", "diff_v1", "diff_v2"):
        assert re.search(rf"^{v}\s+v2 path\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+x$", out, re.M)
        assert re.search(rf"^{v}\s+v3 path\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+x$", out, re.M)
    assert re.search(r"^baseline\s+v3 path\s+.*\s1\.00x$", out, re.M)  # the baseline against itself
    assert re.search(r"jobs per minute per worker .* v2 path [\d.]+, v3 path [\d.]+: [\d.]+x", out)
    assert "# load average (1 min) before:" in out and "# load average (1 min) after:" in out


@pytest.mark.parametrize("flag", ["--steps", "--rounds"])
def test_bench_retrieval_refuses_zero(flag, capsys):
    assert main(["bench", "retrieval", flag, "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0]
