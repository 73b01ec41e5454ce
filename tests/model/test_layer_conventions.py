"""The layer in PyTorch's conventions (issue 71 item 2): ``attn_mask`` (SDPA's: bool True = may attend, or a float
added to the logits; per head or shared) against the float64 oracle on a prefix-LM, a packed-document and a
sliding-window mask, ``key_padding_mask`` read as ``nn.MultiheadAttention`` reads it, attention dropout, biases, the
maps, the record kept with the weights, the fused kernels never given a mask they would misread, and every misuse
refused in one line naming the argument."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from test_layer import D_MODEL, VARIANTS, assert_same, grads, make, oracle, padding

from difftransformer import DiffAttention, DiffTransformerLM, ModelConfig
from difftransformer.model.attention import dispatch
from difftransformer.model.attention.masks import build_mask

T = 10


def prefix_lm(T: int, prefix: int) -> torch.Tensor:
    """(T, T): the prefix attends bidirectionally, the rest causally."""
    m = torch.ones(T, T, dtype=torch.bool).tril()
    m[:prefix, :prefix] = True
    return m


def packed(T: int, lengths: list[int]) -> torch.Tensor:
    """(T, T) block-diagonal causal: documents packed into one row see only themselves."""
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return (doc[:, None] == doc[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()


def sliding(T: int, window: int) -> torch.Tensor:
    i = torch.arange(T)
    return (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)


MASKS = {"prefix_lm": prefix_lm(T, 4), "packed": packed(T, [3, 5, 2]), "sliding": sliding(T, 3)}


# ---------------------------------------------------------------------------------------------- attn_mask
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(MASKS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_bool_attn_mask_matches_the_oracle(variant, name, backend):
    """A bidirectional layer given the mask (a prefix-LM, packed documents, a sliding window) equals the equations
    with that visibility, forward and every gradient; with causal=True the causal rule is and-ed in."""
    m = MASKS[name]
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    for causal in (False, True):
        layer = make(variant, n_kv_heads=2, causal=causal, backend=backend)
        allowed = m[None, None]
        assert_same(grads(layer, lambda t, layer=layer: layer(t, attn_mask=m), x),
                    grads(layer, lambda t, layer=layer: oracle(layer, t, allowed=allowed), x))


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_float_attn_mask_is_added_to_the_logits(variant, backend):
    """A float mask: -inf where the sliding window masks, plus an ALiBi-like bias per head, and padding on top."""
    layer = make(variant, n_kv_heads=2, causal=False, backend=backend)
    h = layer.n_mask_heads
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().to(torch.float64)
    bias = -dist[None, None] * torch.linspace(0.1, 0.6, h, dtype=torch.float64)[None, :, None, None]
    bias = bias.masked_fill(~sliding(T, 4)[None, None], float("-inf"))  # (1, h, T, T)
    kpm = padding(2, T)  # True: a real key (the oracle's); the layer gets ~kpm
    assert_same(grads(layer, lambda t: layer(t, attn_mask=bias, key_padding_mask=~kpm), x),
                grads(layer, lambda t: oracle(layer, t, kpm=kpm, bias=bias), x))


@pytest.mark.parametrize("variant", VARIANTS)
def test_attn_mask_per_batch_and_head(variant):
    """(B, heads, T, S): each row and each output head its own mask; both maps of a differential head share it."""
    layer = make(variant, n_kv_heads=2, causal=False, backend="sdpa")
    h = layer.n_mask_heads
    g = torch.Generator().manual_seed(5)
    m = torch.rand(2, h, T, T, generator=g) < 0.6
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    assert_same(grads(layer, lambda t: layer(t, attn_mask=m), x), grads(layer, lambda t: oracle(layer, t, allowed=m), x))


@pytest.mark.parametrize("variant", VARIANTS)
def test_cross_attention_takes_an_attn_mask(variant):
    layer = make(variant, n_kv_heads=2, causal=False, backend="sdpa")
    x, c = torch.randn(2, 5, D_MODEL, dtype=torch.float64), torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    m = torch.ones(5, 7, dtype=torch.bool).triu(1).logical_not()  # query t sees context keys 0..t
    assert_same(grads(layer, lambda a, b: layer(a, context=b, attn_mask=m), x, c),
                grads(layer, lambda a, b: oracle(layer, a, context=b, allowed=m[None, None]), x, c))


# ---------------------------------------------------------------------------------------------- key_padding_mask
@pytest.mark.parametrize("variant", VARIANTS)
def test_key_padding_mask_reads_as_multihead_attentions(variant):
    """True = padding, as in torch.nn.MultiheadAttention: its own layer, given the same mask, ignores the same keys
    (the outputs of real queries do not depend on padded keys), and so does ours."""
    layer = make(variant, causal=False, backend="sdpa")
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    kpm = torch.zeros(2, T, dtype=torch.bool)
    kpm[:, -3:] = True  # the last three keys are padding
    x2 = x.clone()
    x2[:, -3:] = torch.randn(2, 3, D_MODEL, dtype=torch.float64)  # change only the padding
    torch.testing.assert_close(layer(x, key_padding_mask=kpm)[:, :-3], layer(x2, key_padding_mask=kpm)[:, :-3],
                               rtol=1e-12, atol=1e-12)
    mha = torch.nn.MultiheadAttention(D_MODEL, 4, batch_first=True).double()
    y1, _ = mha(x, x, x, key_padding_mask=kpm)
    y2, _ = mha(x2, x2, x2, key_padding_mask=kpm)
    torch.testing.assert_close(y1[:, :-3], y2[:, :-3], rtol=1e-12, atol=1e-12)  # the same convention


# ---------------------------------------------------------------------------------------------- the fused kernels
@pytest.mark.parametrize("variant", ["diff_v1", "diff_v2"])
def test_the_fused_kernels_never_get_a_general_mask(variant, monkeypatch):
    """The fused kernels read a mask as causal & real keys. A bidirectional, cross or attn_mask call must reach a
    PyTorch path whatever the backend asks (before, backend='triton' ran a bidirectional layer causally)."""
    seen: list[str] = []
    real = dispatch.diff_route

    def spy(*a, **kw):
        path, kernel = real(*a, **kw)
        seen.append(path if kw.get("fused", True) else "pytorch")
        return path, kernel

    monkeypatch.setattr(dispatch, "diff_route", spy)
    x = torch.randn(1, 8, D_MODEL)
    for backend in ("blocked", "triton"):
        for kw, causal in (({}, False), ({"attn_mask": sliding(8, 3)}, True), ({"context": x}, False)):
            seen.clear()
            layer = DiffAttention(D_MODEL, 4, variant, causal=causal, backend=backend)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                layer(x, **kw)
            assert seen == ["pytorch"], (backend, kw, seen)
    layer = DiffAttention(D_MODEL, 4, variant, causal=True, backend="blocked")
    seen.clear()
    layer(x)
    assert seen == ["blocked"]  # a plain causal call still takes the kernel asked for


# ---------------------------------------------------------------------------------------------- dropout, biases
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_dropout_is_off_in_eval_and_unbiased_in_training(variant, backend):
    """The output is linear in the maps (DIFF V1's head-wise norm, which is not, is off here), so dropping each map
    with p and scaling by 1/(1-p) leaves its mean where eval puts it."""
    torch.manual_seed(0)
    kw = {"headwise_norm": False} if variant == "diff_v1" else {}
    layer = DiffAttention(D_MODEL, 4, variant, causal=False, attn_drop=0.3, backend=backend, **kw).double()
    plain = DiffAttention(D_MODEL, 4, variant, causal=False, backend=backend, **kw).double()
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(1, 6, D_MODEL, dtype=torch.float64)
    layer.eval()
    torch.testing.assert_close(layer(x), plain(x), rtol=0, atol=0)  # eval: no dropout at all
    layer.train()
    a, b = layer(x), layer(x)
    assert not torch.allclose(a, b)  # training: a new draw every call
    with torch.no_grad():  # 3000 draws as one batch of copies: each row has its own dropout masks
        mean = layer(x.expand(3000, -1, -1)).mean(0, keepdim=True)
        err = (mean - plain(x)).abs().max() / plain(x).abs().max()
    assert err < 0.06, float(err)


def test_dropout_on_each_map_before_the_pair_is_combined(monkeypatch):
    """Eager DIFF V1: F.dropout runs on A1 and on A2 (two calls of the maps' shape), not on A1 - lambda A2."""
    shapes = []
    real = torch.nn.functional.dropout

    def spy(t, p=0.5, *a, **kw):
        shapes.append(tuple(t.shape))
        return real(t, p, *a, **kw)

    monkeypatch.setattr(dispatch.F, "dropout", spy)
    layer = DiffAttention(D_MODEL, 4, "diff_v1", causal=False, attn_drop=0.2, backend="eager").train()
    layer(torch.randn(2, 6, D_MODEL))
    assert shapes == [(2, 2, 6, 6), (2, 2, 6, 6)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_biases_match_the_oracle(variant):
    torch.manual_seed(1)
    layer = DiffAttention(D_MODEL, 4, variant, causal=True, qkv_bias=True, proj_bias=True, layer_idx=2).double()
    with torch.no_grad():
        for n, p in layer.named_parameters():
            if n.endswith("bias"):
                p.normal_()
    assert {n for n, _ in layer.named_parameters() if n.endswith("bias")} == {
        "wq.bias", "wk.bias", "wv.bias", "wo.bias"}
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    core = layer.core
    # the oracle's projections without biases: fold each bias into an extra input channel of ones
    y = layer(x)
    for lin in (core.wq, core.wk, core.wv):
        assert lin.bias is not None
    ones = torch.ones(2, 7, 1, dtype=torch.float64)

    def widened(t):  # x' = [x, 1], W' = [W, b]: x' W'^T = x W^T + b
        return torch.cat([t, ones], -1)

    big = DiffAttention(D_MODEL + 1, 4, variant, causal=True, head_dim=8, layer_idx=2, proj_bias=True).double()
    with torch.no_grad():
        for name in ("wq", "wk", "wv"):
            lin = getattr(core, name)
            getattr(big.core, name).weight.copy_(torch.cat([lin.weight, lin.bias[:, None]], 1))
        big.core.wo.weight.zero_()
        big.core.wo.weight[:D_MODEL].copy_(core.wo.weight)
        big.core.wo.bias.zero_()
        big.core.wo.bias[:D_MODEL].copy_(core.wo.bias)
        for n, p in big.core.named_parameters():
            if not n.startswith(("wq", "wk", "wv", "wo")):
                p.copy_(dict(core.named_parameters())[n] if n != "wlambda.weight"
                        else torch.cat([core.wlambda.weight, torch.zeros(4, 1, dtype=torch.float64)], 1))
    torch.testing.assert_close(y, oracle(big, widened(x))[..., :D_MODEL], rtol=1e-10, atol=1e-10)


def test_model_biases_start_at_zero_and_export_is_refused(tmp_path):
    cfg = ModelConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=4, attention="diff_v1", qkv_bias=True,
                      proj_bias=True)
    model = DiffTransformerLM(cfg)
    model.init_weights()
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    assert len(biases) == 8 and all(bool((b == 0).all()) for b in biases)
    from difftransformer.interop.hf_layout import config_to_hf
    from difftransformer.interop.remote_code import config_to_remote
    with pytest.raises(ValueError, match="qkv_bias=True, proj_bias=True cannot be exported"):
        config_to_hf(cfg, torch.float32)
    with pytest.raises(ValueError, match="has no Hugging Face remote code"):
        config_to_remote(cfg, torch.float32)
    with pytest.raises(ValueError, match="attn_dropout must be a number in"):
        ModelConfig(attn_dropout=1.5)


# ---------------------------------------------------------------------------------------------- the maps
@pytest.mark.parametrize("variant", VARIANTS)
def test_maps_from_the_public_layer(variant):
    """return_maps=True: the output is the same, and attn1 - lambda attn2 = attn for DIFF; each row of A1, A2 sums
    to 1 over the keys it sees; the maps honour the mask."""
    layer = make(variant, causal=False)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    m = MASKS["sliding"]
    out, maps = layer(x, attn_mask=m, return_maps=True)
    torch.testing.assert_close(out, layer(x, attn_mask=m), rtol=1e-10, atol=1e-10)
    assert maps is not None and maps.attn.shape == (2, layer.n_mask_heads, T, T)
    assert bool((maps.attn[..., ~m] == 0).all())
    if variant == "baseline":
        assert maps.attn1 is None
        return
    for a in (maps.attn1, maps.attn2):
        torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))
    lam = maps.lam if maps.lam.dim() == 0 else maps.lam
    torch.testing.assert_close(maps.attn, maps.attn1 - lam * maps.attn2)


