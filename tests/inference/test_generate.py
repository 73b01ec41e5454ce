"""Generation: cached decoding equals the full forward, greedy equals repeated argmax, sampling, stops, padding."""

from __future__ import annotations

import pytest
import torch

from difftransformer.inference.generate import (SamplingConfig, filter_logits, generate, left_pad, sample_next,
                                                stream)
from difftransformer.model import DiffTransformerLM, ModelConfig

VARIANTS = ("baseline", "diff_v1", "diff_v2")


def tiny(attention: str, n_kv_heads: int = 2, **kw) -> ModelConfig:
    """4 heads of 16 (V1: 2 differential heads), 2 layers, context 48; keyword arguments override."""
    return ModelConfig.from_flavour("tiny", **{"attention": attention, "n_kv_heads": n_kv_heads, "max_seq_len": 48,
                                               **kw})


def model_for(attention: str, n_kv_heads: int = 2, dtype=torch.float64, **kw) -> DiffTransformerLM:
    torch.manual_seed(0)
    model = DiffTransformerLM(tiny(attention, n_kv_heads, **kw))
    with torch.no_grad():  # larger weights than the 0.02 init: logits far apart, so errors cannot hide
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return model.to(dtype).eval()


def cached_logits(model: DiffTransformerLM, ids: torch.Tensor, mask: torch.Tensor, n_prefill: int) -> torch.Tensor:
    """Logits at every position: prefill the first n_prefill tokens, then one token at a time through the cache."""
    B, T = ids.shape
    cache_len = T + 3  # longer than needed: unused slots must stay invisible
    cache_mask = torch.ones(B, cache_len, dtype=torch.bool)
    cache_mask[:, :T] = mask
    model.setup_caches(B, cache_len)
    try:
        out = [model(ids[:, :n_prefill], input_pos=torch.arange(n_prefill), attention_mask=cache_mask).logits]
        for t in range(n_prefill, T):
            out.append(model(ids[:, t:t + 1], input_pos=torch.tensor([t]), attention_mask=cache_mask).logits)
    finally:
        model.clear_caches()
    return torch.cat(out, dim=1)  # (B, T, V)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("n_kv_heads", [4, 2])  # MHA and GQA (V1: h_kv = 2 and 1)
@pytest.mark.parametrize("attention", VARIANTS)
def test_cached_decode_equals_full_forward(attention, n_kv_heads, backend):
    model = model_for(attention, n_kv_heads, backend=backend)
    ids = torch.randint(0, 64, (2, 14))
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        full = model(ids).logits
        inc = cached_logits(model, ids, mask, n_prefill=5)
    torch.testing.assert_close(inc, full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("attention, kw", [("baseline", {}), ("diff_v1", {}), ("diff_v2", {}),
                                        ("diff_v2", dict(v2_pairing="halves")), ("diff_v2", dict(v2_lambda="none")),
                                        ("diff_v1", dict(headwise_norm=False, headwise_norm_weight=False)),
                                        ("diff_v2", dict(v2_keys="separate")), ("diff_v2", dict(v2_lambda="scalar")),
                                        ("diff_v2", dict(v2_headwise_norm=True))])
def test_cached_decode_wide_gqa_and_ablations(attention, kw):
    """8 query heads on 2 KV heads (V1: 4 heads per group, V2: 8 query heads per KV head) and the ablations."""
    model = model_for(attention, n_kv_heads=2, n_heads=8, d_model=128, **kw)
    ids = torch.randint(0, 64, (3, 11))
    with torch.no_grad():
        full = model(ids).logits
        inc = cached_logits(model, ids, torch.ones_like(ids, dtype=torch.bool), n_prefill=3)
    torch.testing.assert_close(inc, full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("attention", VARIANTS)
def test_cached_decode_with_left_padded_batch(attention):
    """A padded batch through the cache gives every row the logits it gets alone, unpadded, without a cache."""
    model = model_for(attention, backend="sdpa")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (13, 6, 9)]
    ids, mask = left_pad(prompts, pad_id=7)
    with torch.no_grad():
        inc = cached_logits(model, ids, mask, n_prefill=4)  # the prefill holds only padding for row 1
        full_masked = model(ids, attention_mask=mask).logits
        T = ids.shape[1]
        for i, p in enumerate(prompts):
            alone = model(torch.tensor([p])).logits[0]
            torch.testing.assert_close(inc[i, T - len(p):], alone, rtol=0, atol=1e-9)
            torch.testing.assert_close(full_masked[i, T - len(p):], alone, rtol=0, atol=1e-9)


def test_cache_bytes_per_variant():
    """V1 caches 2*h_kv key half-heads (d) and h_kv values (2d); V2 caches exactly the baseline's H_kv heads."""
    B, N, L, d, Hkv = 3, 40, 2, 16, 2
    nbytes = {}
    for attention in VARIANTS:
        model = model_for(attention, Hkv, dtype=torch.float32)
        model.setup_caches(B, N)
        nbytes[attention] = model.cache_nbytes()
        model.clear_caches()
    assert nbytes["baseline"] == L * 2 * (B * Hkv * N * d) * 4
    hkv = Hkv // 2
    assert nbytes["diff_v1"] == L * (B * 2 * hkv * N * d + B * hkv * N * 2 * d) * 4
    assert nbytes["diff_v2"] == nbytes["baseline"]
    assert nbytes["diff_v1"] == nbytes["baseline"]  # with h_kv = H_kv/2 the bytes match too


@pytest.mark.parametrize("attention", VARIANTS)
def test_greedy_generate_equals_repeated_full_argmax(attention):
    model = model_for(attention)
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7], [11]]
    out = generate(model, prompts, SamplingConfig(max_new_tokens=10, temperature=0))
    for p, new in zip(prompts, out.tokens):
        seq = list(p)
        with torch.no_grad():
            for _ in range(10):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
        assert new == seq[len(p):]
    assert out.stopped == [False, False, False]


