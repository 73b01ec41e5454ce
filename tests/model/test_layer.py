"""The public layer ``DiffAttention`` against the float64 oracle written from the equations (causal and
bidirectional, self and cross-attention, key padding, RoPE on and off, GQA), against timm's ``DiffAttention`` given
the same weights (DIFF V1, bidirectional), against our language model's own attention, cached decoding against the
full forward, torch.compile(fullgraph=True) against eager, and its refusals."""

from __future__ import annotations

import math

import attention_reference as ref
import pytest
import torch

from difftransformer import DiffAttention, DiffTransformerLM, ModelConfig
from difftransformer.bench.layer import timm_diff_attention  # timm's layer without timm's __init__ (torchvision)
from difftransformer.model.rope import rope_cos_sin, rope_frequencies

VARIANTS = ("baseline", "diff_v1", "diff_v2")
D_MODEL, N_HEADS, HEAD_DIM = 32, 4, 8


# ---------------------------------------------------------------------------------------------- the oracle
def oracle(layer: DiffAttention, x: torch.Tensor, context=None, kpm=None, allowed=None, bias=None) -> torch.Tensor:
    """The layer's output head by head from the equations, sharing no code with the package: queries from x, keys
    and values from ``context`` (x itself for self-attention), query t sees key s when (s <= t if causal), kpm[b, s]
    (True: a real key) and allowed[b, i, t, s] (output head i, or 0 where that axis is 1), logits plus bias[b, i, t, s]
    (the same broadcast); a self-attention row that sees no key sees itself; RoPE at positions 0.. of each sequence.
    One mask serves both softmax maps of a differential head."""
    core, cfg = layer.core, layer.cfg
    kv = x if context is None else context
    B, T, _ = x.shape
    S = kv.shape[1]
    rope_on = layer.rope if layer.rope is not None else context is None
    rot = ref.rope if rope_on else (lambda t: t)
    H, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * layer.layer_idx)

    def pick(m, b, i):
        return None if m is None else m[b if m.shape[0] > 1 else 0, i if m.shape[1] > 1 else 0]

    def vis_of(b, i):
        vis = torch.ones(T, S, dtype=torch.bool)
        if layer.causal:
            vis = vis.tril()
        if kpm is not None:
            vis = vis & kpm[b][None, :]
        if allowed is not None:
            vis = vis & pick(allowed, b, i)
        bb = pick(bias, b, i)
        if context is None:
            seen = vis if bb is None else vis & (bb > float("-inf"))
            empty = ~seen.any(-1)
            vis = vis.clone()
            vis[empty, empty.nonzero().flatten()] = True
            if bb is not None:
                bb = bb.clone()
                bb[empty, empty.nonzero().flatten()] = 0.0
        return vis, bb

    def attn(q, k, b, i):
        vis, bb = vis_of(b, i)
        logits = q @ k.T / math.sqrt(q.shape[-1])
        if bb is not None:
            logits = logits + bb
        return torch.softmax(logits.masked_fill(~vis, float("-inf")), dim=-1)

    outs = []
    for b in range(B):
        xb, cb, heads = x[b], kv[b], []
        if layer.variant == "baseline":
            for i in range(H):
                g = i // (H // Hkv)
                q, k = rot(xb @ ref.rows(core.wq.weight, i, d).T), rot(cb @ ref.rows(core.wk.weight, g, d).T)
                heads.append(attn(q, k, b, i) @ (cb @ ref.rows(core.wv.weight, g, d).T))
        elif layer.variant == "diff_v1":  # eq. (1)-(3): h = H/2 heads, Q1/Q2 and K1/K2 half-heads, a 2d-wide value
            h, hkv = H // 2, Hkv // 2
            lam = torch.exp((core.lambda_q1 * core.lambda_k1).sum()) - torch.exp(
                (core.lambda_q2 * core.lambda_k2).sum()) + lam_init
            for i in range(h):
                g = i // (h // hkv)
                a = [attn(rot(xb @ ref.rows(core.wq.weight, 2 * i + s, d).T),
                          rot(cb @ ref.rows(core.wk.weight, 2 * g + s, d).T), b, i) for s in (0, 1)]
                head = (a[0] - lam * a[1]) @ (cb @ ref.rows(core.wv.weight, g, 2 * d).T)
                if core.subln is not None:
                    head = ref.rms(head) * (core.subln.weight if core.subln.weight is not None else 1.0)
                heads.append((1 - lam_init) * head)
        else:  # DIFF V2: query heads 2i, 2i+1 over KV head (2i) // (2H / H_kv); lambda = sigmoid(x W_lambda)
            for i in range(H):
                g = 2 * i // (2 * H // Hkv)
                k, v = rot(cb @ ref.rows(core.wk.weight, g, d).T), cb @ ref.rows(core.wv.weight, g, d).T
                a = [attn(rot(xb @ ref.rows(core.wq.weight, j, d).T), k, b, i) @ v for j in (2 * i, 2 * i + 1)]
                heads.append(a[0] - torch.sigmoid(xb @ core.wlambda.weight[i])[:, None] * a[1])
        out = torch.cat(heads, -1) @ core.wo.weight.T
        outs.append(out if core.wo.bias is None else out + core.wo.bias)
    return torch.stack(outs)


