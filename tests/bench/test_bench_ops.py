"""`bench ops`: the operator counts of one training step (baseline, V1, V2) on a tiny shape, and the rules that
decide which profiled aten operator is a kernel."""

from __future__ import annotations

import collections

import pytest
import torch

from difftransformer.bench import ops as bench_ops
from difftransformer.cli import build_parser, main

TINY = ["--shape", "tiny", "--seq-len", "16", "--batch", "1", "--steps", "1", "--warmup", "0"]


def test_views_allocations_and_composites_are_no_kernels():
    for name in ("transpose", "slice", "expand", "view", "_unsafe_view", "empty", "linear", "reshape", "to",
                 "contiguous", "result_type"):
        assert bench_ops.launches_no_kernel(name), name
    for name in ("mm", "copy_", "add", "add_", "mul", "fill_", "sum", "_scaled_dot_product_flash_attention_for_cpu"):
        assert not bench_ops.launches_no_kernel(name), name


def _profile(fn) -> collections.Counter:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return bench_ops.count_cpu_kernels(prof.events())[0]


def test_kernel_count_of_known_calls():
    a, b = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
    assert _profile(lambda: torch.nn.functional.linear(a, b)) == {"mm": 1}  # linear -> t (view) + mm
    assert _profile(lambda: a.t().contiguous()) == {"copy_": 1}  # clone -> empty + copy_
    assert _profile(lambda: a.sum(0)) == {"sum": 1}  # its own output fill is part of it
    assert sum(_profile(lambda: torch.zeros(3)).values()) == 1  # zeros -> zero_ (-> fill_): one kernel
    assert _profile(lambda: a.to(torch.float32)) == {}  # a no-op cast: no kernel


def test_top_differences_ranks_by_spread():
    counts = [collections.Counter(mm=2, add=1), collections.Counter(mm=2, add=5, cat=1)]
    assert bench_ops.top_differences(counts, 5) == ["add", "cat"]
    assert bench_ops.top_differences(counts, 1) == ["add"]


def test_bench_ops_prints_counts_for_every_case(capsys):
    assert main(["bench", "ops", *TINY, "--top", "3"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0] + " " + line.split()[1]: line.split() for line in out.splitlines()
            if line.split()[:1] in (["baseline"], ["V1"], ["V2"])}
    assert list(rows) == ["baseline sdpa", "V1 sdpa", "V2 sdpa"]
    assert rows["baseline sdpa"][4] == "1.00x" and rows["baseline sdpa"][-1] == "1.000x"
    assert all(int(r[3].replace(",", "")) > 0 for r in rows.values())
    assert "kernels whose count differs most" in out


def test_counts_do_not_depend_on_batch_or_length():
    """Past batch 1 (where the embedding's backward takes another kernel on the CPU), so --batch 2 counts the
    bench shape's operators."""
    args = build_parser().parse_args(["bench", "ops", *TINY])
    bench_ops.resolve_shape(args, bench_ops.bench_train.SHAPE_DESTS)
    counts = []
    for batch, seq in ((2, 16), (3, 32)):
        args.batch, args.seq_len = batch, seq
        cfg = bench_ops.bench_train.model_config(args, "diff_v2", "sdpa")
        step, _ = bench_ops.make_step(cfg, args)
        step()
        counts.append(bench_ops.count_ops(step, torch.device("cpu")))
    assert counts[0].kernels == counts[1].kernels and counts[0].aten_calls == counts[1].aten_calls
    assert counts[1].flops > counts[0].flops > 0


@pytest.mark.parametrize("argv, msg", [(["--steps", "0"], "--steps must be >= 1"),
                                       (["--top", "-1"], "--top must be >= 0"),
                                       (["--kv-heads", "0"], "--kv-heads must be >= 1")])
def test_bad_flags_are_one_line_errors(argv, msg, capsys):
    assert main(["bench", "ops", *TINY, *argv]) == 2
    assert msg in capsys.readouterr().err
