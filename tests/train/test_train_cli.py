"""`difftransformer train` on bad input: one clear error line, exit code != 0, nothing overwritten."""

from __future__ import annotations

import pytest

from difftransformer.cli import main
from difftransformer.train.trainer import train
from suite_helpers import cli_fails
from train_helpers import run_cli, snapshot, tiny_config

QUIET = ["--no-progress", "--log.tensorboard", "false"]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n\n")
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": 3}\n')
    (tmp_path / "short.txt").write_text("In the beginning.\n\nAnd the earth.\n\nAnd the light.\n")
    (tmp_path / "unknown_key.toml").write_text('[train]\nstep = 10\n')
    return tmp_path


@pytest.mark.parametrize("source, expected", [
    ("missing.txt", "missing.txt does not exist"),
    ("empty.txt", "empty.txt is empty"),
    ("binary.txt", "binary.txt looks binary"),
    ("latin1.txt", "latin1.txt is not UTF-8 text"),
    ("bad.jsonl", 'bad.jsonl:2 needs a string field "text"'),
])
def test_bad_data_files(files, capsys, source, expected):
    out = files / "run"
    cli_fails(capsys, ["train", "--config", "tiny", "--out", str(out), "--data.sources", f'["{files / source}"]',
                       *QUIET],
              expected)
    assert not (out / "run_config.json").exists()


@pytest.mark.parametrize("args, expected", [
    (["--train.batch_size", "6", "--train.micro_batch_size", "4"], "train.batch_size=6 must be a multiple of"),
    (["--data.seq_len", "65"], "data.seq_len=65 must be in [2, model.max_seq_len=64]"),
    (["--train.micro_batch_size", "0"], "train.micro_batch_size must be a positive integer"),
    (["--model.attention", "diff_v3"], "attention"),
    (["--train.precision", "fp8"], "train.precision='fp8' is not allowed"),
])
def test_impossible_sizes_and_values(tmp_path, capsys, args, expected):
    cli_fails(capsys, ["train", "--config", "tiny", "--out", str(tmp_path / "run"), *args, *QUIET], expected)
    assert not (tmp_path / "run").exists()


def test_window_longer_than_the_data(files, capsys):
    cli_fails(capsys, ["train", "--config", "tiny", "--out", str(files / "run"), "--data.sources",
                       f'["{files / "short.txt"}"]', "--data.val_fraction", "0.45", *QUIET],
              "data.seq_len=32 needs at least 34 tokens")


def test_unknown_config_key_in_a_file(files, capsys):
    cli_fails(capsys, ["train", "--config", str(files / "unknown_key.toml"), "--out", str(files / "run"), *QUIET],
              "unknown key(s) in [train]: step; allowed:")


@pytest.mark.parametrize("argv,prog,text", [
    (["train", "--config", "tiny", "--train.stepz", "3"], "difftransformer train", "unrecognized arguments: --train.stepz 3"),
    (["train", "--config", "tiny", "--train.step", "-1"], "difftransformer train", "unrecognized arguments"),  # no abbrev
    (["report", "x", "--bogus"], "difftransformer report", "unrecognized arguments: --bogus"),
    (["eval", "needles", "--run", "x", "--zz"], "difftransformer eval needles", "unrecognized arguments: --zz"),
    (["bench", "attention", "--batch", "x"], "difftransformer bench attention", "invalid int value: 'x'"),
    (["generate"], "difftransformer generate", "the following arguments are required"),
    (["bogus"], "difftransformer", "invalid choice: 'bogus'"),
])
def test_parser_errors_are_one_line_naming_the_subcommand(tmp_path, capsys, argv, prog, text):
    argv = [*argv, "--out", str(tmp_path / "run")] if argv[0] == "train" else argv
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{prog}: error: ") and text in err[0], err
    assert err[0].endswith(f"(see {prog} --help)"), err
    assert not (tmp_path / "run").exists()


