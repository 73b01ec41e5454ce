"""A difftransformer language model (baseline, DIFF V1 or DIFF V2 attention) for Hugging Face transformers.

Load an exported directory with ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)``. This file
imports only torch and transformers; the math is the difftransformer package's, operation for operation:

  block:  Y = X + Attention(RMSNorm(X)),  X' = Y + W2 (silu(W1 RMSNorm(Y)) * W3 RMSNorm(Y))
  model:  embeddings, the blocks, a final RMSNorm, the LM head (tied to the embeddings with tie_word_embeddings)

RMSNorm runs in float32 (``F.rms_norm``), RoPE rotates interleaved channel pairs (2i, 2i+1) of every query and key
head (GPT-J layout, the official DIFF code's; not Llama's rotate_half), with float64 angles, in float32.

* baseline: softmax attention, H query heads over H_kv key/value heads (query head i reads KV head i // (H/H_kv)).
* DIFF V1 (paper eq. 1-3): query half-heads (2i, 2i+1) are (Q1, Q2) of differential head i, key half-heads (2g,
  2g+1) are (K1, K2) of KV group g; out_i = (softmax(Q1 K1^T/sqrt d) - lambda softmax(Q2 K2^T/sqrt d)) V_g, then the
  head-wise RMSNorm (eps 1e-5, optional weight), times (1 - lambda_init). lambda = exp(lq1.lk1) - exp(lq2.lk2) +
  lambda_init in float32, lambda_init = 0.8 - 0.6 exp(-0.3 l) for the 0-based layer l (or a constant); the per_head
  layout multiplies lambda by the buffer ``neg_weight`` (a converted model's negative-branch warm-up weight).
* DIFF V2: 2H query heads over H_kv KV heads in one attention; out_i = attn_(2i) - lambda attn_(2i+1) with lambda =
  sigmoid(W_lambda x) per token and head ("raw": no sigmoid; "none": lambda = 1); ``v2_pairing="halves"``: head i
  paired with head i + H.

The weights are the difftransformer state dict under the prefix ``model.`` (``output.weight`` is ``lm_head.weight``),
so a conversion either way is a rename. Attention runs ``torch.nn.functional.scaled_dot_product_attention``
(``attn_implementation="sdpa"``, the default) or a float32 matmul-softmax (``"eager"``). The KV cache is transformers'
``DynamicCache`` (``StaticCache`` too, with ``cache_implementation="static"``); DIFF V1 caches its 2 h_kv key
half-heads and its h_kv values as 2 h_kv heads of half their width.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import __version__ as _TRANSFORMERS_VERSION
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_difftransformer import DiffTransformerConfig

try:  # transformers 5: init functions that leave weights loaded from the checkpoint alone
    from transformers import initialization as _init
except ImportError:  # transformers 4: _init_weights only ever sees weights the checkpoint lacks
    _init = nn.init

_TRANSFORMERS_MAJOR = int(_TRANSFORMERS_VERSION.split(".")[0])
# The name of the KV cache in the model outputs: "cache" in recent transformers, "past_key_values" before.
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


# ---------------------------------------------------------------------------------------------- building blocks
def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, in (at least) float32, cast back to x's dtype."""
    acc = torch.promote_types(x.dtype, torch.float32)
    w = None if weight is None else weight.to(acc)
    xf = x.to(acc)
    if hasattr(F, "rms_norm"):
        y = F.rms_norm(xf, (x.shape[-1],), w, eps)
    else:  # torch < 2.4
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        y = y if w is None else y * w
    return y.to(x.dtype)


class DiffTransformerRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, affine={self.weight is not None}"


def rope_inv_freq(config: DiffTransformerConfig, device: torch.device) -> torch.Tensor:
    """theta^(-2i/d), i < d/2, in float64 (float32 on MPS), with Llama 3.1's scaling for rope_type "llama3"."""
    dtype = torch.float32 if device.type == "mps" else torch.float64
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, device=device, dtype=dtype) / d))
    if config.rope_type == "llama3":
        factor, low, high = config.rope_factor, config.rope_low_freq_factor, config.rope_high_freq_factor
        original = config.rope_original_max_len
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


