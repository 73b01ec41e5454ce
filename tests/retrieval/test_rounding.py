"""The rounding check (retrieval/rounding.py): both verdict tables side by side, the verdicts that differ named, and
the report page showing them; a second run under the same code path is refused."""

import copy
import json

import pytest

from difftransformer.retrieval.page import section
from difftransformer.retrieval.benchmark import run_benchmark
from difftransformer.retrieval.config import Condition, RetrievalConfig
from difftransformer.retrieval.rounding import compare, format_rounding, rounding_check
from difftransformer.studies.schema import RoundingRow, validate_rounding


def _cfg(**kw) -> RetrievalConfig:
    d = dict(d_model=16, n_heads=2, n_layers=1, steps=120, batch=4, warmup=1, seeds=3, seed_base=10, eval_contexts=4,
             val_contexts=4, train_pairs=(2, 3), train_context=(4, 8), queries=2, cpu_code_path="machine",
             lr_grid=(2e-3, 4e-3), lr_widen=0, variants=("baseline", "diff_v1"), quant_bits=(4,),
             conditions=(Condition("p3c8", 3, 8), Condition("p3c12", 3, 12)), primary="p3c8", extrapolation="p3c12")
    return RetrievalConfig(**{**d, **kw})


def test_compare_names_the_verdicts_that_differ_and_the_page_shows_both(tmp_path):
    first = run_benchmark(_cfg(steps=3), None, workers=1, progress=False)
    first["config"]["steps"] = 600  # judged as a full run (3 steps would be a smoke run: no verdicts to compare)
    same = compare(first, copy.deepcopy(first))
    assert same["verdicts_same"] == same["verdicts"] == len(same["rows"]) > 0 and same["not_run"] == 0
    assert same["grid_runs_equal_at_primary"] == [12, 12] and same["lr_choices_differ"] == {}
    assert "every verdict survives" in format_rounding(same)
    second = copy.deepcopy(first)
    for i, r in enumerate(second["variants"]["diff_v1"]["runs"]):  # DIFF V1 far ahead at the primary endpoint
        r["conditions"]["p3c8"]["accuracy"] = 0.9 + 0.01 * i
    for i, r in enumerate(second["variants"]["baseline"]["runs"]):
        r["conditions"]["p3c8"]["accuracy"] = 0.3 + 0.01 * i
    check = compare(first, second)
    primary = [RoundingRow._make(r) for r in check["rows"] if r[0].startswith("retrieves better among")]
    assert primary[0].variant == "diff_v1" and primary[0].other_verdict == "held" and primary[0].same == "NO"
    assert check["verdicts_same"] == check["verdicts"] - 1
    assert "DIFFERS" in format_rounding(check) and "1 verdict(s) differ" in format_rounding(check)
    (tmp_path / "rounding.json").write_text(json.dumps(check))  # one shape for both studies' rounding.json
    back = validate_rounding(json.loads(json.dumps(check)), "rounding.json")
    assert back["rows"][0][:2] == list(check["rows"][0][:2])
    page = section(first, tmp_path)
    assert "The rounding check" in page and "1 verdict(s) differ between the two code paths" in page


def test_the_same_code_path_is_refused(tmp_path):
    first = run_benchmark(_cfg(steps=3), None, workers=1, progress=False)
    with pytest.raises(ValueError, match="already ran that CPU code path"):
        rounding_check(first, _cfg(steps=3), tmp_path)