def make(variant: str, *, n_kv_heads: int = N_HEADS, seed: int = 0, **kw) -> DiffAttention:
    torch.manual_seed(seed)
    layer = DiffAttention(D_MODEL, N_HEADS, variant, n_kv_heads=n_kv_heads, head_dim=HEAD_DIM, layer_idx=2,
                          **kw).double()
    with torch.no_grad():  # a norm weight away from 1, so that the tests see it
        for name, p in layer.named_parameters():
            if "subln" in name:
                p.uniform_(0.5, 1.5)
    return layer


def grads(layer: DiffAttention, fn, *inputs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """fn's output and the gradients of a fixed random weighting of it: every parameter and every input."""
    layer.zero_grad()
    ins = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*ins)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    (out * w).sum().backward()
    g = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    g.update({f"input{i}": t.grad.clone() for i, t in enumerate(ins)})
    return out.detach(), g


def assert_same(a, b, tol=1e-10):
    (oa, ga), (ob, gb) = a, b
    torch.testing.assert_close(oa, ob, rtol=tol, atol=tol)
    assert ga.keys() == gb.keys()
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=tol, atol=tol, msg=lambda m, k=k: f"gradient {k}: {m}")


def padding(B: int, S: int) -> torch.Tensor:
    kpm = torch.ones(B, S, dtype=torch.bool)
    kpm[0, :3] = False  # left padding
    kpm[-1, -2:] = False  # right padding
    return kpm


# ---------------------------------------------------------------------------------------------- self-attention
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("variant", VARIANTS)
def test_self_attention_matches_the_oracle(variant, causal, padded, n_kv_heads, backend):
    layer = make(variant, n_kv_heads=n_kv_heads, causal=causal, backend=backend)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    kpm = padding(2, 9) if padded else None
    assert_same(grads(layer, lambda t: layer(t, key_padding_mask=None if kpm is None else ~kpm), x),
                grads(layer, lambda t: oracle(layer, t, kpm=kpm), x))


@pytest.mark.parametrize("variant", VARIANTS)
def test_rope_off_is_the_callers_position_scheme(variant):
    """rope=False: no rotation, so a bidirectional layer is permutation-equivariant (a ViT adds its own positions)."""
    layer = make(variant, causal=False, rope=False)
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    assert_same(grads(layer, layer, x), grads(layer, lambda t: oracle(layer, t), x))
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(layer(x[:, perm]), layer(x)[:, perm], rtol=1e-12, atol=1e-12)
    with_rope = make(variant, causal=False)
    assert not torch.allclose(with_rope(x[:, perm]), with_rope(x)[:, perm])  # RoPE: positions matter


