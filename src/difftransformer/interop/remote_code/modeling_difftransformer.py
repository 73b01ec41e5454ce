"""A difftransformer language model (baseline, DIFF V1 or DIFF V2 attention) for Hugging Face transformers.

Load an exported directory with ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)``. This file
and its two neighbours (``configuration_difftransformer.py``, ``layers_difftransformer.py``: the building blocks)
import only torch and transformers; the math is the difftransformer package's, operation for operation:

  block:  Y = X + Attention(RMSNorm(X)),  X' = Y + W2 (silu(W1 RMSNorm(Y)) * W3 RMSNorm(Y))
  model:  embeddings, the blocks, a final RMSNorm, the LM head (tied to the embeddings with tie_word_embeddings)

RMSNorm runs in float32 (``F.rms_norm``), RoPE rotates interleaved channel pairs (2i, 2i+1) of every query and key
head (GPT-J layout, the official DIFF code's; not Llama's rotate_half), with float64 angles, in float32.

* baseline: softmax attention, H query heads over H_kv key/value heads (query head i reads KV head i // (H/H_kv)).
* DIFF V1 (paper eq. 1-3): query half-heads (2i, 2i+1) are (Q1, Q2) of differential head i, key half-heads (2g,
  2g+1) are (K1, K2) of KV group g; out_i = (softmax(Q1 K1^T/sqrt d) - lambda softmax(Q2 K2^T/sqrt d)) V_g, then the
  head-wise RMSNorm (eps 1e-5, optional weight), times (1 - lambda_init). lambda = exp(lq1.lk1) - exp(lq2.lk2) +
  lambda_init in float32, lambda_init = 0.8 - 0.6 exp(-0.3 l) for the 0-based layer l (or a constant); the per_head
  layout multiplies lambda by the buffer ``neg_weight`` (a converted model's negative-branch warm-up weight).
* DIFF V2: 2H query heads over H_kv KV heads in one attention; out_i = attn_(2i) - lambda attn_(2i+1) with lambda =
  sigmoid(W_lambda x) per token and head ("raw": no sigmoid; "none": lambda = 1); ``v2_pairing="halves"``: head i
  paired with head i + H.

The weights are the difftransformer state dict under the prefix ``model.`` (``output.weight`` is ``lm_head.weight``),
so a conversion either way is a rename. Attention runs ``torch.nn.functional.scaled_dot_product_attention``
(``attn_implementation="sdpa"``, the default) or a float32 matmul-softmax (``"eager"``). The KV cache is transformers'
``DynamicCache`` (``StaticCache`` too, with ``cache_implementation="static"``); DIFF V1 caches its 2 h_kv key
half-heads and its h_kv values as 2 h_kv heads of half their width.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import __version__ as _TRANSFORMERS_VERSION
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_difftransformer import DiffTransformerConfig
from .layers_difftransformer import (
    DiffTransformerAttention,
    DiffTransformerMLP,
    DiffTransformerRMSNorm,
    rope_cos_sin,
    rope_inv_freq,
)

_init: Any  # one of two modules of the same init functions
try:  # transformers 5: init functions that leave weights loaded from the checkpoint alone
    from transformers import initialization as _init
except ImportError:  # transformers 4: _init_weights only ever sees weights the checkpoint lacks
    _init = nn.init

_TRANSFORMERS_MAJOR = int(_TRANSFORMERS_VERSION.split(".")[0])
# The name of the KV cache in the model outputs: "cache" in recent transformers, "past_key_values" before.
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


# ---------------------------------------------------------------------------------------------- the model
class DiffTransformerBlock(nn.Module):
    def __init__(self, config: DiffTransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = DiffTransformerRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = DiffTransformerAttention(config, layer_idx)
        self.ffn_norm = DiffTransformerRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ffn = DiffTransformerMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: Optional[torch.Tensor],
                cache: Optional[Cache] = None, cache_position: Optional[torch.Tensor] = None) -> torch.Tensor:
        y = x + self.attn(self.attn_norm(x), cos, sin, mask, cache, cache_position)
        return y + self.ffn(self.ffn_norm(y))


class DiffTransformerPreTrainedModel(PreTrainedModel):
    config: DiffTransformerConfig  # the type of self.config (transformers declares the base configuration)
    config_class = DiffTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DiffTransformerBlock"]  # noqa: RUF012 (transformers' attribute, a list)
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flash_attn_2 = False
    _supports_flex_attn = False
    _supports_cache_class = True
    _supports_static_cache = True

    def _init_weights(self, module: nn.Module) -> None:
        """Linear and embedding weights N(0, initializer_range), norm weights 1, DIFF V1's lambda vectors
        N(0, 0.1) and the per_head negative-branch weight 1 (difftransformer's init)."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            _init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, DiffTransformerRMSNorm) and module.weight is not None:
            _init.ones_(module.weight)
        elif isinstance(module, DiffTransformerAttention) and module.kind == "diff_v1":
            for p in (module.lambda_q1, module.lambda_k1, module.lambda_q2, module.lambda_k2):
                _init.normal_(p, mean=0.0, std=0.1)
            if module.neg_weight is not None:
                _init.ones_(module.neg_weight)


class DiffTransformerModel(DiffTransformerPreTrainedModel):
    """The decoder without the LM head: its output is the final RMSNorm's."""

    def __init__(self, config: DiffTransformerConfig) -> None:
        super().__init__(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DiffTransformerBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = DiffTransformerRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.tok_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:  # type: ignore[override]  # base: any Module
        self.tok_embeddings = value

    def build_mask(self, attention_mask: Optional[torch.Tensor], batch: int, q_len: int, past: int,
                   device: torch.device) -> Optional[torch.Tensor]:
        """The (B, 1, T, past + T) bool mask of this forward, or None where plain causal attention over the input (no
        past) or a single query over every cached key (no padding) needs none. A 4D mask is used as given."""
        kv_len = past + q_len
        if attention_mask is not None and attention_mask.dim() == 4:
            return attention_mask
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < kv_len:
                raise ValueError(f"attention_mask must have shape (batch, past + seq_len) = ({batch}, {kv_len}), got "
                                 f"{tuple(attention_mask.shape)}")
            attention_mask = attention_mask[:, -kv_len:]
            if bool(attention_mask.all()):
                attention_mask = None
        if attention_mask is None and (past == 0 or q_len == 1):
            return None
        q_idx = torch.arange(past, kv_len, device=device)
        k_idx = torch.arange(kv_len, device=device)
        allowed = (k_idx[None, :] <= q_idx[:, None])[None, None]  # (1, 1, T, Tk)
        if attention_mask is not None:
            allowed = allowed & attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
            # a query that sees no key (a left-pad position) sees itself, so that its row stays finite
            own = (k_idx[None, :] == q_idx[:, None])[None, None]
            allowed = allowed | (own & ~allowed.any(dim=-1, keepdim=True))
        return allowed

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, cache=None, cache_position=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if output_attentions:
            raise ValueError("output_attentions is not supported by DiffTransformerModel (differential attention "
                             "has two maps per head); use the difftransformer package's analyses")
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            use_cache = False  # the recomputed forward would write the cache a second time
        x = self.tok_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        B, T, _ = x.shape
        if use_cache and cache is None:
            cache = _new_cache(self.config)
        elif isinstance(cache, tuple) and hasattr(DynamicCache, "from_legacy_cache"):
            cache = DynamicCache.from_legacy_cache(cache)
        if not use_cache:
            cache = None
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=x.device)[None].expand(B, -1)
        cos, sin = rope_cos_sin(position_ids.to(x.device), rope_inv_freq(self.config, x.device))
        mask = self.build_mask(attention_mask, B, T, past, x.device)
        hidden: Optional[tuple[torch.Tensor, ...]] = () if output_hidden_states else None
        for layer in self.layers:
            if hidden is not None:  # output_hidden_states
                hidden += (x,)
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = self._gradient_checkpointing_func(layer.__call__, x, cos, sin, mask)
            else:
                x = layer(x, cos, sin, mask, cache, cache_position)
        x = self.norm(x)
        if hidden is not None:
            hidden += (x,)
        out = BaseModelOutputWithPast(last_hidden_state=x, hidden_states=hidden, **{_CACHE_FIELD: cache})
        return out if return_dict else out.to_tuple()


def _new_cache(config: DiffTransformerConfig) -> Cache:
    try:
        return DynamicCache(config=config)
    except TypeError:  # transformers < 4.56: no config argument
        return DynamicCache()


class DiffTransformerForCausalLM(DiffTransformerPreTrainedModel, GenerationMixin):
    """The decoder and its LM head; ``labels`` (unshifted, -100 ignored) give the next-token loss."""

    if _TRANSFORMERS_MAJOR >= 5:
        _tied_weights_keys = {"lm_head.weight": "model.tok_embeddings.weight"}
    else:  # transformers 4 lists the tied weights (5 types the attribute as this mapping)
        _tied_weights_keys = ["lm_head.weight"]  # type: ignore[assignment]

    def __init__(self, config: DiffTransformerConfig) -> None:
        super().__init__(config)
        self.model = DiffTransformerModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.tok_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:  # type: ignore[override]  # base: any Module
        self.model.tok_embeddings = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def get_decoder(self) -> DiffTransformerModel:
        return self.model

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, logits_to_keep=0, cache=None, **kwargs):
        # cache_position arrives in kwargs from transformers 4's generate (its static cache needs it); not a named
        # parameter, so that transformers 5 does not warn that this remote model still expects it
        cache_position = kwargs.pop("cache_position", None)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache if cache is not None else past_key_values, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, output_attentions=output_attentions,
                         output_hidden_states=output_hidden_states, return_dict=True, cache_position=cache_position)
        x = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            x = x[:, -logits_to_keep:] if logits_to_keep > 0 else x
        else:
            x = x[:, logits_to_keep]
        logits = self.lm_head(x)
        loss = None
        if labels is not None:
            loss = self._loss(logits, labels, **kwargs)
        result = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        **{_CACHE_FIELD: getattr(out, _CACHE_FIELD)})
        return result if return_dict else result.to_tuple()

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        """Mean next-token cross-entropy in float32 (transformers' loss_function where it has one: it also takes
        the Trainer's ``num_items_in_batch`` under gradient accumulation)."""
        fn = getattr(self, "loss_function", None)
        if fn is not None:
            extra = {k: v for k, v in kwargs.items() if k in ("num_items_in_batch", "ignore_index")}
            return fn(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **extra)
        shift_logits = logits[:, :-1].float().reshape(-1, logits.shape[-1])
        return F.cross_entropy(shift_logits, labels[:, 1:].reshape(-1).to(logits.device), ignore_index=-100)


__all__ = ["DiffTransformerForCausalLM", "DiffTransformerModel", "DiffTransformerPreTrainedModel"]
