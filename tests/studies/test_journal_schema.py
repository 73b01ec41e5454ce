"""Issue 56 part 1: the job journals' records have one written schema per study (``retrieval/benchmark_schema.py``,
``lmsweep/sweep_schema.py``: a retrieval job's ``RetrievalRun``, a diagnostic arm's ``RetrievalArmRun``, a language-
model sweep job's ``LmSweepRun``, its diagnostics' ``LmArmRun``), which every reader of a journal applies through
``jobs.Journal``/``read_journal``'s ``check``: a record of another shape is one line naming the file, the line and
the field, before any job runs."""

from __future__ import annotations

import argparse
import json
import shutil
import typing
from pathlib import Path

import pytest

from difftransformer.cli import main
from difftransformer.jobs import Journal, read_journal
from difftransformer.retrieval.schema import V4Run, validate_v4_run
from difftransformer.lmsweep import sweep_schema as lm
from difftransformer.retrieval import benchmark_schema as kv

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
COMMITTED = sorted(RESULTS.rglob("*.jsonl"))
# the header's "benchmark" (a study's journal names its kind there) -> the schema its records' results take
SCHEMAS = {"kv_retrieval benchmark": kv.RetrievalRun, "kv_retrieval width sweep": kv.RetrievalRun,
           "retrieval diagnostic": kv.RetrievalArmRun, "retrieval longer training": kv.RetrievalArmRun,
           "language-model sweep": lm.LmSweepRun, "language-model longer training": lm.LmArmRun,
           "DIFF V1 diagnostic": lm.LmArmRun, "DIFF V2 diagnostic": lm.LmArmRun,
           "retrieval mechanism arms": kv.RetrievalArmRun,
           "retrieval mechanism arms, longer": kv.RetrievalArmRun,
           "language-model mechanism arms": lm.LmArmRun, "retrieval protocol 4": V4Run}
# journals committed while their study runs (each resumes from its committed journal): at least one record
IN_PROGRESS: set[str] = set()  # none since 2026-12-07 (protocol 4's rounding check finished)
# finished journals of fewer than 20 jobs, each with its whole count
SMALL: dict[str, int] = {"lm-mechanism/rounding-avx2/lm-mechanism-jobs.jsonl": 15}  # finished 2026-12-02
CHECKS = {kv.RetrievalRun: kv.validate_retrieval_run, kv.RetrievalArmRun:
          kv.validate_retrieval_arm_run, lm.LmSweepRun: lm.validate_lm_run,
          lm.LmArmRun: lm.validate_lm_arm_run, V4Run: validate_v4_run}
TINY_KV = ["--d-model", "16", "--n-layers", "1", "--steps", "3", "--batch", "4", "--seeds", "2", "--lr-grid", "2e-3",
           "--lr-widen", "0", "--eval-contexts", "4", "--train-pairs", "8,10", "--train-context", "40,48",
           "--queries", "2", "--variants", "baseline,diff_v2", "--workers", "1", "--no-progress"]


def _schema(header: dict) -> type:
    return SCHEMAS[header["benchmark"].removesuffix(" rounding check")]


def test_every_committed_journal_holds_its_studys_schema_and_nothing_else():
    # the sweeps, the benchmark, the diagnostics, their rounding checks, the re-readings, the mechanism arms
    assert len(COMMITTED) == 19
    for path in COMMITTED:
        header = json.loads(path.read_text().splitlines()[0])["journal"]
        schema = _schema(header)
        _, records = read_journal(path, CHECKS[schema])  # the readers' own call: raises on the first bad record
        rel = path.relative_to(RESULTS).as_posix()
        assert len(records) >= (1 if rel in IN_PROGRESS else SMALL.get(rel, 20)), path
        fields = set(typing.get_type_hints(schema))
        for rec in records.values():  # the schema is the whole record: no field the writer adds goes unnamed
            assert set(rec["result"]) <= fields, (path, set(rec["result"]) - fields)


def _damaged(source: Path, dest: Path, line: int, change) -> Path:
    """``source`` with the result of record ``line`` (from 1: the header is line 1) changed by ``change``."""
    lines = source.read_text().splitlines(keepends=True)
    rec = json.loads(lines[line - 1])
    change(rec["result"])
    lines[line - 1] = json.dumps(rec, sort_keys=True) + "\n"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(lines))
    return dest


def _wrong_type(r: dict) -> None:
    r["val_loss"] = str(r["val_loss"])


@pytest.fixture
def no_jobs(monkeypatch):
    """No local job may start: a refusal must come before any."""
    from difftransformer.jobs import local

    def refuse(*a, **k):
        raise AssertionError("a job started before the bad journal was refused")

    monkeypatch.setattr(local.LocalPool, "__init__", refuse)
    monkeypatch.setattr(local.Inline, "__init__", refuse)
    monkeypatch.delenv("DIFFTRANSFORMER_DEBUG", raising=False)


