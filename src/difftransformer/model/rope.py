"""Rotary position embedding (Su et al., 2021) in the interleaved (GPT-J) layout of the official DIFF code.

Channels (2i, 2i+1) of each head form one rotated pair. Hugging Face's Llama/DiffLlama use the NeoX layout
(channel i paired with i + d/2): the interop converter permutes the q/k projection rows between the two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import torch


def rope_frequencies(head_dim: int, theta: float, device: torch.device | str | None = None,
                     dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d), i < d/2.

    float64 by default: angles = position * frequency then stay exact to float32 rounding even at long contexts,
    and float64 tests see exact RoPE. Not stored as a buffer, so ``model.to(bfloat16)`` cannot degrade it.
    """
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=dtype) / head_dim))


def llama3_scaled(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                  original_max_len: int) -> torch.Tensor:
    """Llama 3.1's RoPE frequency scaling (``rope_type: llama3``): wavelengths longer than
    ``original_max_len / low_freq_factor`` are stretched by ``factor``, those shorter than
    ``original_max_len / high_freq_factor`` are kept, and the band between is interpolated smoothly."""
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = original_max_len / low_freq_factor, original_max_len / high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (..., T, 1, d/2) for positions of shape (..., T); broadcast over heads.

    Computed in inv_freq's dtype; apply_rope casts them to its working dtype.
    """
    angles = positions.to(inv_freq.dtype)[..., None] * inv_freq  # (..., T, d/2)
    return angles.cos()[..., None, :], angles.sin()[..., None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x of shape (B, T, heads, d) pairwise; math in float32, result in x's dtype."""
    acc = torch.promote_types(x.dtype, torch.float32)  # at least fp32, float64 stays float64
    xf = x.to(acc).unflatten(-1, (-1, 2))  # (B, T, heads, d/2, 2)
    cos, sin = cos.to(acc), sin.to(acc)
    x1, x2 = xf[..., 0], xf[..., 1]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, T, heads, d/2, 2)
    return out.flatten(-2).type_as(x)


def rotary(positions: torch.Tensor, head_dim: int, theta: float,
           llama3: Optional[tuple[float, float, float, int]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The (cos, sin) tables of ``positions`` ((T,) or (B, T)) for heads of width ``head_dim``: the one RoPE set-up of
    the model and the layer. Frequencies in float64 (exact angles at long contexts), float32 where the device has no
    float64 (MPS); ``llama3``: (factor, low_freq_factor, high_freq_factor, original_max_len), Llama 3.1's scaling.

    Under torch.compile the tables are one opaque operator of the graph (``difftransformer::rope_tables``), computed
    as eagerly: else inductor fuses their float64 pow, cos and sin into every rotated element (B x T x heads x d/2 of
    them, in a scalar loop), and the compiled baseline layer with RoPE took 1.4-1.8x its time without
    (`bench layer --rope on --modes compile`, BENCHMARKS.md)."""
    if torch.compiler.is_compiling():
        return _rope_tables(positions, head_dim, float(theta), None if llama3 is None else [float(v) for v in llama3])
    return _tables(positions, head_dim, theta, llama3)


def _tables(positions: torch.Tensor, head_dim: int, theta: float,
            llama3: Optional[Sequence[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.float32 if positions.device.type == "mps" else torch.float64
    inv_freq = rope_frequencies(head_dim, theta, positions.device, dtype)
    if llama3 is not None:
        factor, low, high, original = llama3
        inv_freq = llama3_scaled(inv_freq, factor, low, high, int(original))
    return rope_cos_sin(positions, inv_freq)


@torch.library.custom_op("difftransformer::rope_tables", mutates_args=())
def _rope_tables(positions: torch.Tensor, head_dim: int, theta: float,
                 llama3: Optional[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = _tables(positions, head_dim, theta, llama3)
    return cos.contiguous(), sin.contiguous()


@_rope_tables.register_fake
def _(positions: torch.Tensor, head_dim: int, theta: float,
      llama3: Optional[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.float32 if positions.device.type == "mps" else torch.float64
    shape = (*positions.shape, 1, head_dim // 2)
    return positions.new_empty(shape, dtype=dtype), positions.new_empty(shape, dtype=dtype)


def rotate(x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """``apply_rope(x, *rope)``, or x itself where ``rope`` is None (no rotary positions: ``DiffAttention(rope=False)``,
    a caller's own position scheme, and cross-attention unless asked)."""
    return x if rope is None else apply_rope(x, *rope)