# ---------------------------------------------------------------------------------------------- the record
def test_a_reload_into_a_layer_built_otherwise_fails_loudly():
    from safetensors.torch import load, save
    a = DiffAttention(D_MODEL, 4, "diff_v1", layer_idx=3)
    blob = save(a.state_dict())  # the record is a tensor: safetensors holds it
    DiffAttention(D_MODEL, 4, "diff_v1", layer_idx=3).load_state_dict(load(blob))
    with pytest.raises(ValueError, match=r"layer_idx=3 \(this layer: 0\).*lambda_init"):
        DiffAttention(D_MODEL, 4, "diff_v1", layer_idx=0).load_state_dict(load(blob))
    with pytest.raises(ValueError, match="causal=True"):
        DiffAttention(D_MODEL, 4, "diff_v1", layer_idx=3, causal=False).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="options"):
        DiffAttention(D_MODEL, 4, "diff_v1", layer_idx=3, lambda_init=0.5).load_state_dict(a.state_dict())
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    DiffAttention(D_MODEL, 4, "diff_v1", layer_idx=3).load_state_dict(torch.load(buf, weights_only=True))
    old = {k: v for k, v in a.state_dict().items() if k != "_extra_state"}  # a state dict from before the record
    with pytest.warns(UserWarning, match="no _extra_state"):
        DiffAttention(D_MODEL, 4, "diff_v1", layer_idx=3).load_state_dict(old)