def _refused(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"difftransformer {argv[0]}: error: "), out.err
    assert "Traceback" not in out.err + out.out
    return lines[0]


def test_reuse_jobs_refuses_a_record_of_another_shape_before_any_job(tmp_path, capsys, no_jobs):
    bad = _damaged(RESULTS / "retrieval-v3" / "jobs.jsonl", tmp_path / "bad" / "jobs.jsonl", 4, _wrong_type)
    line = _refused(["retrieval", "--out", str(tmp_path / "s"), "--sweep-width", "16,24", "--reuse-jobs", str(bad),
                     *TINY_KV], capsys)
    assert f"--reuse-jobs: {bad}, line 4, result: val_loss is a JSON string, not a number" in line
    assert not (tmp_path / "s" / "sweep-jobs.jsonl").exists()  # nothing copied, nothing run


def test_a_resumed_run_refuses_a_record_of_another_shape_before_any_job(tmp_path, capsys, no_jobs):
    from difftransformer.retrieval import cli as rcli
    from difftransformer.retrieval.benchmark import JOURNAL, journal_header
    out = tmp_path / "o"
    p = argparse.ArgumentParser()
    rcli.add_arguments(p)
    cfg = rcli.config_from_args(p.parse_args(["--out", str(out), *TINY_KV]))
    committed = (RESULTS / "retrieval-v3" / "jobs.jsonl").read_text().splitlines(keepends=True)
    out.mkdir()
    # this command's header (so the journal is this run's), two finished jobs; the second lacks its val_loss
    (out / JOURNAL).write_text(json.dumps({"journal": {**journal_header(cfg), "quick": False}}) + "\n"
                               + "".join(committed[1:3]))
    _damaged(out / JOURNAL, out / JOURNAL, 3, lambda r: r.pop("val_loss"))
    before = (out / JOURNAL).read_bytes()
    line = _refused(["retrieval", "--out", str(out), *TINY_KV], capsys)
    assert f"{out / JOURNAL}, line 3, result: it lacks \"val_loss\"" in line and "delete the file" in line
    assert (out / JOURNAL).read_bytes() == before and sorted(p.name for p in out.iterdir()) == [JOURNAL]


def test_a_language_model_reference_of_another_shape_is_refused_in_one_line(tmp_path, capsys, no_jobs):
    ref = tmp_path / "ref"
    shutil.copytree(RESULTS / "lm-sweep-v2", ref)
    _damaged(ref / "lm-jobs.jsonl", ref / "lm-jobs.jsonl", 7, lambda r: r["curve"].update(steps="all"))
    line = _refused(["lm-sweep", "--out", str(tmp_path / "o"), "--diagnostic", "v1", "--reference", str(ref),
                     "--workers", "1"], capsys)
    assert f"--reference {ref}: {ref / 'lm-jobs.jsonl'}, line 7, result: curve.steps is a JSON string, not a list" \
        in line
    assert not (tmp_path / "o").exists()


def test_every_reader_and_the_writer_apply_the_check(tmp_path):
    """Journal (resume), read_journal (the readers), reuse_from (the other journal, nothing copied) and append (the
    writer's side: a result the readers would refuse is never written)."""
    from difftransformer.lmsweep.rounding import read_journal as read_sweep
    src = RESULTS / "lm-sweep-v2" / "lm-jobs.jsonl"
    bad = _damaged(src, tmp_path / "bad" / "lm-jobs.jsonl", 9, lambda r: r.update(diverged="no"))
    header = json.loads(src.read_text().splitlines()[0])["journal"]
    where = f"{bad}, line 9, result: diverged is a JSON string, not a boolean"
    for read in (lambda: Journal(bad, header, lm.validate_lm_run), lambda: read_sweep(bad.parent),
                 lambda: read_journal(bad, lm.validate_lm_run)):
        with pytest.raises(ValueError, match="^" + where.replace("(", r"\(")):
            read()
    fresh = Journal(tmp_path / "new" / "lm-jobs.jsonl", header, lm.validate_lm_run)
    with pytest.raises(ValueError, match=where):
        fresh.reuse_from(bad)
    assert not fresh.path.exists()
    rec = json.loads(src.read_text().splitlines()[1])
    with pytest.raises(ValueError, match=r"\(as written\), job .*, result: it lacks \"floor\""):
        fresh.append(rec["key"], rec["job"], {k: v for k, v in rec["result"].items() if k != "floor"})
    assert not fresh.path.exists()
    assert fresh.reuse_from(src) == 160 and len(Journal(fresh.path, header, lm.validate_lm_run).records) == 160
