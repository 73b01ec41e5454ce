"""The head-wise norm's mechanism arms (retrieval/LONGER.md, the addition of 17:10): the committed journal read back
(every record's key is the one the study computes for its job, from the committed diagnostic's configuration), its
rebuild equal to the committed ``mechanism.json`` once the journal is complete, and the rebuild's refusal of another
study's journal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from difftransformer.retrieval import mechanism as M
from difftransformer.retrieval.protocol import Job

ROOT = Path(__file__).resolve().parents[2]
DIAG = ROOT / "docs" / "results" / "retrieval-diagnostic"
OUT = ROOT / "docs" / "results" / "retrieval-mechanism"


def test_the_committed_journal_rebuilds():
    first = json.loads((DIAG / "diagnostic.json").read_text())
    res = M.rebuild(DIAG, OUT)
    key = M._key(first["config"], "cpu")
    lines = (OUT / M.JOURNAL).read_text().splitlines()[1:]
    assert lines, "the journal holds no job"
    for line in lines:
        rec = json.loads(line)
        assert rec["key"] == key(Job(*rec["job"]))
        assert rec["job"][0] in M.ARMS
    done, total = res["complete"]
    assert done == len(lines) and total >= 3 * 3 * 12  # three arms, a grid of at least three lrs, 12 seeds
    if done == total:  # finished: the committed results are this rebuild's reading, number for number
        committed = json.loads((OUT / M.RESULTS).read_text())
        assert set(committed["rows"]) == set(M.ARMS)
        assert json.loads(json.dumps(res["rows"])) == committed["rows"]
    for arm, row in res["rows"].items():
        assert row["C_against"] == M.ARMS[arm][2] and len(row["accuracy"]) == 12


def test_rebuild_refuses_another_studys_journal(tmp_path):
    shutil.copytree(OUT, tmp_path / "m")
    j = tmp_path / "m" / M.JOURNAL
    lines = j.read_text().splitlines()
    head = json.loads(lines[0])
    head["journal"]["benchmark"] = "retrieval longer training"
    j.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    with pytest.raises(ValueError):
        M.rebuild(DIAG, tmp_path / "m")
