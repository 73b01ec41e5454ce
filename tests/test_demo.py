"""`difftransformer demo` end to end on the tiny preset: three runs on shared tokens, the table, reuse on a rerun."""

from __future__ import annotations

import json

from difftransformer.cli import main


def test_demo_trains_three_variants_then_reuses_them(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "--config", "tiny", "--steps", "4", "--out", str(out), "--no-report", "--no-progress", "--no-retrieval"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    for kind in ("baseline", "diff_v1", "diff_v2"):
        cfg = json.loads((out / kind / "run_config.json").read_text())
        assert cfg["model"]["attention"] == kind and cfg["train"]["steps"] == 4
        assert (out / kind / "data" / "train.bin").is_file()
    # One tokenisation shared by the three runs: their shards are the same file (hard links).
    inodes = {(out / k / "data" / "train.bin").stat().st_ino for k in ("baseline", "diff_v1", "diff_v2")}
    assert len(inodes) == 1
    rows = [line.split() for line in first.splitlines() if line.split()[:1] in (["baseline"], ["diff_v1"], ["diff_v2"])]
    assert [r[0] for r in rows] == ["baseline", "diff_v1", "diff_v2"] and rows[0][2] == "1.000x"
    assert main(argv) == 0  # complete runs are reused, not retrained or refused
    again = capsys.readouterr().out
    assert again.count("reused") == 3
    # A complete run from other options (here another preset) is refused, not silently reported as this one.
    assert main(["demo", "--config", "demo", "--steps", "4", "--out", str(out), "--no-report", "--no-progress", "--no-retrieval"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other model or data options" in err[0]


def test_demo_bad_input_is_one_line(tmp_path, capsys):
    assert main(["demo", "--seeds", "0", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seeds" in err[0]
