"""Every variant and backend against the naive float64 reference (forward and every gradient), GQA 1/2/4,
with and without a padding mask; plus lambda, pairing and causality checks."""

from __future__ import annotations

import math

import pytest
import torch

import attention_reference as ref
from difftransformer.model.attention import build_attention
from difftransformer.model.config import ModelConfig
from difftransformer.model.rope import rope_cos_sin, rope_frequencies

VARIANTS = ("baseline", "diff_v1", "diff_v2", "diff_v1_per_head")
# "diff_v1_per_head": DIFF V1 with v1_layout="per_head" (H heads, d-wide values), negative branch at weight 0.7.
BACKENDS = ("eager", "sdpa", "blocked")
D_MODEL, N_HEADS, HEAD_DIM, T = 32, 4, 8, 11


def make(attention: str, n_kv_heads: int, backend: str = "eager", layer_idx: int = 2, **opts):
    torch.manual_seed(0)
    per_head = attention == "diff_v1_per_head"
    if per_head:
        attention, opts = "diff_v1", {**opts, "v1_layout": "per_head"}
    cfg = ModelConfig(vocab_size=16, d_model=D_MODEL, n_layers=4, n_heads=N_HEADS, n_kv_heads=n_kv_heads,
                      head_dim=HEAD_DIM, attention=attention, backend=backend, **opts)
    mod = build_attention(cfg, layer_idx).double()
    with torch.no_grad():  # non-trivial norm weights, so the tests see them
        for name, p in mod.named_parameters():
            if "subln" in name:
                p.uniform_(0.5, 1.5)
    if per_head:
        mod.set_negative_weight(0.7)
    return mod


def run_module(mod, x, pad):
    B, T_ = x.shape[:2]
    rope = rope_cos_sin(torch.arange(T_), rope_frequencies(HEAD_DIM, 10000.0))
    mask = None
    if pad is not None:
        vis = torch.stack([ref.visible(T_, pad[b]) for b in range(B)])[:, None]  # (B, 1, T, T)
        mask = vis
    out, _ = mod(x, rope, mask)
    return out


def reference(mod, x, pad, layer_idx=2):
    if mod.cfg.attention == "baseline":
        return ref.baseline(mod, x, pad)
    if mod.cfg.attention == "diff_v1":
        return ref.diff_v1(mod, x, layer_idx, pad)
    return ref.diff_v2(mod, x, pad)


def grads_of(mod, x, out_fn, pad, weight):
    mod.zero_grad()
    x = x.detach().clone().requires_grad_(True)
    out = out_fn(mod, x, pad)
    real = torch.ones(out.shape[:2], dtype=torch.bool) if pad is None else pad
    loss = (out * weight)[real].sum()  # padded query rows are undefined by convention: leave them out
    loss.backward()
    g = {n: p.grad.clone() for n, p in mod.named_parameters()}
    g["x"] = x.grad.clone()
    return out[real].detach(), g


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_kv_heads", [4, 2])  # the baseline's KV heads -> GQA ratio 1 and 2 (V1: h=2, h_kv 2/1)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("attention", VARIANTS)
def test_matches_reference_forward_and_backward(attention, n_kv_heads, padded, backend):
    mod = make(attention, n_kv_heads, backend)
    torch.manual_seed(1)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    weight = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    pad = None
    if padded:
        pad = torch.ones(2, T, dtype=torch.bool)
        pad[0, :4] = False  # left padding on the first row
    out, g = grads_of(mod, x, run_module, pad, weight)
    out_ref, g_ref = grads_of(mod, x, reference, pad, weight)
    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-10)
    assert set(g) == set(g_ref)
    for name in g:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-9, atol=1e-10, msg=f"gradient of {name}")


