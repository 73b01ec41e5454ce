"""`difftransformer bench layer` at a tiny size (eager): a table per shape with the four cases, positive finite
times and ratios, ours V1 computing timm's function; bad flags and a missing timm are one error line, exit 2."""

from __future__ import annotations

import math
import sys

import pytest

from difftransformer.bench import layer as bench_layer
from difftransformer.cli import main

TINY = ["--modes", "eager", "--batch", "2", "--seq-len", "12", "--rounds", "2", "--warmup", "0"]


def _number(cell: str) -> float:
    return float(cell.rstrip("x"))


def test_tables_rows_and_positive_finite_ratios(capsys):
    assert main(["bench", "layer", *TINY]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# bench layer: torch ") and " 1 threads" in out[0]
    assert out[1].startswith("# load average (1 min) before: ") and out[-1].startswith("# load average (1 min) after: ")
    titles = [i for i, line in enumerate(out) if line.startswith("## ")]
    assert [out[i].split(":")[0] for i in titles] == ["## vit, eager", "## lm, eager"]
    for i in titles:
        assert "B=2 T=12" in out[i]
        assert out[i + 1].split() == ["case", "ms", "fwd+bwd", "vs", "baseline", "vs", "timm"]
        rows = [line.split() for line in out[i + 2:i + 6]]
        assert [" ".join(r[:2]) for r in rows] == list(bench_layer.CASES)  # each label is two words
        for r in rows:  # ms, vs baseline, and for ours V1 alone vs timm
            values = [_number(c) for c in r[2:]]
            assert len(values) == (3 if r[:2] == ["ours", "V1"] else 2), r
            assert all(math.isfinite(v) and v > 0 for v in values), r
        assert rows[3][-1] == "1.000x"  # the baseline against itself
        check = out[i + 6]
        assert check.startswith("# ours V1 holds timm's weights") and float(check.rsplit("=", 1)[1]) <= 1e-5


@pytest.mark.parametrize("argv, flag", [(["--shapes", "vit,convnet"], "--shapes"), (["--modes", "jit"], "--modes"),
                                        (["--rounds", "0"], "--rounds"), (["--warmup", "-1"], "--warmup"),
                                        (["--batch", "-2"], "--batch")])
def test_bad_flags_are_one_line_errors(argv, flag, capsys):
    assert main(["bench", "layer", *TINY, *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before any work
    assert captured.err.count("\n") == 1 and captured.err.startswith("difftransformer bench: error: ")
    assert flag in captured.err


def test_missing_timm_is_one_line_naming_the_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # importlib.util.find_spec("timm") -> None: not installed
    with pytest.raises(ValueError, match="pip install timm"):
        bench_layer.timm_diff_attention()
    assert main(["bench", "layer", *TINY]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "pip install timm" in captured.err
    assert sys.modules["timm"] is None  # sys.modules left as it was


def test_rope_on_times_every_layer_with_rope_against_the_baseline_with_rope(capsys):
    assert main(["bench", "layer", *TINY, "--shapes", "lm", "--rope", "off,on"]) == 0
    out = capsys.readouterr().out.splitlines()
    titles = [line.split(":")[0] for line in out if line.startswith("## ")]
    assert titles == ["## lm, eager", "## lm, eager, RoPE on"]
    assert any(line.startswith("# RoPE on in ours") for line in out)
    assert main(["bench", "layer", *TINY, "--rope", "maybe"]) == 2
    assert "--rope" in capsys.readouterr().err
