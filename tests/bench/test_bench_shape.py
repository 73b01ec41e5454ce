"""`bench attention` / `bench train`: ``--shape`` (a named shape of ``model.config.FLAVOURS``, flags on top), the
``--backends`` choices read from ``model.config.BACKENDS``, and ``bench train --hf-difflama`` (transformers'
DiffLlama timed at the same shape) on a tiny shape."""

from __future__ import annotations

import math
import sys

import pytest

from difftransformer.bench import attention as bench_attention
from difftransformer.bench import train as bench_train
from difftransformer.bench.common import bench_cases, diff_backends, resolve_shape
from difftransformer.cli import build_parser, main
from difftransformer.model import config as model_config
from difftransformer.model.config import FLAVOURS

TINY_TRAIN = ["--shape", "tiny", "--seq-len", "32", "--steps", "1", "--warmup", "0", "--backends", "sdpa"]


def parse(what: str, *argv: str):
    return build_parser().parse_args(["bench", what, *argv])


def _subparser(what: str):
    bench = next(a for a in build_parser()._subparsers._group_actions[0].choices["bench"]._actions
                 if a.dest == "bench")
    return bench.choices[what]


# ---------------------------------------------------------------------------------------------- --shape
def test_shape_sets_the_train_shape_and_flags_override_it():
    args = parse("train", "--shape", "paper-3b", "--layers", "4")
    assert resolve_shape(args, bench_train.SHAPE_DESTS) == "shape paper-3b with --layers 4"
    assert (args.d_model, args.heads, args.kv_heads, args.layers, args.vocab_size) == (3072, 24, None, 4, 100288)
    cfg = bench_train.model_config(args, "baseline", "sdpa")
    assert (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_hidden, cfg.n_layers, cfg.vocab_size) \
        == (3072, 24, 24, 128, FLAVOURS["paper-3b"]["ffn_hidden"], 4, 100288)
    v1 = bench_train.model_config(args, "diff_v1", "sdpa")
    assert (v1.n_diff_heads, v1.v1_value_dim) == (12, 256)

    # a narrower width keeps the shape's heads (head_dim d_model / heads) and gets its own default FFN
    args = parse("train", "--shape", "paper-3b", "--d-model", "1536", "--layers", "2", "--vocab-size", "512")
    resolve_shape(args, bench_train.SHAPE_DESTS)
    cfg = bench_train.model_config(args, "baseline", "sdpa")
    assert (cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.ffn_hidden, cfg.vocab_size) == (1536, 24, 64, 4096, 512)

    # a shape's own KV heads (tiny: 2), overridden by --kv-heads
    args = parse("train", "--shape", "tiny")
    resolve_shape(args, bench_train.SHAPE_DESTS)
    assert (args.d_model, args.heads, args.kv_heads, args.layers, args.vocab_size) == (64, 4, 2, 2, 64)
    args = parse("train", "--shape", "tiny", "--kv-heads", "4")
    resolve_shape(args, bench_train.SHAPE_DESTS)
    assert bench_train.model_config(args, "diff_v2", "sdpa").n_kv_heads == 4


def test_shape_sets_the_attention_shape_and_flags_override_it():
    args = parse("attention", "--shape", "paper-3b")
    assert resolve_shape(args, ("d_model", "head_dim", "kv_heads")) == "shape paper-3b"
    assert (args.d_model, args.head_dim, args.kv_heads) == (3072, 128, None)
    args = parse("attention", "--shape", "paper-3b", "--head-dim", "64")
    assert resolve_shape(args, ("d_model", "head_dim", "kv_heads")) == "shape paper-3b with --head-dim 64"
    assert (args.d_model, args.head_dim) == (3072, 64)
    args = parse("attention")  # today's default shape
    resolve_shape(args, ("d_model", "head_dim", "kv_heads"))
    assert (args.d_model, args.head_dim, args.kv_heads) == (512, 64, None)
    assert args.seq_lens == [512, 1024, 2048, 4096]


