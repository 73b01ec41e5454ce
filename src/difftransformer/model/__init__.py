from .attention import ATTENTION_REGISTRY, AttentionMaps, build_attention
from .config import ModelConfig
from .kv_cache import KVCache
from .transformer import DiffTransformerLM, LMOutput, lm_loss

__all__ = ["ModelConfig", "DiffTransformerLM", "LMOutput", "lm_loss", "AttentionMaps", "KVCache",
           "ATTENTION_REGISTRY", "build_attention"]