def test_registry_drives_the_layer():
    """Every registered variant and v1_layout go through the layer (the option list is the registry's)."""
    layer = DiffAttention(D_MODEL, 4, "diff_v1", v1_layout="per_head")
    assert layer.core.n_heads == 4 and layer(torch.randn(1, 5, D_MODEL)).shape == (1, 5, D_MODEL)
    with pytest.raises(ValueError, match="headwise_norm=False only applies to diff_v1"):
        DiffAttention(D_MODEL, 4, "diff_v2", headwise_norm=False)
    off = DiffAttention(D_MODEL, 4, "diff_v1", headwise_norm=False)  # the norm's weight goes with it
    assert off.core.subln is None


# ---------------------------------------------------------------------------------------------- misuse
def bad_calls():
    layer = DiffAttention(D_MODEL, 4, "diff_v1")
    cross = DiffAttention(D_MODEL, 4, "diff_v1", causal=False)
    x = torch.randn(2, 5, D_MODEL)
    return layer, cross, x, [
        (lambda: layer(x.tolist()), TypeError, "x must be a torch.Tensor, got list"),
        (lambda: layer(x.numpy()), TypeError, "x must be a torch.Tensor, got ndarray"),
        (lambda: layer(x.double()), ValueError, "x is torch.float64 but the layer's weights are torch.float32"),
        (lambda: layer(x.long()), TypeError, "x must be a floating-point tensor"),
        (lambda: layer(x, key_padding_mask=[[True] * 5] * 2), TypeError, "key_padding_mask must be a torch.Tensor"),
        (lambda: layer(x, key_padding_mask=torch.ones(2, 5)), ValueError, "True where a key is padding"),
        (lambda: layer(x, attn_mask=torch.ones(5, 5, dtype=torch.long)), ValueError, "attn_mask must be bool"),
        (lambda: layer(x, attn_mask=torch.ones(8, 5, 5, dtype=torch.bool)), ValueError,
         r"attn_mask must broadcast to \(B=2, heads=2 or 1, T=5, S=5\)"),
        (lambda: layer(x, attn_mask=torch.ones(5, dtype=torch.bool)), ValueError, "attn_mask must broadcast"),
        (lambda: layer(x, positions=torch.tensor(3)), ValueError, "positions must be integer positions"),
        (lambda: layer(x, positions=torch.zeros(3, 5, dtype=torch.long)), ValueError, r"\(B=2, 5\)"),
        (lambda: layer(x, positions=torch.ones(5, dtype=torch.bool)), ValueError, "positions must be integer"),
        (lambda: layer(x, positions=torch.arange(5) - 1), ValueError, "positions must be >= 0"),
        (lambda: layer(x, positions=torch.arange(5.0)), ValueError, "positions must be integer"),
        (lambda: layer(x, positions=torch.arange(5).tolist()), TypeError, "positions must be a torch.Tensor"),
        (lambda: layer(x, context_positions=torch.arange(5)), ValueError, "context_positions goes with context="),
        (lambda: cross(x, context=x, context_positions=torch.arange(5)), ValueError,
         "context_positions goes with context= and rope=True"),
        (lambda: cross(x, context=x[:, :0]), ValueError, "context has no keys"),
        (lambda: cross(x, context=x.double()), ValueError, "context is torch.float64 but x is torch.float32"),
        (lambda: cross(x, context=x.numpy()), TypeError, "context must be a torch.Tensor"),
        (lambda: layer(x, return_maps=1), TypeError, "return_maps must be True or False"),
        (lambda: layer.setup_cache(0, 8), ValueError, "batch_size must be a positive integer"),
        (lambda: layer.setup_cache(2, 0), ValueError, "max_seq_len must be a positive integer"),
        (lambda: layer.setup_cache(2.0, 8), TypeError, "batch_size must be an integer"),
        (lambda: layer.setup_cache(2, 8, dtype=torch.float64), ValueError, "the KV cache's dtype must be"),
    ]


