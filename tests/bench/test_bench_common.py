"""The benchmarks' shared helpers: one matched shape (the bench flavour), table rows, the explicit subcommands."""

from __future__ import annotations

import pytest

from difftransformer.bench import cli as bench_cli
from difftransformer.bench import train as bench_train
from difftransformer.bench.common import SHAPE, bench_config, load_average, resolve_shape, table_row
from difftransformer.cli import build_parser
from difftransformer.model.config import ModelConfig


def test_default_flags_give_the_bench_flavour():
    args = build_parser().parse_args(["bench", "decode"])
    cfg = bench_config("diff_v1", d_model=args.d_model, head_dim=args.head_dim, n_layers=args.layers,
                       vocab_size=args.vocab_size, max_seq_len=SHAPE["max_seq_len"])
    assert cfg == ModelConfig.from_flavour("bench", attention="diff_v1", backend="sdpa")
    train = build_parser().parse_args(["bench", "train"])
    assert resolve_shape(train, bench_train.SHAPE_DESTS) == "shape bench"
    assert (train.d_model, train.layers, train.heads) == (SHAPE["d_model"], SHAPE["n_layers"], SHAPE["n_heads"])
    assert bench_train.model_config(train, "diff_v1", "sdpa") == ModelConfig.from_flavour(
        "bench", attention="diff_v1", backend="sdpa", max_seq_len=train.seq_len)


def test_table_row_and_load():
    assert table_row(("a", 1.5, "x"), (-3, 5, 2)) == "a     1.5  x"
    with pytest.raises(ValueError, match="3 cells for 2 widths"):
        table_row((1, 2, 3), (4, 4))
    assert load_average() == "n/a" or float(load_average()) >= 0


def test_every_bench_module_registers_its_subcommand():
    sub = [a for a in build_parser()._subparsers._group_actions[0].choices["bench"]._actions
           if a.dest == "bench"][0]
    assert list(sub.choices) == [m.__name__.rsplit(".", 1)[1] for m in bench_cli.BENCH_MODULES]