def test_headers_name_the_shape(monkeypatch, capsys):
    # attention: real (tiny) timings in this process, the per-case memory children replaced by a constant
    monkeypatch.setattr(bench_attention, "peak_memory", lambda *a: 1024.0)
    assert main(["bench", "attention", "--shape", "tiny", "--head-dim", "8", "--seq-lens", "8", "--repeats",
                 "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("# attention fwd+bwd, shape tiny with --head-dim 8: d_model=64 head_dim=8 "
                                          "kv_heads=2")
    # train at the paper's width: only the configs are built here, the children replaced by fixed numbers
    monkeypatch.setattr(bench_train, "measure", lambda cfg, args, hf=None: (0.5, 1000))
    assert main(["bench", "train", "--shape", "paper-3b", "--layers", "1", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert "shape paper-3b with --layers 1: seq 1024" in header
    assert "d_model 3072, 1 layers, 24 baseline heads of 128 (kv 24), FFN 8192, vocab 100288" in header
    assert [line.split()[0:2] for line in out.splitlines() if line.startswith(("baseline", "V1", "V2"))] == [
        ["baseline", "sdpa"], ["V1", "sdpa"], ["V1", "blocked"], ["V2", "sdpa"], ["V2", "blocked"]]


@pytest.mark.parametrize("what", ["attention", "train"])
def test_bad_shape_names_the_flag_and_the_shapes(capsys, what):
    args = parse(what, "--shape", "paper-7b")
    with pytest.raises(ValueError, match="--shape") as e:
        args.func(args)
    assert all(name in str(e.value) for name in FLAVOURS) and "paper-7b" in str(e.value)
    assert main(["bench", what, "--shape", "paper-7b"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--shape" in err and "paper-3b" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------- --backends
def test_backend_choices_and_default_cases():
    assert diff_backends() == tuple(b for b in model_config.BACKENDS if b not in ("eager", "auto")) == (
        "sdpa", "blocked", "triton")
    for what in ("attention", "train"):
        flag = next(a for a in _subparser(what)._actions if a.dest == "backends")
        assert tuple(flag.choices) == diff_backends() and "eager" not in flag.choices
    # today's defaults and column orders
    assert [c[0] for c in bench_train.cases(parse("train"))] == [
        "baseline sdpa", "V1 sdpa", "V1 blocked", "V2 sdpa", "V2 blocked"]
    assert [c[0] for c in bench_attention.cases(parse("attention"))] == [
        "baseline sdpa", "V1 blocked", "V1 sdpa", "V2 blocked", "V2 sdpa"]
    assert [c[0] for c in bench_attention.cases(parse("attention", "--eager"))] == [
        "baseline sdpa", "V1 blocked", "V1 sdpa", "V1 eager", "V2 blocked", "V2 sdpa"]
    with pytest.raises(ValueError,
                       match="--backends eager is not allowed; choose one or more of sdpa, blocked, triton"):
        bench_cases(["eager"])
    assert bench_train.cases(parse("train", "--backends", "blocked", "blocked")) == [
        ("baseline sdpa", "baseline", "sdpa"), ("V1 blocked", "diff_v1", "blocked"),
        ("V2 blocked", "diff_v2", "blocked")]


def test_a_backend_added_to_the_config_is_offered_and_timed(monkeypatch, capsys):
    """A backend added to model.config.BACKENDS (e.g. "triton") becomes a --backends choice of both benches and
    the cases "V1 <b>" / "V2 <b>"; only the case lists are built here, nothing runs the fake backend."""
    monkeypatch.setattr(model_config, "BACKENDS", (*model_config.BACKENDS, "fake"))
    assert "fake" in diff_backends()
    for what, module in (("attention", bench_attention), ("train", bench_train)):
        flag = next(a for a in _subparser(what)._actions if a.dest == "backends")
        assert "fake" in flag.choices and "fake" in flag.help
        before = module.cases(parse(what, "--backends", "sdpa"))
        after = module.cases(parse(what, "--backends", "sdpa", "fake"))
        assert len(after) == len(before) + 2
        assert {("V1 fake", "diff_v1", "fake"), ("V2 fake", "diff_v2", "fake")} <= set(after)
        assert after[0] == ("baseline sdpa", "baseline", "sdpa")
    monkeypatch.undo()
    with pytest.raises(SystemExit) as e:  # gone again: argparse refuses it
        main(["bench", "train", "--backends", "fake"])
    assert e.value.code == 2
    assert "--backends" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- --hf-difflama
def test_hf_difflama_has_our_v1_shape():
    pytest.importorskip("transformers")
    args = parse("train", *TINY_TRAIN)
    resolve_shape(args, bench_train.SHAPE_DESTS)
    cfg = bench_train.model_config(args, "diff_v1", "sdpa")
    impl = bench_train.hf_attn_implementation()
    assert impl in ("sdpa", "eager")
    hf = bench_train.build_hf_difflama(cfg, impl)
    c = hf.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.intermediate_size, c.vocab_size) == (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                                                   cfg.head_dim, cfg.ffn_hidden, cfg.vocab_size)
    assert c._attn_implementation == impl and hf.training
    # the same parameters as ours but the learnable 2d-wide head-wise norm weight of each layer (DiffLlama has none)
    from difftransformer.model.transformer import DiffTransformerLM

    ours = sum(p.numel() for p in DiffTransformerLM(cfg).parameters())
    assert ours - sum(p.numel() for p in hf.parameters()) == cfg.n_layers * 2 * cfg.head_dim


def test_hf_difflama_row_on_a_tiny_shape(capsys, monkeypatch):
    """The real thing: d_model 64, 2 layers, seq 32, one step; DiffLlama's case in its own spawned child, as every
    case runs without ``--in-process``, our three in this process (``measure_here``, ``--in-process``'s path: the
    same ``_time_steps`` the child runs), as a child each was most of this test's time."""
    pytest.importorskip("transformers")
    real, in_child = bench_train.measure, []

    def measure(cfg, args, hf=None):
        in_child.append(hf)
        return real(cfg, args, hf) if hf else bench_train.measure_here(cfg, args)

    monkeypatch.setattr(bench_train, "measure", measure)
    assert main(["bench", "train", *TINY_TRAIN, "--hf-difflama"]) == 0
    assert in_child[:3] == [None] * 3 and in_child[3] in ("sdpa", "eager") and len(in_child) == 4
    out = capsys.readouterr().out
    impl = bench_train.hf_attn_implementation()
    assert "# HF DiffLlama: transformers" in out and f"attn_implementation {impl!r}" in out
    rows = {line[:14].strip(): line[14:].split() for line in out.splitlines()
            if line.startswith(("baseline", "V1", "V2", "HF"))}
    assert list(rows) == ["baseline sdpa", "V1 sdpa", "V2 sdpa", "HF DiffLlama", "V1 sdpa vs HF"]
    params, ms, tok_s, ratio = rows["HF DiffLlama"]
    assert all(math.isfinite(v) and v > 0 for v in (float(ms), float(tok_s.replace(",", "")),
                                                    float(ratio.rstrip("x"))))
    assert int(params.replace(",", "")) == int(rows["V1 sdpa"][0].replace(",", "")) - 2 * 2 * 16
    line = next(line for line in out.splitlines() if line.startswith("V1 sdpa vs HF DiffLlama: "))
    assert float(line.split(": ")[1].split("x")[0]) > 0


def test_hf_difflama_without_transformers_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(ValueError, match="--hf-difflama needs transformers"):
        bench_train.hf_attn_implementation()
    assert main(["bench", "train", *TINY_TRAIN, "--hf-difflama"]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and "--hf-difflama" in captured.err
    assert "Traceback" not in captured.err and "parameters" not in captured.out  # refused before any case ran


def test_every_flag_has_help():
    for what, flags in (("attention", {"--shape", "--backends", "--d-model", "--head-dim", "--kv-heads"}),
                        ("train", {"--shape", "--backends", "--hf-difflama", "--d-model", "--layers", "--heads",
                                   "--kv-heads", "--vocab-size"})):
        actions = [a for a in _subparser(what)._actions if a.option_strings and a.dest != "help"]
        assert {a.option_strings[0] for a in actions} >= flags
        assert all(a.help for a in actions), what
        shape = next(a for a in actions if a.dest == "shape")
        assert all(name in shape.help for name in FLAVOURS)


def test_the_prefill_pass_times_the_forward_alone_without_autograd(monkeypatch):
    """``--pass prefill``: each step is one forward under no_grad (what ``auto``'s "prefill" entries are read from);
    ``--pass train`` (the default) a forward with autograd and a backward."""
    from difftransformer.kernels.launches import triton_pass
    seen: list[tuple[str, bool]] = []
    real = bench_attention.build_attention

    def spy(cfg, layer_idx):
        m = real(cfg, layer_idx)
        m.register_forward_hook(lambda mod, inp, out: seen.append((triton_pass(inp[0]), out[0].requires_grad)))
        return m

    monkeypatch.setattr(bench_attention, "build_attention", spy)
    for flag, want in (("prefill", ("prefill", False)), ("train", ("train", True))):
        args = parse("attention", "--shape", "tiny", "--head-dim", "8", "--seq-lens", "8", "--pass", flag)
        assert args.pass_ == flag
        resolve_shape(args, ("d_model", "head_dim", "kv_heads"))
        seen.clear()
        step = bench_attention._build("diff_v1", "sdpa", 8, args)
        step()
        assert seen == [want], (flag, seen)
    assert parse("attention").pass_ == "train"