@pytest.mark.parametrize("i", range(len(bad_calls()[3])))
def test_every_misuse_is_one_error_naming_the_argument(i):
    *_, calls = bad_calls()
    fn, kind, match = calls[i]
    with pytest.raises(kind, match=match):
        fn()


def test_kv_cache_misuse_is_refused():
    layer = DiffAttention(D_MODEL, 4, "diff_v2")
    x = torch.randn(2, 5, D_MODEL)
    layer.setup_cache(2, 8)
    layer(x, positions=torch.arange(5))
    with pytest.raises(ValueError, match="overflow the KV cache of 8 positions"):
        layer(x[:, :4], positions=torch.arange(5, 9))
    with pytest.raises(ValueError, match="x has batch 1 but the KV cache was set up for 2"):
        layer(x[:1, :1], positions=torch.tensor([5]))
    with pytest.raises(ValueError, match="a gap would be attended as zeros"):
        layer(x[:, :1], positions=torch.tensor([7]))
    with pytest.raises(ValueError, match="consecutive"):
        layer(x[:, :2], positions=torch.tensor([5, 7]))
    with pytest.raises(ValueError, match="do not go with a KV cache"):
        layer(x[:, :1], positions=torch.tensor([5]), attn_mask=torch.ones(1, 6, dtype=torch.bool))
    layer(x[:, :1], positions=torch.tensor([5]))  # the next position is fine
    layer(x[:, :1], positions=torch.tensor([5]))  # and so is writing it again (a rewind)


