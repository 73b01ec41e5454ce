"""`difftransformer convert` end to end: HF -> ours -> HF through the command line, and bad input failing with
exactly one error line (no traceback, exit code != 0) and nothing written to --out."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

from difftransformer.cli import main  # noqa: E402
from difftransformer.interop.hf import read_hf_weights  # noqa: E402
from difftransformer.model import DiffTransformerLM, ModelConfig  # noqa: E402
from difftransformer.model.pretrained import save_pretrained  # noqa: E402
from suite_helpers import cli_fails, randomise

VOCAB = 80
IDS = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))


def hf_model(kind: str):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=32, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    torch.manual_seed(0)
    if kind == "diffllama":
        return randomise(DiffLlamaForCausalLM(DiffLlamaConfig(**common)))
    return randomise(LlamaForCausalLM(LlamaConfig(**common)))


def ours(attention: str, **kw) -> DiffTransformerLM:
    cfg = ModelConfig.from_flavour("tiny", vocab_size=VOCAB, ffn_hidden=96, max_seq_len=32, attention=attention, **kw)
    torch.manual_seed(0)
    return randomise(DiffTransformerLM(cfg))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    for kind in ("diffllama", "llama"):
        hf_model(kind).save_pretrained(root / kind)
    (root / "diffllama" / "tokenizer.json").write_text('{"not": "read, only copied"}')
    save_pretrained(ours("diff_v1", headwise_norm_weight=False), root / "ours_v1")
    save_pretrained(ours("diff_v2"), root / "ours_v2")
    save_pretrained(ours("baseline"), root / "ours_base")
    return root


# ---------------------------------------------------------------------------------------------- working conversions
@pytest.mark.parametrize("kind, cls, attention", [("diffllama", DiffLlamaForCausalLM, "diff_v1"),
                                                  ("llama", LlamaForCausalLM, "baseline")])
def test_from_hf_and_back_through_the_cli(tmp_path, dirs, capsys, kind, cls, attention):
    assert main(["convert", "--from-hf", str(dirs / kind), "--out", str(tmp_path / "ours")]) == 0
    assert "wrote" in capsys.readouterr().out
    model = DiffTransformerLM.from_pretrained(tmp_path / "ours")
    assert model.cfg.attention == attention and model.cfg.rope_theta == 1000.0
    hf = cls.from_pretrained(dirs / kind).eval()
    with torch.no_grad():
        want, got = hf(IDS).logits, model(IDS).logits
    assert want.abs().max() > 1.0 and (want - got).abs().max() <= 1e-5
    assert (tmp_path / "ours" / "tokenizer.json").is_file() == (kind == "diffllama")
    # and back: the very same Hugging Face tensors
    assert main(["convert", "--to-hf", str(tmp_path / "ours"), "--out", str(tmp_path / "back")]) == 0
    a, b = read_hf_weights(dirs / kind), read_hf_weights(tmp_path / "back")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_llama_to_diff_v2_keeps_the_function(tmp_path, dirs, capsys):
    """`convert --from-hf LLAMA --attention diff_v2`: transformers' logits on the source weights, and the added
    parameters printed."""
    assert main(["convert", "--from-hf", str(dirs / "llama"), "--attention", "diff_v2",
                 "--out", str(tmp_path / "v2")]) == 0
    out = capsys.readouterr().out
    model = DiffTransformerLM.from_pretrained(tmp_path / "v2")
    assert model.cfg.attention == "diff_v2" and model.cfg.v2_lambda == "sigmoid"
    added = 2 * (4 * 16 + 4) * 64  # per layer: the second query of each pair (H*d rows) and W_lambda (H rows)
    assert f"{model.num_parameters():,} parameters; +{added:,} over the source" in out, out
    hf = LlamaForCausalLM.from_pretrained(dirs / "llama").eval()
    with torch.no_grad():
        want, got = hf(IDS).logits, model(IDS).logits
    assert want.abs().max() > 1.0 and (want - got).abs().max() <= 1e-5
    cli_fails(capsys, ["convert", "--from-hf", str(dirs / "diffllama"), "--attention", "diff_v2",
                       "--out", str(tmp_path / "x")], "converts a Llama")
    cli_fails(capsys, ["convert", "--to-hf", str(dirs / "ours_base"), "--attention", "diff_v2",
                       "--out", str(tmp_path / "x")], "--from-hf only")
    assert not (tmp_path / "x").exists()


def test_llama_to_diff_v1_keeps_the_function_and_prints_the_gaps(tmp_path, dirs, capsys):
    """`convert --from-hf LLAMA --attention diff_v1`: the per_head layout, transformers' logits on the source weights,
    the added parameters and the step-0 gap of each option printed (and measured: the no-warm-up one is large)."""
    assert main(["convert", "--from-hf", str(dirs / "llama"), "--attention", "diff_v1",
                 "--out", str(tmp_path / "v1")]) == 0
    out = capsys.readouterr().out
    model = DiffTransformerLM.from_pretrained(tmp_path / "v1")
    assert (model.cfg.attention, model.cfg.v1_layout, model.cfg.headwise_norm) == ("diff_v1", "per_head", False)
    added = 2 * ((4 + 2) * 16 * 64 + 4 * 16)  # per layer: a second query (H*d) and key (H_kv*d) map, 4 lambda vectors
    assert f"{model.num_parameters():,} parameters; +{added:,} over the source" in out, out
    gaps = re.search(r"random tokens: (\S+) \(negative branch at weight 0\); (\S+) without the warm-up", out)
    assert gaps and float(gaps.group(1)) <= 1e-4 and float(gaps.group(2)) > 1e-2, out
    hf = LlamaForCausalLM.from_pretrained(dirs / "llama").eval()
    with torch.no_grad():
        want, got = hf(IDS).logits, model(IDS).logits
    assert want.abs().max() > 1.0 and (want - got).abs().max() <= 1e-5
    assert main(["convert", "--from-hf", str(dirs / "llama"), "--attention", "diff_v1", "--v1-headwise-norm",
                 "--out", str(tmp_path / "v1n")]) == 0
    gap = re.search(r"random tokens: (\S+) \(with the head-wise norm\)", capsys.readouterr().out)
    assert gap and float(gap.group(1)) > 1e-2
    # DiffLlama cannot hold the per_head layout: exported as remote code instead (tests/interop/test_remote_code.py)
    assert main(["convert", "--to-hf", str(tmp_path / "v1"), "--out", str(tmp_path / "v1hf")]) == 0
    assert "holds v1_layout='per_head': written as remote code" in capsys.readouterr().out
    cli_fails(capsys, ["convert", "--from-hf", str(dirs / "llama"), "--v1-headwise-norm",
                       "--out", str(tmp_path / "x")], "--attention diff_v1 only")
    assert not (tmp_path / "x").exists()


def test_ours_to_hf_to_ours_through_the_cli_is_bitwise(tmp_path, dirs, capsys):
    assert main(["convert", "--to-hf", str(dirs / "ours_v1"), "--out", str(tmp_path / "hf"),
                 "--expect", "diff_v1"]) == 0
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back"),
                 "--expect", "diffllama"]) == 0
    a, b = DiffTransformerLM.from_pretrained(dirs / "ours_v1"), DiffTransformerLM.from_pretrained(tmp_path / "back")
    assert a.cfg == b.cfg
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    hf = DiffLlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        assert (hf(IDS).logits - a(IDS).logits).abs().max() <= 1e-5


def test_empty_out_directory_is_accepted(tmp_path, dirs):
    (tmp_path / "out").mkdir()
    assert main(["convert", "--from-hf", str(dirs / "llama"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()


# ---------------------------------------------------------------------------------------------- bad input
def _edited_copy(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    (dst / "manifest.json").unlink(missing_ok=True)  # hand-edited: without its manifest it is read as is, so the check under test is reached
    return dst


def test_missing_inputs(tmp_path, capsys):
    out = tmp_path / "out"
    cli_fails(capsys, ["convert", "--from-hf", str(tmp_path / "nope"), "--out", str(out)], "nope does not exist")
    cli_fails(capsys, ["convert", "--to-hf", str(tmp_path / "nope"), "--out", str(out)], "nope does not exist")
    (tmp_path / "empty").mkdir()
    cli_fails(capsys, ["convert", "--from-hf", str(tmp_path / "empty"), "--out", str(out)],
              "config.json does not exist")
    cli_fails(capsys, ["convert", "--to-hf", str(tmp_path / "empty"), "--out", str(out)], "holds neither")
    (tmp_path / "file").write_text("x")
    cli_fails(capsys, ["convert", "--from-hf", str(tmp_path / "file"), "--out", str(out)], "is not a directory")
    assert not out.exists()


def test_missing_weights(tmp_path, dirs, capsys):
    shutil.copytree(dirs / "llama", tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").unlink()
    cli_fails(capsys, ["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out")],
              "holds neither model.safetensors nor model.safetensors.index.json")
    (tmp_path / "hf" / "pytorch_model.bin").write_bytes(b"pickle")
    cli_fails(capsys, ["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], "pickle")
    assert not (tmp_path / "out").exists()


def test_wrong_architecture(tmp_path, dirs, capsys):
    out = tmp_path / "out"
    gpt2 = _edited_copy(dirs / "llama", tmp_path / "gpt2", model_type="gpt2", architectures=["GPT2LMHeadModel"])
    cli_fails(capsys, ["convert", "--from-hf", str(gpt2), "--out", str(out)], "model_type='gpt2' is not supported")
    cli_fails(capsys, ["convert", "--from-hf", str(dirs / "llama"), "--out", str(out), "--expect", "diffllama"],
              "not the expected diff_v1")
    cli_fails(capsys, ["convert", "--to-hf", str(dirs / "ours_base"), "--out", str(out), "--expect", "diff_v1"],
              "not the expected diff_v1")
    assert main(["convert", "--to-hf", str(dirs / "ours_v2"), "--out", str(tmp_path / "v2hf")]) == 0  # remote code
    assert "holds attention='diff_v2': written as remote code" in capsys.readouterr().out
    cli_fails(capsys, ["convert", "--to-hf", str(dirs / "diffllama"), "--out", str(out)],
              "already a Hugging Face checkpoint (use --from-hf")
    cli_fails(capsys, ["convert", "--from-hf", str(dirs / "ours_v1"), "--out", str(out)],
              "is in our own format, not a Hugging Face checkpoint")
    assert not out.exists()


@pytest.mark.parametrize("kind, changes, expected", [
    ("diffllama", dict(hidden_size=32), "shape"),
    ("diffllama", dict(num_attention_heads=8, head_dim=8), "shape"),
    ("llama", dict(num_hidden_layers=3), "lacks tensor"),
    ("llama", dict(num_hidden_layers=1), "no place for"),
    ("llama", dict(vocab_size=VOCAB + 1), "shape"),
])
def test_hf_shape_mismatches(tmp_path, dirs, capsys, kind, changes, expected):
    bad = _edited_copy(dirs / kind, tmp_path / "bad", **changes)
    cli_fails(capsys, ["convert", "--from-hf", str(bad), "--out", str(tmp_path / "out")], expected)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("changes, expected", [(dict(d_model=128, head_dim=32), "has shape"),
                                               (dict(n_layers=3), "does not match")])
def test_our_shape_mismatches(tmp_path, dirs, capsys, changes, expected):
    bad = _edited_copy(dirs / "ours_base", tmp_path / "bad", **changes)
    cli_fails(capsys, ["convert", "--to-hf", str(bad), "--out", str(tmp_path / "out")], expected)
    assert not (tmp_path / "out").exists()


def test_existing_out_is_not_overwritten(tmp_path, dirs, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    cli_fails(capsys, ["convert", "--from-hf", str(dirs / "llama"), "--out", str(out)], "exists and is not an empty")
    cli_fails(capsys, ["convert", "--to-hf", str(dirs / "ours_v1"), "--out", str(out)], "exists and is not an empty")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_side_files_travel_both_ways(tmp_path, dirs):
    """tokenizer_config.json, special_tokens_map.json, generation_config.json and the chat template survive
    HF -> ours -> HF byte for byte, and config.json takes its token ids from generation_config.json."""
    src = tmp_path / "llama"
    shutil.copytree(dirs / "llama", src)
    side = {"tokenizer_config.json": b'{"eos_token": "<|im_end|>", "tokenizer_class": "PreTrainedTokenizerFast"}\n',
            "special_tokens_map.json": b'{"eos_token": "<|im_end|>"}\n',
            "generation_config.json": b'{"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}\n',
            "chat_template.jinja": b"{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"}
    for name, data in side.items():
        (src / name).write_bytes(data)
    assert main(["convert", "--from-hf", str(src), "--out", str(tmp_path / "ours")]) == 0
    assert main(["convert", "--to-hf", str(tmp_path / "ours"), "--out", str(tmp_path / "back")]) == 0
    for name, data in side.items():
        assert (tmp_path / "ours" / name).read_bytes() == data and (tmp_path / "back" / name).read_bytes() == data
    cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)


def test_our_run_exports_its_end_token(tmp_path):
    """An exported run of ours names <|endoftext|> as transformers' end token (it assumed ids 1/2 before, which
    are ordinary tokens of our BPE), so AutoTokenizer knows it and transformers' generate stops there."""
    from transformers import AutoTokenizer

    from difftransformer import rundir

    assert main(["train", "--config", "tiny", "--model.attention", "baseline", "--train.steps", "1",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == eos
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["eos_token_id"] == eos and cfg["bos_token_id"] == eos
    assert tok("In the beginning")["input_ids"] == rundir.read_tokenizer(
        rundir.tokenizer_path(tmp_path / "run"), 512).encode("In the beginning").ids
    model = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert model.generation_config.eos_token_id == eos


# ---------------------------------------------------------------------------------------------- the model card
def _card(directory) -> tuple[dict, str]:
    """(front matter, body) of ``directory/README.md``, the front matter parsed by YAML and by huggingface_hub's
    model card reader (what a hub shows)."""
    yaml = pytest.importorskip("yaml")
    from huggingface_hub import ModelCard

    text = (directory / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n") and text.count("---\n") >= 2
    _, head, body = text.split("---\n", 2)
    meta = yaml.safe_load(head)
    assert ModelCard.load(directory / "README.md").data.to_dict() == meta
    return meta, body


@pytest.mark.parametrize("source, remote", [("ours_v1", False), ("ours_base", False), ("ours_v2", False),
                                            ("ours_v1", True)])
def test_every_export_has_a_model_card_and_loads_in_transformers(tmp_path, dirs, capsys, source, remote):
    """The card's front matter parses (YAML and huggingface_hub), says what the model is, and the directory loads
    in transformers computing our logits; --from-hf ignores the card: the round trip is bitwise."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    ours_model = DiffTransformerLM.from_pretrained(dirs / source)
    attention = ours_model.cfg.attention
    assert main(["convert", "--to-hf", str(dirs / source), "--out", str(out), "--license", "Apache-2.0",
                 *(["--remote-code"] if remote else [])]) == 0
    as_remote = remote or attention == "diff_v2"
    meta, body = _card(out)
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation"
    assert attention.replace("_", "-") in meta["tags"] and "difftransformer" in meta["tags"]
    assert ("differential-attention" in meta["tags"]) == (attention != "baseline")
    assert ("custom_code" in meta["tags"]) == as_remote
    assert meta["license"] == "apache-2.0" and "base_model" not in meta  # no source: no base model
    n = ours_model.num_parameters()
    for text in ("## Model", f"{n:,}", "## Where it came from", "ours_" + source.split("_")[1], "## How to load",
                 f'AutoModelForCausalLM.from_pretrained("{out}"', "2410.05258", "@inproceedings"):
        assert text in body, text
    assert ("trust_remote_code=True" in body) == as_remote
    assert ("lambda_init" in body) == (attention == "diff_v1") and ("v2_lambda" in body) == (attention == "diff_v2")
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=as_remote, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (hf(IDS).logits - ours_model(IDS).logits).abs().max() <= 1e-5
    assert main(["convert", "--from-hf", str(out), "--out", str(tmp_path / "back")]) == 0
    assert not (tmp_path / "back" / "README.md").exists()
    back = DiffTransformerLM.from_pretrained(tmp_path / "back")
    a, b = ours_model.state_dict(), back.state_dict()
    assert back.cfg == ours_model.cfg and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_runs_card_says_where_it_came_from(tmp_path, capsys):
    """A run continued from a source: the card gives the step and validation loss, names the source, inherits the
    source card's licence (the source's README.md is ignored by every loader), and takes --base-model."""
    from difftransformer import rundir

    quiet = ["--no-progress", "--log.tensorboard", "false"]
    assert main(["train", "--config", "tiny", "--model.attention", "diff_v2", "--train.steps", "1",
                 "--out", str(tmp_path / "first"), *quiet]) == 0
    src = tmp_path / "source"
    shutil.copytree(rundir.resolve_checkpoint(tmp_path / "first"), src)
    (src / "README.md").write_text("---\nlicense: apache-2.0\ntags:\n- x\n---\n\n# a source with a card\n")
    assert main(["train", "--config", "tiny", "--init-from", str(src), "--train.steps", "2",
                 "--train.eval_every", "2", "--out", str(tmp_path / "run"), *quiet]) == 0
    val = [r["val_loss"] for r in rundir.read_metric_records(tmp_path / "run") if "val_loss" in r][-1]
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf"),
                 "--base-model", "me/diff-v2-source"]) == 0
    meta, body = _card(tmp_path / "hf")
    assert meta["base_model"] == "me/diff-v2-source" and meta["license"] == "apache-2.0"
    assert "custom_code" in meta["tags"]
    for text in ("in the run `run`: step 2 of 2", f"Validation loss {val:.4f} at step 2", "Continued from `source`",
                 'AutoTokenizer.from_pretrained("' + str(tmp_path / "hf") + '", trust_remote_code=True)'):
        assert text in body, text


def test_source_metadata_reads_a_hub_name_never_a_path(tmp_path):
    from difftransformer.interop.model_card import source_metadata

    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "config.json").write_text(json.dumps({"_name_or_path": "HuggingFaceTB/SmolLM2-135M"}))
    (tmp_path / "hub" / "README.md").write_text('---\nlicense: "Apache-2.0"\n---\n')
    assert source_metadata(tmp_path / "hub") == ("HuggingFaceTB/SmolLM2-135M", "apache-2.0")
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "config.json").write_text(json.dumps({"_name_or_path": str(tmp_path / "hub")}))
    assert source_metadata(tmp_path / "local") == (None, None)