@pytest.mark.parametrize("attention", VARIANTS)
def test_gqa_ratio_4(attention):
    """n_heads=8 over 2 KV heads (baseline ratio 4; V1 4 heads over 1 group; V2 16 queries over 2)."""
    global N_HEADS
    torch.manual_seed(0)
    opts = {"v1_layout": "per_head"} if attention == "diff_v1_per_head" else {}
    cfg = ModelConfig(vocab_size=16, d_model=64, n_layers=1, n_heads=8, n_kv_heads=2, head_dim=8,
                      attention=opts and "diff_v1" or attention, backend="sdpa", **opts)
    mod = build_attention(cfg, 0).double()
    x = torch.randn(1, 9, 64, dtype=torch.float64)
    rope = rope_cos_sin(torch.arange(9), rope_frequencies(8, 10000.0))
    out = mod(x, rope, None)[0]
    expect = {"baseline": lambda: ref.baseline(mod, x), "diff_v1": lambda: ref.diff_v1(mod, x, 0),
              "diff_v1_per_head": lambda: ref.diff_v1(mod, x, 0), "diff_v2": lambda: ref.diff_v2(mod, x)}[attention]()
    torch.testing.assert_close(out, expect, rtol=1e-10, atol=1e-10)
    mod.backend = "blocked"
    torch.testing.assert_close(mod(x, rope, None)[0], expect, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention", VARIANTS)
def test_backends_agree_float32(attention):
    mod = make(attention, 2).float()
    x = torch.randn(2, 64, D_MODEL)
    rope = rope_cos_sin(torch.arange(64), rope_frequencies(HEAD_DIM, 10000.0))
    outs = {}
    for backend in BACKENDS:
        mod.backend = backend
        outs[backend] = mod(x, rope, None)[0]
    torch.testing.assert_close(outs["sdpa"], outs["eager"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["blocked"], outs["eager"], rtol=1e-5, atol=1e-5)


def test_v1_lambda_init_schedule_and_gradient():
    cfg = ModelConfig(vocab_size=16, d_model=32, n_layers=6, n_heads=4, head_dim=8, attention="diff_v1")
    for l in range(cfg.n_layers):
        mod = build_attention(cfg, l)
        assert mod.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * l), abs=1e-15)
    assert build_attention(cfg, 0).lambda_init == pytest.approx(0.2)  # l = 0: 0.8 - 0.6
    const = build_attention(cfg.replace(lambda_init=0.5), 3)
    assert const.lambda_init == 0.5
    # lambda's four vectors receive gradient through both backends
    for backend in BACKENDS:
        mod = make("diff_v1", 4, backend)
        x = torch.randn(1, 8, D_MODEL, dtype=torch.float64)
        run_module(mod, x, None).square().sum().backward()
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            g = getattr(mod, name).grad
            assert g is not None and g.abs().sum() > 0, (backend, name)


def test_v1_lambda_stays_fp32_under_autocast():
    mod = make("diff_v1", 4).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lam = mod.lambda_full()
    assert lam.dtype == torch.float32 and mod.lambda_q1.dtype == torch.float32


@pytest.mark.parametrize("backend", BACKENDS)
def test_v2_pairing_stays_inside_gqa_group(backend):
    """Swapping the partner of a query head for a head of another GQA group must change the output;
    swapping two heads' positions inside the same group-pair layout is what the reference pins down."""
    mod = make("diff_v2", 2, backend)  # 2H = 8 query heads over 2 KV heads: heads 0-3 read KV 0, heads 4-7 KV 1
    x = torch.randn(1, T, D_MODEL, dtype=torch.float64)
    before = run_module(mod, x, None)
    d = HEAD_DIM
    with torch.no_grad():
        w = mod.wq.weight
        # move query head 1 (partner of head 0, group 0) to slot 5 (group 1) and head 5 to slot 1
        a, b = w[1 * d:2 * d].clone(), w[5 * d:6 * d].clone()
        w[1 * d:2 * d], w[5 * d:6 * d] = b, a
    after = run_module(mod, x, None)
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, ref.diff_v2(mod, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv", [1, 2, 4])
def test_v2_halves_pairing_matches_the_equations(backend, kv):
    """The "halves" ablation pairs heads of different GQA groups: each map must meet its own head's values
    (the eager path once multiplied A1 - lambda A2 by the first head's values: off by ~0.4 with 2 KV heads)."""
    mod = make("diff_v2", kv, backend, v2_pairing="halves")
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64, requires_grad=True)
    out = run_module(mod, x, None)
    torch.testing.assert_close(out, ref.diff_v2(mod, x), rtol=1e-10, atol=1e-10)
    g, = torch.autograd.grad(out.square().sum(), x)
    g_ref, = torch.autograd.grad(ref.diff_v2(mod, x).square().sum(), x)
    torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9)


def test_v2_wrong_grouping_ablation_differs():
    good = make("diff_v2", 2)
    bad = make("diff_v2", 2, v2_pairing="halves")
    bad.load_state_dict(good.state_dict())
    x = torch.randn(1, T, D_MODEL, dtype=torch.float64)
    assert (run_module(good, x, None) - run_module(bad, x, None)).abs().max() > 1e-3


