"""Attention variants behind one interface, chosen by ``ModelConfig.attention``."""

from __future__ import annotations

from ..config import ModelConfig
from .base import Attention, AttentionMaps
from .baseline import BaselineAttention
from .diff_v1 import DiffV1Attention
from .diff_v2 import DiffV2Attention

ATTENTION_REGISTRY: dict[str, type[Attention]] = {
    "baseline": BaselineAttention,
    "diff_v1": DiffV1Attention,
    "diff_v2": DiffV2Attention,
}


def build_attention(cfg: ModelConfig, layer_idx: int) -> Attention:
    try:
        cls = ATTENTION_REGISTRY[cfg.attention]
    except KeyError:
        raise ValueError(f"ModelConfig.attention={cfg.attention!r} is not allowed; "
                         f"choose one of {', '.join(ATTENTION_REGISTRY)}") from None
    return cls(cfg, layer_idx)


__all__ = ["Attention", "AttentionMaps", "BaselineAttention", "DiffV1Attention", "DiffV2Attention",
           "ATTENTION_REGISTRY", "build_attention"]
