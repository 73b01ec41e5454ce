"""`difftransformer generate` end to end on a tiny saved model: the streamed text is the library's greedy output,
and bad input fails with exactly one error line (no traceback, exit code != 0) before anything is printed."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from difftransformer.cli import main
from difftransformer.data.tokenizer import train_tokenizer
from difftransformer.inference.generate import SamplingConfig, generate
from difftransformer.model import DiffTransformerLM, ModelConfig
from difftransformer.model.pretrained import save_pretrained
from suite_helpers import cli_fails

TEXT = ["In the beginning was the word, and the word was with the model.",
        "The quick brown fox jumps over the lazy dog; the dog sleeps on."] * 20
CONTEXT = 40


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(TEXT, vocab_size=300).save(str(path))
    return path


def tiny_model(attention: str, vocab_size: int = 320) -> DiffTransformerLM:
    torch.manual_seed(0)
    cfg = ModelConfig.from_flavour("tiny", vocab_size=vocab_size, d_model=32, head_dim=8, max_seq_len=CONTEXT,
                                   attention=attention)
    model = DiffTransformerLM(cfg)
    with torch.no_grad():  # weights far from the near-uniform init: greedy tokens are well separated
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, tokenizer_file):
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for attention in ("baseline", "diff_v1", "diff_v2"):
        dirs[attention] = save_pretrained(tiny_model(attention), root / attention, tokenizer_file=tokenizer_file)
    return dirs


GREEDY = ["--max-new-tokens", "6", "--temperature", "0", "--ignore-eos", "--device", "cpu"]


@pytest.mark.parametrize("attention", ["baseline", "diff_v1", "diff_v2"])
def test_streamed_text_is_the_greedy_generation(model_dirs, tokenizer_file, capsys, attention):
    from difftransformer.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_file)
    prompt = "In the beginning"
    assert main(["generate", "--checkpoint", str(model_dirs[attention]), "--prompt", prompt, *GREEDY]) == 0
    out = capsys.readouterr()
    model = DiffTransformerLM.from_pretrained(model_dirs[attention])
    new = generate(model, [tok.encode(prompt).ids], SamplingConfig(max_new_tokens=6, temperature=0)).tokens[0]
    assert out.out == prompt + tok.decode(new) + "\n"
    err = out.err.strip().splitlines()
    assert len(err) == 1 and "tokens/s" in err[0] and attention in err[0]


def test_batch_of_prompts_prints_each(model_dirs, tokenizer_file, capsys):
    prompts = ["The quick brown fox", "In"]
    assert main(["generate", "--checkpoint", str(model_dirs["diff_v1"]), "--prompt", prompts[0], "--prompt",
                 prompts[1], *GREEDY]) == 0
    blocks = capsys.readouterr().out.split("\n\n")
    assert blocks[0].startswith(prompts[0]) and blocks[1].startswith(prompts[1])
    # each row of the padded batch gives what it gives alone
    for p, block in zip(prompts, blocks):
        main(["generate", "--checkpoint", str(model_dirs["diff_v1"]), "--prompt", p, *GREEDY])
        assert capsys.readouterr().out == block + "\n"


def test_seeded_sampling_is_reproducible(model_dirs, capsys):
    argv = ["generate", "--checkpoint", str(model_dirs["diff_v2"]), "--prompt", "The", "--max-new-tokens", "8",
            "--temperature", "1.0", "--top-k", "50", "--top-p", "0.9", "--seed", "3", "--ignore-eos"]
    assert main(argv) == 0
    a = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == a


# ---------------------------------------------------------------------------------------------- bad input
def test_missing_checkpoint_and_run(tmp_path, capsys):
    cli_fails(capsys, ["generate", "--checkpoint", str(tmp_path / "nope"), "--prompt", "a"],
              "nope does not exist", stdout_empty=True)
    (tmp_path / "run").mkdir()
    cli_fails(capsys, ["generate", "--run", str(tmp_path / "run"), "--prompt", "a"],
              "holds neither model.safetensors", stdout_empty=True)


def test_missing_tokenizer(tmp_path, model_dirs, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(model_dirs["baseline"], bare)
    (bare / "tokenizer.json").unlink()
    cli_fails(capsys, ["generate", "--checkpoint", str(bare), "--prompt", "a"], "pass --tokenizer", stdout_empty=True)
    cli_fails(capsys, ["generate", "--checkpoint", str(bare), "--prompt", "a", "--tokenizer", str(tmp_path / "t.json")],
              "t.json does not exist", stdout_empty=True)


def test_tokenizer_larger_than_the_model(tmp_path, tokenizer_file, capsys):
    small = save_pretrained(tiny_model("baseline", vocab_size=200), tmp_path / "small", tokenizer_file=tokenizer_file)
    cli_fails(capsys, ["generate", "--checkpoint", str(small), "--prompt", "a"],
              "tokenizer does not belong to this model", stdout_empty=True)


def test_hugging_face_directory_is_refused_with_the_way_to_convert(tmp_path, model_dirs, capsys):
    from difftransformer.interop.hf import save_hf

    save_hf(DiffTransformerLM.from_pretrained(model_dirs["baseline"]), tmp_path / "hf")
    cli_fails(capsys, ["generate", "--checkpoint", str(tmp_path / "hf"), "--prompt", "a"],
              "is a Hugging Face checkpoint; convert it first: difftransformer convert --from-hf", stdout_empty=True)


def test_wrong_architecture_in_config(tmp_path, model_dirs, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(model_dirs["diff_v1"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["attention"] = "diff_v3"
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "manifest.json").unlink()  # hand-edited: without its manifest it is read as is, so the check under test is reached
    cli_fails(capsys, ["generate", "--checkpoint", str(bad), "--prompt", "a"], "attention", stdout_empty=True)


@pytest.mark.parametrize("changes, expected", [
    (dict(d_model=64, head_dim=16), "has shape"),  # every tensor the wrong size
    (dict(n_layers=3), "does not match"),  # missing layer
    (dict(attention="baseline"), "does not match"),  # V1 weights (lambdas) under a baseline config
])
def test_config_and_weights_that_do_not_match(tmp_path, model_dirs, capsys, changes, expected):
    bad = tmp_path / "bad"
    shutil.copytree(model_dirs["diff_v1"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(changes)
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "manifest.json").unlink()  # hand-edited: without its manifest it is read as is, so the check under test is reached
    cli_fails(capsys, ["generate", "--checkpoint", str(bad), "--prompt", "a"], expected, stdout_empty=True)


def test_corrupt_weights(tmp_path, model_dirs, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(model_dirs["diff_v2"], bad)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    cli_fails(capsys, ["generate", "--checkpoint", str(bad), "--prompt", "a"], "model.safetensors is truncated",
              stdout_empty=True)  # the manifest catches it first
    (bad / "manifest.json").unlink()  # hand-edited: without its manifest it is read as is, so the check under test is reached
    cli_fails(capsys, ["generate", "--checkpoint", str(bad), "--prompt", "a"],
              "not a readable safetensors file", stdout_empty=True)


def test_empty_prompt(model_dirs, capsys):
    cli_fails(capsys, ["generate", "--checkpoint", str(model_dirs["diff_v2"]), "--prompt", "a", "--prompt", ""],
              "prompt 2 is empty", stdout_empty=True)
    cli_fails(capsys, ["generate", "--checkpoint", str(model_dirs["diff_v2"]), "--prompt", ""],
              "prompt 1 is empty", stdout_empty=True)


@pytest.mark.parametrize("n_prompts", [1, 2])  # streamed and batched
def test_prompt_longer_than_the_context(model_dirs, capsys, n_prompts):
    long = " ".join(["zebra quartz"] * 40)  # far more than 40 tokens
    prompts = ["--prompt", long] + (["--prompt", "a"] if n_prompts == 2 else [])
    cli_fails(capsys, ["generate", "--checkpoint", str(model_dirs["diff_v1"]), *prompts],
              f"the model's context (max_seq_len) is {CONTEXT}", stdout_empty=True)
    # a prompt that fits, but not with the new tokens
    cli_fails(capsys, ["generate", "--checkpoint", str(model_dirs["diff_v1"]), "--prompt", "The quick brown fox",
                       "--max-new-tokens", str(CONTEXT)], "exceeds the model's context", stdout_empty=True)


@pytest.mark.parametrize("flags, expected", [
    (["--temperature", "-1"], "temperature"),
    (["--top-k", "0"], "top_k"),
    (["--top-p", "1.5"], "top_p"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--device", "nonsense"], "--device nonsense is not usable"),
])
def test_bad_sampling_and_device_flags(model_dirs, capsys, flags, expected):
    cli_fails(capsys, ["generate", "--checkpoint", str(model_dirs["baseline"]), "--prompt", "a", *flags],
              expected, stdout_empty=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_graph_decode_on_cpu_is_refused_before_output(model_dirs, capsys):
    cli_fails(capsys, ["generate", "--checkpoint", str(model_dirs["baseline"]), "--prompt", "a", "--device", "cpu",
                       "--decode", "cuda-graph", "--max-new-tokens", "4"], "cuda-graph", stdout_empty=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_generate_refuses_cuda_graph_on_cpu_before_decoding():
    """The library call behind the CLI: refused up front, not after the prefill and the first token."""
    from difftransformer.inference import generate as gen_module

    seen = []
    with pytest.raises(ValueError, match="cuda-graph.*CUDA"):
        gen_module.generate(tiny_model("diff_v1"), [[1, 2, 3]], SamplingConfig(max_new_tokens=3, temperature=0),
                            decode="cuda-graph", on_token=lambda t, d: seen.append(t))
    assert seen == []


def test_end_tokens_from_the_generation_config_and_stop(model_dirs, tokenizer_file, tmp_path, capsys):
    """A converted model's generation_config.json end token and --stop both end the text where they appear."""
    from difftransformer.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_file)
    prompt = "In the beginning"
    model = DiffTransformerLM.from_pretrained(model_dirs["baseline"])
    new = generate(model, [tok.encode(prompt).ids], SamplingConfig(max_new_tokens=6, temperature=0)).tokens[0]
    cut = 3  # end at the greedy path's 4th token
    end = new[cut]
    assert end not in new[:cut]
    args = ["--prompt", prompt, "--max-new-tokens", "6", "--temperature", "0", "--device", "cpu"]
    d = tmp_path / "m"
    shutil.copytree(model_dirs["baseline"], d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [end]}))
    assert main(["generate", "--checkpoint", str(d), *args]) == 0
    assert capsys.readouterr().out == prompt + tok.decode(new[:cut]) + "\n"
    assert main(["generate", "--checkpoint", str(model_dirs["baseline"]), *args,
                 "--stop", tok.id_to_token(end)]) == 0
    assert capsys.readouterr().out == prompt + tok.decode(new[:cut]) + "\n"
    assert main(["generate", "--checkpoint", str(d), *args, "--ignore-eos"]) == 0  # and without: all 6
    assert capsys.readouterr().out == prompt + tok.decode(new) + "\n"
    cli_fails(capsys, ["generate", "--checkpoint", str(d), *args, "--stop", "no such token here"], "--stop")


def test_chat_template_renders_as_transformers_does(model_dirs, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    d = tmp_path / "chat"
    shutil.copytree(model_dirs["baseline"], d)
    (d / "chat_template.jinja").write_text(template)
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    from difftransformer.inference.cli import _chat, _side_config

    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"), eos_token="</s>")
    hf_tok.chat_template = template
    msg = [{"role": "user", "content": "the word"}]
    assert _chat("the word", _side_config(d, None)) == hf_tok.apply_chat_template(msg, add_generation_prompt=True,
                                                                                  tokenize=False)
    assert main(["generate", "--checkpoint", str(d), "--chat", "--prompt", "the word", *GREEDY]) == 0
    assert capsys.readouterr().out.startswith("<|user|>\nthe word</s>\n<|assistant|>\n")
    cli_fails(capsys, ["generate", "--checkpoint", str(model_dirs["baseline"]), "--chat", "--prompt", "x", *GREEDY],
              "no chat template")
