"""The building blocks of the difftransformer remote-code model: RMSNorm, interleaved RoPE, the SwiGLU MLP and the
attention of every variant (baseline, DIFF V1 paper and per_head layouts, DIFF V2); ``modeling_difftransformer.py``
assembles them. Imports only torch and transformers; the equations are in ``modeling_difftransformer.py``'s
docstring.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache

from .configuration_difftransformer import DiffTransformerConfig


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
    """cos, sin of shape (B, T, 1, d/2) for position_ids (B, T), in inv_freq's dtype. Under torch.compile (torch >=
    2.4) one opaque operator of the graph, computed as eagerly: else inductor fuses the float64 cos and sin into
    every rotated element (the package's rope.py says what it cost)."""
    if _ROPE_OP is not None and _compiling():
        return _ROPE_OP(position_ids, inv_freq)
    return _rope_cos_sin(position_ids, inv_freq)


def _rope_cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    angles = position_ids.to(inv_freq.dtype)[..., None] * inv_freq
    return angles.cos()[..., None, :], angles.sin()[..., None, :]


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def _rope_op():
    """``difftransformer_remote::rope_cos_sin`` (defining it again, as a second copy of this file does, replaces it
    with the same function), or None where torch has no ``torch.library.custom_op``."""
    if not hasattr(torch.library, "custom_op"):
        return None

    @torch.library.custom_op("difftransformer_remote::rope_cos_sin", mutates_args=())
    def op(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = _rope_cos_sin(position_ids, inv_freq)
        return cos.contiguous(), sin.contiguous()

    @op.register_fake
    def _(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*position_ids.shape, 1, inv_freq.shape[-1])
        return inv_freq.new_empty(shape), inv_freq.new_empty(shape)

    return op


_ROPE_OP = _rope_op()


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
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.to(acc)
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
