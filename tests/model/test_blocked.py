"""blocked_diff_attention against a naive float64 reference of eq. (1) (arXiv 2410.05258), forward and backward."""

from __future__ import annotations

import math

import pytest
import torch

from difftransformer.kernels.blocked import blocked_diff_attention

NAMES = ("q1", "q2", "k1", "k2", "v", "lam")


def reference(q1, q2, k1, k2, v, lam, scale=None):
    """Materialised maps in float64: (softmax(q1 k1^T s + causal) - lam softmax(q2 k2^T s + causal)) v."""
    b, hq, t, d = q1.shape
    r = hq // k1.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k1, k2, v = (x.double().repeat_interleave(r, dim=1) for x in (k1, k2, v))  # (B, Hq, T, .)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)

    def probs(q, k):
        logits = (q.double() @ k.transpose(-1, -2)) * scale
        return logits.masked_fill(future, float("-inf")).softmax(-1)

    return (probs(q1, k1) - lam.double() * probs(q2, k2)) @ v


def make_inputs(b=2, hq=4, hk=2, t=37, d=8, dv=None, lam_kind="scalar", shared_k=False,
                dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    q1, q2 = rnd(b, hq, t, d), rnd(b, hq, t, d)
    k1 = rnd(b, hk, t, d)
    k2 = k1 if shared_k else rnd(b, hk, t, d)
    v = rnd(b, hk, t, dv)
    if lam_kind == "scalar":
        lam = torch.tensor(0.8, dtype=dtype)
    else:  # DIFF V2: per token and head, in (0, 1)
        lam = torch.sigmoid(rnd(b, hq, t, 1))
    return q1, q2, k1, k2, v, lam


def leaves(inputs):
    """Fresh leaf copies requiring grad; keeps k1 is k2 when the inputs share it."""
    q1, q2, k1, k2, v, lam = (x.detach().clone().requires_grad_() for x in (*inputs[:3], inputs[3], *inputs[4:]))
    if inputs[2] is inputs[3]:
        k2 = k1
    return q1, q2, k1, k2, v, lam


def check_against_reference(inputs, block_size, atol=1e-10, rtol=1e-8, scale=None):
    got_in = leaves(inputs)
    ref_in = leaves(inputs)
    out = blocked_diff_attention(*got_in, block_size=block_size, scale=scale)
    ref = reference(*ref_in, scale=scale)
    assert out.shape == ref.shape and out.dtype == inputs[0].dtype
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)

    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out.backward(grad.to(out.dtype))
    ref.backward(grad)
    for name, a, b in zip(NAMES, got_in, ref_in):
        if name == "k2" and got_in[2] is got_in[3]:
            continue  # same leaf as k1, checked there
        assert a.grad is not None, name
        assert a.grad.shape == a.shape and a.grad.dtype == a.dtype, name
        torch.testing.assert_close(a.grad.double(), b.grad, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("hq,hk", [(4, 4), (4, 2), (8, 2)])  # GQA ratios 1, 2, 4
@pytest.mark.parametrize("dv_mult", [1, 2])  # dv == d (DIFF V2) and dv == 2d (DIFF V1)
@pytest.mark.parametrize("lam_kind", ["scalar", "per_token"])
def test_matches_reference(hq, hk, dv_mult, lam_kind):
    inputs = make_inputs(hq=hq, hk=hk, dv=8 * dv_mult, lam_kind=lam_kind)
    check_against_reference(inputs, block_size=16)  # 16 does not divide T = 37


@pytest.mark.parametrize("block_size", [1, 5, 16, 37, 64])  # incl. block == T and block > T
@pytest.mark.parametrize("shared_k", [False, True])
def test_block_sizes_and_shared_keys(block_size, shared_k):
    inputs = make_inputs(hq=4, hk=2, lam_kind="per_token", shared_k=shared_k)
    check_against_reference(inputs, block_size=block_size)


def test_diff_v2_shape_shared_keys_gqa():
    # DIFF V2: k1 is k2, dv == d, per-token lambda, GQA ratio 2; the shared key gets both maps' gradients.
    inputs = make_inputs(b=1, hq=4, hk=2, t=40, d=16, lam_kind="per_token", shared_k=True)
    check_against_reference(inputs, block_size=8)


def test_custom_scale_and_broadcast_lambda():
    q1, q2, k1, k2, v, _ = make_inputs(hq=4, hk=4, t=21)
    lam = torch.rand(1, 4, 1, 1, dtype=torch.float64)  # per head only: its gradient keeps this shape
    check_against_reference((q1, q2, k1, k2, v, lam), block_size=8, scale=0.3)


def test_gradcheck_tiny():
    inputs = leaves(make_inputs(b=1, hq=2, hk=1, t=7, d=3, dv=4, lam_kind="per_token"))
    assert torch.autograd.gradcheck(lambda *x: blocked_diff_attention(*x, block_size=3), inputs)


def test_gradcheck_scalar_lambda_shared_k():
    q1, q2, k, _, v, lam = leaves(make_inputs(b=1, hq=2, hk=2, t=6, d=3, dv=6, lam_kind="scalar"))
    assert torch.autograd.gradcheck(lambda q1, q2, k, v, lam: blocked_diff_attention(q1, q2, k, k, v, lam,
                                                                                      block_size=4),
                                    (q1, q2, k, v, lam))


def test_inputs_without_grad():
    q1, q2, k1, k2, v, lam = make_inputs(hq=4, hk=2, lam_kind="scalar")
    q1 = q1.requires_grad_()
    v = v.requires_grad_()
    out = blocked_diff_attention(q1, q2, k1, k2, v, lam, block_size=16)
    out.sum().backward()
    ref_q1, ref_v = q1.detach().clone().requires_grad_(), v.detach().clone().requires_grad_()
    reference(ref_q1, q2, k1, k2, ref_v, lam).sum().backward()
    torch.testing.assert_close(q1.grad, ref_q1.grad)
    torch.testing.assert_close(v.grad, ref_v.grad)
    assert k1.grad is None and lam.grad is None

    lam_only = lam.clone().requires_grad_()  # only lambda needs a gradient
    blocked_diff_attention(q1.detach(), q2, k1, k2, v.detach(), lam_only, block_size=16).sum().backward()
    ref_lam = lam.clone().requires_grad_()
    reference(q1.detach(), q2, k1, k2, v.detach(), ref_lam).sum().backward()
    torch.testing.assert_close(lam_only.grad, ref_lam.grad)


def test_no_grad_forward():
    inputs = make_inputs(hq=4, hk=2, lam_kind="per_token")
    with torch.no_grad():
        out = blocked_diff_attention(*inputs, block_size=16)
    torch.testing.assert_close(out, reference(*inputs))


def test_noncontiguous_inputs():
    # Callers pass strided views (e.g. q[:, 0::2], k[:, 1::2] of one projection).
    q1, q2, k1, k2, v, lam = make_inputs(hq=4, hk=2, t=19, lam_kind="per_token")
    q = torch.stack((q1, q2), dim=2).flatten(1, 2)  # (B, 2Hq, T, d), pairs interleaved
    k = torch.stack((k1, k2), dim=2).flatten(1, 2)
    views = (q[:, 0::2], q[:, 1::2], k[:, 0::2], k[:, 1::2], v.transpose(2, 3).contiguous().transpose(2, 3), lam)
    torch.testing.assert_close(blocked_diff_attention(*views, block_size=8), reference(q1, q2, k1, k2, v, lam))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lam_kind", ["scalar", "per_token"])
def test_low_precision_close_to_float64(dtype, lam_kind):
    inputs = make_inputs(b=1, hq=4, hk=2, t=70, d=16, dv=32, lam_kind=lam_kind)
    lam_dtype = torch.float32  # DIFF V1 keeps lambda in fp32; V2 gets it in the activations' dtype
    low = [x.to(dtype) for x in inputs[:5]] + [inputs[5].to(lam_dtype if lam_kind == "scalar" else dtype)]
    low = leaves(low)
    out = blocked_diff_attention(*low, block_size=32)
    assert out.dtype == dtype
    ref_in = leaves(inputs)
    ref = reference(*ref_in)
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(out.double(), ref, **tol)
    out.double().pow(2).sum().backward()
    ref.pow(2).sum().backward()
    gtol = dict(atol=1e-4, rtol=1e-3) if dtype == torch.float32 else dict(atol=1.5e-1, rtol=1e-1)
    for name, a, b in zip(NAMES, low, ref_in):
        assert a.grad.dtype == a.dtype, name
        torch.testing.assert_close(a.grad.double(), b.grad, **gtol, msg=lambda m: f"{name}: {m}")


def test_bf16_forward_close_to_fp32():
    inputs = make_inputs(b=2, hq=4, hk=4, t=64, d=32, dv=64, lam_kind="per_token", dtype=torch.float32)
    out32 = blocked_diff_attention(*inputs, block_size=16)
    out16 = blocked_diff_attention(*(x.bfloat16() for x in inputs), block_size=16)
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.float(), out32, atol=3e-2, rtol=3e-2)


