"""A full disk or a read-only mount at each write: one error line naming the file, nothing half-written, and the
run recovers to the same result once space is back.

``DIFFTRANSFORMER_FAULT_AT=k:ENOSPC`` (or ``k:EROFS``) raises that OSError at the k-th write, as the kernel would
(``fileio.fault_point``). Driven in-process through ``cli.main``, so the error line is the user's.
"""

from __future__ import annotations

import os

import pytest
import torch

from difftransformer import fileio, rundir
from difftransformer.cli import main

from train_helpers import weights

ARGS = ["--config", "tiny", "--no-progress", "--log.tensorboard", "false", "--data.max_chars", "30000",
        "--train.steps", "2", "--train.eval_every", "2", "--train.warmup_steps", "1", "--checkpoint.every", "1",
        "--checkpoint.keep_last", "2", "--log.every", "1"]


def _train(out, *extra, fault=None, monkeypatch=None):
    if fault:
        monkeypatch.setenv(fileio.FAULT_ENV, fault)
    else:
        monkeypatch.delenv(fileio.FAULT_ENV, raising=False)
    monkeypatch.setattr(fileio, "_writes", 0)
    return main(["train", *ARGS, "--out", str(out), *extra])


def test_a_full_disk_at_every_write_is_one_line_then_recovers(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DIFFTRANSFORMER_DEBUG", raising=False)
    assert _train(tmp_path / "ref", monkeypatch=monkeypatch) == 0
    ref = weights(rundir.step_dir(tmp_path / "ref", 2))
    seen = []
    for k in range(1, 40):
        d = tmp_path / f"full-{k}"
        capsys.readouterr()
        rc = _train(d, fault=f"{k}:ENOSPC", monkeypatch=monkeypatch)
        if rc == 0:  # fewer than k writes: every one has failed once
            break
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, (k, err)
        assert err[0].startswith("difftransformer train: error: [Errno 28] No space left on device: "), err
        assert str(d) in err[0], err  # names the file it could not write
        seen.append(err[0].split(str(d), 1)[1])
        assert not list(d.rglob(".*.tmp-*")), "a temporary file was left behind"
        # space is back: the same command (before run_config.json exists) or --resume completes the run
        resumable = rundir.run_config_path(d).is_file()
        assert _train(d, *(["--resume"] if resumable else []), monkeypatch=monkeypatch) == 0, k
        got = weights(rundir.step_dir(d, 2))
        assert got.keys() == ref.keys() and all(torch.equal(got[n], ref[n]) for n in ref), k
    else:
        pytest.fail("the run never finished without a fault")
    # every kind of file a run writes failed once: tokenizer, shards, meta, run config, metrics, checkpoints
    names = " ".join(seen)
    for part in ("tokenizer.json", "train.bin", "meta.json", "run_config.json", "metrics.jsonl", "step_00000001"):
        assert part in names, (part, seen)


@pytest.mark.parametrize("cmd", ["convert", "report", "eval", "generate-dir"])
def test_a_read_only_output_is_one_line(tmp_path, capsys, monkeypatch, cmd):
    monkeypatch.delenv("DIFFTRANSFORMER_DEBUG", raising=False)
    run = tmp_path / "run"
    assert _train(run, monkeypatch=monkeypatch) == 0
    out = tmp_path / "out"
    argv = {"convert": ["convert", "--to-hf", str(run), "--out", str(out)],
            "report": ["report", str(run), "--no-progress", "--out", str(out)],
            "eval": ["eval", "outliers", "--run", str(run), "--out", str(out / "o.json")],
            "generate-dir": ["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(out)]}[cmd]
    if cmd == "generate-dir":  # a round trip's second half: our format written from a Hugging Face directory
        monkeypatch.delenv(fileio.FAULT_ENV, raising=False)
        assert main(["convert", "--to-hf", str(run), "--out", str(tmp_path / "hf")]) == 0
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    monkeypatch.setenv(fileio.FAULT_ENV, "1:EROFS")
    monkeypatch.setattr(fileio, "_writes", 0)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[Errno 30] Read-only file system: " in err[0] and str(out) in err[0], err
    assert err[0].startswith(f"difftransformer {argv[0]}: error: "), err
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before
    # nothing half-written: the page (or model, or JSON) is absent, not cut. The report's figures are plain PNGs
    # written before its first atomic file, so on a real read-only mount they would be the first write to fail.
    written = {p.name for p in out.rglob("*") if p.is_file()} if out.exists() else set()
    assert not written - ({p.name for p in out.glob("*.png")} if cmd == "report" else set()), written
    assert not any(n.startswith(".") for n in written), written


def test_an_unknown_fault_name_is_refused(monkeypatch):
    monkeypatch.setenv(fileio.FAULT_ENV, "1:ENOTANERRNO")
    monkeypatch.setattr(fileio, "_writes", 0)
    with pytest.raises(ValueError, match="errno name"):
        fileio.fault_point()
    assert os.environ[fileio.FAULT_ENV] == "1:ENOTANERRNO"
