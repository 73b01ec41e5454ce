"""A throwaway fourth attention variant, registered by this test only, goes through train, eval, report and bench
with no other file changed; converting it to a Hugging Face directory is refused in one line.

This is the recipe of ARCHITECTURE.md ("A fourth attention variant") tried for real: a class implementing the
``Attention`` interface plus one ``Variant`` in the registry. Anything in the package that still restates the
variant list, or compares ``cfg.attention`` with a built-in name, fails here (an unknown name, a missing label or
colour, a table without the new column).
"""

from __future__ import annotations

import json

import pytest
import torch

from difftransformer.cli import main
from difftransformer.model import variants
from difftransformer.model.attention import BaselineAttention
from difftransformer.model.config import ModelConfig
from difftransformer.model.variants import Variant


class HalfAttention(BaselineAttention):
    """The baseline's attention with its output halved: a different function on the same interface."""

    def forward(self, x, rope, mask, *args, **kwargs):
        out, maps = super().forward(x, rope, mask, *args, **kwargs)
        return 0.5 * out, maps


TOY = Variant("half", label="Half attention", short="Half", colour="#2ca02c", cls=HalfAttention,
              differential=False)
TRAIN = ["--config", "tiny", "--train.steps", "6", "--train.eval_every", "6", "--checkpoint.every", "6"]


@pytest.fixture(scope="module")
def toy():
    with variants.registered(TOY):
        yield TOY


@pytest.fixture(scope="module")
def runs(toy, tmp_path_factory):
    root = tmp_path_factory.mktemp("fourth")
    prepared = root / "data"
    out = {}
    for name in (variants.reference().name, toy.name):
        assert main(["train", *TRAIN, "--model.attention", name, "--data.prepared_dir", str(prepared),
                     "--out", str(root / name)]) == 0
        out[name] = root / name
    return out


def test_registry_knows_it(toy):
    assert variants.names()[-1] == "half" and variants.compared()[-1] is toy
    cfg = ModelConfig.from_flavour("tiny", attention="half")
    assert cfg.attention == "half"
    with pytest.raises(ValueError, match="only applies to diff_v1, not attention='half'"):
        ModelConfig.from_flavour("tiny", attention="half", v1_layout="per_head")


def test_train_then_eval(runs, tmp_path, capsys):
    from difftransformer.rundir import read_metrics

    assert len(read_metrics(runs["half"])["val_loss"]) >= 1
    out = tmp_path / "positions.json"
    assert main(["eval", "positions", "--run", str(runs["half"]), "--sequences", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["model"]["attention"] == "half"


def test_report_judges_it(runs, tmp_path):
    assert main(["report", str(runs["baseline"]), str(runs["half"]), "--out", str(tmp_path / "rep"),
                 "--no-progress"]) == 0
    res = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert {r["variant"] for r in res["verdicts"]} == {"half"}  # one row per claim for the one compared variant
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "Half attention" in page


def test_bench_times_it(toy, capsys, monkeypatch):
    """Timed beside the others, and its memory measured in its own spawned child (which must know "half"); the
    built-in variants' memory children, the same code for a name every process knows, are replaced by a constant."""
    from difftransformer.bench import attention as bench_attention

    real, measured = bench_attention.peak_memory, []

    def peak_memory(attention, backend, n, args):
        if attention != toy.name:
            return 1024.0
        measured.append(real(attention, backend, n, args))
        return measured[-1]

    monkeypatch.setattr(bench_attention, "peak_memory", peak_memory)
    assert main(["bench", "attention", "--shape", "tiny", "--head-dim", "8", "--seq-lens", "8", "--repeats", "1",
                 "--backends", "sdpa"]) == 0
    out = capsys.readouterr().out
    assert "Half sdpa" in out
    assert len(measured) == 1 and measured[0] > 0
    row = next(line for line in out.splitlines() if line.split()[:1] == ["8"])
    assert f"{measured[0] / 1024.0:8.2f}xM" in row  # its cell, the last, from its child's number


def test_bench_decode_has_its_column(toy):
    from difftransformer.bench import decode

    assert "Half tok/s" in decode.columns() and "Half/base" in decode.columns()


def test_hf_conversion_is_refused_in_one_line(runs, tmp_path, capsys):
    rc = main(["convert", "--to-hf", str(runs["half"]), "--out", str(tmp_path / "hf")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "half" in err[0], err
    assert not (tmp_path / "hf").exists()


def test_forward_is_its_own(toy):
    torch.manual_seed(0)
    from difftransformer.model.transformer import DiffTransformerLM

    cfg = ModelConfig.from_flavour("tiny", attention="baseline", backend="sdpa")
    base = DiffTransformerLM(cfg)
    half = DiffTransformerLM(cfg.replace(attention="half"))
    half.load_state_dict(base.state_dict())
    x = torch.randint(0, cfg.vocab_size, (1, 8))
    assert not torch.allclose(base(x).logits, half(x).logits)


def test_spawned_workers_know_it(toy):
    """A spawned child (bench's memory and training measurements, retrieval's workers) adopts the parent's
    registered variants: without ``variants.adopt`` it would not know "half"."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1, initializer=variants.adopt, initargs=(variants.variants(),)) as pool:
        assert pool.apply(variants.names)[-1] == "half"
    with ctx.Pool(1) as pool:
        assert "half" not in pool.apply(variants.names)  # the check above can fail


def test_the_public_layer_builds_it(toy):
    """``DiffAttention(variant="half")``: the registry drives the layer too; its output is the baseline layer's
    halved (the same weights), and its state dict loads into a model layer of the variant."""
    from difftransformer import DiffAttention
    from difftransformer.model.transformer import DiffTransformerLM

    torch.manual_seed(0)
    base, half = DiffAttention(32, 4, "baseline"), DiffAttention(32, 4, "half")
    half.load_state_dict(base.state_dict() | {"_extra_state": half.get_extra_state()})
    x = torch.randn(2, 6, 32)
    torch.testing.assert_close(half(x), 0.5 * base(x))
    model = DiffTransformerLM(ModelConfig.from_flavour("tiny", attention="half"))
    attn = model.layers[0].attn
    assert isinstance(attn, HalfAttention) and isinstance(half, HalfAttention) and half.core is half
    with pytest.raises(ValueError, match="variant"):
        DiffAttention(32, 4, "third")