@pytest.mark.parametrize("mode", ["none", "raw"])
def test_v2_lambda_ablations(mode):
    mod = make("diff_v2", 2, v2_lambda=mode)
    x = torch.randn(1, 6, D_MODEL, dtype=torch.float64)
    lam = mod.lambda_values(x)
    if mode == "none":
        assert lam is None and mod.wlambda is None
    else:
        torch.testing.assert_close(lam, (x @ mod.wlambda.weight.T).transpose(1, 2).unsqueeze(-1))
    eager = run_module(mod, x, None)
    mod.backend = "sdpa"
    torch.testing.assert_close(run_module(mod, x, None), eager)


def test_v1_without_headwise_norm_matches_reference():
    mod = make("diff_v1", 4, headwise_norm=False, headwise_norm_weight=False)
    assert mod.subln is None
    x = torch.randn(1, 7, D_MODEL, dtype=torch.float64)
    torch.testing.assert_close(run_module(mod, x, None), ref.diff_v1(mod, x, 2), rtol=1e-10, atol=1e-10)


def test_eager_maps_are_the_differential_maps():
    mod = make("diff_v1", 2)
    x = torch.randn(1, 7, D_MODEL, dtype=torch.float64)
    rope = rope_cos_sin(torch.arange(7), rope_frequencies(HEAD_DIM, 10000.0))
    _, maps = mod(x, rope, None, return_maps=True)
    lam = mod.lambda_full()
    torch.testing.assert_close(maps.attn, maps.attn1 - lam * maps.attn2)
    torch.testing.assert_close(maps.attn1.sum(-1), torch.ones_like(maps.attn1.sum(-1)))
    assert maps.logits.shape == (1, 2 * mod.n_heads, 7, 7)
    assert torch.isinf(maps.logits[0, 0, 0, 1])  # causal entries are masked


def test_the_backend_is_stored_once_in_the_config():
    """``attn.backend`` reads the layer's config; setting it (the model's set_backend does) replaces that config."""
    from difftransformer.model import DiffTransformerLM

    model = DiffTransformerLM(ModelConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=4, head_dim=8,
                                          backend="sdpa"))
    attn = model.layers[0].attn
    assert attn.backend == attn.cfg.backend == "sdpa" and "backend" not in vars(attn)
    model.set_backend("blocked")
    assert model.cfg.backend == "blocked"
    assert all(layer.attn.backend == layer.attn.cfg.backend == "blocked" for layer in model.layers)
    attn.backend = "eager"
    assert attn.cfg.backend == "eager"
    with pytest.raises(ValueError, match="backend='flash' is not allowed"):
        attn.backend = "flash"


def test_which_path_each_backend_runs_on_cpu():
    """The dispatcher's rules (model/attention/dispatch.py), for the cases that need no Triton."""
    from difftransformer.model.attention.dispatch import diff_path

    mod = make("diff_v1", 4, "sdpa")
    x = torch.zeros(2, 5, D_MODEL, dtype=torch.float64)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()

    def path(backend, x=x, mask=None, return_maps=False, fused=True):
        mod.backend = backend
        return diff_path(mod, x, HEAD_DIM, 2 * HEAD_DIM, mask, None, return_maps, fused)

    assert [path(b) for b in ("auto", "sdpa", "eager", "blocked", "triton")] == [
        "sdpa", "sdpa", "eager", "blocked", "sdpa"]  # triton: head_dim 8 is not built
    assert path("sdpa", return_maps=True) == "eager" and path("blocked", return_maps=True) == "eager"
    assert path("blocked", mask=mask) == "sdpa"  # a padding mask or a cache
    assert path("blocked", fused=False) == "sdpa"  # V2's "halves" pairs cross GQA groups
    mod.logits_hook = lambda z: z
    assert path("sdpa") == "eager"
    mod.logits_hook = None
    mod.kv_cache = object()  # a decode step: one new token per row under a KV cache
    assert path("blocked", x=x[:, :1], mask=mask[..., -1:, :]) == "decode"
    assert path("eager", x=x[:, :1], mask=mask[..., -1:, :]) == "eager"


V2_ARMS = {"separate_keys": {"v2_keys": "separate"}, "lambda_scalar": {"v2_lambda": "scalar"},
           "headwise_norm": {"v2_headwise_norm": True},
           "norm_after_first": {"v2_headwise_norm": True, "v2_headwise_norm_layers": "after_first"},
           "all_three": {"v2_keys": "separate", "v2_lambda": "scalar", "v2_headwise_norm": True}}


