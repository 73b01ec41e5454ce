"""The one model loader (``difftransformer.loading``): a run, one of our model directories and a Hugging Face
directory each open to the same model with its tokenizer; anything else is one ValueError naming the path and the
kinds accepted."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from difftransformer import rundir
from difftransformer.data.tokenizer import train_tokenizer
from difftransformer.interop.hf import save_hf
from difftransformer.loading import load_model, locate
from difftransformer.model.pretrained import save_pretrained
from difftransformer.model.transformer import DiffTransformerLM
from suite_helpers import tiny_model_config

ALL = "not a run, a model directory of ours or a Hugging Face directory"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """One random baseline written as a run (two checkpoints, the newer one broken), a model directory and a
    Hugging Face Llama directory, each with the tokenizer."""
    root = tmp_path_factory.mktemp("loading")
    tok = root / "tokenizer.json"
    train_tokenizer(["In the beginning was the word, and the word was with God."] * 20, 300).save(str(tok))
    torch.manual_seed(0)
    model = DiffTransformerLM(tiny_model_config("baseline", vocab_size=300)).eval()
    run = root / "run"
    save_pretrained(model, rundir.step_dir(run, 1), tokenizer_file=tok)
    save_pretrained(model, rundir.step_dir(run, 2), tokenizer_file=tok)
    (rundir.step_dir(run, 2) / rundir.MANIFEST_NAME).unlink()  # incomplete: the loader takes step 1
    rundir.write_run_config(run, "{}")
    shutil.copy(tok, rundir.tokenizer_path(run))
    save_pretrained(model, root / "model", tokenizer_file=tok)
    save_hf(model, root / "hf", tokenizer_file=tok)
    return root, model


@pytest.mark.parametrize("kind", ["run", "model", "hf"])
def test_each_kind_opens_to_the_same_model(dirs, kind, capsys):
    root, model = dirs
    path = root / kind
    source = locate(path)  # what it is, without reading the weights
    assert source.kind == kind and source.path == path
    assert source.model_dir == {"run": rundir.step_dir(path, 1), "model": path, "hf": path}[kind]
    assert source.run_dir == (path if kind == "run" else None)
    if kind == "run":
        assert "step_00000002" in capsys.readouterr().err  # the broken newer checkpoint is named once
    loaded = source.load()
    assert loaded.model.cfg.attention == "baseline" and not loaded.model.training
    assert source.config() == loaded.model.cfg
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(loaded.model(ids).logits, model(ids).logits, atol=1e-5)
    assert loaded.tokenizer().get_vocab_size() <= 300
    assert loaded.tokenizer_file().read_bytes() == (root / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("kind", ["run", "model", "hf"])
def test_device_dtype_and_backend(dirs, kind):
    root, _ = dirs
    m = load_model(root / kind, device="cpu", dtype=torch.float64, backend="eager").model
    assert m.output.weight.dtype == torch.float64 and m.cfg.backend == "eager"
    assert all(layer.attn.backend == "eager" for layer in m.layers)


def test_a_bad_path_is_one_error_naming_it_and_the_kinds(dirs, tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"name": "something else"}))
    for name, why in (("missing", "does not exist"), ("file", "is not a directory"),
                      ("empty", "holds neither model.safetensors"), ("other", "holds neither model.safetensors")):
        with pytest.raises(ValueError) as e:
            load_model(tmp_path / name)
        assert str(e.value).startswith(f"{tmp_path / name} {why}") and str(e.value).endswith(ALL), e.value


def test_a_caller_may_accept_fewer_kinds(dirs):
    root, _ = dirs
    with pytest.raises(ValueError, match="is a Hugging Face checkpoint; convert it first: difftransformer convert "
                                         "--from-hf"):
        locate(root / "hf", kinds=("run", "model"))
    with pytest.raises(ValueError, match="is a run, not a Hugging Face directory"):
        locate(root / "run", kinds=("hf",))
    with pytest.raises(ValueError, match="does not exist, so it is not a run or a model directory of ours$"):
        locate(root / "nope", kinds=("run", "model"))
    with pytest.raises(ValueError, match="kinds"):
        locate(root / "run", kinds=("runs",))
