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
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..config import ModelConfig
from ..rope import apply_rope
from .base import Attention, QueryRows
from .dispatch import diff_attention


class DiffV2Attention(Attention):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        H, Hkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        self.wq = nn.Linear(cfg.d_model, 2 * H * d, bias=False)
        self.wk = nn.Linear(cfg.d_model, Hkv * d, bias=False)
        self.wv = nn.Linear(cfg.d_model, Hkv * d, bias=False)
        self.wo = nn.Linear(H * d, cfg.d_model, bias=False)
        self.wlambda = nn.Linear(cfg.d_model, H, bias=False) if cfg.v2_lambda != "none" else None
        self.lambda_mode, self.pairing = cfg.v2_lambda, cfg.v2_pairing

    def cache_layout(self) -> tuple[int, int, int, int]:
        return self.n_kv_heads, self.head_dim, self.n_kv_heads, self.head_dim

    # Mean over batch, heads and tokens of lambda (after the sigmoid unless v2_lambda='raw'), per layer.
    lambda_summary_name = "lambda_v2_mean_sigmoid"

    def lambda_parameters(self) -> list[nn.Parameter]:
        return [] if self.wlambda is None else list(self.wlambda.parameters())

    def lambda_summary(self, x: torch.Tensor) -> Optional[float]:
        lam = self.lambda_values(x)
        return None if lam is None else float(lam.float().mean())

    def lambda_values(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """(B, H, T, 1) per-token per-head lambda (after the sigmoid unless v2_lambda='raw'); None for 'none'."""
        if self.wlambda is None:
            return None
        lam = self.wlambda(x).transpose(1, 2).unsqueeze(-1)  # (B, T, H) -> (B, H, T, 1)
        return torch.sigmoid(lam) if self.lambda_mode == "sigmoid" else lam

    takes_query_rows = True

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: Optional[torch.Tensor],
                input_pos: Optional[torch.Tensor] = None, return_maps: bool = False, query: Optional[QueryRows] = None):
        B, T, _ = x.shape
        H, Hkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        xq, rq, mask = (x, rope, mask) if query is None else query  # queries at every position, or at K rows
        Tq = xq.shape[1]
        q = apply_rope(self.wq(xq).view(B, Tq, 2 * H, d), *rq).transpose(1, 2)  # (B, 2H, Tq, d)
        k = apply_rope(self.wk(x).view(B, T, Hkv, d), *rope).transpose(1, 2)  # (B, Hkv, T, d)
        v = self.wv(x).view(B, T, Hkv, d).transpose(1, 2)  # (B, Hkv, T, d)
        k, v = self.update_cache(input_pos, k, v)
        # attn: softmax attention over the 2H query heads ("shared" keys: standard GQA). Pair i is query heads 2i and
        # 2i+1, one GQA group's (v2_pairing="halves": i and H+i, across groups); out_i = attn_2i - lambda_i attn_2i+1.
        out, maps = diff_attention(self, xq, q, k, v, self.lambda_values(xq), mask, input_pos, return_maps,
                                   keys="shared", pairing=self.pairing)  # (B, H, Tq, d)
        out = out.transpose(1, 2).reshape(B, Tq, H * d)  # (B, Tq, H*d)
        return self.wo(out), maps