@pytest.mark.fast
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("arm", V2_ARMS)
def test_v2_diagnostic_switches_match_the_equations(arm, n_kv_heads, backend):
    """DIFF V2's one-change arms (separate keys, V1's scalar lambda, V1's head-wise norm) against a reference written
    from the equations, float64, forward and every gradient, on every CPU backend, with a padding mask."""
    mod = make("diff_v2", n_kv_heads, backend, **V2_ARMS[arm])
    torch.manual_seed(1)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    weight = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    pad = torch.ones(2, T, dtype=torch.bool)
    pad[0, :3] = False
    out, g = grads_of(mod, x, run_module, pad, weight)
    out_ref, g_ref = grads_of(mod, x, lambda m, x_, p: ref.diff_v2_arm(m, x_, 2, p), pad, weight)
    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-10)
    assert set(g) == set(g_ref)
    for name in g:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-9, atol=1e-10, msg=f"gradient of {name}")


def test_v2_diagnostic_switches_shapes_and_parameters():
    """What each switch adds: separate keys double W_k (d_model x H_kv x d more), the scalar lambda swaps W_lambda
    (d_model x H) for four d-vectors, the norm adds a d-wide weight; each changes the output."""
    base = make("diff_v2", 2)
    n = {a: sum(p.numel() for p in make("diff_v2", 2, **o).parameters()) for a, o in V2_ARMS.items()}
    n0 = sum(p.numel() for p in base.parameters())
    assert n["separate_keys"] - n0 == D_MODEL * 2 * HEAD_DIM
    assert n["lambda_scalar"] - n0 == 4 * HEAD_DIM - D_MODEL * N_HEADS
    assert n["headwise_norm"] - n0 == HEAD_DIM
    x = torch.randn(1, T, D_MODEL, dtype=torch.float64)
    for arm in ("lambda_scalar", "headwise_norm"):
        mod = make("diff_v2", 2, **V2_ARMS[arm])
        mod.load_state_dict(base.state_dict(), strict=False)
        assert (run_module(mod, x, None) - run_module(base, x, None)).abs().max() > 1e-4, arm
    lam = make("diff_v2", 2, v2_lambda="scalar").lambda_values(x)
    assert lam.dim() == 0 and abs(float(lam.detach()) - (0.8 - 0.6 * math.exp(-0.6))) < 0.2  # near layer 2's lambda_init
    with pytest.raises(ValueError, match="v2_keys='separate' needs v2_pairing='interleaved'"):
        ModelConfig(vocab_size=16, d_model=32, n_heads=4, attention="diff_v2", v2_keys="separate",
                    v2_pairing="halves")
    with pytest.raises(ValueError, match="v2_headwise_norm"):
        ModelConfig(vocab_size=16, d_model=32, n_heads=4, attention="diff_v1", v2_headwise_norm=True)


@pytest.mark.parametrize("layer_idx", [0, 1])
def test_v2_norm_after_first_skips_layer_0_only(layer_idx):
    """``v2_headwise_norm_layers="after_first"``: layer 0 is plain DIFF V2 (no norm, no multiplier), later layers
    carry the head-wise norm; both against the reference from the equations."""
    mod = make("diff_v2", 2, layer_idx=layer_idx, v2_headwise_norm=True, v2_headwise_norm_layers="after_first")
    assert (mod.subln is None) == (layer_idx == 0) and mod.output_scale() == (1.0 if layer_idx == 0 else
                                                                              1 - (0.8 - 0.6 * math.exp(-0.3)))
    x = torch.randn(1, T, D_MODEL, dtype=torch.float64)
    torch.testing.assert_close(run_module(mod, x, None), ref.diff_v2_arm(mod, x, layer_idx), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="v2_headwise_norm_layers needs v2_headwise_norm=true"):
        ModelConfig(vocab_size=16, d_model=32, n_heads=4, attention="diff_v2", v2_headwise_norm_layers="after_first")


