"""ModelConfig: JSON round trip, derived sizes, and one clear ValueError per impossible combination."""

from __future__ import annotations

import json

import pytest

from difftransformer.model.config import ModelConfig


def test_json_round_trip(tmp_path):
    cfg = ModelConfig(vocab_size=100, d_model=96, n_layers=3, n_heads=6, n_kv_heads=2, attention="diff_v1",
                      lambda_init=0.5, headwise_norm_weight=False)
    path = tmp_path / "c.json"
    cfg.to_json(path)
    assert ModelConfig.from_json(path) == cfg
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    assert ModelConfig.from_dict(json.loads(path.read_text())) == cfg


def test_derived_sizes():
    cfg = ModelConfig(d_model=512, n_heads=8)
    assert cfg.head_dim == 64 and cfg.n_kv_heads == 8
    assert cfg.ffn_hidden % cfg.ffn_multiple_of == 0 and 8 * 512 / 3 <= cfg.ffn_hidden < 8 * 512 / 3 + 64
    assert cfg.n_diff_heads == 4
    # replace() re-derives defaults of the old shape
    assert cfg.replace(d_model=256).head_dim == 32
    assert cfg.replace(d_model=256, head_dim=64).head_dim == 64


@pytest.mark.parametrize("changes, field", [
    ({"attention": "diff_v3"}, "attention"),
    ({"backend": "flash"}, "backend"),
    ({"n_heads": 8, "n_kv_heads": 3}, "n_kv_heads"),
    ({"n_heads": 6, "n_kv_heads": 3, "attention": "diff_v1"}, "n_kv_heads"),
    ({"n_heads": 5, "n_kv_heads": 5, "head_dim": 16, "attention": "diff_v1"}, "n_heads"),
    ({"head_dim": 7}, "head_dim"),
    ({"d_model": 0}, "d_model"),
    ({"vocab_size": -1}, "vocab_size"),
    ({"lambda_init": 1.5}, "lambda_init"),
    ({"lambda_init": "linear"}, "lambda_init"),
    ({"v2_lambda": "tanh", "attention": "diff_v2"}, "v2_lambda"),
    ({"v2_pairing": "random", "attention": "diff_v2"}, "v2_pairing"),
    ({"headwise_norm": False}, "headwise_norm_weight"),
    ({"attention": "baseline", "lambda_init": 0.5}, "lambda_init"),
    ({"attention": "diff_v1", "v2_pairing": "halves"}, "v2_pairing"),
    ({"attention": "diff_v2", "headwise_norm": False, "headwise_norm_weight": False}, "headwise_norm"),
    ({"norm_eps": 0}, "norm_eps"),
    ({"tie_embeddings": "yes"}, "tie_embeddings"),
    ({"attention": "diff_v1", "v1_layout": "split"}, "v1_layout"),
    ({"attention": "diff_v2", "v1_layout": "per_head"}, "v1_layout"),
    ({"attention": "baseline", "v1_layout": "per_head"}, "v1_layout"),
])
def test_bad_configs_name_the_field(changes, field):
    base = {"vocab_size": 64, "d_model": 64, "n_heads": 4, "head_dim": 16}
    base.update(changes)
    with pytest.raises(ValueError, match=field):
        ModelConfig(**base)


def test_v1_per_head_layout_keeps_odd_head_counts():
    """per_head: H differential heads over H_kv groups, so odd counts are fine (the paper layout halves them)."""
    cfg = ModelConfig(vocab_size=64, d_model=48, n_heads=6, n_kv_heads=3, head_dim=8, attention="diff_v1",
                      v1_layout="per_head")
    assert (cfg.n_diff_heads, cfg.v1_value_dim) == (6, 8)
    assert ModelConfig.from_json(cfg.to_json()) == cfg


def test_unknown_key_raises():
    with pytest.raises(ValueError, match="unknown ModelConfig key.*n_head\\b"):
        ModelConfig.from_dict({"n_head": 4})
    with pytest.raises(ValueError, match="unknown"):
        ModelConfig().replace(dmodel=4)


def test_diff_v2_odd_kv_heads_allowed():
    # V2 keeps the baseline's KV heads; 2H / H_kv is always even, so pairs stay inside a group.
    cfg = ModelConfig(d_model=96, n_heads=3, n_kv_heads=1, head_dim=32, attention="diff_v2")
    assert cfg.n_kv_heads == 1


def test_flavours():
    from difftransformer.model.config import FLAVOURS

    cfg = ModelConfig.from_flavour("tiny", attention="diff_v2", max_seq_len=32)
    assert (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.max_seq_len, cfg.attention) == (64, 4, 2, 32, "diff_v2")
    assert set(FLAVOURS) >= {"tiny", "bench", "paper-3b"}
    with pytest.raises(ValueError, match="flavour 'huge' is not defined; choose one of tiny"):
        ModelConfig.from_flavour("huge")
    with pytest.raises(ValueError, match="unknown ModelConfig key"):
        ModelConfig.from_flavour("tiny", dmodel=3)