def test_generate_float32_matches_full_argmax_and_leaves_no_cache():
    model = model_for("diff_v1", dtype=torch.float32)
    out = generate(model, [[3, 1, 4, 1, 5]], SamplingConfig(max_new_tokens=6, temperature=0))
    seq = [3, 1, 4, 1, 5]
    with torch.no_grad():
        for _ in range(6):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert out.tokens[0] == seq[5:]
    assert all(layer.attn.kv_cache is None for layer in model.layers)


def test_stop_tokens_end_rows_and_are_not_returned():
    model = model_for("baseline")
    free = generate(model, [[1, 2, 3], [4, 5]], SamplingConfig(max_new_tokens=8, temperature=0))
    stop_tok = free.tokens[0][3]
    first = free.tokens[0].index(stop_tok)
    out = generate(model, [[1, 2, 3], [4, 5]], SamplingConfig(max_new_tokens=8, temperature=0,
                                                              stop_tokens=(stop_tok,)))
    assert out.tokens[0] == free.tokens[0][:first] and out.stopped[0]
    row1 = free.tokens[1]
    cut = row1.index(stop_tok) if stop_tok in row1 else len(row1)
    assert out.tokens[1] == row1[:cut] and out.stopped[1] == (stop_tok in row1)


def test_stream_yields_pad_after_stop_and_exits_early():
    model = model_for("diff_v2")
    free = generate(model, [[1, 2, 3]], SamplingConfig(max_new_tokens=8, temperature=0)).tokens[0]
    steps = list(stream(model, [[1, 2, 3]], SamplingConfig(max_new_tokens=8, temperature=0,
                                                            stop_tokens=(free[1],))))
    assert len(steps) == free.index(free[1]) + 1  # stops right after the stop token when every row is done
    assert bool(steps[-1][1].all())


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    model = model_for("diff_v1")
    cfg = dict(max_new_tokens=12, temperature=1.0, top_k=20, top_p=0.9)
    a = generate(model, [[1, 2], [3]], SamplingConfig(seed=123, **cfg)).tokens
    b = generate(model, [[1, 2], [3]], SamplingConfig(seed=123, **cfg)).tokens
    c = generate(model, [[1, 2], [3]], SamplingConfig(seed=124, **cfg)).tokens
    assert a == b and a != c


def test_filter_logits_top_k_and_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).log_softmax(-1)
    k2 = filter_logits(logits, top_k=2, top_p=None)
    assert torch.isfinite(k2).tolist() == [[True, True, False, False, False]]
    probs = logits.exp()[0]
    # top_p just above the first token's mass keeps two tokens; exactly the first two's mass keeps two as well
    p = filter_logits(logits, top_k=None, top_p=float(probs[0]) + 1e-4)
    assert torch.isfinite(p).tolist() == [[True, True, False, False, False]]
    p1 = filter_logits(logits, top_k=None, top_p=float(probs[0]) * 0.5)
    assert torch.isfinite(p1).tolist() == [[True, False, False, False, False]]


