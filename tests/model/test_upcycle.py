"""Baseline -> DIFF V2 with the same function (``model/upcycle.py``): logits equal in float64 on every backend,
KV-head count and tied embeddings, with a KV cache too; the construction is a real V2 model that trains off it."""

from __future__ import annotations

import pytest
import torch

from difftransformer.model.transformer import DiffTransformerLM
from difftransformer.model.upcycle import baseline_to_diff_v2, diff_v2_config_from_baseline
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
