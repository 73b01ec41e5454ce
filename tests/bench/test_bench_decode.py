"""`difftransformer bench decode` at toy sizes: the table has a row per (batch, context), positive finite numbers,
and bad flags fail with one line naming the flag."""

from __future__ import annotations

import math

import pytest
import torch

from difftransformer.bench import decode as bench_decode
from difftransformer.cli import build_parser, main

TINY = ["--batch", "1", "2", "--contexts", "6", "17", "--layers", "1", "--d-model", "32", "--head-dim", "8",
        "--vocab-size", "64", "--new-tokens", "3", "--rounds", "1"]


def parse(*extra: str):
    return build_parser().parse_args(["bench", "decode", *TINY, *extra])


def _number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("x"))


def test_table_rows_and_positive_finite_ratios(capsys):
    pytest.importorskip("transformers")
    assert main(["bench", "decode", *TINY]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if not line.startswith("#")]
    assert " ".join(lines[0].split()) == " ".join(bench_decode.columns())
    rows = [line.split() for line in lines[1:]]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(1, 6), (1, 17), (2, 6), (2, 17)]
    for r in rows:
        assert len(r) == 9
        values = [_number(c) for c in r[2:]]
        assert all(math.isfinite(v) and v > 0 for v in values), r
    # the HF model really holds our V1 weights: the same prefill logits
    check = next(line for line in out.splitlines() if line.startswith("# same weights check"))
    assert float(check.rsplit("=", 1)[1]) <= 1e-5


def test_measure_without_hf_returns_rows_and_equal_v2_cache():
    rows = bench_decode.measure(parse("--no-hf", "--batch", "2", "--contexts", "9"))
    assert len(rows) == 1
    row = rows[0]
    assert (row["batch"], row["context"]) == (2, 9)
    assert row["V1/HF"] is None and "HF DiffLlama" not in row["tok_s"]
    assert all(math.isfinite(v) and v > 0 for v in [*row["tok_s"].values(), row["V1/base"], row["V2/base"]])
    assert row["cache_bytes"]["V2"] == row["cache_bytes"]["baseline"] == row["cache_bytes"]["V1"]
    assert "-" in bench_decode.format_row(row)


@pytest.mark.parametrize("extra, flag", [
    (["--new-tokens", "0"], "--new-tokens"),
    (["--batch", "0"], "--batch"),
    (["--contexts", "4", "-1"], "--contexts"),
    (["--rounds", "0"], "--rounds"),
    (["--layers", "0"], "--layers"),
    (["--d-model", "36"], "--head-dim"),  # 36 is not a multiple of 8
    (["--d-model", "24"], "--d-model"),  # 3 heads: DIFF V1 needs an even count
    (["--kv-heads", "3"], "--kv-heads"),
    (["--decode-mode", "cuda-graph"], "--decode-mode"),
])
def test_bad_values_name_the_flag(capsys, extra, flag):
    with pytest.raises(ValueError, match=flag):
        bench_decode.check_args(parse("--no-hf", *extra))
    capsys.readouterr()
    assert main(["bench", "decode", *TINY, "--no-hf", *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and flag in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(ValueError, match="--device cuda"):
        bench_decode.check_args(parse("--device", "cuda"))


def test_every_flag_has_help():
    parser = build_parser()
    bench = next(a for a in parser._subparsers._group_actions[0].choices["bench"]._actions
                 if a.dest == "bench")
    decode = bench.choices["decode"]
    flags = [a for a in decode._actions if a.option_strings and a.dest != "help"]
    assert {a.option_strings[0] for a in flags} >= {"--device", "--dtype", "--new-tokens", "--batch", "--contexts",
                                                    "--layers", "--d-model", "--rounds", "--decode-mode", "--no-hf"}
    assert all(a.help for a in flags)
    assert "2 CPU cores" in next(a.help for a in flags if a.dest == "new_tokens")


def test_bench_pretrained_runs_on_a_tiny_llama(tmp_path, capsys):
    """`bench pretrained` on a small random Llama: every row printed, tokens identical to transformers'."""
    transformers = pytest.importorskip("transformers")
    from difftransformer.cli import main

    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)  # well-separated greedy choices
    model.save_pretrained(tmp_path / "hf")
    assert main(["bench", "pretrained", "--hf-dir", str(tmp_path / "hf"), "--batch", "1,2", "--prompt-len", "8",
                 "--new-tokens", "3", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("same tokens") == 6 and "TOKENS DIFFER" not in out and out.count("prefill") == 6
    assert "diff_v1" in out and "diff_v2" in out
