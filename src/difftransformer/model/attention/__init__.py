"""Attention variants behind one interface, chosen by ``ModelConfig.attention``; each registered here once.

The registry (``model/variants.py``) holds what the rest of the package asks of a variant: its name, label,
bench column, colour, the ``ModelConfig`` options only it reads, whether it is the reference, and its class.
"""

from __future__ import annotations

from ..config import AttentionConfig
from ..variants import Variant, register, variant
from .base import Attention, AttentionMaps
from .baseline import BaselineAttention
from .diff_v1 import DiffV1Attention
from .diff_v2 import DiffV2Attention


def _check_diff_v1(cfg: AttentionConfig) -> None:
    if cfg.v1_layout == "paper" and (cfg.n_heads % 2 or cfg.n_kv_heads % 2):
        raise ValueError(
            f"{type(cfg).__name__}.n_heads={cfg.n_heads} and n_kv_heads={cfg.n_kv_heads} must both be even for "
            "attention='diff_v1' (it uses n_heads/2 differential heads and n_kv_heads/2 KV heads; "
            "v1_layout='per_head' keeps n_heads heads)")


BASELINE = register(Variant("baseline", label="Baseline", short="baseline", colour="#555555",
                            cls=BaselineAttention, reference=True, differential=False))
DIFF_V1 = register(Variant("diff_v1", label="DIFF V1", short="V1", colour="#1f77b4", cls=DiffV1Attention,
                           options=("lambda_init", "headwise_norm", "headwise_norm_weight", "v1_layout", "head_gain"),
                           check=_check_diff_v1))
DIFF_V2 = register(Variant("diff_v2", label="DIFF V2", short="V2", colour="#d62728", cls=DiffV2Attention,
                           options=("v2_lambda", "v2_pairing", "v2_keys", "v2_headwise_norm",
                                    "v2_headwise_norm_layers", "head_gain")))

# name -> class, kept for importers (rundir's metric keys); the registry is the source
ATTENTION_REGISTRY: dict[str, type[Attention]] = {v.name: v.cls for v in (BASELINE, DIFF_V1, DIFF_V2)}


def build_attention(cfg: AttentionConfig, layer_idx: int) -> Attention:
    """Layer ``layer_idx``'s attention module of ``cfg``'s variant (a ``ModelConfig`` is an ``AttentionConfig``)."""
    return variant(cfg.attention, f"{type(cfg).__name__}.attention").cls(cfg, layer_idx)


__all__ = ["Attention", "AttentionMaps", "BaselineAttention", "DiffV1Attention", "DiffV2Attention",
           "ATTENTION_REGISTRY", "build_attention"]
