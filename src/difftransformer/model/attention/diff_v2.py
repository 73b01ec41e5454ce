"""DIFF V2 (Ye, Dong, Sun, Wei; "Differential Transformer V2", January 2026).

With the baseline's H query heads and H_kv KV heads of width d:
  W_q: d_model -> 2H*d (query heads doubled), W_k, W_v: d_model -> H_kv*d (the baseline's KV cache),
  W_lambda: d_model -> H (lambda per token and per head), W_o: H*d -> d_model (the baseline's), no biases.
  attn = softmax-attention(q, k, v, causal) over 2H query heads (standard kernels, GQA)
  out  = attn[:, 0::2] - sigmoid(lambda) * attn[:, 1::2]
Query heads 2i and 2i+1 lie in the same GQA group (2H / H_kv is even), so they share KV head i // (H / H_kv).
No per-head RMSNorm, no lambda_init, no (1 - lambda_init) factor.

Ablations of the article: ``v2_lambda="none"`` (attn1 - attn2), ``"raw"`` (no sigmoid), and
``v2_pairing="halves"`` (head i paired with head i + H: the "wrong grouping" across GQA groups).

The retrieval diagnostic's one-change arms (each moves one part of DIFF V1 into V2; docs/retrieval.md):
  ``v2_lambda="scalar"``: lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, one per
      layer (DIFF V1's eq. 2 and its lambda_init schedule), in place of sigmoid(W_lambda x); no W_lambda.
  ``v2_keys="separate"``: W_k: d_model -> 2 H_kv d; query heads 2i and 2i+1 read key heads 2g and 2g+1 of their
      group g (K1 and K2, as DIFF V1), both still weighting the one value head g.
  ``v2_headwise_norm=True``: out_i = (1 - lambda_init) * RMSNorm(attn_2i - lambda_i attn_2i+1) over head i's d
      channels with a learnable d-wide weight (DIFF V1's eq. 3), lambda_init on the paper's layer schedule;
      ``v2_headwise_norm_layers="after_first"``: in every layer but the first (the follow-up arm).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..config import AttentionConfig
from ..norm import RMSNorm
from ..rope import rotate
from .base import Attention, QueryRows, normal_init_
from .diff_v1 import reparameterised_lambda
from .dispatch import diff_attention, sdpa_diff, sdpa_direct
from .masks import MaskKind, expand_heads


class DiffV2Attention(Attention):
    def __init__(self, cfg: AttentionConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        H, Hkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        self.keys = "paired" if cfg.v2_keys == "separate" else "shared"  # separate: K1, K2 per group
        self.n_key_heads = 2 * Hkv if self.keys == "paired" else Hkv
        self.wq = nn.Linear(cfg.d_model, 2 * H * d, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.d_model, self.n_key_heads * d, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.d_model, Hkv * d, bias=cfg.qkv_bias)
        self.wo = nn.Linear(H * d, cfg.d_model, bias=cfg.proj_bias)
        self.wlambda = nn.Linear(cfg.d_model, H, bias=False) if cfg.v2_lambda in ("sigmoid", "raw") else None
        self.lambda_mode, self.pairing = cfg.v2_lambda, cfg.v2_pairing
        self.lambda_init = cfg.lambda_init_for(layer_idx)  # the paper's schedule: "scalar" lambda, the norm's factor
        self.lambda_vectors = nn.ParameterList(
            [nn.Parameter(torch.empty(d, dtype=torch.float32)) for _ in range(4)] if cfg.v2_lambda == "scalar" else [])
        normed = cfg.v2_headwise_norm and (cfg.v2_headwise_norm_layers == "all" or layer_idx > 0)
        self.subln = RMSNorm(d, eps=1e-5) if normed else None
        self.make_head_gain(H)
        self.reset_lambda()

    def output_scale(self) -> float:
        return 1.0 - self.lambda_init if self.subln is not None else 1.0  # only with v2_headwise_norm

    def cache_layout(self) -> tuple[int, int, int, int]:
        return self.n_key_heads, self.head_dim, self.n_kv_heads, self.head_dim

    # Mean over batch, heads and tokens of lambda (after the sigmoid unless v2_lambda='raw'), per layer.
    lambda_summary_name = "lambda_v2_mean_sigmoid"

    def lambda_parameters(self) -> list[nn.Parameter]:
        return list(self.lambda_vectors) if self.wlambda is None else list(self.wlambda.parameters())

    def reset_lambda(self) -> None:
        for p in self.lambda_vectors:
            normal_init_(p, 0.1)  # as DIFF V1's (the reference code's N(0, 0.1))
        self.reset_head_gain()

    def static_lambda(self) -> Optional[torch.Tensor]:
        return self.scalar_lambda() if self.lambda_vectors else None

    def scalar_lambda(self) -> torch.Tensor:
        """``v2_lambda="scalar"``: DIFF V1's eq. (2), a 0-dim fp32 tensor."""
        q1, k1, q2, k2 = self.lambda_vectors
        return reparameterised_lambda(q1, k1, q2, k2, self.lambda_init)

    def lambda_summary(self, x: torch.Tensor) -> Optional[float]:
        lam = self.lambda_values(x)
        return None if lam is None else float(lam.float().mean())

    def lambda_values(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """(B, H, T, 1) per-token per-head lambda (after the sigmoid unless v2_lambda='raw'); None for 'none'; a
        0-dim tensor for 'scalar' (one per layer)."""
        if self.lambda_vectors:
            return self.scalar_lambda()
        if self.wlambda is None:
            return None
        lam = self.wlambda(x).transpose(1, 2).unsqueeze(-1)  # (B, T, H) -> (B, H, T, 1)
        return torch.sigmoid(lam) if self.lambda_mode == "sigmoid" else lam

    takes_query_rows = True

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: Optional[torch.Tensor],
                input_pos: Optional[torch.Tensor] = None, return_maps: bool = False, query: Optional[QueryRows] = None,
                mask_kind: MaskKind = "causal"):
        B, T, _ = x.shape
        H, Hkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        xq, rq, mask = (x, rope, mask) if query is None else query  # queries at every position, or at K rows
        Tq = xq.shape[1]
        xq_q, x_k, x_v = self.project(xq, x)  # x W_q, x W_k, x W_v (one matmul where it can)
        q = rotate(xq_q.view(B, Tq, 2 * H, d), rq).transpose(1, 2)  # (B, 2H, Tq, d)
        k = rotate(x_k.view(B, T, self.n_key_heads, d), rope).transpose(1, 2)  # (B, Hkv or 2Hkv, T, d)
        v = x_v.view(B, T, Hkv, d).transpose(1, 2)  # (B, Hkv, T, d)
        k, v = self.update_cache(input_pos, k, v)
        # attn: softmax attention over the 2H query heads ("shared" keys: standard GQA). Pair i is query heads 2i and
        # 2i+1, one GQA group's (v2_pairing="halves": i and H+i, across groups); out_i = attn_2i - lambda_i attn_2i+1.
        # v2_keys="separate": "paired" keys, query head 2i reads key head 2g and 2i+1 reads 2g+1 (as DIFF V1).
        lam = self.lambda_values(xq)
        if sdpa_direct(self, x, return_maps):  # the default path: SDPA, nothing else could take the call
            m = expand_heads(mask, self.pairing) if self.keys == "shared" else mask  # a pair's two maps: one mask
            out, maps = sdpa_diff(q, k, v, lam, m, self.scale, self.keys, self.pairing, self.dropout_p), None
        else:  # the maps, a KV cache or a fused kernel's backend: the dispatcher's rules
            out, maps = diff_attention(self, xq, q, k, v, lam, mask, input_pos, return_maps, keys=self.keys,
                                       pairing=self.pairing, mask_kind=mask_kind)  # (B, H, Tq, d)
        if self.subln is not None:  # v2_headwise_norm: DIFF V1's eq. (3) on each d-wide head
            out = self.subln(out) * (1.0 - self.lambda_init)
        elif self.head_gain is not None:  # head_gain: a learnable gain per head, no normalisation
            out = self.apply_head_gain(out)
        out = out.transpose(1, 2).reshape(B, Tq, H * d)  # (B, Tq, H*d)
        return self.wo(out), maps