def test_memory_is_blocked():
    # The workspace holds (block x T) slabs; a T x T tensor would be 64x larger here.
    inputs = make_inputs(b=1, hq=2, hk=2, t=512, d=8, lam_kind="scalar", dtype=torch.float32)
    out = blocked_diff_attention(*inputs, block_size=8)
    assert out.shape == (1, 2, 512, 8)


@pytest.mark.parametrize("bad, match", [
    (dict(q2=torch.zeros(2, 4, 37, 9)), "q2"),
    (dict(k1=torch.zeros(2, 3, 37, 8)), "k1"),
    (dict(k1=torch.zeros(2, 2, 36, 8)), "k1"),
    (dict(k2=torch.zeros(2, 2, 37, 7)), "k2"),
    (dict(v=torch.zeros(2, 2, 30, 8)), "v"),
    (dict(lam=torch.zeros(2, 4, 37, 2)), "lam"),
    (dict(lam=torch.zeros(3, 1, 1, 1)), "lam"),
    (dict(q1=torch.zeros(4, 37, 8)), "q1"),
    (dict(block_size=0), "block_size"),
])
def test_validation(bad, match):
    kwargs = dict(zip(NAMES, make_inputs(hq=4, hk=2, dtype=torch.float32)))
    kwargs.update(block_size=16)
    kwargs.update(bad)
    block_size = kwargs.pop("block_size")
    with pytest.raises(ValueError, match=match):
        blocked_diff_attention(*(kwargs[n] for n in NAMES), block_size=block_size)