def test_sampling_frequencies_follow_the_distribution():
    """The exponential-race draw is a draw from softmax(logits / T): check the empirical frequencies."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(20000, 4)
    g = torch.Generator().manual_seed(0)
    draws = sample_next(logits, SamplingConfig(temperature=1.0), g)
    freq = torch.bincount(draws, minlength=4).double() / draws.numel()
    torch.testing.assert_close(freq, probs.double(), rtol=0, atol=0.015)
    # temperature 0.5 squares the probabilities (renormalised)
    draws = sample_next(logits, SamplingConfig(temperature=0.5), g)
    freq = torch.bincount(draws, minlength=4).double() / draws.numel()
    sq = probs.double() ** 2
    torch.testing.assert_close(freq, sq / sq.sum(), rtol=0, atol=0.015)


@pytest.mark.parametrize("bad, match", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_p=1.5), "top_p"),
])
def test_sampling_config_rejects_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**bad)


def test_generate_rejects_empty_and_too_long_prompts():
    model = model_for("baseline")
    with pytest.raises(ValueError, match="empty"):
        generate(model, [[1], []], SamplingConfig(max_new_tokens=2))
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, [list(range(48))], SamplingConfig(max_new_tokens=2))
    with pytest.raises(ValueError, match="max_new_tokens <= 8"):
        generate(model, [list(range(40))], SamplingConfig(max_new_tokens=9))
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        generate(model, [[70]], SamplingConfig(max_new_tokens=2))


def test_v1_lambda_is_computed_once_per_generation():
    """Under a KV cache (no autograd) V1's lambda comes from the prefill, not from its four vectors at every step: a
    change of the vectors after the prefill does not reach the decode step, and a new cache set-up picks it up."""
    model = model_for("diff_v1")
    ids = torch.randint(0, model.cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.setup_caches(1, 16, dtype=torch.float64)
        model(ids[:, :10], input_pos=torch.arange(10))
        before = model(ids[:, 10:11], input_pos=torch.tensor([10])).logits
        model.layers[0].attn.lambda_q1.add_(0.5)  # lambda changes; the frozen one stays
        model.layers[0].attn.kv_cache.k[:, :, 10:].zero_()
        same = model(ids[:, 10:11], input_pos=torch.tensor([10])).logits
        assert torch.equal(before, same)
        model.setup_caches(1, 16, dtype=torch.float64)  # a new generation: the new lambda
        model(ids[:, :10], input_pos=torch.arange(10))
        after = model(ids[:, 10:11], input_pos=torch.tensor([10])).logits
        model.clear_caches()
        full = model(ids[:, :11]).logits[:, 10:11]
    assert (after - before).abs().max() > 1e-6
    torch.testing.assert_close(after, full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention", VARIANTS)
def test_compiled_decode_step_is_one_graph_for_every_position(attention):
    """The compiled step traces the whole model once (fullgraph: no graph break) and serves every position without a
    recompile: a host read of the position (int(input_pos)) would specialise the graph on it and recompile per
    token until dynamo's limit, then run eager. A counting backend sees the frames; the logits equal eager's."""
    from torch._dynamo.testing import CompileCounter

    from difftransformer.inference.generate import decode_step

    torch._dynamo.reset()
    model = model_for(attention)
    counter = CompileCounter()
    step = torch.compile(decode_step, backend=counter, fullgraph=True, dynamic=False)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 14), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 16, dtype=torch.bool)
    with torch.no_grad():
        model.setup_caches(2, 16, dtype=torch.float64)
        model(ids[:, :8], input_pos=torch.arange(8), attention_mask=mask)
        got = [step(model, ids[:, t:t + 1], torch.tensor([t]), mask) for t in range(8, 14)]
        model.clear_caches()
        full = model(ids).logits[:, 8:14]
    torch._dynamo.reset()
    assert counter.frame_count == 1, f"{counter.frame_count} compiled frames for 6 positions"
    torch.testing.assert_close(torch.stack(got, dim=1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention", VARIANTS)
def test_prefill_from_position_zero_attends_over_the_prompt_only(attention):
    """A cached prefill from position 0 attends over its own T keys, not the cache's length: no mask at all without
    padding (the is_causal kernels), a (T, T) one with it; a later chunk and the decode step see the whole cache.
    Each result equals the full forward."""
    model = model_for(attention)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    ones = torch.ones(2, 20, dtype=torch.bool)
    padded = ones.clone()
    padded[1, :3] = False
    model.setup_caches(2, 20, dtype=torch.float64)
    assert model.build_mask(2, 8, torch.arange(8), ones, ids.device) is None
    assert model.build_mask(2, 8, torch.arange(8), None, ids.device) is None
    assert model.build_mask(2, 8, torch.arange(8), padded, ids.device).shape == (2, 1, 8, 8)
    assert model.build_mask(2, 4, torch.arange(8, 12), ones, ids.device).shape == (2, 1, 4, 20)
    assert model.build_mask(2, 1, torch.tensor([8]), ones, ids.device).shape == (2, 1, 1, 20)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, 20\)"):
        model.build_mask(2, 8, torch.arange(8), ones[:, :8], ids.device)
    model.clear_caches()
    for mask in (ones, padded):
        got = cached_logits(model, ids, mask[:, :12], n_prefill=8)
        full = model(ids, attention_mask=mask[:, :12]).logits
        real = mask[:, :12]
        torch.testing.assert_close(got[real], full[real], rtol=1e-10, atol=1e-10)
