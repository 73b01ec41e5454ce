"""The sdpa path's fused pair combine (``pairs.PairCombine``) against the autograd composition it replaces,
``combine(*split_pairs(o, pairing), lam)``, in float64: values and gradients, both pairings, V2's per-token lambda,
V1's 0-dim lambda and no lambda; and SDPA's GQA (no copied KV heads) against ``repeat_kv``."""

from __future__ import annotations

import pytest
import torch

from difftransformer.model.attention.dispatch import combine, pair_combine, repeat_kv, sdpa, split_pairs

B, H, T, D = 2, 3, 5, 4


def _o(layout: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if layout == "sdpa":  # SDPA's output: (B, T, 2h, d) in memory, seen as (B, 2h, T, d)
        return torch.randn(B, T, 2 * H, D, dtype=torch.float64, generator=g).transpose(1, 2)
    return torch.randn(B, 2 * H, T, D, dtype=torch.float64, generator=g)


def _lam(kind: str):
    if kind == "none":
        return None
    g = torch.Generator().manual_seed(1)
    shape = (B, H, T, 1) if kind == "per_token" else ()
    return torch.rand(shape, dtype=torch.float64, generator=g) + 0.1


@pytest.mark.parametrize("pairing", ["interleaved", "halves"])
@pytest.mark.parametrize("lam_kind", ["per_token", "scalar", "none"])
@pytest.mark.parametrize("layout", ["sdpa", "contiguous"])
def test_pair_combine_matches_the_composition(pairing, lam_kind, layout):
    o, lam = _o(layout).requires_grad_(), _lam(lam_kind)
    if lam is not None:
        lam.requires_grad_()
    o_ref = o.detach().clone().requires_grad_()
    lam_ref = None if lam is None else lam.detach().clone().requires_grad_()
    out = pair_combine(o, lam, pairing)
    ref = combine(*split_pairs(o_ref, pairing), lam_ref)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-15)
    g = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    out.backward(g)
    ref.backward(g)
    assert o.grad is not None and o_ref.grad is not None
    torch.testing.assert_close(o.grad, o_ref.grad, rtol=0, atol=1e-15)
    if lam is not None:
        assert lam.grad is not None and lam_ref is not None and lam_ref.grad is not None
        assert lam.grad.shape == lam.shape
        torch.testing.assert_close(lam.grad, lam_ref.grad, rtol=1e-14, atol=1e-14)
    # a change that drops lambda's sign or the pairing would fail here
    assert not torch.allclose(out, combine(*split_pairs(o_ref.detach(), "halves" if pairing == "interleaved"
                                                          else "interleaved"), lam_ref))


@pytest.mark.parametrize("pairing", ["interleaved", "halves"])
def test_pair_combine_gradcheck(pairing):
    o = _o("sdpa").requires_grad_()
    lam = _lam("per_token").requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: pair_combine(a, b, pairing), (o, lam))
    assert torch.autograd.gradcheck(lambda a: pair_combine(a, None, pairing), (o,))


def test_pair_combine_keeps_the_layout_and_the_dtype():
    o = _o("sdpa").to(torch.bfloat16)
    out = pair_combine(o, _lam("per_token").to(torch.float32), "interleaved")
    assert out.dtype == torch.bfloat16
    assert out.transpose(1, 2).is_contiguous()  # (B, T, h, d) in memory: the caller's reshape is a view


@pytest.mark.parametrize("mask", [False, True])
def test_sdpa_gqa_matches_repeated_kv(mask):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, 4, T, D, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(B, 2, T, D, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(B, 2, T, D, dtype=torch.float64, generator=g, requires_grad=True)
    m = torch.ones(T, T, dtype=torch.bool).tril()[None, None] if mask else None
    out = sdpa(q, k, v, m, 0.5)
    ref = sdpa(q, repeat_kv(k, 2), repeat_kv(v, 2), m, 0.5)
    torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-13)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    refs = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, b in zip(grads, refs):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("lam_shape", [(), (2, 1, 1, 1), (2, 2, 5, 1)])
@pytest.mark.parametrize("value_parts", [2, 1])
def test_sdpa_diff_paired_keys_matches_eager(lam_shape, value_parts):
    """V1's paired-key layout through the stacked SDPA call and the fused combine, against the eager oracle, with a
    scalar lambda and with one per row (values and gradients, float64, GQA: 2 heads over 1 KV group)."""
    from difftransformer.model.attention.dispatch import eager_diff, sdpa_diff

    g = torch.Generator().manual_seed(4)
    h, hkv, d = 2, 1, 4
    q = torch.randn(2, 2 * h, T, d, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(2, 2 * hkv, T, d, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(2, hkv, T, value_parts * d, dtype=torch.float64, generator=g, requires_grad=True)
    lam = (torch.rand(lam_shape, dtype=torch.float64, generator=g) + 0.1).requires_grad_()
    out = sdpa_diff(q, k, v, lam, None, 0.5, "paired", "interleaved")
    ref, _ = eager_diff(q, k, v, lam, None, 0.5, None, "paired", "interleaved", torch.float64, False)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, lam))
    refs = torch.autograd.grad(ref.square().sum(), (q, k, v, lam))
    for a, b in zip(grads, refs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
