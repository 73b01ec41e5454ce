"""DIFF V1: multi-head differential attention (Ye et al., 2024, arXiv 2410.05258, section 2.1).

Read this file against the paper's equations:

  Eq. (1)  [Q1; Q2] = X W_Q,  [K1; K2] = X W_K,  V = X W_V
           DiffAttn(X) = (softmax(Q1 K1^T / sqrt(d)) - lambda * softmax(Q2 K2^T / sqrt(d))) V
  Eq. (2)  lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init,
           lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)),  l in [1, L]   (we use 0-based l: same numbers)
  Eq. (3)  head_i' = (1 - lambda_init) * LN(head_i),  MultiHead(X) = Concat(head_1', ..., head_h') W_O

Shapes, with the *baseline's* H query heads and H_kv KV heads of width d (see ``ModelConfig``):
h = H/2 differential heads, h_kv = H_kv/2 KV groups. The projections are
W_q: d_model -> 2h*d, W_k: d_model -> 2h_kv*d, W_v: d_model -> h_kv*2d, W_o: h*2d -> d_model,
exactly the baseline's sizes, so parameters and projection FLOPs match (paper: "h = d_model/2d").

Pairing (official layout): half-heads 2i and 2i+1 of the query projection are Q1 and Q2 of head i; key
half-heads 2g and 2g+1 are K1 and K2 of KV group g; query head i reads group i // (h / h_kv). Q1 reads K1
and Q2 reads K2 of the *same* group -- the official plain-PyTorch file repeats the key half-heads before
pairing, so under GQA its Q1 and Q2 read the same key half; we split first, then repeat.

``v1_layout="per_head"`` (for a pretrained baseline converted with its function kept, ``model/upcycle.py``):
h = H differential heads and h_kv = H_kv groups, each head with d-wide queries/keys (two of each) and a d-wide
value, so W_q: d_model -> 2H*d, W_k: d_model -> 2H_kv*d, W_v: d_model -> H_kv*d, W_o: H*d -> d_model (the
baseline's V and W_o; the queries and keys doubled). Its lambda is multiplied by ``neg_weight``, a per-layer
buffer that a conversion sets to 0 (the negative branch off: the layer is then the source's head, rescaled) and
training warms up to 1 over ``train.v1_negative_warmup`` steps. A per_head model built from scratch starts at 1.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..config import AttentionConfig
from ..norm import RMSNorm
from ..rope import rotate
from .base import Attention, QueryRows, normal_init_
from .dispatch import diff_attention, sdpa_diff, sdpa_direct
from .masks import MaskKind


def reparameterised_lambda(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor,
                           lambda_init: float) -> torch.Tensor:
    """Eq. (2): exp(q1 . k1) - exp(q2 . k2) + lambda_init, a 0-dim tensor in at least fp32 (not clamped)."""
    acc = torch.promote_types(q1.dtype, torch.float32)
    lam1 = torch.exp(torch.sum(q1.to(acc) * k1.to(acc)))
    lam2 = torch.exp(torch.sum(q2.to(acc) * k2.to(acc)))
    return lam1 - lam2 + lambda_init


class DiffV1Attention(Attention):
    def __init__(self, cfg: AttentionConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        per_head = cfg.v1_layout == "per_head"
        self.n_heads = cfg.n_diff_heads
        self.n_kv_heads = cfg.n_kv_heads if per_head else cfg.n_kv_heads // 2
        self.head_dim, self.value_dim = cfg.head_dim, cfg.v1_value_dim
        h, hkv, d, dv = self.n_heads, self.n_kv_heads, self.head_dim, self.value_dim
        self.wq = nn.Linear(cfg.d_model, 2 * h * d, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.d_model, 2 * hkv * d, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.d_model, hkv * dv, bias=cfg.qkv_bias)
        self.wo = nn.Linear(h * dv, cfg.d_model, bias=cfg.proj_bias)
        # Eq. (2): four learnable vectors in R^d, one lambda per layer shared by its heads; kept in fp32.
        self.lambda_init = cfg.lambda_init_for(layer_idx)
        self.lambda_q1 = nn.Parameter(torch.empty(d, dtype=torch.float32))
        self.lambda_k1 = nn.Parameter(torch.empty(d, dtype=torch.float32))
        self.lambda_q2 = nn.Parameter(torch.empty(d, dtype=torch.float32))
        self.lambda_k2 = nn.Parameter(torch.empty(d, dtype=torch.float32))
        # Eq. (3): head-wise RMSNorm over each 2d-wide head (Table 6 ablation: headwise_norm=False).
        self.subln = (RMSNorm(dv, eps=1e-5, elementwise_affine=cfg.headwise_norm_weight)
                      if cfg.headwise_norm else None)
        # per_head layout: the negative branch's weight (0 after a conversion, warmed up to 1 by training).
        self.neg_weight: Optional[torch.Tensor]
        if per_head:
            self.register_buffer("neg_weight", torch.ones((), dtype=torch.float32))
        else:
            self.neg_weight = None
        self.make_head_gain(self.n_heads)  # head_gain: in place of the norm and the fixed (1 - lambda_init)
        self.reset_lambda()

    lambda_summary_name = "lambda_v1"  # the learned lambda of eq. (2), per layer

    def lambda_parameters(self) -> list[nn.Parameter]:
        return [self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2]

    def reset_lambda(self) -> None:
        for p in self.lambda_parameters():
            normal_init_(p, 0.1)  # the reference code's N(0, 0.1)
        self.reset_head_gain()

    def static_lambda(self) -> torch.Tensor:
        return self.lambda_full()

    def lambda_summary(self, x: torch.Tensor) -> float:
        return float(self.lambda_full())

    def output_scale(self) -> float:
        if self.head_gain is not None:
            return 1.0  # head_gain: a learnable gain per head in its place
        return 1.0 - self.lambda_init  # eq. (3), with or without the head-wise norm

    def cache_layout(self) -> tuple[int, int, int, int]:
        return 2 * self.n_kv_heads, self.head_dim, self.n_kv_heads, self.value_dim

    def set_negative_weight(self, w: float) -> None:
        if self.neg_weight is not None:
            self.neg_weight.fill_(w)
            if self.kv_cache is not None:
                self.kv_cache.frozen.clear()

    def lambda_full(self) -> torch.Tensor:
        """Eq. (2), a 0-dim fp32 tensor; not clamped (it may go negative or above 1 during training).

        Under ``v1_layout="per_head"`` it is multiplied by the negative branch's warm-up weight ``neg_weight``:
        the lambda that the layer applies, which is what the analyses and the metrics read.
        """
        lam = reparameterised_lambda(self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2, self.lambda_init)
        return lam if self.neg_weight is None else lam * self.neg_weight.to(lam.dtype)

    def generation_lambda(self) -> torch.Tensor:
        """Eq. (2)'s lambda; under a KV cache without autograd, computed once per generation (at the prefill, kept
        with the cache, which every generation sets up anew) instead of from the four vectors at every step."""
        cache = self.kv_cache
        if cache is None or torch.is_grad_enabled():
            return self.lambda_full()
        lam = cache.frozen.get("lambda")
        if lam is None:
            lam = cache.frozen["lambda"] = self.lambda_full()
        return lam

    takes_query_rows = True

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: Optional[torch.Tensor],
                input_pos: Optional[torch.Tensor] = None, return_maps: bool = False, query: Optional[QueryRows] = None,
                mask_kind: MaskKind = "causal"):
        B, T, _ = x.shape
        h, hkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        xq, rq, mask = (x, rope, mask) if query is None else query  # queries at every position, or at K rows
        Tq = xq.shape[1]
        xq_q, x_k, x_v = self.project(xq, x)  # x W_q, x W_k, x W_v (one matmul where it can)
        q = rotate(xq_q.view(B, Tq, 2 * h, d), rq).transpose(1, 2)  # (B, 2h, Tq, d)
        k = rotate(x_k.view(B, T, 2 * hkv, d), rope).transpose(1, 2)  # (B, 2hkv, T, d)
        v = x_v.view(B, T, hkv, self.value_dim).transpose(1, 2)  # (B, hkv, T, 2d) (per_head: d)
        k, v = self.update_cache(input_pos, k, v)
        # Eq. (1): half-heads (2i, 2i+1) are (Q1, Q2) of head i and (K1, K2) of KV group g = i // (h / h_kv); Q1
        # reads K1 and Q2 reads K2 of that group ("paired" keys: split, then repeat). (B, h, T, 2d) = (A1 - lambda A2) V
        lam = self.generation_lambda()
        if sdpa_direct(self, x, return_maps):  # the default path: SDPA, nothing else could take the call
            out, maps = sdpa_diff(q, k, v, lam, mask, self.scale, "paired", "interleaved", self.dropout_p), None
        else:  # the maps, a KV cache or a fused kernel's backend: the dispatcher's rules
            out, maps = diff_attention(self, xq, q, k, v, lam, mask, input_pos, return_maps, keys="paired",
                                       mask_kind=mask_kind)
        if self.head_gain is not None:  # the mechanism arm: a learnable gain per head, no norm, no fixed factor
            out = self.apply_head_gain(out)
        else:
            if self.subln is not None:
                out = self.subln(out)  # Eq. (3): RMSNorm over each head's 2d channels
            out = out * (1.0 - self.lambda_init)  # Eq. (3): fixed multiplier aligns gradients with the baseline
        out = out.transpose(1, 2).reshape(B, Tq, h * self.value_dim)  # (B, Tq, h*2d): Concat(heads)
        return self.wo(out), maps
