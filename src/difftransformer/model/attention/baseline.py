"""Baseline multi-head / grouped-query softmax attention (Vaswani et al., 2017; GQA, Ainslie et al., 2023)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..config import AttentionConfig
from ..rope import rotate
from .base import Attention, QueryRows
from .dispatch import softmax_attention
from .masks import MaskKind


class BaselineAttention(Attention):
    """H query heads and H_kv key/value heads of width d; query head i reads KV head i // (H / H_kv)."""

    def __init__(self, cfg: AttentionConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        d = self.head_dim
        self.wq = nn.Linear(cfg.d_model, self.n_heads * d, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.d_model, self.n_kv_heads * d, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.d_model, self.n_kv_heads * d, bias=cfg.qkv_bias)
        self.wo = nn.Linear(self.n_heads * d, cfg.d_model, bias=cfg.proj_bias)

    def cache_layout(self) -> tuple[int, int, int, int]:
        return self.n_kv_heads, self.head_dim, self.n_kv_heads, self.head_dim

    takes_query_rows = True

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: Optional[torch.Tensor],
                input_pos: Optional[torch.Tensor] = None, return_maps: bool = False, query: Optional[QueryRows] = None,
                mask_kind: MaskKind = "causal"):
        B, T, _ = x.shape
        H, Hkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        xq, rq, mask = (x, rope, mask) if query is None else query  # queries at every position, or at K rows
        Tq = xq.shape[1]
        xq_q, x_k, x_v = self.project(xq, x)  # x W_q, x W_k, x W_v (one matmul where it can)
        q = rotate(xq_q.view(B, Tq, H, d), rq).transpose(1, 2)  # (B, H, Tq, d)
        k = rotate(x_k.view(B, T, Hkv, d), rope).transpose(1, 2)  # (B, Hkv, T, d)
        v = x_v.view(B, T, Hkv, d).transpose(1, 2)  # (B, Hkv, T, d)
        k, v = self.update_cache(input_pos, k, v)
        out, maps = softmax_attention(self, xq, q, k, v, mask, return_maps)  # (B, H, Tq, d)
        out = out.transpose(1, 2).reshape(B, Tq, H * d)  # (B, Tq, H*d)
        return self.wo(out), maps
