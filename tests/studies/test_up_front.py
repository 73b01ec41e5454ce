"""Issue 57 item 2: every input a long command uses later is checked before the first job starts or any file is
written. Each case is one class of bad input that the commands used to find only after work had started (jobs run,
OUT made, data prepared) or named in an OS error; here no worker may start (a local job would fail the test), OUT
is not created, and the refusal is one line naming the flag."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from difftransformer.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY_KV = ["--d-model", "16", "--n-layers", "1", "--steps", "3", "--batch", "4", "--seeds", "2", "--lr-grid", "2e-3",
           "--lr-widen", "0", "--eval-contexts", "4", "--train-pairs", "8,10", "--train-context", "40,48",
           "--queries", "2", "--variants", "baseline,diff_v2", "--workers", "1", "--no-progress"]
TINY_LM = ["--preset", "tiny", "--widths", "16,32", "--steps", "4", "--warmup-steps", "1", "--batch", "2",
           "--seq-len", "32", "--seeds", "2", "--lr-grid", "4e-3", "--lr-widen", "0", "--eval-every", "2",
           "--variants", "baseline,diff_v2", "--workers", "1", "--no-progress"]


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Path:
    """A workspace with a file where a directory is wanted, and studies' journals without their finished results;
    and no local job can run."""
    from difftransformer.jobs import local

    def no_jobs(*a, **k):
        raise AssertionError("a job started before the bad input was refused")

    monkeypatch.setattr(local.LocalPool, "__init__", no_jobs)
    monkeypatch.setattr(local.Inline, "__init__", no_jobs)
    monkeypatch.delenv("DIFFTRANSFORMER_DEBUG", raising=False)
    (tmp_path / "afile").write_text("x")
    for study, journal in (("lm-sweep-v2", "lm-jobs.jsonl"), ("retrieval-v3", "jobs.jsonl")):
        (tmp_path / study).mkdir()  # the journal alone: the study was stopped before its results were written
        shutil.copy(ROOT / "docs" / "results" / study / journal, tmp_path / study / journal)
    return tmp_path


CASES = [
    # an --out that is a file, or lies under one
    (["retrieval", "--out", "{t}/afile", *TINY_KV], "--out {t}/afile: it is a file, not a directory"),
    (["retrieval", "--out", "{t}/afile/sub", *TINY_KV], "--out {t}/afile/sub: {t}/afile is a file"),
    (["retrieval", "--out", "{t}/afile", "--sweep-width", "16,32", *TINY_KV], "--out {t}/afile: it is a file"),
    (["lm-sweep", "--out", "{t}/afile", *TINY_LM], "--out {t}/afile: it is a file, not a directory"),
    (["lm-sweep", "--out", "{t}/afile/sub", "--diagnostic", "v1", "--reference",
      str(ROOT / "docs" / "results" / "lm-sweep-v2")], "{t}/afile is a file"),
    # a later stage's code path: the benchmark's rounding check under the code path the benchmark itself runs
    (["retrieval", "--out", "{t}/o", "--rounding-check", "machine", *TINY_KV],
     "--rounding-check machine: the benchmark runs that CPU code path itself"),
    # a preset that does not exist (it used to be named --config, after OUT was made)
    (["lm-sweep", "--out", "{t}/o", *TINY_LM, "--preset", "nope"], "--preset nope: neither a file nor a preset"),
    (["lm-sweep", "--out", "{t}/o", *TINY_LM, "--preset", "{t}/none.toml"], "--preset {t}/none.toml: no such file"),
    # a --reference that is not a finished study: its journal without its results
    (["lm-sweep", "--out", "{t}/o", "--diagnostic", "v1", "--reference", "{t}/lm-sweep-v2", "--workers", "1"],
     "--reference {t}/lm-sweep-v2: holds no sweep.json"),
    (["lm-sweep", "--out", "{t}/o", "--diagnostic", "v2", "--reference", "{t}/lm-sweep-v2", "--workers", "1"],
     "--reference {t}/lm-sweep-v2: holds no sweep.json"),
    (["retrieval", "--out", "{t}/o", "--diagnostic", "--reference", "{t}/retrieval-v3", "--workers", "1"],
     "--reference {t}/retrieval-v3: holds no results.json"),
]


@pytest.mark.parametrize("argv, text", CASES, ids=[" ".join(a[:1] + [x for x in a if x.startswith("{t}")][:1])
                                                   + f" {i}" for i, (a, _) in enumerate(CASES)])
def test_bad_input_is_refused_before_any_job_or_file(ws, capsys, argv, text):
    argv = [a.replace("{t}", str(ws)) for a in argv]
    before = sorted(p.name for p in ws.iterdir())
    capsys.readouterr()
    assert main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"difftransformer {argv[0]}: error: "), out.err
    assert text.replace("{t}", str(ws)) in lines[0], lines[0]
    assert "Traceback" not in out.err + out.out
    assert sorted(p.name for p in ws.iterdir()) == before  # no OUT, nothing written
    assert (ws / "afile").read_text() == "x"


def test_demo_refuses_a_run_to_reuse_of_other_options_before_its_retrieval_stage(tmp_path, capsys, monkeypatch):
    """A complete language-model run in OUT trained with other options (here another preset) was refused when the
    demo reached its language models, after the retrieval benchmark (21 minutes); now before it."""
    import difftransformer.demo as demo
    from difftransformer.train.config import load_config
    from difftransformer.train.trainer import train

    out = tmp_path / "d"
    train(load_config("tiny", {"data": {"max_chars": 30000, "prepared_dir": str(out / "data")},
                               "train": {"steps": 2, "eval_every": 2}, "checkpoint": {"every": 2},
                               "log": {"tensorboard": False}}), out / "baseline", progress=False)

    def no_benchmark(*a, **k):
        raise AssertionError("the retrieval benchmark started before the bad input was refused")

    monkeypatch.setattr(demo, "retrieval_benchmark", no_benchmark)
    monkeypatch.delenv("DIFFTRANSFORMER_DEBUG", raising=False)
    capsys.readouterr()
    assert main(["demo", "--config", "demo", "--quick", "--steps", "2", "--no-report", "--no-progress",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{out}/baseline was trained with other model or data options" in err[0], err
    assert not (out / "retrieval").exists()
