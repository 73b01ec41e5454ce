"""The study results' schema (each beside its study: ``retrieval/benchmark_schema.py``,
``lmsweep/sweep_schema.py``): every committed result file validates against its study's schema, and a file that
departs from it is refused by every command that takes a study's directory, in one line that names the field (exit
2), before any model is read."""

from __future__ import annotations

import copy
import json
import typing
from pathlib import Path

import pytest

from difftransformer.cli import main
from difftransformer.lmsweep.schema import read_sweep as read_lm_sweep
from difftransformer.retrieval.schema import read_results as read_retrieval
from difftransformer.rundir import files
from difftransformer.lmsweep.sweep_schema import LmSweepResults, validate_lm_sweep
from difftransformer.retrieval.benchmark_schema import POLICIES, Policy, RetrievalResults, validate_retrieval_results
from difftransformer.studies.schema import validate, validate_rounding

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"
RETRIEVAL = DOCS / "retrieval-v3"
SWEEPS = [DOCS / "lm-sweep-v2", DOCS / "lm-sweep-v2-avx2"]


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads((RETRIEVAL / files.RESULTS_NAME).read_text())


def test_every_committed_result_file_validates(committed):
    res = validate_retrieval_results(committed, str(RETRIEVAL))
    assert set(res["verdicts"]) == set(POLICIES)
    assert read_retrieval(RETRIEVAL, "--retrieval")["variants"].keys() == res["variants"].keys()
    for d in SWEEPS:
        assert read_lm_sweep(d, "--lm-sweep")["benchmark"] == "lm_sweep"
        validate_lm_sweep(json.loads((d / files.SWEEP_RESULTS_NAME).read_text()), str(d))
    validate_rounding(json.loads((DOCS / "lm-sweep-v2-avx2" / files.ROUNDING_NAME).read_text()), "x")


def test_policies_are_the_schemas():
    assert POLICIES == typing.get_args(Policy) == ("runs", "matched_runs", "no_failures")
    # a reader's key that the schema does not hold is a key mypy refuses: the schemas name what the readers read
    hints = typing.get_type_hints(RetrievalResults)
    assert {"config", "variants", "conditions", "verdicts"} <= set(hints)
    assert {"table", "verdict_rows", "timings"} <= set(typing.get_type_hints(LmSweepResults))


