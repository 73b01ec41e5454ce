"""KV cache sizes: DIFF V1 caches 2*h_kv key half-heads of width d and h_kv values of width 2d (h_kv = H_kv/2),
DIFF V2 exactly the baseline's H_kv heads of width d; the cache generate() sets up holds prompt + new tokens."""

from __future__ import annotations

import pytest
import torch

from difftransformer.inference.generate import SamplingConfig, generate
from difftransformer.model import DiffTransformerLM, ModelConfig


def model(attention: str, n_heads: int, n_kv_heads: int, dtype: torch.dtype) -> DiffTransformerLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, d_model=16 * n_heads, n_layers=3, n_heads=n_heads, n_kv_heads=n_kv_heads,
                      head_dim=16, max_seq_len=64, attention=attention)
    return DiffTransformerLM(cfg).to(dtype).eval()


def expected_bytes(attention: str, L: int, B: int, N: int, Hkv: int, d: int, elt: int) -> int:
    if attention == "diff_v1":
        hkv = Hkv // 2
        return L * B * N * (2 * hkv * d + hkv * 2 * d) * elt  # keys: 2*h_kv half-heads of d; values: h_kv of 2d
    return L * B * N * (Hkv * d + Hkv * d) * elt  # baseline and V2: H_kv heads of d for keys and values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 4), (8, 2), (8, 4), (6, 2)])
def test_cache_bytes_follow_the_formulas(n_heads, n_kv_heads, dtype):
    B, N, d, L = 2, 24, 16, 3
    elt = torch.finfo(dtype).bits // 8
    got = {}
    for attention in ("baseline", "diff_v1", "diff_v2"):
        m = model(attention, n_heads, n_kv_heads, dtype)
        m.setup_caches(B, N)
        got[attention] = m.cache_nbytes()
        layer = m.layers[0].attn.kv_cache
        assert layer.k.dtype == dtype and layer.v.dtype == dtype
        if attention == "diff_v1":
            assert tuple(layer.k.shape) == (B, n_kv_heads, N, d)  # 2*h_kv = H_kv half-heads
            assert tuple(layer.v.shape) == (B, n_kv_heads // 2, N, 2 * d)
        else:
            assert tuple(layer.k.shape) == tuple(layer.v.shape) == (B, n_kv_heads, N, d)
        m.clear_caches()
        assert m.cache_nbytes() == 0
        assert got[attention] == expected_bytes(attention, L, B, N, n_kv_heads, d, elt)
    assert got["diff_v2"] == got["baseline"] == got["diff_v1"]


@pytest.mark.parametrize("attention", ["baseline", "diff_v1", "diff_v2"])
def test_generate_sets_up_exactly_prompt_plus_new_tokens(attention):
    m = model(attention, 8, 4, torch.float32)
    seen = []
    prompts = [[1, 2, 3, 4, 5], [6, 7]]
    generate(m, prompts, SamplingConfig(max_new_tokens=4, temperature=0),
             on_token=lambda t, d: seen.append(m.cache_nbytes()))
    want = expected_bytes(attention, 3, 2, 5 + 4, 4, 16, 4)
    assert seen == [want] * 4
    assert m.cache_nbytes() == 0  # dropped afterwards
