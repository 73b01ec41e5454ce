"""`difftransformer eval ...` through the command line: results written, and bad input refused with one clear
error line and exit code 2 (no traceback)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from difftransformer.cli import main
from difftransformer.data.tokenizer import train_tokenizer
from difftransformer.eval import cli as eval_cli
from difftransformer.eval.analyses import ANALYSES
from difftransformer.rundir import resolve_checkpoint
from eval_helpers import cli_fails


def test_every_analysis_is_registered(capsys):
    with pytest.raises(SystemExit) as e:
        main(["eval", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    names = [s.name for s in ANALYSES]
    # the subcommands argparse lists, in order: exactly the imported specs, nothing registered elsewhere
    assert re.findall(r"^    ([a-z]+)", out, re.M) == names, out
    assert set(eval_cli.FLAGS) == set(names)
    assert names.index("positions") < names.index("attnmap")
    assert names.index("icl") < names.index("attnmap")


@pytest.mark.parametrize("name, words", [("positions", ["Fig. 4", "--factor", "--length", "--sequences"]),
                                         ("icl", ["Fig. 6", "--classes", "--orders", "--context", "chance"])])
def test_help_of_the_new_analyses(capsys, name, words):
    with pytest.raises(SystemExit) as e:
        main(["eval", name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for w in words + ["--run", "--out", "--seed"]:
        assert w in out, w


def test_positions_and_icl_write_json(runs, tmp_path, capsys):
    out = tmp_path / "res" / "positions.json"
    assert main(["eval", "positions", "--run", str(runs["diff_v2"]), "--sequences", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["analysis"] == "positions" and r["length"] == 128 and r["model"]["attention"] == "diff_v2"
    assert "NLL by position" in printed and "<- training length" in printed
    out = tmp_path / "icl.json"
    assert main(["eval", "icl", "--run", str(runs["baseline"]), "--samples", "4", "--orders", "2", "--words", "4",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["analysis"] == "icl" and r["chance"] == 0.25 and len(r["order"]["accuracies"]) == 2
    assert "chance" in printed and "spread" in printed


def test_a_model_directory_works_like_a_run(runs, capsys):
    ckpt = resolve_checkpoint(runs["baseline"])
    assert main(["eval", "outliers", "--run", str(ckpt), "--sequences", "1"]) == 0
    assert "attention_logits" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- bad input
def test_run_directory_without_checkpoint(runs, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(runs["baseline"] / "run_config.json", run)
    shutil.copy(runs["baseline"] / "tokenizer.json", run)
    (run / "checkpoints").mkdir()
    for name in ("needles", "positions", "icl"):
        cli_fails(capsys, ["eval", name, "--run", str(run)], "holds neither model.safetensors nor any checkpoint")
    cli_fails(capsys, ["eval", "positions", "--run", str(tmp_path / "missing")], "missing does not exist")


def test_incomplete_checkpoint_is_not_loaded(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs["diff_v1"], run)
    ckpt = resolve_checkpoint(run)
    (ckpt / "manifest.json").unlink()
    cli_fails(capsys, ["eval", "icl", "--run", str(run)], "no complete checkpoint")


def test_tokenizer_of_another_model(runs, tmp_path, capsys):
    model_dir = tmp_path / "model"
    shutil.copytree(resolve_checkpoint(runs["baseline"]), model_dir)
    from difftransformer.data.corpus import embedded_corpus

    big = train_tokenizer(embedded_corpus("kjv")[:400], 700)
    assert big.get_vocab_size() > 512
    big.save(str(model_dir / "tokenizer.json"))
    for name in ("positions", "icl", "noise"):
        cli_fails(capsys, ["eval", name, "--run", str(model_dir)], "tokenizer does not belong to this model",
                  f"has {big.get_vocab_size()} tokens but the model's vocab_size is 512")
    cli_fails(capsys, ["eval", "attnmap", "--run", str(runs["baseline"]), "--run", str(model_dir)],
              "tokenizer does not belong")


def test_tokenizer_without_eos(runs, tmp_path, capsys):
    model_dir = tmp_path / "model"
    shutil.copytree(resolve_checkpoint(runs["diff_v2"]), model_dir)
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["In the beginning God created"] * 10,
                            trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(model_dir / "tokenizer.json"))
    cli_fails(capsys, ["eval", "positions", "--run", str(model_dir)], "has no <|endoftext|> token")


@pytest.mark.parametrize("args, expected", [
    (["positions", "--sequences", "1"], "--sequences must be >= 2"),
    (["positions", "--factor", "-1"], "--factor must be a positive number"),
    (["positions", "--factor", "nan"], "--factor must be a positive number"),
    (["positions", "--length", "129"], "--length 129 must be in [2, 128]"),
    (["positions", "--length", "1"], "--length must be >= 2"),
    (["icl", "--classes", "1"], "--classes must be in [2, 8]"),
    (["icl", "--classes", "9"], "--classes must be in [2, 8]"),
    (["icl", "--orders", "0"], "--orders must be >= 1"),
    (["icl", "--samples", "0"], "--samples must be >= 1"),
    (["icl", "--words", "0"], "--words must be >= 1"),
    (["icl", "--context", "500"], "--context 500 must be in [2, 128]"),
    (["icl", "--context", "8"], "use a longer --context or fewer --words"),
    (["icl", "--samples", "100000"], "--samples 100000: not enough verses"),
    (["needles", "--depths", "0.5,2"], "--depths must be numbers in [0, 1]"),
    (["needles", "--lengths", "a,b"], "--lengths expects comma-separated numbers"),
    (["noise", "--samples", "0"], "--samples must be >= 1"),
    (["outliers", "--sequences", "0"], "--sequences must be >= 1"),
    (["quantized", "--bits", "8,1"], "--bits: 1 is too few"),
    (["quantized", "--bits", "eight"], "--bits must be comma-separated integers"),
    (["attnmap", "--out", "map.txt"], "name a .png file"),
    (["attnmap", "--layer", "5"], "--layer 5 is out of range"),
    (["attnmap", "--depth", "1.5"], "--depth must be in [0, 1]"),
])
def test_bad_flag_values(runs, capsys, args, expected):
    cli_fails(capsys, ["eval", args[0], "--run", str(runs["diff_v1"]), *args[1:]], expected)


def test_unparsable_flag_is_refused_by_the_parser(runs, capsys):
    with pytest.raises(SystemExit) as e:
        main(["eval", "icl", "--run", str(runs["baseline"]), "--classes", "four"])
    assert e.value.code == 2
    assert "argument --classes: invalid int value" in capsys.readouterr().err