# ---------------------------------------------------------------------------------------------- head_gain
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("attention", ["diff_v1", "diff_v2"])
def test_head_gain_matches_the_equations(attention, backend):
    """head_gain: out_h = g_h * head_h before W_o (DIFF V1: in place of its norm and fixed (1 - lambda_init)); read
    against the float64 reference with W_o's columns of head h scaled by g_h instead, forward and every gradient."""
    opts = {"headwise_norm": False, "headwise_norm_weight": False} if attention == "diff_v1" else {}
    mod = make(attention, 2, backend, head_gain="one", **opts)
    g = torch.linspace(0.5, 1.7, mod.head_gain.numel(), dtype=torch.float32)
    with torch.no_grad():
        mod.head_gain.copy_(g)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    out = run_module(mod, x, None)
    fixed = 1.0 - mod.lambda_init if attention == "diff_v1" else 1.0  # the reference's V1 keeps it; ours drops it
    width = mod.wo.weight.shape[1] // g.numel()
    with torch.no_grad():
        mod.wo.weight.mul_((g.double() / fixed).repeat_interleave(width)[None, :])
    torch.testing.assert_close(out, reference(mod, x, None), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention", ["diff_v1", "diff_v2"])
def test_head_gain_norm_start_puts_each_head_where_the_norm_would(attention):
    """norm_start: after the first forward each head's output RMS (over channels, mean over tokens) is 1 -
    lambda_init, what the head-wise norm gives at its start (weight 1), on average instead of per token; the gain is
    set once, kept through a state dict, and started again by init_weights."""
    opts = {"headwise_norm": False, "headwise_norm_weight": False} if attention == "diff_v1" else {}
    mod = make(attention, 2, "sdpa", head_gain="norm_start", **opts)
    assert mod.gain_pending
    seen = {}
    mod.wo.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    run_module(mod, x, None)
    h = mod.head_gain.numel()
    heads = seen["x"].unflatten(-1, (h, -1))  # (B, T, h, dv): what W_o reads
    rms = heads.pow(2).mean(-1).sqrt().mean(dim=(0, 1))
    torch.testing.assert_close(rms, torch.full_like(rms, 1.0 - mod.lambda_init), rtol=1e-6, atol=1e-6)
    g0 = mod.head_gain.detach().clone()
    run_module(mod, 2 * x, None)
    assert torch.equal(mod.head_gain.detach(), g0) and not mod.gain_pending  # set once
    fresh = make(attention, 2, "sdpa", head_gain="norm_start", **opts)
    fresh.load_state_dict(mod.state_dict())
    assert not fresh.gain_pending and torch.equal(fresh.head_gain.detach(), g0)
    fresh.reset_lambda()
    assert fresh.gain_pending and torch.equal(fresh.head_gain.detach(), torch.ones_like(g0))


@pytest.mark.parametrize("opts, match", [
    ({"attention": "baseline", "head_gain": "one"}, "head_gain applies to"),
    ({"attention": "diff_v1", "head_gain": "one"}, "head_gain replaces the head-wise norm"),
    ({"attention": "diff_v2", "head_gain": "one", "v2_headwise_norm": True}, "head_gain replaces the head-wise norm"),
    ({"attention": "diff_v2", "head_gain": "half"}, "head_gain='half' is not allowed"),
])
def test_head_gain_refusals(opts, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(vocab_size=16, d_model=D_MODEL, n_layers=2, n_heads=N_HEADS, **opts)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("attention", VARIANTS)
def test_the_stacked_projection_is_the_three_layers(attention, bias):
    """Attention.project's one matmul over the stacked W_q, W_k, W_v (self-attention) against the three layers one
    by one: the same values and gradients in float64 (to rounding); a hook on one projection, a wrapped projection
    or queries at other rows take the three layers, so the hook still fires."""
    mod = make(attention, 2, qkv_bias=bias)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64, requires_grad=True)
    stacked = mod.project(x, x)
    layers = (mod.wq(x), mod.wk(x), mod.wv(x))
    for a, b in zip(stacked, layers):
        assert a.shape == b.shape and (a - b).abs().max().item() < 1e-13
    g = [torch.randn_like(t) for t in layers]
    params = [x] + [lin.weight for lin in (mod.wq, mod.wk, mod.wv)] + ([mod.wq.bias, mod.wk.bias, mod.wv.bias] if bias
                                                                     else [])
    ga = torch.autograd.grad(stacked, params, g)
    gb = torch.autograd.grad(layers, params, g)
    for a, b in zip(ga, gb):
        assert (a - b).abs().max().item() < 1e-12
    seen = []
    handle = mod.wk.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    try:
        mod.project(x, x)
    finally:
        handle.remove()
    assert seen == [layers[1].shape]  # the hooked layer ran on its own
    mod.kv_cache = object()  # under a KV cache (a decode step's few rows): the three layers, no weight copy
    try:
        mod.wq.register_forward_hook(lambda m, i, o: seen.append("q"))
        mod.project(x, x)
    finally:
        mod.kv_cache = None
        mod.wq._forward_hooks.clear()
    assert seen[-1] == "q"
    rows = x[:, :3]
    assert (mod.project(rows, x)[0] - mod.wq(rows)).abs().max().item() == 0.0  # queries at other rows: W_q alone
