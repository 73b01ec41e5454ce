"""Baseline -> DIFF V2 / DIFF V1 (per_head layout) with the same function (``model/upcycle.py``): logits equal in
float64 on every backend, KV-head counts (odd too) and tied embeddings, with a KV cache too; the constructions are
real DIFF models that train off the copied point (V1: not the zero-initialised saddle)."""

from __future__ import annotations

import pytest
import torch

from difftransformer.model.transformer import DiffTransformerLM
from difftransformer.model.upcycle import (baseline_to_diff_v1, baseline_to_diff_v2, convert,
                                           diff_v1_config_from_baseline, diff_v2_config_from_baseline, step0_gap,
                                           targets)
from suite_helpers import tiny_model_config


def _random_baseline(**changes) -> DiffTransformerLM:
    torch.manual_seed(0)
    m = DiffTransformerLM(tiny_model_config("baseline", **changes)).double().eval()
    with torch.no_grad():
        for p in m.parameters():  # away from init, so that equality is not an accident of small weights
            p.add_(torch.randn_like(p) * 0.1)
    return m


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("tie", [False, True])
def test_converted_v2_computes_the_baseline_function(backend, n_kv_heads, tie):
    base = _random_baseline(n_kv_heads=n_kv_heads, tie_embeddings=tie, backend=backend)
    v2 = baseline_to_diff_v2(base)
    assert v2.cfg.attention == "diff_v2" and v2.cfg.n_heads == base.cfg.n_heads
    ids = torch.randint(0, base.cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    want, got = base(ids).logits, v2(ids).logits
    assert want.abs().max() > 1.0
    assert (want - got).abs().max() <= 1e-10
    # the extra parameters are the second query of each pair and W_lambda, per layer
    c = base.cfg
    assert v2.num_parameters() - base.num_parameters() == c.n_layers * (c.n_heads * c.head_dim + c.n_heads) * c.d_model
    if tie:
        assert v2.output.weight is v2.tok_embeddings.weight


@pytest.mark.parametrize("v2_lambda", ["sigmoid", "raw"])
def test_both_lambda_forms_and_the_kv_cache(v2_lambda):
    base = _random_baseline()
    v2 = baseline_to_diff_v2(base, v2_lambda)
    ids = torch.randint(0, base.cfg.vocab_size, (1, 24), generator=torch.Generator().manual_seed(2))
    want = base(ids).logits
    v2.setup_caches(1, 32, dtype=torch.float64)
    pre = v2(ids[:, :20], input_pos=torch.arange(20)).logits
    steps = [v2(ids[:, t:t + 1], input_pos=torch.tensor([t])).logits for t in range(20, 24)]
    got = torch.cat([pre, *steps], dim=1)
    assert (want - got).abs().max() <= 1e-10


def test_training_moves_off_the_copied_point():
    """The pair's two queries get gradients g and -g/2 (they separate), and W_lambda's gradient is not zero."""
    base = _random_baseline()
    v2 = baseline_to_diff_v2(base).train()
    ids = torch.randint(0, base.cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(3))
    v2(ids[:, :-1], targets=ids[:, 1:]).loss.backward()
    attn = v2.layers[0].attn
    H, d = v2.cfg.n_heads, v2.cfg.head_dim
    g = attn.wq.weight.grad.view(H, 2, d, -1)
    assert g[:, 0].abs().max() > 0
    torch.testing.assert_close(g[:, 1], -0.5 * g[:, 0], rtol=1e-9, atol=1e-12)
    assert attn.wlambda.weight.grad.abs().max() > 0


def test_refusals():
    base = _random_baseline()
    with pytest.raises(ValueError, match="v2_lambda='none'"):
        baseline_to_diff_v2(base, "none")
    v1 = DiffTransformerLM(tiny_model_config("diff_v1"))
    with pytest.raises(ValueError, match="only a baseline"):
        baseline_to_diff_v2(v1)
    with pytest.raises(TypeError, match="DiffTransformerLM"):
        baseline_to_diff_v2(torch.nn.Linear(2, 2))
    assert diff_v2_config_from_baseline(base.cfg).v2_pairing == "interleaved"


# ---------------------------------------------------------------- DIFF V1, per_head layout
@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 1), (4, 2), (4, 4), (6, 3)])  # odd KV heads: per_head allows
@pytest.mark.parametrize("tie", [False, True])
def test_converted_v1_computes_the_baseline_function(backend, n_heads, n_kv_heads, tie):
    base = _random_baseline(n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=8, tie_embeddings=tie, backend=backend)
    v1 = baseline_to_diff_v1(base)
    c = base.cfg
    assert (v1.cfg.attention, v1.cfg.v1_layout, v1.cfg.n_heads) == ("diff_v1", "per_head", c.n_heads)
    ids = torch.randint(0, c.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    want = base(ids).logits
    assert want.abs().max() > 1.0
    assert step0_gap(base, v1, ids) <= 1e-10
    # a second query and key map per head and the four lambda vectors, per layer
    assert v1.num_parameters() - base.num_parameters() == c.n_layers * (
        (c.n_heads + c.n_kv_heads) * c.head_dim * c.d_model + 4 * c.head_dim)
    if tie:
        assert v1.output.weight is v1.tok_embeddings.weight
    # the negative branch at full weight (no warm-up) and the head-wise norm do change the function
    v1.set_negative_weight(1.0)
    assert step0_gap(base, v1, ids) > 1e-2
    assert step0_gap(base, baseline_to_diff_v1(base, headwise_norm=True), ids) > 1e-2


@pytest.mark.parametrize("w", [0.0, 0.6])
def test_v1_kv_cache_follows_the_full_forward(w):
    base = _random_baseline(n_kv_heads=2)
    v1 = baseline_to_diff_v1(base)
    v1.set_negative_weight(w)
    ids = torch.randint(0, base.cfg.vocab_size, (1, 24), generator=torch.Generator().manual_seed(2))
    want = v1(ids).logits
    v1.setup_caches(1, 32, dtype=torch.float64)
    pre = v1(ids[:, :20], input_pos=torch.arange(20)).logits
    steps = [v1(ids[:, t:t + 1], input_pos=torch.tensor([t])).logits for t in range(20, 24)]
    assert (want - torch.cat([pre, *steps], dim=1)).abs().max() <= 1e-10
    if w == 0.0:
        assert (base(ids).logits - want).abs().max() <= 1e-10


def test_v1_negative_branch_learns_once_warmed_up():
    """At weight 0 nothing reaches the negative branch; above 0 its queries, keys and lambda get gradients. With
    zero-initialised Q2 and K2 (the saddle the random start avoids) they would get none at any weight."""
    base = _random_baseline(n_kv_heads=2)
    ids = torch.randint(0, base.cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(3))

    def grads(model, w):
        model.zero_grad()
        model.set_negative_weight(w)
        model(ids[:, :-1], targets=ids[:, 1:]).loss.backward()
        a = model.layers[0].attn
        d, h, hkv = a.head_dim, a.n_heads, a.n_kv_heads
        return (a.wq.weight.grad.view(h, 2, d, -1)[:, 1], a.wk.weight.grad.view(hkv, 2, d, -1)[:, 1],
                a.lambda_q1.grad)

    v1 = baseline_to_diff_v1(base).train()
    assert all(g.abs().max() == 0 for g in grads(v1, 0.0))
    assert all(g.abs().max() > 0 for g in grads(v1, 0.3))
    with torch.no_grad():  # the saddle: Q2 = K2 = 0
        for name, heads in (("wq", v1.layers[0].attn.n_heads), ("wk", v1.layers[0].attn.n_kv_heads)):
            getattr(v1.layers[0].attn, name).weight.view(heads, 2, v1.cfg.head_dim, -1)[:, 1] = 0
    gq, gk, _ = grads(v1, 0.3)
    assert gq.abs().max() == 0 and gk.abs().max() == 0


def test_v1_conversion_is_seeded_and_refuses_what_it_cannot_convert():
    base = _random_baseline()
    a, b, c = baseline_to_diff_v1(base, seed=0), baseline_to_diff_v1(base, seed=0), baseline_to_diff_v1(base, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["layers.0.attn.wq.weight"], sc["layers.0.attn.wq.weight"])
    with pytest.raises(ValueError, match="only a baseline"):
        baseline_to_diff_v1(a)
    with pytest.raises(TypeError, match="headwise_norm"):
        baseline_to_diff_v1(base, headwise_norm="yes")


def test_convert_is_the_one_entry_point():
    """convert(model or config, attention): the conversion between the two classes, identity for the same
    variant, and one ValueError naming the conversions there are for any other pair."""
    base = _random_baseline()
    ids = torch.randint(0, base.cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(5))
    for name, direct in (("diff_v2", baseline_to_diff_v2(base, "raw")), ("diff_v1", baseline_to_diff_v1(base, seed=3))):
        via = convert(base, name, v2_lambda="raw", seed=3)
        assert via.cfg == direct.cfg and torch.equal(via(ids).logits, direct(ids).logits)
        assert convert(base.cfg, name, v2_lambda="raw") == direct.cfg  # the config alone converts too
        assert convert(via, name) is via and convert(via.cfg, name) is via.cfg  # already that variant
    assert convert(base, "baseline") is base
    assert convert(base.cfg, "diff_v1", headwise_norm=True) == diff_v1_config_from_baseline(base.cfg, True)
    assert targets(base.cfg) == ("baseline", "diff_v1", "diff_v2")
    v2 = convert(base.cfg, "diff_v2")
    assert targets(v2) == ("diff_v2",)
    for cfg, to in ((v2, "diff_v1"), (v2, "baseline"), (convert(base.cfg, "diff_v1"), "diff_v2")):
        with pytest.raises(ValueError, match=rf"attention='{to}' is not a conversion of a {cfg.attention} model .*"
                                             r"only baseline -> diff_v1 or diff_v2, or a variant to itself"):
            convert(cfg, to)
    with pytest.raises(ValueError, match="'nope' is not allowed; choose one of baseline, diff_v1, diff_v2"):
        convert(base, "nope")
    with pytest.raises(TypeError, match="DiffTransformerLM or a ModelConfig"):
        convert(base.state_dict(), "diff_v2")
