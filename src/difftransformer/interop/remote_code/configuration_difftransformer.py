"""Configuration of a difftransformer model for Hugging Face transformers (remote code: ``trust_remote_code=True``).

One decoder-only language model whose only variable part is the attention (``attention``):

* ``baseline``: softmax attention with ``num_attention_heads`` (H) query heads and ``num_key_value_heads`` (H_kv)
  key/value heads of width ``head_dim`` (d);
* ``diff_v1``: DIFF V1, differential attention (Ye et al., 2024, arXiv 2410.05258): ``v1_layout="paper"`` has H/2
  differential heads with 2d-wide values (the baseline's parameters), ``"per_head"`` one differential head per
  baseline head with d-wide values; lambda per layer from four learned vectors, optional head-wise RMSNorm;
* ``diff_v2``: DIFF V2 (January 2026): 2H query heads over the baseline's KV heads, pairs (2i, 2i+1) subtracted with
  a per-token, per-head lambda ``sigmoid(W_lambda x)``.

Head counts are always the baseline's (H, H_kv); each variant derives its own. This file imports only transformers
(it is copied into exported model directories and must run without the ``difftransformer`` package).
"""

from __future__ import annotations

import math

from transformers import PretrainedConfig

ATTENTION_KINDS = ("baseline", "diff_v1", "diff_v2")
V1_LAYOUTS = ("paper", "per_head")
V2_LAMBDA_MODES = ("sigmoid", "none", "raw")
V2_PAIRINGS = ("interleaved", "halves")
ROPE_TYPES = ("default", "llama3")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"DiffTransformerConfig.{name} must be a positive integer, got {value!r}")


def _positive_number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"DiffTransformerConfig.{name} must be a positive finite number, got {value!r}")


def _choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"DiffTransformerConfig.{name}={value!r} is not allowed; choose one of {', '.join(allowed)}")