# ---------------------------------------------------------------------------------------------- cross-attention
@pytest.mark.parametrize("rope", [None, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_cross_attention_matches_the_oracle(variant, padded, rope):
    layer = make(variant, n_kv_heads=2, causal=False, rope=rope, backend="sdpa")
    x, c = torch.randn(2, 5, D_MODEL, dtype=torch.float64), torch.randn(2, 11, D_MODEL, dtype=torch.float64)
    kpm = padding(2, 11) if padded else None
    assert_same(grads(layer, lambda a, b: layer(a, context=b, key_padding_mask=None if kpm is None else ~kpm), x, c),
                grads(layer, lambda a, b: oracle(layer, a, context=b, kpm=kpm), x, c))


# ---------------------------------------------------------------------------------------------- against timm
def ours_from_timm(t, dim: int, heads: int, depth: int) -> DiffAttention:
    """Our layer with timm's weights: timm's ``num_heads`` are DIFF V1's h differential heads (our n_heads = 2h);
    its fused qkv splits into W_q, W_k, W_v in that order, with the same head layout (half-heads 2i, 2i+1 = Q1, Q2)."""
    ours = DiffAttention(dim, 2 * heads, "diff_v1", causal=False, rope=False, layer_idx=depth).to(t.qkv.weight.dtype)
    wq, wk, wv = t.qkv.weight.detach().chunk(3, dim=0)
    sd = {"wq.weight": wq, "wk.weight": wk, "wv.weight": wv, "wo.weight": t.proj.weight,
          "subln.weight": t.sub_norm.weight, **{f"lambda_{n}": getattr(t, f"lambda_{n}") for n in ("q1", "k1", "q2", "k2")}}
    ours.load_state_dict({**{k: v.detach().clone() for k, v in sd.items()}, "_extra_state": ours.get_extra_state()})
    return ours


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.float32, 2e-5)])
def test_equals_timm_diff_attention(fused, dtype, tol):
    """timm's DIFF V1 layer (bidirectional, no RoPE, no biases) and ours, forward and every gradient. In float64 the
    tolerance is float32's: timm rounds lambda to float32 (``_compute_lambda``'s ``.float()``; ours keeps float64),
    measured 4e-8 apart; float64 throughout would agree to 1e-10 (the oracle tests)."""
    Timm = timm_diff_attention()
    torch.manual_seed(0)
    t = Timm(48, num_heads=3, qkv_bias=False, proj_bias=False, depth=3).to(dtype)
    t.fused_attn = fused
    with torch.no_grad():
        t.sub_norm.weight.uniform_(0.5, 1.5)
    ours = ours_from_timm(t, 48, 3, 3)
    x = torch.randn(2, 13, 48, dtype=dtype)
    (o1, g1), (o2, g2) = grads(t, t, x), grads(ours, ours, x)
    torch.testing.assert_close(o2, o1, rtol=tol, atol=tol)
    names = {"qkv.weight": None, "proj.weight": "wo.weight", "sub_norm.weight": "subln.weight", "input0": "input0",
             **{f"lambda_{n}": f"lambda_{n}" for n in ("q1", "k1", "q2", "k2")}}
    for tn, on in names.items():
        mine = torch.cat([g2[f"w{p}.weight"] for p in "qkv"]) if on is None else g2[on]
        torch.testing.assert_close(mine, g1[tn], rtol=tol, atol=tol, msg=lambda m, tn=tn: f"gradient {tn}: {m}")


