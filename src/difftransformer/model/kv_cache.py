"""A static, preallocated KV cache written in place at the input positions (the gpt-fast design).

Each attention variant says what it caches (``cache_layout``): the baseline and DIFF V2 cache H_kv heads of
width d for keys and values; DIFF V1 caches 2*h_kv key half-heads of width d and h_kv values of width 2d.
"""

from __future__ import annotations

import torch
from torch import nn


class KVCache(nn.Module):
    k: torch.Tensor  # (B, Hk, max_seq_len, dk), a buffer (not saved with the model)
    v: torch.Tensor  # (B, Hv, max_seq_len, dv)

    def __init__(self, batch_size: int, max_seq_len: int, k_heads: int, k_dim: int, v_heads: int, v_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(batch_size, k_heads, max_seq_len, k_dim, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("v", torch.zeros(batch_size, v_heads, max_seq_len, v_dim, dtype=dtype, device=device),
                             persistent=False)
        # Input-independent values a layer computes once per generation (DIFF V1's lambda), set by the layer.
        self.frozen: dict[str, torch.Tensor] = {}

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[2]

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k (B, Hk, T, dk) and v (B, Hv, T, dv) at positions input_pos (T,); return the whole cache."""
        self.k.index_copy_(2, input_pos, k.to(self.k.dtype))
        self.v.index_copy_(2, input_pos, v.to(self.v.dtype))
        return self.k, self.v

    def reset(self) -> None:
        self.k.zero_()
        self.v.zero_()
        self.frozen.clear()

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()
