"""manifest.json is checked wherever weights are read: a model directory given directly (generate --checkpoint,
convert --to-hf, the analyses, ``from_pretrained``, a checkpoint inside a run), a run's newest checkpoint
(--run: one stderr line names the skipped one and the one used), and --resume. A flipped byte keeps the size,
so only the hash can see it; a directory without a manifest (Hugging Face, hand-made) is read as is."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from difftransformer import rundir
from difftransformer.cli import main
from difftransformer.model.transformer import DiffTransformerLM
from difftransformer.train.config import load_config
from difftransformer.train.trainer import train

QUIET = {"log": {"progress": False, "tensorboard": False}}


def flip_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    path.write_bytes(bytes(raw))


def tiny(**train_kw):
    return load_config("tiny", {**QUIET, "data": {"max_chars": 30000},
                                "train": {"steps": 2, "eval_every": 2, **train_kw},
                                "checkpoint": {"every": 1, "keep_last": 2}})


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("ck") / "run"
    train(tiny(), run)
    return run


@pytest.fixture
def run(clean_run, tmp_path) -> Path:
    """A copy of the 2-checkpoint run whose newest checkpoint has one flipped byte in its weights."""
    r = tmp_path / "run"
    shutil.copytree(clean_run, r)
    flip_byte(rundir.step_dir(r, 2) / rundir.WEIGHTS_NAME)
    return r


def one_error(capsys, argv, *texts) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"difftransformer {argv[0]}: error: "), err
    for t in texts:
        assert t in err[0], err[0]
    return err[0]


def test_generate_checkpoint_given_directly(run, capsys):
    one_error(capsys, ["generate", "--checkpoint", str(rundir.step_dir(run, 2)), "--prompt", "In"],
              "model.safetensors is corrupted")


def test_convert_to_hf_given_directly(run, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(rundir.step_dir(run, 2), model)
    one_error(capsys, ["convert", "--to-hf", str(model), "--out", str(tmp_path / "hf")],
              f"{model / 'model.safetensors'} is corrupted")
    assert not (tmp_path / "hf").exists()


def test_from_pretrained_and_eval_loading(run):
    from difftransformer.eval.loading import load_for_eval

    with pytest.raises(ValueError, match="model.safetensors is corrupted"):
        DiffTransformerLM.from_pretrained(rundir.step_dir(run, 2))
    with pytest.raises(ValueError, match="model.safetensors is corrupted"):
        load_for_eval(rundir.step_dir(run, 2))


def test_a_corrupt_config_is_refused_too(clean_run, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(rundir.step_dir(clean_run, 2), model)
    text = (model / rundir.CONFIG_NAME).read_text()
    (model / rundir.CONFIG_NAME).write_text(text.replace('"n_layers": 2', '"n_layers": 1'))
    with pytest.raises(ValueError, match="config.json"):
        DiffTransformerLM.from_pretrained(model)


def test_run_skips_the_corrupt_newest_checkpoint_and_says_so(run, capsys):
    capsys.readouterr()
    assert main(["generate", "--run", str(run), "--prompt", "In the", "--max-new-tokens", "2",
                 "--temperature", "0"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 1, err
    assert "step_00000002" in err[0] and "corrupted" in err[0], err[0]
    assert f"using {rundir.step_dir(run, 1)} instead" in err[0], err[0]


def test_run_with_every_checkpoint_corrupt_is_an_error(run, capsys):
    flip_byte(rundir.step_dir(run, 1) / rundir.WEIGHTS_NAME)
    one_error(capsys, ["generate", "--run", str(run), "--prompt", "In"], "no complete checkpoint")


def test_resume_skips_the_corrupt_newest_checkpoint(run, capsys):
    res = train(tiny(steps=3), run, resume=True)
    assert len(res.losses) == 2  # steps 2 and 3 again, from step 1
    err = capsys.readouterr().err
    assert "skipping checkpoint step_00000002" in err and "resuming from" in err and "step 1)" in err


def test_a_directory_without_manifest_is_read_as_is(clean_run, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(rundir.step_dir(clean_run, 2), model)
    (model / rundir.MANIFEST_NAME).unlink()
    assert DiffTransformerLM.from_pretrained(model).num_parameters() > 0