def test_existing_run_is_not_overwritten_and_resume_refuses_another_model(tmp_path, prepared_dir, capsys):
    run = tmp_path / "run"
    train(tiny_config(data={"prepared_dir": prepared_dir}, train={"steps": 2}, checkpoint={"every": 1}), run)
    before = snapshot(run)
    cli_fails(capsys, ["train", "--config", "tiny", "--out", str(run), *QUIET], "already holds a run")
    cli_fails(capsys, ["train", "--out", str(run), "--resume", "--train.steps", "4", "--model.d_model", "64", *QUIET],
              "--resume: the model config differs from the run's (d_model: 32 in the run vs 64 now")
    cli_fails(capsys, ["train", "--out", str(run), "--resume", "--train.steps", "4", "--model.attention", "baseline",
                       *QUIET], "attention: 'diff_v1' in the run vs 'baseline' now")
    cli_fails(capsys, ["train", "--out", str(run), "--resume", "--train.steps", "4", "--data.vocab_size", "600",
                       *QUIET],
              "vocab_size: 512 in the run vs 600 now")
    cli_fails(capsys, ["train", "--out", str(run), "--resume", "--train.steps", "4", "--data.max_chars", "100000",
                       *QUIET], "the [data] section differs")
    cli_fails(capsys, ["train", "--out", str(run), "--resume", *QUIET], "already at step 2 >= train.steps=2")
    assert snapshot(run) == before


def test_a_real_process_prints_one_line_and_exits_2(tmp_path):
    res = run_cli("train", "--config", "tiny", "--out", str(tmp_path / "run"), "--data.sources",
                  f'["{tmp_path / "nope.jsonl"}"]', *QUIET)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"difftransformer train: error: data.sources: {tmp_path / 'nope.jsonl'} does not exist (give \"kjv\", a "
        ".txt/.jsonl file or a folder of them)"]
    assert not (tmp_path / "run").exists()


def test_help_documents_every_config_key(capsys):
    """Each section key's help comes from its field (one source) and --help shows a flag for each."""
    from dataclasses import fields

    from difftransformer.train.config import SECTIONS, override_keys

    keys = dict(override_keys())
    for section, typ in SECTIONS.items():
        for f in fields(typ):
            assert keys[f"{section}.{f.name}"] == f.metadata["help"] and f.metadata["help"]
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(f"--{k}" in text for k in keys)
    assert "--train.weight_decay VALUE AdamW weight decay on matrices" in text


def test_load_config_refuses_a_list_of_overrides():
    from difftransformer.train.config import load_config

    with pytest.raises(TypeError, match="overrides must be a dict"):
        load_config("tiny", ["--train.lr", "3e-4"])


def test_resume_of_a_finished_run_verifies_the_checkpoint_it_counts_on(tmp_path, prepared_dir, capsys):
    """Issue 57: a run at train.steps whose newest checkpoint is corrupt is not "already at step 2": the resume
    checks that checkpoint, says it is broken, continues from the newest good one and writes it again, exactly."""
    import torch

    from difftransformer import rundir
    from difftransformer.model.pretrained import verify_manifest
    from train_helpers import weights

    run = tmp_path / "run"
    train(tiny_config(data={"prepared_dir": prepared_dir}, train={"steps": 2}, checkpoint={"every": 1}), run)
    newest = rundir.step_dir(run, 2)
    good = weights(newest)
    raw = bytearray((newest / rundir.WEIGHTS_NAME).read_bytes())
    raw[len(raw) // 2] ^= 0x40  # same size, a bad checksum
    (newest / rundir.WEIGHTS_NAME).write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", *QUIET]) == 0
    err = capsys.readouterr().err
    assert "skipping checkpoint step_00000002" in err and "continuing from step_00000001 (step 1)" in err, err
    assert "already at step" not in err
    assert verify_manifest(newest) is None  # written again by the resumed run
    again = weights(newest)
    for k in good:
        torch.testing.assert_close(again[k], good[k], rtol=0, atol=1e-6, msg=k)
