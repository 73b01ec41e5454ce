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
from .base import (Attention, AttentionMaps, eager_dtype, grouped_attention, key_padding, repeat_kv, sdpa,
                   softmax_maps, triton_pass)


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

    def split_pairs(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 2H, ...) -> two (B, H, ...): the two members of each differential pair."""
        if self.pairing == "interleaved":
            return a[:, 0::2], a[:, 1::2]
        return a[:, : self.n_heads], a[:, self.n_heads:]  # ablation: pairs cross GQA groups

    def combine(self, a1: torch.Tensor, a2: torch.Tensor, lam: Optional[torch.Tensor]) -> torch.Tensor:
        return a1 - a2 if lam is None else a1 - lam.to(a1.dtype) * a2

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: Optional[torch.Tensor],
                input_pos: Optional[torch.Tensor] = None, return_maps: bool = False):
        B, T, _ = x.shape
        H, Hkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        rep = 2 * H // Hkv
        q = apply_rope(self.wq(x).view(B, T, 2 * H, d), *rope).transpose(1, 2)  # (B, 2H, T, d)
        k = apply_rope(self.wk(x).view(B, T, Hkv, d), *rope).transpose(1, 2)  # (B, Hkv, T, d)
        v = self.wv(x).view(B, T, Hkv, d).transpose(1, 2)  # (B, Hkv, T, d)
        k, v = self.update_cache(input_pos, k, v)
        lam = self.lambda_values(x)

        maps = None
        if self.use_eager(return_maps):
            probs, logits = softmax_maps(q, repeat_kv(k, rep), mask, self.scale, self.logits_hook)  # (B, 2H, T, Tk)
            a1, a2 = self.split_pairs(probs)  # (B, H, T, Tk) each
            diff = self.combine(a1, a2, None if lam is None else lam.to(eager_dtype(x)))
            out = torch.matmul(diff, repeat_kv(v, H // Hkv).to(eager_dtype(x))).to(x.dtype)  # (B, H, T, d)
            if return_maps:
                maps = AttentionMaps(attn=diff, logits=logits, attn1=a1, attn2=a2,
                                     lam=None if lam is None else lam.detach())
        elif (self.use_decode(T, return_maps) and self.pairing == "interleaved"
              and self.use_triton_decode(x, mask, d)):
            from .triton_decode import triton_diff_decode  # imported here: only this path needs triton

            lam_t = torch.ones((), dtype=x.dtype, device=x.device) if lam is None else lam.to(x.dtype)
            out = self.run_triton(  # (B, H, 1, d); each key read once; the PyTorch step if a launch fails
                x, "decode", d, d,
                lambda: triton_diff_decode(q[:, 0::2], q[:, 1::2], k, k, v, lam_t, self.scale,
                                           mask[:, 0, -1, :].expand(B, -1)),
                lambda: self.combine(*self.split_pairs(grouped_attention(q, k, v, mask, self.scale)), lam))
        elif self.use_decode(T, return_maps):  # KV-cache decode: the baseline's cache, read once
            out = self.combine(*self.split_pairs(grouped_attention(q, k, v, mask, self.scale)), lam)  # (B, H, 1, d)
        elif self.pairing == "interleaved" and self.use_triton(x, return_maps, d, input_pos):
            from .triton_diff import triton_diff_attention  # imported here: only this path needs triton

            lam_t = torch.ones((), dtype=torch.float32, device=x.device) if lam is None else lam
            out = self.run_triton(  # (B, H, T, d); the pair shares its KV head; sdpa if a launch fails
                x, triton_pass(x), d, d,
                lambda: triton_diff_attention(q[:, 0::2], q[:, 1::2], k, k, v, lam_t, self.scale,
                                              key_padding(mask, B, T)),
                lambda: self._sdpa(q, k, v, lam, mask, rep))
        elif (self.backend == "blocked" and mask is None  # no mask: no cache, or a prefill from 0
              and self.pairing == "interleaved" and x.device.type == "cpu"):
            q1, q2 = q[:, 0::2], q[:, 1::2]  # (B, H, T, d): pair i reads KV head i // (H / Hkv)
            lam_b = torch.ones((), dtype=x.dtype, device=x.device) if lam is None else lam
            from .blocked import blocked_diff_attention  # imported here: only this path needs it

            out = blocked_diff_attention(q1, q2, k, k, v, lam_b, scale=self.scale)  # (B, H, T, d)
        else:
            out = self._sdpa(q, k, v, lam, mask, rep)
        out = out.transpose(1, 2).reshape(B, T, H * d)  # (B, T, H*d)
        return self.wo(out), maps

    def _sdpa(self, q, k, v, lam, mask, rep) -> torch.Tensor:
        o = sdpa(q, repeat_kv(k, rep), repeat_kv(v, rep), mask, self.scale)  # (B, 2H, T, d)
        return self.combine(*self.split_pairs(o), lam)  # (B, H, T, d)
