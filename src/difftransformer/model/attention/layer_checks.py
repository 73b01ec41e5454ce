"""The public layer's argument checks (``DiffAttention``, ``layer.py``): every bad tensor, shape, dtype, position and
mask a caller can give is refused in one ``ValueError`` or ``TypeError`` naming the argument, before any work."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..config import AttentionConfig
from ..kv_cache import KVCache


class LayerChecks(nn.Module):
    """The checks as methods of the layer (mixed in before the variant's module: they read its cache and heads)."""

    cfg: AttentionConfig
    kv_cache: Optional[KVCache]
    _filled: int  # under a KV cache: how many positions hold keys

    @property
    def n_mask_heads(self) -> int:
        """The head axis an ``attn_mask`` may have besides 1: the layer's output heads (DIFF V1: n_heads/2)."""
        return int(getattr(self, "n_heads", self.cfg.n_heads))

    @staticmethod
    def _tensor(name: str, t: Any) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"DiffAttention: {name} must be a torch.Tensor, got {type(t).__name__}")
        return t

    def _check_dtype(self, name: str, x: torch.Tensor) -> None:
        if not x.is_floating_point():
            raise TypeError(f"DiffAttention: {name} must be a floating-point tensor, got {x.dtype}")
        wq = getattr(self, "wq", None)
        w = wq.weight if isinstance(wq, nn.Linear) else next(self.parameters())
        if x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(f"DiffAttention: {name} is {x.dtype} but the layer's weights are {w.dtype}: cast one "
                             f"(layer.to({x.dtype}) or {name}.to({w.dtype})), or run under torch.autocast")

    def _positions(self, name: str, p: Optional[torch.Tensor], B: int, T: int, device: torch.device) -> torch.Tensor:
        if p is None:
            return torch.arange(T, device=device)
        p = self._tensor(name, p)
        if p.dtype == torch.bool or p.is_floating_point() or p.is_complex() or p.dim() not in (1, 2) \
                or p.shape[-1] != T or (p.dim() == 2 and p.shape[0] != B):
            raise ValueError(f"DiffAttention: {name} must be integer positions of shape ({T},) or (B={B}, {T}), got "
                             f"{p.dtype} {tuple(p.shape)}")
        if p.device != device:
            raise ValueError(f"DiffAttention: {name} is on {p.device} but x is on {device}")
        if not p.is_meta and not torch.compiler.is_compiling() and p.numel() and bool((p < 0).any()):
            raise ValueError(f"DiffAttention: {name} must be >= 0")
        return p

    def _cache_positions(self, p: Optional[torch.Tensor], B: int, T: int) -> torch.Tensor:
        cache = self.kv_cache
        assert cache is not None
        if p is None or not isinstance(p, torch.Tensor) or p.dim() != 1:
            raise ValueError("DiffAttention: under a KV cache, positions= (T,) says where the new tokens go")
        if B != cache.k.shape[0]:
            raise ValueError(f"DiffAttention: x has batch {B} but the KV cache was set up for {cache.k.shape[0]} "
                             "(setup_cache(batch_size, ...))")
        p = self._positions("positions", p, B, T, cache.k.device)
        if T == 0:
            raise ValueError("DiffAttention: under a KV cache, x must hold at least one new token")
        if not p.is_meta and not torch.compiler.is_compiling():
            first, last = int(p[0]), int(p[-1])
            if last >= cache.max_seq_len:
                raise ValueError(f"DiffAttention: positions up to {last} overflow the KV cache of "
                                 f"{cache.max_seq_len} positions (setup_cache(batch_size, max_seq_len))")
            if not torch.equal(p, torch.arange(first, first + T, device=p.device)) or first > self._filled:
                raise ValueError(f"DiffAttention: under a KV cache, positions must be consecutive and start at or "
                                 f"before {self._filled} (the positions filled so far), got {first}..{last}: a gap "
                                 "would be attended as zeros")
        return p

    def _padding(self, kpm: Any, B: int, S: int) -> torch.Tensor:
        kpm = self._tensor("key_padding_mask", kpm)
        if kpm.dtype != torch.bool or kpm.shape != (B, S):
            raise ValueError(f"DiffAttention: key_padding_mask must be a bool tensor (B={B}, S={S}), True where a "
                             f"key is padding (torch.nn.MultiheadAttention's convention), got {kpm.dtype} "
                             f"{tuple(kpm.shape)}")
        return kpm

    def _attn_mask(self, am: Any, B: int, T: int, S: int) -> torch.Tensor:
        am = self._tensor("attn_mask", am)
        h = self.n_mask_heads
        if am.dtype != torch.bool and not am.is_floating_point():
            raise ValueError(f"DiffAttention: attn_mask must be bool (True: may attend) or floating (added to the "
                             f"logits), got {am.dtype}")
        full = (B, h, T, S)
        try:
            ok = 2 <= am.dim() <= 4 and torch.broadcast_shapes(am.shape, full) == full
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"DiffAttention: attn_mask must broadcast to (B={B}, heads={h} or 1, T={T}, S={S}) "
                             f"(SDPA's convention), got {tuple(am.shape)}")
        return am.reshape((1,) * (4 - am.dim()) + tuple(am.shape))

def positive_int(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"DiffAttention: {name} must be an integer, got {type(v).__name__} {v!r}")
    if v <= 0:
        raise ValueError(f"DiffAttention: {name} must be a positive integer, got {v!r}")