class DiffTransformerConfig(PretrainedConfig):
    r"""Configuration of [`DiffTransformerForCausalLM`].

    Args:
        vocab_size: vocabulary size.
        hidden_size: model width (d_model).
        intermediate_size: SwiGLU hidden width.
        num_hidden_layers: number of decoder blocks.
        num_attention_heads: the baseline's query heads H (DIFF V1 paper layout uses H/2, DIFF V2 2H).
        num_key_value_heads: the baseline's key/value heads H_kv (grouped-query attention); default H.
        head_dim: width d of one head; default hidden_size // num_attention_heads.
        attention: "baseline", "diff_v1" or "diff_v2".
        max_position_embeddings: longest sequence the model was configured for.
        rms_norm_eps: eps of the pre-attention, pre-FFN and final RMSNorms.
        rope_theta: RoPE base; rotary pairs are interleaved channels (2i, 2i+1) (GPT-J layout).
        rope_type: "default" or "llama3" (Llama 3.1's frequency scaling, with the four rope_* numbers below).
        initializer_range: std of the normal init of linear and embedding weights.
        tie_word_embeddings: the LM head is the token embedding.
        lambda_init: DIFF V1 lambda_init, "schedule" (0.8 - 0.6 exp(-0.3 l), l the 0-based layer) or a number in (0, 1).
        headwise_norm: DIFF V1 head-wise RMSNorm (eps 1e-5) over each head's value channels.
        headwise_norm_weight: that norm has a learnable weight shared by the heads.
        v1_layout: DIFF V1 "paper" (H/2 heads, 2d-wide values) or "per_head" (H heads, d-wide values).
        v2_lambda: DIFF V2 "sigmoid" (attn1 - sigmoid(W_lambda x) attn2), "raw" (no sigmoid) or "none" (attn1 - attn2).
        v2_pairing: DIFF V2 pairs "interleaved" (2i, 2i+1) or "halves" (i, i + H).
    """

    model_type = "difftransformer"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]  # noqa: RUF012 (transformers' attribute, a list)

    def __init__(
        self,
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=None,
        head_dim=None,
        attention="diff_v1",
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_type="default",
        rope_factor=1.0,
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
        rope_original_max_len=8192,
        initializer_range=0.02,
        tie_word_embeddings=False,
        lambda_init="schedule",
        headwise_norm=True,
        headwise_norm_weight=True,
        v1_layout="paper",
        v2_lambda="sigmoid",
        v2_pairing="interleaved",
        use_cache=True,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if head_dim is None and isinstance(num_attention_heads, int) and num_attention_heads > 0:
            head_dim = hidden_size // num_attention_heads
        self.head_dim = head_dim
        self.attention = attention
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.rope_type = rope_type
        self.rope_factor = rope_factor
        self.rope_low_freq_factor = rope_low_freq_factor
        self.rope_high_freq_factor = rope_high_freq_factor
        self.rope_original_max_len = rope_original_max_len
        self.initializer_range = initializer_range
        self.lambda_init = lambda_init
        self.headwise_norm = headwise_norm
        self.headwise_norm_weight = headwise_norm_weight
        self.v1_layout = v1_layout
        self.v2_lambda = v2_lambda
        self.v2_pairing = v2_pairing
        self.use_cache = use_cache
        self.check()
        # transformers 5 types its config's __init__ by its dataclass fields; the keyword is accepted (4 needs it)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)  # type: ignore[call-arg]

    def check(self):
        """Raise ValueError naming the field for a configuration the model cannot be built from."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_original_max_len"):
            _positive_int(name, getattr(self, name))
        for name in ("rms_norm_eps", "rope_theta", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                     "initializer_range"):
            _positive_number(name, getattr(self, name))
        _choice("attention", self.attention, ATTENTION_KINDS)
        _choice("rope_type", self.rope_type, ROPE_TYPES)
        _choice("v1_layout", self.v1_layout, V1_LAYOUTS)
        _choice("v2_lambda", self.v2_lambda, V2_LAMBDA_MODES)
        _choice("v2_pairing", self.v2_pairing, V2_PAIRINGS)
        for name in ("headwise_norm", "headwise_norm_weight"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"DiffTransformerConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.headwise_norm_weight and not self.headwise_norm:
            raise ValueError("DiffTransformerConfig.headwise_norm_weight=true needs headwise_norm=true")
        if self.lambda_init != "schedule":
            v = self.lambda_init
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v < 1.0:
                raise ValueError(f"DiffTransformerConfig.lambda_init={v!r} is not allowed; use \"schedule\" or a "
                                 "number in (0, 1)")
        if self.head_dim % 2:
            raise ValueError(f"DiffTransformerConfig.head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"DiffTransformerConfig.num_key_value_heads={self.num_key_value_heads} must divide "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.attention == "diff_v1" and self.v1_layout == "paper" and (
                self.num_attention_heads % 2 or self.num_key_value_heads % 2):
            raise ValueError(f"DiffTransformerConfig.num_attention_heads={self.num_attention_heads} and "
                             f"num_key_value_heads={self.num_key_value_heads} must both be even for attention="
                             "'diff_v1' with v1_layout='paper'")

    # ------------------------------------------------------------------ derived sizes
    @property
    def n_diff_heads(self):
        """DIFF V1's differential heads: H/2 (paper layout) or H (per_head)."""
        return self.num_attention_heads if self.v1_layout == "per_head" else self.num_attention_heads // 2

    @property
    def v1_value_dim(self):
        """Width of one DIFF V1 head's value: 2d (paper layout) or d (per_head)."""
        return self.head_dim if self.v1_layout == "per_head" else 2 * self.head_dim

    def lambda_init_for(self, layer_idx):
        """DIFF V1 eq. (2) lambda_init of the 0-based layer ``layer_idx``."""
        if self.lambda_init == "schedule":
            return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
        return float(self.lambda_init)


__all__ = ["DiffTransformerConfig"]
