"""`train --init-from`: continued training from one of our runs or a Hugging Face Llama, with the source's own
tokenizer; the first step's loss is the source model's on that batch (the DIFF V2 conversion keeps the function),
resume is exact, and what cannot be honoured is one error line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from difftransformer import rundir
from difftransformer.cli import main
from difftransformer.data.shards import WindowSampler, read_prepared, windows
from difftransformer.model.transformer import DiffTransformerLM
from suite_helpers import cli_fails
from train_helpers import weights

QUIET = ["--no-progress", "--log.tensorboard", "false"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A 4-step tiny baseline run: the model to continue."""
    root = tmp_path_factory.mktemp("init_from")
    assert main(["train", "--config", "tiny", "--model.attention", "baseline", "--train.steps", "4",
                 "--out", str(root / "src"), *QUIET]) == 0
    return root / "src"


def _first_batch_loss(model: DiffTransformerLM, run) -> float:
    """The loss of ``model`` on the first training batch the run ``run`` drew."""
    cfg = json.loads(rundir.run_config_path(run).read_text())
    data = read_prepared(rundir.data_dir(run))
    T, B = cfg["data"]["seq_len"], cfg["train"]["batch_size"]
    starts = WindowSampler(data.num_tokens["train"], T, cfg["train"]["seed"]).next_starts(B)
    x, y = windows(data.tokens("train"), starts, T)
    with torch.no_grad():
        return float(model.eval()(x, y).loss)


def _first_logged_loss(run) -> float:
    return next(r["loss"] for r in rundir.read_metric_records(run) if r.get("step") == 1 and "loss" in r)


@pytest.mark.parametrize("attention", ["baseline", "diff_v2", "diff_v1"])
def test_continues_from_the_source_with_its_tokenizer(tmp_path, source, attention):
    out = tmp_path / "ft"
    assert main(["train", "--config", "tiny", "--init-from", str(source), "--model.attention", attention,
                 "--train.steps", "2", "--log.every", "1", "--train.v1_negative_warmup", "3",
                 "--out", str(out), *QUIET]) == 0
    # the source's tokenizer, byte for byte, and the same tokens as the source's own data
    assert rundir.tokenizer_path(out).read_bytes() == rundir.tokenizer_path(source).read_bytes()
    a, b = read_prepared(rundir.data_dir(source)), read_prepared(rundir.data_dir(out))
    assert np.array_equal(a.tokens("train"), b.tokens("train"))
    cfg = json.loads(rundir.run_config_path(out).read_text())
    assert cfg["train"]["init_from"] == str(source.resolve()) and cfg["model"]["attention"] == attention
    # step 1 starts from the source's function: its loss is the source model's on that batch
    src = DiffTransformerLM.from_pretrained(rundir.resolve_checkpoint(source))
    want = _first_batch_loss(src, out)
    assert _first_logged_loss(out) == pytest.approx(want, abs=1e-5)
    fresh = tmp_path / "fresh"  # the same run from a seeded init starts elsewhere: the test can fail
    assert main(["train", "--config", "tiny", "--model.attention", attention, "--train.steps", "1",
                 "--log.every", "1", "--data.tokenizer", str(rundir.tokenizer_path(source)),
                 "--out", str(fresh), *QUIET]) == 0
    assert abs(_first_logged_loss(fresh) - want) > 1e-2
    if attention == "diff_v1":  # per_head layout; the negative branch's weight after step 2 of a 3-step warm-up
        assert cfg["model"]["v1_layout"] == "per_head"
        last = DiffTransformerLM.from_pretrained(rundir.resolve_checkpoint(out))
        assert float(last.layers[0].attn.neg_weight) == pytest.approx(1 / 3)


def test_v1_without_the_warm_up_starts_away_from_the_source(tmp_path, source):
    out = tmp_path / "ft"
    assert main(["train", "--config", "tiny", "--init-from", str(source), "--model.attention", "diff_v1",
                 "--train.steps", "1", "--log.every", "1", "--train.v1_negative_warmup", "0",
                 "--out", str(out), *QUIET]) == 0
    src = DiffTransformerLM.from_pretrained(rundir.resolve_checkpoint(source))
    assert abs(_first_logged_loss(out) - _first_batch_loss(src, out)) > 1e-3


def test_from_a_hugging_face_llama(tmp_path, source, capsys):
    hf = tmp_path / "hf"
    assert main(["convert", "--to-hf", str(source), "--out", str(hf)]) == 0  # a LlamaForCausalLM + tokenizer.json
    out = tmp_path / "ft"
    assert main(["train", "--config", "tiny", "--init-from", str(hf), "--model.attention", "diff_v2",
                 "--train.steps", "1", "--log.every", "1", "--out", str(out), *QUIET]) == 0
    src = DiffTransformerLM.from_pretrained(rundir.resolve_checkpoint(source))
    assert _first_logged_loss(out) == pytest.approx(_first_batch_loss(src, out), abs=1e-5)


@pytest.mark.parametrize("attention", ["diff_v2", "diff_v1"])
def test_resume_equals_an_uninterrupted_run(tmp_path, source, attention):
    args = ["--config", "tiny", "--init-from", str(source), "--model.attention", attention, "--checkpoint.every", "2",
            "--train.v1_negative_warmup", "3", *QUIET]
    assert main(["train", *args, "--train.steps", "4", "--out", str(tmp_path / "straight")]) == 0
    assert main(["train", *args, "--train.steps", "2", "--out", str(tmp_path / "cut")]) == 0
    assert main(["train", "--out", str(tmp_path / "cut"), "--resume", "--train.steps", "4", "--no-progress"]) == 0
    a = weights(rundir.step_dir(tmp_path / "straight", 4))
    b = weights(rundir.step_dir(tmp_path / "cut", 4))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_what_cannot_be_honoured_is_one_line(tmp_path, source, capsys):
    base = ["train", "--config", "tiny", "--init-from", str(source), "--out", str(tmp_path / "x"), *QUIET]
    cli_fails(capsys, [*base, "--model.d_model", "64"], "--model.d_model cannot change it")
    v2 = tmp_path / "v2"
    assert main(["convert", "--to-hf", str(source), "--out", str(tmp_path / "hf")]) == 0
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--attention", "diff_v2", "--out", str(v2)]) == 0
    cli_fails(capsys, ["train", "--config", "tiny", "--init-from", str(v2), "--model.attention", "diff_v1",
                       "--out", str(tmp_path / "x"), *QUIET], "only baseline -> diff_v1 or diff_v2")
    cli_fails(capsys, [*base, "--train.v1_negative_warmup", "-1"], "train.v1_negative_warmup=-1 must be >= 0")
    cli_fails(capsys, ["train", "--config", "tiny", "--init-from", str(tmp_path / "none"),
                       "--out", str(tmp_path / "x"), *QUIET], "none")
    (tmp_path / "plain").mkdir()
    cli_fails(capsys, ["train", "--config", "tiny", "--init-from", str(tmp_path / "plain"),
                       "--out", str(tmp_path / "x"), *QUIET], "not a run, a model directory")
    assert not (tmp_path / "x").exists()
