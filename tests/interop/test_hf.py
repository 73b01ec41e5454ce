"""Hugging Face interop: tiny random DiffLlama / Llama models built and saved offline, converted to ours and back.

Weights are drawn with std 0.1 (logits of order 1-4, far from the 0.02 init's near-uniform output) so that a wrong
permutation or a missing fold shows up as an O(1) difference, while fp32 rounding (HF computes RoPE angles in
float32, we in float64) stays below the 1e-5 bound.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM, LlamaConfig, LlamaForCausalLM

from difftransformer.inference.generate import SamplingConfig, generate
from difftransformer.interop.hf import (interleaved_to_neox, load_hf, neox_to_interleaved, read_hf_weights,
                                        save_hf)
from difftransformer.model import DiffTransformerLM, ModelConfig
from suite_helpers import randomise

VOCAB = 96


def width(heads: int) -> int:
    return 96 if heads % 3 == 0 else 64  # transformers wants hidden_size divisible by the head count


def hf_model(kind: str, heads: int, kv_heads: int, tie: bool = False, theta: float = 500.0):
    common = dict(vocab_size=VOCAB, hidden_size=width(heads), intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16, max_position_embeddings=64,
                  tie_word_embeddings=tie, rope_parameters={"rope_type": "default", "rope_theta": theta},
                  rms_norm_eps=1e-5)
    torch.manual_seed(0)
    if kind == "diffllama":
        return randomise(DiffLlamaForCausalLM(DiffLlamaConfig(**common)))
    return randomise(LlamaForCausalLM(LlamaConfig(**common)))


def ours_model(attention: str, heads: int, kv_heads: int, **kw) -> DiffTransformerLM:
    cfg = ModelConfig(vocab_size=VOCAB, d_model=width(heads), n_layers=3, n_heads=heads, n_kv_heads=kv_heads, head_dim=16,
                      ffn_hidden=96, max_seq_len=64, attention=attention, rope_theta=500.0, **kw)
    torch.manual_seed(0)
    return randomise(DiffTransformerLM(cfg), seed=1)


IDS = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(5))


def test_rope_permutations_are_inverse_and_map_pairs():
    d = 8
    a, b = neox_to_interleaved(d), interleaved_to_neox(d)
    assert a.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert a[b].tolist() == list(range(d)) and b[a].tolist() == list(range(d))


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (8, 2)])  # V1 groups: h/h_kv = 1, 2, 4
def test_diffllama_to_ours_logits_match(tmp_path, heads, kv_heads):
    hf = hf_model("diffllama", heads, kv_heads)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf")
    assert ours.cfg.attention == "diff_v1" and not ours.cfg.headwise_norm_weight
    assert ours.cfg.n_heads == heads and ours.cfg.n_kv_heads == kv_heads and ours.cfg.rope_theta == 500.0
    with torch.no_grad():
        want, got = hf(IDS).logits, ours(IDS).logits
    assert want.abs().max() > 1.0  # not a near-uniform output that any layout would match
    assert (want - got).abs().max() <= 1e-5


@pytest.mark.parametrize("heads, kv_heads, tie", [(4, 4, False), (6, 3, True), (4, 1, False), (6, 2, False)])
def test_llama_to_ours_logits_match_any_gqa(tmp_path, heads, kv_heads, tie):
    hf = hf_model("llama", heads, kv_heads, tie=tie)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf")
    assert ours.cfg.attention == "baseline" and ours.cfg.tie_embeddings == tie
    with torch.no_grad():
        want, got = hf(IDS).logits, ours(IDS).logits
    assert want.abs().max() > 1.0
    assert (want - got).abs().max() <= 1e-5


def _assert_same_model(a: DiffTransformerLM, b: DiffTransformerLM) -> None:
    assert a.cfg == b.cfg
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("attention, heads, kv_heads, kw", [
    ("diff_v1", 8, 4, dict(headwise_norm_weight=False)),
    ("baseline", 6, 3, dict(tie_embeddings=True)),
    ("baseline", 4, 2, {}),
])
def test_ours_to_hf_to_ours_is_bitwise(tmp_path, attention, heads, kv_heads, kw):
    model = ours_model(attention, heads, kv_heads, **kw)
    save_hf(model, tmp_path / "hf")
    _assert_same_model(model, load_hf(tmp_path / "hf"))
    # and in bfloat16: permutations move bits, they never round
    save_hf(model.to(torch.bfloat16), tmp_path / "hf16")
    _assert_same_model(model, load_hf(tmp_path / "hf16"))


def test_hf_to_ours_to_hf_is_bitwise(tmp_path):
    hf = hf_model("diffllama", 8, 2)
    hf.save_pretrained(tmp_path / "hf")
    save_hf(load_hf(tmp_path / "hf"), tmp_path / "back")
    a, b = read_hf_weights(tmp_path / "hf"), read_hf_weights(tmp_path / "back")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("attention, heads, kv_heads", [("diff_v1", 4, 2), ("diff_v1", 8, 2), ("baseline", 6, 3)])
def test_exported_weights_in_hf_give_our_logits_and_greedy_tokens(tmp_path, attention, heads, kv_heads):
    """Our model (V1 with a learnable head-wise norm weight, folded into o_proj on export) loaded by transformers."""
    model = ours_model(attention, heads, kv_heads)
    save_hf(model, tmp_path / "hf")
    cls = DiffLlamaForCausalLM if attention == "diff_v1" else LlamaForCausalLM
    hf = cls.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        want, got = model(IDS).logits, hf(IDS).logits
    assert want.abs().max() > 1.0
    assert (want - got).abs().max() <= 1e-5
    prompt = IDS[0, :6].tolist()
    ours_tokens = generate(model, [prompt], SamplingConfig(max_new_tokens=12, temperature=0)).tokens[0]
    hf_tokens = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, 6:].tolist()
    assert ours_tokens == hf_tokens


def test_v1_norm_weight_fold_round_trip_keeps_logits(tmp_path):
    model = ours_model("diff_v1", 4, 2)  # headwise_norm_weight=True: folded into W_o, so not bitwise
    save_hf(model, tmp_path / "hf")
    back = load_hf(tmp_path / "hf")
    assert not back.cfg.headwise_norm_weight
    with torch.no_grad():
        assert (model(IDS).logits - back(IDS).logits).abs().max() <= 1e-5


def test_sharded_safetensors_are_read(tmp_path):
    hf = hf_model("llama", 4, 2)
    hf.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    with torch.no_grad():
        assert (hf(IDS).logits - load_hf(tmp_path / "hf")(IDS).logits).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------- refusals
def test_v2_export_is_refused(tmp_path):
    with pytest.raises(ValueError, match="diff_v2.*no Hugging Face class"):
        save_hf(ours_model("diff_v2", 4, 2), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kw, match", [
    (dict(headwise_norm=False, headwise_norm_weight=False), "headwise_norm"),
    (dict(lambda_init=0.8), "lambda_init"),
    (dict(norm_eps=1e-6), "norm_eps"),
])
def test_v1_options_without_a_diffllama_equivalent_are_refused(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        save_hf(ours_model("diff_v1", 4, 2, **kw), tmp_path / "hf")


def test_pickle_only_directory_is_refused(tmp_path):
    hf = hf_model("llama", 4, 2)
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").rename(tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pytorch_model.bin.*pickle"):
        load_hf(tmp_path / "hf")


def _edit_config(path, **changes):
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, error, match", [
    (dict(model_type="gpt2", architectures=["GPT2LMHeadModel"]), ValueError, "model_type='gpt2' is not supported"),
    (dict(hidden_size=32), ValueError, "shape"),
    (dict(num_hidden_layers=4), ValueError, "lacks tensor"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0}), ValueError, "yarn"),
    (dict(rms_norm_eps=1e-6), ValueError, "rms_norm_eps"),
])
def test_bad_hf_directories_are_refused(tmp_path, changes, error, match):
    hf = hf_model("diffllama", 4, 2)
    hf.save_pretrained(tmp_path / "hf")
    _edit_config(tmp_path / "hf" / "config.json", **changes)
    with pytest.raises(error, match=match):
        load_hf(tmp_path / "hf")


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf(tmp_path / "empty")
    hf_model("llama", 4, 2).config.save_pretrained(tmp_path / "cfgonly")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf(tmp_path / "cfgonly")


def test_expected_architecture_is_enforced(tmp_path):
    hf_model("llama", 4, 2).save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match="not the expected diff_v1"):
        load_hf(tmp_path / "hf", expect="diff_v1")


@pytest.mark.parametrize("factor, low, high, original", [(8.0, 1.0, 4.0, 16), (32.0, 1.0, 4.0, 8)])
def test_llama3_rope_scaling_converts_both_ways(tmp_path, factor, low, high, original):
    """Llama 3.1/3.2's `rope_type: llama3`: our logits equal transformers' (positions past the original length
    included, where the scaling acts), and an export reads back the same scaling."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from difftransformer.interop.hf import load_hf, save_hf

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": original}
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5,
                      rope_parameters=rope, rope_scaling=rope)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf")
    assert ours.cfg.rope_type == "llama3" and ours.cfg.rope_factor == factor
    ids = torch.randint(0, 96, (2, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = hf(ids).logits, ours(ids).logits
    assert (want - got).abs().max() <= 1e-4
    plain = ours.cfg.replace(rope_type="default", rope_factor=1.0, rope_low_freq_factor=1.0,
                             rope_high_freq_factor=4.0, rope_original_max_len=8192)
    other = DiffTransformerLM(plain)
    other.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert (other.eval()(ids).logits - want).abs().max() > 1e-3  # the scaling matters at these positions
    save_hf(ours, tmp_path / "back")
    assert load_hf(tmp_path / "back").cfg == ours.cfg


def test_from_pretrained_on_a_hugging_face_directory_says_what_to_do(tmp_path):
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match="is a Hugging Face checkpoint .*convert --from-hf"):
        DiffTransformerLM.from_pretrained(tmp_path / "hf")