def test_head_gain_first_call_without_tokens_or_with_nan_is_refused():
    layer = DiffAttention(D_MODEL, 4, "diff_v2", head_gain="norm_start", causal=False)
    layer(torch.randn(2, 0, D_MODEL))  # no tokens: the gain stays pending, nothing set
    assert layer.core.gain_pending
    x = torch.randn(2, 5, D_MODEL)
    x[0, 2] = float("nan")
    with pytest.raises(ValueError, match="head_gain='norm_start'.*not finite"):
        layer(x)
    assert layer.core.gain_pending  # still pending: the next good batch sets it
    assert torch.isfinite(layer(torch.randn(2, 5, D_MODEL))).all() and not layer.core.gain_pending


def test_the_model_refuses_bad_token_ids():
    model = DiffTransformerLM(ModelConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=4))
    with pytest.raises(TypeError, match="idx must hold integer token ids, got torch.float32"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"idx holds token ids outside \[0, 16\): -1 .. 16"):
        model(torch.tensor([[1, -1, 16, 3]]))
    with pytest.raises(TypeError, match="idx must be a torch.Tensor"):
        model([[1, 2]])


def test_mask_builder_matches_the_remote_codes():
    """The remote code cannot import the package: its build_mask is checked against ours on padded prompts, a padded
    cache step and plain causal calls."""
    from difftransformer.interop.remote_code.modeling_difftransformer import DiffTransformerModel
    g = torch.Generator().manual_seed(0)
    for B, T, past in ((2, 6, 0), (3, 1, 5), (2, 3, 4), (1, 5, 0)):
        am = (torch.rand(B, past + T, generator=g) > 0.3)
        am[:, -1] = True
        for mask in (am, None):
            theirs = DiffTransformerModel.build_mask(None, mask, B, T, past, torch.device("cpu"))
            ours = build_mask(T, past + T, causal=True, device=torch.device("cpu"),
                              query_pos=torch.arange(past, past + T) if past else None,
                              key_valid=mask)
            if theirs is None:
                assert mask is None or bool(mask.all())
                continue
            assert ours is not None
            torch.testing.assert_close(theirs.expand(B, 1, T, past + T), ours.expand(B, 1, T, past + T))