def rope_cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (B, T, 1, d/2) for position_ids (B, T), in inv_freq's dtype."""
    angles = position_ids.to(inv_freq.dtype)[..., None] * inv_freq
    return angles.cos()[..., None, :], angles.sin()[..., None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (2i, 2i+1) of x (B, T, heads, d) in (at least) float32; result in x's dtype."""
    acc = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(acc).unflatten(-1, (-1, 2))
    cos, sin = cos.to(acc), sin.to(acc)
    x1, x2 = xf[..., 0], xf[..., 1]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2).type_as(x)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hk, T, d) -> (B, Hk*n_rep, T, d): KV head g serves query heads g*n_rep .. g*n_rep + n_rep - 1."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


class DiffTransformerMLP(nn.Module):
    """SwiGLU: W2 (silu(W1 x) * W3 x)."""

    def __init__(self, config: DiffTransformerConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


# ---------------------------------------------------------------------------------------------- attention
class DiffTransformerAttention(nn.Module):
    """Baseline, DIFF V1 or DIFF V2 attention (``config.attention``), with the projections' names of difftransformer:
    ``wq``, ``wk``, ``wv``, ``wo`` (and DIFF V2's ``wlambda``; DIFF V1's ``lambda_q1`` .. ``lambda_k2``, ``subln``)."""

    def __init__(self, config: DiffTransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx, self.kind = config, layer_idx, config.attention
        self.head_dim = d = config.head_dim
        self.scale = d ** -0.5
        D, H, Hkv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        if self.kind == "baseline":
            self.n_heads, self.n_kv_heads = H, Hkv
            self.wq = nn.Linear(D, H * d, bias=False)
            self.wk = nn.Linear(D, Hkv * d, bias=False)
            self.wv = nn.Linear(D, Hkv * d, bias=False)
            self.wo = nn.Linear(H * d, D, bias=False)
        elif self.kind == "diff_v1":
            per_head = config.v1_layout == "per_head"
            self.n_heads = h = config.n_diff_heads
            self.n_kv_heads = hkv = Hkv if per_head else Hkv // 2
            self.value_dim = dv = config.v1_value_dim
            self.wq = nn.Linear(D, 2 * h * d, bias=False)
            self.wk = nn.Linear(D, 2 * hkv * d, bias=False)
            self.wv = nn.Linear(D, hkv * dv, bias=False)
            self.wo = nn.Linear(h * dv, D, bias=False)
            self.lambda_init = config.lambda_init_for(layer_idx)
            self.lambda_q1 = nn.Parameter(torch.zeros(d, dtype=torch.float32))
            self.lambda_k1 = nn.Parameter(torch.zeros(d, dtype=torch.float32))
            self.lambda_q2 = nn.Parameter(torch.zeros(d, dtype=torch.float32))
            self.lambda_k2 = nn.Parameter(torch.zeros(d, dtype=torch.float32))
            self.subln = (DiffTransformerRMSNorm(dv, eps=1e-5, elementwise_affine=config.headwise_norm_weight)
                          if config.headwise_norm else None)
            if per_head:
                self.register_buffer("neg_weight", torch.ones((), dtype=torch.float32))
            else:
                self.neg_weight = None
        else:  # diff_v2
            self.n_heads, self.n_kv_heads = H, Hkv
            self.wq = nn.Linear(D, 2 * H * d, bias=False)
            self.wk = nn.Linear(D, Hkv * d, bias=False)
            self.wv = nn.Linear(D, Hkv * d, bias=False)
            self.wo = nn.Linear(H * d, D, bias=False)
            self.wlambda = nn.Linear(D, H, bias=False) if config.v2_lambda != "none" else None

    # ------------------------------------------------------------------ lambda
    def lambda_full(self) -> torch.Tensor:
        """DIFF V1 eq. (2): a 0-dim float32 tensor (times ``neg_weight`` in the per_head layout)."""
        acc = torch.promote_types(self.lambda_q1.dtype, torch.float32)
        lam1 = torch.exp(torch.sum(self.lambda_q1.to(acc) * self.lambda_k1.to(acc)))
        lam2 = torch.exp(torch.sum(self.lambda_q2.to(acc) * self.lambda_k2.to(acc)))
        lam = lam1 - lam2 + self.lambda_init
        return lam if self.neg_weight is None else lam * self.neg_weight.to(acc)

    def lambda_values(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """DIFF V2: (B, H, T, 1) lambda per token and head, or None for v2_lambda "none"."""
        if self.wlambda is None:
            return None
        lam = self.wlambda(x).transpose(1, 2).unsqueeze(-1)
        return torch.sigmoid(lam) if self.config.v2_lambda == "sigmoid" else lam

    # ------------------------------------------------------------------ kernels
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        """softmax(q k^T / sqrt(d)) v with k, v repeated to q's heads. ``mask``: None (causal over the input, or every
        key for a single query), a bool (B or 1, 1, Tq, Tk) mask (True: attend) or an additive float one."""
        if self.config._attn_implementation == "eager":
            acc = torch.promote_types(q.dtype, torch.float32)
            scores = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * self.scale
            if mask is None:
                tq, tk = scores.shape[-2:]
                mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, float("-inf"))
            else:
                scores = scores + mask.to(acc)
            return torch.matmul(torch.softmax(scores, dim=-1), v.to(acc)).to(q.dtype)
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and q.shape[2] > 1,
                                              scale=self.scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: Optional[torch.Tensor],
                cache: Optional[Cache] = None, cache_position: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, T, _ = x.shape
        d = self.head_dim
        # where a static cache writes (transformers 4 needs it; 5 counts itself and ignores it)
        where = None if cache_position is None else {"cache_position": cache_position}
        if self.kind == "diff_v1":
            return self._diff_v1(x, cos, sin, mask, cache, where)
        qh = 2 * self.n_heads if self.kind == "diff_v2" else self.n_heads
        q = apply_rope(self.wq(x).view(B, T, qh, d), cos, sin).transpose(1, 2)  # (B, qh, T, d)
        k = apply_rope(self.wk(x).view(B, T, self.n_kv_heads, d), cos, sin).transpose(1, 2)  # (B, Hkv, T, d)
        v = self.wv(x).view(B, T, self.n_kv_heads, d).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, where)
        rep = qh // self.n_kv_heads
        out = self.attend(q, repeat_kv(k, rep), repeat_kv(v, rep), mask)  # (B, qh, T, d)
        if self.kind == "diff_v2":
            H = self.n_heads
            if self.config.v2_pairing == "interleaved":
                a1, a2 = out[:, 0::2], out[:, 1::2]
            else:
                a1, a2 = out[:, :H], out[:, H:]
            lam = self.lambda_values(x)
            out = a1 - a2 if lam is None else a1 - lam.to(a1.dtype) * a2  # (B, H, T, d)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.n_heads * d))

    def _diff_v1(self, x, cos, sin, mask, cache, where) -> torch.Tensor:
        B, T, _ = x.shape
        h, hkv, d, dv = self.n_heads, self.n_kv_heads, self.head_dim, self.value_dim
        rep = h // hkv
        q = apply_rope(self.wq(x).view(B, T, 2 * h, d), cos, sin).transpose(1, 2)  # (B, 2h, T, d)
        k = apply_rope(self.wk(x).view(B, T, 2 * hkv, d), cos, sin).transpose(1, 2)  # (B, 2hkv, T, d)
        v = self.wv(x).view(B, T, hkv, dv).transpose(1, 2)  # (B, hkv, T, dv)
        if cache is not None:
            # cached as 2 hkv heads of dv/2 (each value's two halves), as many heads as the keys: caches that
            # allocate one head count for both (StaticCache) hold it; read back unchanged, bit for bit
            v = v.view(B, hkv, T, 2, dv // 2).transpose(2, 3).reshape(B, 2 * hkv, T, dv // 2)
            k, v = cache.update(k, v, self.layer_idx, where)
            v = v.view(B, hkv, 2, -1, dv // 2).transpose(2, 3).reshape(B, hkv, -1, dv)
        q1, q2 = q[:, 0::2], q[:, 1::2]  # (B, h, T, d)
        k1, k2 = k[:, 0::2], k[:, 1::2]  # (B, hkv, Tk, d)
        lam = self.lambda_full()
        # A1 V and A2 V in one attention call, V split into d-wide pieces stacked along the batch (fused kernels
        # want the value as wide as the query): (q1, k1, v_a), (q1, k1, v_b), (q2, k2, v_a), (q2, k2, v_b).
        vs = v.split(d, dim=-1)
        n = len(vs)
        qn = torch.cat((q1,) * n + (q2,) * n, dim=0)
        kn = repeat_kv(torch.cat((k1,) * n + (k2,) * n, dim=0), rep)
        vn = repeat_kv(torch.cat(vs + vs, dim=0), rep)
        mn = mask.repeat(2 * n, 1, 1, 1) if mask is not None and mask.shape[0] > 1 else mask
        o = self.attend(qn, kn, vn, mn).split(B, dim=0)
        a1v, a2v = torch.cat(o[:n], dim=-1), torch.cat(o[n:], dim=-1)  # (B, h, T, dv) each
        out = a1v - lam.to(a1v.dtype) * a2v
        if self.subln is not None:
            out = self.subln(out)
        out = out * (1.0 - self.lambda_init)
        return self.wo(out.transpose(1, 2).reshape(B, T, h * dv))


# ---------------------------------------------------------------------------------------------- the model
class DiffTransformerBlock(nn.Module):
    def __init__(self, config: DiffTransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = DiffTransformerRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = DiffTransformerAttention(config, layer_idx)
        self.ffn_norm = DiffTransformerRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ffn = DiffTransformerMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: Optional[torch.Tensor],
                cache: Optional[Cache] = None, cache_position: Optional[torch.Tensor] = None) -> torch.Tensor:
        y = x + self.attn(self.attn_norm(x), cos, sin, mask, cache, cache_position)
        return y + self.ffn(self.ffn_norm(y))


class DiffTransformerPreTrainedModel(PreTrainedModel):
    config_class = DiffTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DiffTransformerBlock"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flash_attn_2 = False
    _supports_flex_attn = False
    _supports_cache_class = True
    _supports_static_cache = True

    def _init_weights(self, module: nn.Module) -> None:
        """Linear and embedding weights N(0, initializer_range), norm weights 1, DIFF V1's lambda vectors
        N(0, 0.1) and the per_head negative-branch weight 1 (difftransformer's init)."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            _init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, DiffTransformerRMSNorm) and module.weight is not None:
            _init.ones_(module.weight)
        elif isinstance(module, DiffTransformerAttention) and module.kind == "diff_v1":
            for p in (module.lambda_q1, module.lambda_k1, module.lambda_q2, module.lambda_k2):
                _init.normal_(p, mean=0.0, std=0.1)
            if module.neg_weight is not None:
                _init.ones_(module.neg_weight)


class DiffTransformerModel(DiffTransformerPreTrainedModel):
    """The decoder without the LM head: its output is the final RMSNorm's."""

    def __init__(self, config: DiffTransformerConfig) -> None:
        super().__init__(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DiffTransformerBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = DiffTransformerRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.tok_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.tok_embeddings = value

    def build_mask(self, attention_mask: Optional[torch.Tensor], batch: int, q_len: int, past: int,
                   device: torch.device) -> Optional[torch.Tensor]:
        """The (B, 1, T, past + T) bool mask of this forward, or None where plain causal attention over the input (no
        past) or a single query over every cached key (no padding) needs none. A 4D mask is used as given."""
        kv_len = past + q_len
        if attention_mask is not None and attention_mask.dim() == 4:
            return attention_mask
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < kv_len:
                raise ValueError(f"attention_mask must have shape (batch, past + seq_len) = ({batch}, {kv_len}), got "
                                 f"{tuple(attention_mask.shape)}")
            attention_mask = attention_mask[:, -kv_len:]
            if bool(attention_mask.all()):
                attention_mask = None
        if attention_mask is None and (past == 0 or q_len == 1):
            return None
        q_idx = torch.arange(past, kv_len, device=device)
        k_idx = torch.arange(kv_len, device=device)
        allowed = (k_idx[None, :] <= q_idx[:, None])[None, None]  # (1, 1, T, Tk)
        if attention_mask is not None:
            allowed = allowed & attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
            # a query that sees no key (a left-pad position) sees itself, so that its row stays finite
            own = (k_idx[None, :] == q_idx[:, None])[None, None]
            allowed = allowed | (own & ~allowed.any(dim=-1, keepdim=True))
        return allowed

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, cache=None, cache_position=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if output_attentions:
            raise ValueError("output_attentions is not supported by DiffTransformerModel (differential attention "
                             "has two maps per head); use the difftransformer package's analyses")
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            use_cache = False  # the recomputed forward would write the cache a second time
        x = self.tok_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        B, T, _ = x.shape
        if use_cache and cache is None:
            cache = _new_cache(self.config)
        elif isinstance(cache, tuple) and hasattr(DynamicCache, "from_legacy_cache"):
            cache = DynamicCache.from_legacy_cache(cache)
        if not use_cache:
            cache = None
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=x.device)[None].expand(B, -1)
        cos, sin = rope_cos_sin(position_ids.to(x.device), rope_inv_freq(self.config, x.device))
        mask = self.build_mask(attention_mask, B, T, past, x.device)
        hidden = () if output_hidden_states else None
        for layer in self.layers:
            if output_hidden_states:
                hidden += (x,)
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = self._gradient_checkpointing_func(layer.__call__, x, cos, sin, mask)
            else:
                x = layer(x, cos, sin, mask, cache, cache_position)
        x = self.norm(x)
        if output_hidden_states:
            hidden += (x,)
        out = BaseModelOutputWithPast(last_hidden_state=x, hidden_states=hidden, **{_CACHE_FIELD: cache})
        return out if return_dict else out.to_tuple()


def _new_cache(config: DiffTransformerConfig) -> Cache:
    try:
        return DynamicCache(config=config)
    except TypeError:  # transformers < 4.56: no config argument
        return DynamicCache()


class DiffTransformerForCausalLM(DiffTransformerPreTrainedModel, GenerationMixin):
    """The decoder and its LM head; ``labels`` (unshifted, -100 ignored) give the next-token loss."""

    if _TRANSFORMERS_MAJOR >= 5:
        _tied_weights_keys = {"lm_head.weight": "model.tok_embeddings.weight"}
    else:
        _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config: DiffTransformerConfig) -> None:
        super().__init__(config)
        self.model = DiffTransformerModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.tok_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.tok_embeddings = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def get_decoder(self) -> DiffTransformerModel:
        return self.model

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, logits_to_keep=0, cache=None, cache_position=None, **kwargs):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache if cache is not None else past_key_values, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, output_attentions=output_attentions,
                         output_hidden_states=output_hidden_states, return_dict=True, cache_position=cache_position)
        x = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            x = x[:, -logits_to_keep:] if logits_to_keep > 0 else x
        else:
            x = x[:, logits_to_keep]
        logits = self.lm_head(x)
        loss = None
        if labels is not None:
            loss = self._loss(logits, labels, **kwargs)
        result = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        **{_CACHE_FIELD: getattr(out, _CACHE_FIELD)})
        return result if return_dict else result.to_tuple()

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        """Mean next-token cross-entropy in float32 (transformers' loss_function where it has one: it also takes
        the Trainer's ``num_items_in_batch`` under gradient accumulation)."""
        fn = getattr(self, "loss_function", None)
        if fn is not None:
            extra = {k: v for k, v in kwargs.items() if k in ("num_items_in_batch", "ignore_index")}
            return fn(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **extra)
        shift_logits = logits[:, :-1].float().reshape(-1, logits.shape[-1])
        return F.cross_entropy(shift_logits, labels[:, 1:].reshape(-1).to(logits.device), ignore_index=-100)


__all__ = ["DiffTransformerForCausalLM", "DiffTransformerModel", "DiffTransformerPreTrainedModel"]