# ---------------------------------------------------------------------------------------------- our model
@pytest.mark.parametrize("variant", VARIANTS)
def test_equals_the_models_own_attention(variant):
    """A DiffTransformerLM layer's attention is the layer's own module (the same class): its state dict loads as is,
    and so does the same state dict under the names of before (``core.*``); the outputs agree bit for bit (the
    model's RoPE tables and causal path)."""
    cfg = ModelConfig(vocab_size=32, d_model=D_MODEL, n_layers=3, n_heads=N_HEADS, n_kv_heads=2, attention=variant)
    torch.manual_seed(0)
    model = DiffTransformerLM(cfg).double()
    attn = model.layers[2].attn
    layer = DiffAttention(D_MODEL, N_HEADS, variant, n_kv_heads=2, layer_idx=2).double()
    assert isinstance(layer, type(attn))
    for names in ("{}", "core.{}"):  # today's names, and those of a layer saved before it was the variant's module
        with pytest.warns(UserWarning, match="no _extra_state"):  # a model layer's state: nothing says its layer_idx
            missing = layer.load_state_dict({names.format(k): v for k, v in attn.state_dict().items()}, strict=True)
        assert not missing.missing_keys and not missing.unexpected_keys
    x = torch.randn(2, 10, D_MODEL, dtype=torch.float64)
    rope = rope_cos_sin(torch.arange(10), rope_frequencies(cfg.head_dim, cfg.rope_theta))
    torch.testing.assert_close(layer(x), attn(x, rope, None)[0], rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- cache, compile
@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decode_equals_the_full_forward(variant):
    layer = make(variant, n_kv_heads=2)
    x = torch.randn(2, 12, D_MODEL, dtype=torch.float64)
    full = layer(x)
    layer.setup_cache(2, 16)
    steps = [layer(x[:, :5], positions=torch.arange(5))]  # the prompt, then one token at a time
    steps += [layer(x[:, t:t + 1], positions=torch.tensor([t])) for t in range(5, 12)]
    layer.reset_cache()
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("variant", VARIANTS)
def test_compile_fullgraph_equals_eager(variant, causal):
    """One graph (fullgraph: a break raises), run as traced (a counting backend), forward and every gradient."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    layer = make(variant, causal=causal)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    kpm = padding(2, 9)
    counter = CompileCounter()
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    for kw in ({}, {"key_padding_mask": ~kpm}):
        assert_same(grads(layer, lambda t, kw=kw: compiled(t, **kw), x),
                    grads(layer, lambda t, kw=kw: layer(t, **kw), x), tol=1e-12)
    torch._dynamo.reset()
    assert counter.frame_count >= 1


def test_compile_inductor_runs_the_layer():
    """The default compiler (inductor) on one variant: what a user's torch.compile(model) does."""
    torch._dynamo.reset()
    layer = make("diff_v2", causal=False).float()
    x = torch.randn(2, 9, D_MODEL)
    torch.testing.assert_close(torch.compile(layer, fullgraph=True)(x), layer(x), rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


def test_every_tensor_is_made_on_the_inputs_device():
    """Built and run on the meta device: any tensor the layer made on the CPU (a mask, positions, RoPE tables)
    would meet the meta input and raise."""
    for variant in VARIANTS:
        for causal in (True, False):
            with torch.device("meta"):
                layer = DiffAttention(D_MODEL, N_HEADS, variant, causal=causal)
                x = torch.empty(2, 6, D_MODEL)
                kpm = torch.zeros(2, 6, dtype=torch.bool)
            assert layer(x).device.type == "meta"
            assert layer(x, key_padding_mask=kpm).device.type == "meta"
            if not causal:
                assert layer(x, context=torch.empty(2, 4, D_MODEL, device="meta")).device.type == "meta"


# ---------------------------------------------------------------------------------------------- arguments
def test_parameter_matched_at_the_same_arguments():
    n = {v: sum(p.numel() for p in DiffAttention(64, 4, v).parameters()) for v in VARIANTS}
    assert n["baseline"] == 4 * 64 * 64  # W_q, W_k, W_v, W_o
    assert n["diff_v1"] == n["baseline"] + 4 * 16 + 32  # + the four lambda vectors (d) + the head-wise norm (2d)
    assert n["diff_v2"] == n["baseline"] + 64 * 64 + 64 * 4  # + the doubled query heads and W_lambda


@pytest.mark.parametrize("kwargs,match", [
    (dict(variant="diff_v3"), "variant='diff_v3' is not allowed; choose one of baseline, diff_v1, diff_v2"),
    (dict(causal="yes"), "causal must be True or False"),
    (dict(d_model=64, n_heads=3), "d_model=64 is not divisible by n_heads=3"),
    (dict(d_model="64"), "d_model must be an integer, got str"),
    (dict(d_model=None), "d_model must be an integer, got NoneType"),
    (dict(n_heads=5, head_dim=9, rope=False), "pairs channels even with rope=False"),
    (dict(variant="diff_v2", headwise_norm=False), "headwise_norm=False only applies to diff_v1"),
    (dict(attn_drop=1.0), "attn_drop must be a number in \\[0, 1\\)"),
    (dict(proj_drop=-0.1), "proj_drop must be a number in \\[0, 1\\)"),
    (dict(qkv_bias="no"), "qkv_bias must be True or False"),
    (dict(layer_idx=-1), "layer_idx must be an integer >= 0"),
    (dict(v2_lambda="cosine"), "v2_lambda='cosine' is not allowed"),
    (dict(n_heads=6, variant="diff_v1", n_kv_heads=3), "n_kv_heads=3 must both be even"),
    (dict(n_heads=0), "n_heads must be a positive integer"),
    (dict(n_heads=5, d_model=45), "head_dim=9 must be even"),
    (dict(headwise_normm=True), "unknown argument 'headwise_normm'"),
])
def test_bad_arguments_are_one_error_naming_the_field(kwargs, match):
    args = dict(d_model=48, n_heads=4, variant="diff_v2") | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        DiffAttention(**args)


def test_bad_calls_are_one_error_naming_the_argument():
    layer = DiffAttention(32, 4, "diff_v1")
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match=r"x must be \(B, T, 32\)"):
        layer(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=r"context= .* needs causal=False"):
        layer(x, context=x)
    with pytest.raises(ValueError, match="key_padding_mask must be a bool tensor"):
        layer(x, key_padding_mask=torch.ones(2, 5))
    cross = DiffAttention(32, 4, "diff_v1", causal=False)
    with pytest.raises(ValueError, match="masks every context key of a row"):
        cross(x, context=x, key_padding_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions must be integer positions"):
        layer(x, positions=torch.arange(4))
    layer.setup_cache(2, 8)
    with pytest.raises(ValueError, match="under a KV cache, positions="):
        layer(x)
    with pytest.raises(ValueError, match="a KV cache is for causal self-attention"):
        cross.setup_cache(2, 8)


@pytest.mark.parametrize("variant", VARIANTS)
def test_positions_per_row(variant):
    """positions (B, T): each row its own RoPE positions; a row shifted by k equals the layer at positions k.. for
    that row alone (bidirectional: RoPE is relative, so a common shift changes nothing either)."""
    layer = make(variant, causal=False)
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    pos = torch.stack([torch.arange(7), torch.arange(7) + 5])
    both = layer(x, positions=pos)
    torch.testing.assert_close(both[1:], layer(x[1:], positions=torch.arange(5, 12)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(both, layer(x), rtol=1e-10, atol=1e-10)  # relative positions: a shift is invisible
    uneven = torch.stack([torch.arange(7), torch.arange(7) * 2])
    assert not torch.allclose(layer(x, positions=uneven)[1], both[1])  # but a stretch is not