@pytest.mark.parametrize("change, message", [
    (lambda r: r["variants"]["diff_v1"]["runs"][3]["conditions"]["p48c48"].pop("accuracy"),
     'variants.diff_v1.runs[3].conditions.p48c48 lacks "accuracy"'),
    (lambda r: r.pop("variants"), 'it lacks "variants"'),
    (lambda r: r.update(chance="1/8"), "chance is a JSON string, not a number"),
    (lambda r: r["verdicts"].update(tuned=[]), "verdicts has the key 'tuned', not 'runs' or 'matched_runs'"),
    (lambda r: r["variants"]["baseline"]["lr_grid"][0].update(lr=None), "variants.baseline.lr_grid[0].lr is a JSON"),
    (lambda r: r["config"].pop("primary"), 'config lacks "primary"'),
])
def test_a_departure_is_named(committed, change, message):
    bad = copy.deepcopy(committed)
    change(bad)
    with pytest.raises(ValueError, match="^F: " + message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        validate(bad, RetrievalResults, "F")


def test_report_refuses_a_results_json_with_a_field_removed(committed, tmp_path, capsys):
    """``report --retrieval DIR``: one line naming the file and the field, exit 2, before any run is read."""
    bad = copy.deepcopy(committed)
    del bad["variants"]["diff_v2"]["matched_runs"][0]["seed"]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / files.RESULTS_NAME).write_text(json.dumps(bad))
    assert main(["report", str(tmp_path / "no-run"), "--retrieval", str(tmp_path / "bench"),
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        f"--retrieval: {tmp_path / 'bench' / files.RESULTS_NAME} is not a retrieval result: "
        'variants.diff_v2.matched_runs[0] lacks "seed"')


def test_every_command_taking_a_sweep_refuses_a_mistyped_one(tmp_path, capsys):
    """``report --lm-sweep`` and ``demo --lm-sweep`` (``lm-sweep --rounding-of`` reads through the same
    ``lmsweep.schema.read_sweep``): the same check, the same line."""
    bad = json.loads((SWEEPS[0] / files.SWEEP_RESULTS_NAME).read_text())
    bad["table"]["diff_v1"][0]["test_loss"] = "3.9"
    (tmp_path / "sweep").mkdir()
    path = tmp_path / "sweep" / files.SWEEP_RESULTS_NAME
    path.write_text(json.dumps(bad))
    what = "table.diff_v1[0].test_loss is a JSON string, not a list"
    for argv, flag in ((["report", str(tmp_path / "no-run"), "--lm-sweep", str(path.parent), "--out",
                         str(tmp_path / "o")], "--lm-sweep"),
                       (["demo", "--lm-sweep", str(path.parent), "--out", str(tmp_path / "o")], "--lm-sweep")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].endswith(f"{flag}: {path} is not a lm-sweep result: {what}"), err


def _path_constants(path: Path) -> list[str]:
    """String literals of a module that are paths, docstrings and messages left out (as tests/test_architecture.py
    finds a run's file names)."""
    import ast
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_study_file_names_are_spelled_once():
    """Each plot a study writes beside its results, and the results' files, is one constant of rundir/files.py:
    the writer (the study's plots) and the reader (the report) import it."""
    src = Path(files.__file__).resolve().parents[1]
    names = [*files.RETRIEVAL_PLOTS, files.WIDTH_SWEEP_PNG, files.LM_SWEEP_PARAMS_PNG, files.LM_SWEEP_TOKENS_PNG,
             files.LM_SWEEP_LR_PNG, files.RESULTS_NAME, files.SWEEP_RESULTS_NAME, files.ROUNDING_NAME]
    where: dict[str, list[str]] = {n: [] for n in names}
    for path in sorted(src.rglob("*.py")):
        for s in _path_constants(path):
            for n in names:
                if s == n or s.endswith("/" + n):
                    where[n].append(path.relative_to(src).as_posix())
    assert where == {n: ["rundir/files.py"] for n in names}


# ---------------------------------------------------------------------------------------------- the diagnostics
DIAGNOSTICS = ("retrieval-diagnostic", "v1-diagnostic", "v2-diagnostic")


@pytest.mark.parametrize("where", DIAGNOSTICS)
def test_every_committed_diagnostic_and_its_rounding_check_validate(where):
    from difftransformer.lmsweep.sweep_schema import validate_diagnostic as lm
    from difftransformer.retrieval.benchmark_schema import validate_diagnostic as retrieval
    from difftransformer.studies.schema import validate_readings

    validate_diagnostic = retrieval if where.startswith("retrieval") else lm
    d = json.loads((DOCS / where / files.DIAGNOSTIC_RESULTS_NAME).read_text())
    assert validate_diagnostic(d, where)["benchmark"] == d["benchmark"]
    validate_readings(json.loads((DOCS / where / files.ROUNDING_NAME).read_text()), where)


def _bad_ci(d):
    d["rows"]["diff_v2"]["D"]["ci"] = "wide"


def _no_test_loss(d):
    del d["arms"]["no_norm"]["test_loss"]


def _other_benchmark(d):
    d["benchmark"] = "lm_sweep"


@pytest.mark.parametrize("where, command, change, says", [
    ("retrieval-diagnostic", ["retrieval", "--diagnostic", "--reference", str(RETRIEVAL)], _bad_ci,
     "rows.diff_v2.D.ci is a JSON string, not a list"),
    ("v1-diagnostic", ["lm-sweep", "--diagnostic", "v1", "--reference", str(DOCS / "lm-sweep-v2")], _no_test_loss,
     'arms.no_norm lacks "test_loss"'),
    ("v2-diagnostic", ["lm-sweep", "--diagnostic", "v2", "--reference", str(DOCS / "lm-sweep-v2")],
     _other_benchmark, "its \"benchmark\" is 'lm_sweep', not one of 'v1_diagnostic', 'v2_diagnostic'"),
])
def test_the_rounding_check_refuses_a_diagnostic_of_another_shape(tmp_path, assert_cli_error, where, command,
                                                                   change, says):
    """`--rounding-check` reads OUT/diagnostic.json as the first run: a file of another shape is one line naming the
    field, before any job or directory (it was a KeyError, or read as far as the keys it happened to use)."""
    d = json.loads((DOCS / where / files.DIAGNOSTIC_RESULTS_NAME).read_text())
    change(d)
    (tmp_path / files.DIAGNOSTIC_RESULTS_NAME).write_text(json.dumps(d))
    assert_cli_error([*command, "--out", str(tmp_path), "--rounding-check", "avx2"], "diagnostic.json", says)
    assert sorted(p.name for p in tmp_path.iterdir()) == [files.DIAGNOSTIC_RESULTS_NAME]