@pytest.mark.parametrize("variant", VARIANTS)
def test_masks_compile_in_one_graph_and_build_on_the_inputs_device(variant):
    """torch.compile(fullgraph=True) with a bool and a float attn_mask and with a padded cross-attention (no host
    read of the mask under compile), equal to eager; and the same calls on the meta device (every tensor made there)."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    layer = make(variant, causal=True)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    m = sliding(9, 3)
    f = torch.zeros(9, 9, dtype=torch.float64).masked_fill(~m, float("-inf"))
    compiled = torch.compile(layer, backend=CompileCounter(), fullgraph=True)
    for am in (m, f):
        torch.testing.assert_close(compiled(x, attn_mask=am), layer(x, attn_mask=am), rtol=1e-12, atol=1e-12)
    cross = make(variant, causal=False)
    c, kpm = torch.randn(2, 5, D_MODEL, dtype=torch.float64), torch.zeros(2, 5, dtype=torch.bool)
    kpm[0, -2:] = True
    cc = torch.compile(cross, backend=CompileCounter(), fullgraph=True)
    torch.testing.assert_close(cc(x, context=c, key_padding_mask=kpm), cross(x, context=c, key_padding_mask=kpm),
                               rtol=1e-12, atol=1e-12)
    torch._dynamo.reset()
    with torch.device("meta"):
        meta = DiffAttention(D_MODEL, 4, variant, causal=False)
        xm, cm = torch.empty(2, 6, D_MODEL), torch.empty(2, 4, D_MODEL)
        km, am = torch.zeros(2, 4, dtype=torch.bool), torch.ones(6, 6, dtype=torch.bool)
    assert meta(xm, context=cm, key_padding_mask=km).device.type == "meta"
    assert meta(xm, attn_mask=am).device.type == "meta"


@pytest.mark.parametrize("variant", ["diff_v1", "diff_v2", "baseline"])
def test_the_layer_is_the_variants_module_and_copies_and_old_state_dicts_load(variant):
    """``DiffAttention(..., variant)`` is an instance of the variant's class (one implementation for the layer and
    the model); a deep copy and a pickled copy compute the same; a state dict in the format of before (names under
    ``core.``, with its ``_extra_state``) loads without a warning and gives the same output."""
    import copy
    import io
    import warnings

    from difftransformer.model import variants as registry
    torch.manual_seed(0)
    layer = DiffAttention(D_MODEL, 4, variant).double()
    assert isinstance(layer, registry.variant(variant).cls) and layer.core is layer
    assert repr(layer).startswith("DiffAttention(")
    x = torch.randn(2, 6, D_MODEL, dtype=torch.float64)
    y = layer(x)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for other in (copy.deepcopy(layer), torch.load(buf, weights_only=False)):
        assert type(other) is type(layer) and torch.equal(other(x), y)
    before = {("_extra_state" if k == "_extra_state" else f"core.{k}"): v for k, v in layer.state_dict().items()}
    fresh = DiffAttention(D_MODEL, 4, variant).double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh.load_state_dict(before)
    assert torch.equal(fresh(x), y)
