"""``DiffAttention``: differential attention as one layer to put in any model (a GPT, a ViT, an encoder-decoder).

    from difftransformer import DiffAttention
    attn = DiffAttention(d_model=512, n_heads=8, variant="diff_v2", causal=False)   # "diff_v1", "baseline" too
    y = attn(x)                          # (B, T, d_model): self-attention
    y = attn(x, context=c)               # cross-attention: queries from x, keys and values from c (B, S, d_model)
    y = attn(x, key_padding_mask=m)      # m (B, S) bool: True where a key may be attended

The math is the language model's own: the layer holds the model's attention module of the variant
(``model/attention/``: ``BaselineAttention``, ``DiffV1Attention``, ``DiffV2Attention``) as ``self.core`` and adds
what a layer outside our model needs: its arguments, the masks (causal or not, key padding), the positions and
RoPE (on or off), cross-attention and a KV cache for decoding. ``n_heads`` counts the baseline's heads, as
``ModelConfig`` does: DIFF V1 then has the baseline's projection sizes exactly (plus its lambda vectors and norm
weight), DIFF V2 the baseline's W_k, W_v and W_o with a W_q twice as wide and W_lambda (a layer about 25% more
parameters than the baseline's; a whole model about 5%, the feed-forward layers being shared):

  DIFF V1 (arXiv 2410.05258, eq. 1-3): h = n_heads / 2 heads of two d-wide query/key halves and a 2d-wide value;
      out_i = (1 - lambda_init) RMSNorm((softmax(Q1 K1^T/sqrt d) - lambda softmax(Q2 K2^T/sqrt d)) V),
      lambda = exp(l_q1 . l_k1) - exp(l_q2 . l_k2) + lambda_init, lambda_init = 0.8 - 0.6 exp(-0.3 layer_idx).
  DIFF V2 (January 2026): 2 n_heads query heads over the baseline's keys and values; query heads 2i and 2i+1 form
      pair i, out_i = attn_2i - sigmoid(W_lambda x)_i attn_2i+1; no norm; W_o the baseline's.
  baseline: softmax attention with n_heads query heads.

Every ablation field of ``ModelConfig`` that shapes the attention is a keyword argument with the model's name
(``headwise_norm``, ``headwise_norm_weight``, ``lambda_init``, ``v2_lambda``, ``v2_pairing``, ``v2_keys``,
``v2_headwise_norm``,
``v2_headwise_norm_layers``, ``head_gain``, ``backend``); a bad one is one ``ValueError`` or ``TypeError``
naming the argument and what it allows.

Weights: PyTorch's default ``nn.Linear`` initialisation (the layer lives in your model, whose own scheme may
re-initialise it); DIFF V1's lambda vectors N(0, 0.1), as the reference code. The parameters are named as in our
model (``core.wq.weight``, ..., ``core.lambda_q1``), so a layer's state dict maps one to one onto a
``DiffTransformerLM`` layer's ``attn.*``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .model.attention import Attention, build_attention
from .model.attention.base import prefill_from_start
from .model.config import ModelConfig
from .model.kv_cache import KVCache
from .model.rope import rope_cos_sin, rope_frequencies

VARIANTS = ("baseline", "diff_v1", "diff_v2")
# ModelConfig fields a layer takes as keyword arguments (the attention's own; the rest describe a whole model)
ABLATIONS = ("lambda_init", "headwise_norm", "headwise_norm_weight", "v2_lambda", "v2_pairing", "v2_keys",
             "v2_headwise_norm", "v2_headwise_norm_layers", "head_gain", "backend")


class DiffAttention(nn.Module):
    """Differential (or baseline) multi-head attention over ``(B, T, d_model)`` inputs.

    Args:
        d_model: input and output width.
        n_heads: the baseline's query heads H (DIFF V1 uses H/2 heads of twice the width, DIFF V2 2H query heads).
        variant: "diff_v1", "diff_v2" or "baseline".
        causal: True: query t sees keys <= t (a decoder); False: every key (an encoder, a ViT). Self-attention only:
            cross-attention (``context=``) needs ``causal=False``.
        n_kv_heads: the baseline's key/value heads (grouped-query attention); default ``n_heads``.
        head_dim: d, the width of one softmax head; default ``d_model // n_heads``.
        layer_idx: the layer's 0-based depth, for DIFF V1's lambda_init schedule (and ``v2_headwise_norm_layers``).
        rope: rotary position embedding on the queries and keys (positions 0..T-1 unless given). Default: on for
            self-attention; cross-attention rotates only when ``rope=True`` was asked for. False: your model's own
            position scheme.
        rope_theta: RoPE's base.
        max_seq_len: the longest sequence the KV cache (``setup_cache``) holds.
        **ablations: ``ModelConfig``'s attention fields, by their names (``ABLATIONS``).
    """

    def __init__(self, d_model: int, n_heads: int, variant: str = "diff_v2", *, causal: bool = True,
                 n_kv_heads: Optional[int] = None, head_dim: Optional[int] = None, layer_idx: int = 0,
                 rope: Optional[bool] = None, rope_theta: float = 10000.0, max_seq_len: int = 4096,
                 **ablations: Any) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"DiffAttention: variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        for name, val, kind in (("causal", causal, bool), ("rope", rope, (bool, type(None)))):
            if not isinstance(val, kind):
                raise TypeError(f"DiffAttention: {name} must be True or False, got {val!r}")
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
            raise ValueError(f"DiffAttention: layer_idx must be an integer >= 0, got {layer_idx!r}")
        unknown = sorted(set(ablations) - set(ABLATIONS))
        if unknown:
            raise TypeError(f"DiffAttention: unknown argument {unknown[0]!r}; the attention's fields are "
                            f"{', '.join(ABLATIONS)}")
        try:  # ModelConfig validates every field (head counts, widths, the ablations' allowed values)
            self.cfg = ModelConfig(vocab_size=1, d_model=d_model, n_layers=layer_idx + 1, n_heads=n_heads,
                                   n_kv_heads=n_kv_heads, head_dim=head_dim,  # type: ignore[arg-type]  # None: default
                                   attention=variant,
                                   rope_theta=rope_theta, max_seq_len=max_seq_len, **ablations)
        except (ValueError, TypeError) as e:
            raise type(e)(f"DiffAttention: {str(e).replace('ModelConfig.', '')}") from None
        self.variant, self.causal, self.layer_idx, self.rope = variant, causal, layer_idx, rope
        self.core: Attention = build_attention(self.cfg, layer_idx)

    # ------------------------------------------------------------------ what a caller may read
    @property
    def d_model(self) -> int:
        return self.cfg.d_model

    @property
    def head_dim(self) -> int:
        return self.cfg.head_dim

    def extra_repr(self) -> str:
        return (f"variant={self.variant!r}, d_model={self.cfg.d_model}, n_heads={self.cfg.n_heads}, "
                f"n_kv_heads={self.cfg.n_kv_heads}, head_dim={self.cfg.head_dim}, causal={self.causal}, "
                f"layer_idx={self.layer_idx}")

    # ------------------------------------------------------------------ the call
    def forward(self, x: torch.Tensor, context: Optional[torch.Tensor] = None,
                key_padding_mask: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None,
                context_positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x (B, T, d_model) -> (B, T, d_model).

        context: (B, S, d_model), cross-attention (keys and values from it). key_padding_mask: (B, S) (S = T for
        self-attention) bool, True where a key may be attended. positions: (T,) or (B, T) integer positions of x for
        RoPE (default 0..T-1; under a KV cache, where the new tokens go: required); context_positions: the
        context's (cross-attention with ``rope=True``; default 0..S-1).
        """
        if x.dim() != 3 or x.shape[-1] != self.cfg.d_model:
            raise ValueError(f"DiffAttention: x must be (B, T, {self.cfg.d_model}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        cross = context is not None
        if cross:
            assert context is not None
            if self.causal:
                raise ValueError("DiffAttention: context= (cross-attention) needs causal=False: queries see every "
                                 "context key (mask some with key_padding_mask)")
            if context.dim() != 3 or context.shape[0] != B or context.shape[-1] != self.cfg.d_model:
                raise ValueError(f"DiffAttention: context must be (B={B}, S, {self.cfg.d_model}), got "
                                 f"{tuple(context.shape)}")
            if self.core.kv_cache is not None:
                raise ValueError("DiffAttention: a KV cache is for causal self-attention; call reset_cache() first")
        kv = context if cross else x
        assert kv is not None
        S = kv.shape[1]
        cached = self.core.kv_cache is not None
        if cached and (positions is None or positions.dim() != 1):
            raise ValueError("DiffAttention: under a KV cache, positions= (T,) says where the new tokens go")
        pos_q = _positions(positions, T, x.device, "positions")
        rope_on = self.rope if self.rope is not None else not cross
        rope_q = rope_k = None
        if rope_on:
            inv = rope_frequencies(self.cfg.head_dim, self.cfg.rope_theta, x.device)
            rope_q = rope_cos_sin(pos_q, inv)
            rope_k = rope_cos_sin(_positions(context_positions, S, x.device, "context_positions"), inv) \
                if cross else rope_q
        elif context_positions is not None and not cross:
            raise ValueError("DiffAttention: context_positions goes with context=")
        mask = self._mask(B, T, S, pos_q, key_padding_mask, cross, cached, x.device)
        if cross:
            out, _ = self.core(kv, rope_k, mask, query=(x, rope_q, mask))
        else:
            out, _ = self.core(x, rope_q, mask, input_pos=pos_q if cached else None)
        return out

    def _mask(self, B: int, T: int, S: int, pos: torch.Tensor, kpm: Optional[torch.Tensor], cross: bool,
              cached: bool, device: torch.device) -> Optional[torch.Tensor]:
        """The core's mask: None (causal over the whole input: the fused is_causal path) or bool (B|1, 1, T, Tk)."""
        if kpm is not None:
            if cached:
                raise ValueError("DiffAttention: key_padding_mask does not go with a KV cache (decode unpadded rows)")
            if kpm.dtype != torch.bool or kpm.shape != (B, S):
                raise ValueError(f"DiffAttention: key_padding_mask must be a bool tensor (B={B}, S={S}), True where a "
                                 f"key may be attended, got {kpm.dtype} {tuple(kpm.shape)}")
            if cross and bool((~kpm).all(dim=1).any()):
                raise ValueError("DiffAttention: key_padding_mask masks every context key of a row (its softmax "
                                 "has no key to read)")
        if cached:  # a prompt from position 0 attends itself (causal); any other step the cache up to its positions
            assert self.core.kv_cache is not None
            if prefill_from_start(T, pos):
                return None
            return (torch.arange(self.core.kv_cache.max_seq_len, device=device)[None, :] <= pos[:, None])[None, None]
        if kpm is None:
            # causal self-attention: None, the fused is_causal path; else every key, a (1, 1, 1, S) all-True mask
            # broadcast over the batch and the queries
            return None if self.causal and not cross else torch.ones(1, 1, 1, S, dtype=torch.bool, device=device)
        if cross:
            return kpm[:, None, None, :]
        m = kpm[:, None, None, :].expand(B, 1, T, S)
        if self.causal:
            m = m & torch.ones(T, S, dtype=torch.bool, device=device).tril()
        # a query row that sees no key (a padded position under the causal rule, or a row of padding only) attends
        # itself alone, so that no output is NaN; it is padding, and its output means nothing
        eye = torch.eye(T, dtype=torch.bool, device=device)
        return m | (eye & ~m.any(dim=-1, keepdim=True))

    # ------------------------------------------------------------------ KV cache (causal self-attention)
    def setup_cache(self, batch_size: int, max_seq_len: Optional[int] = None,
                    dtype: Optional[torch.dtype] = None) -> None:
        """A static KV cache for decoding: then call with ``positions=`` (the new tokens' positions, e.g.
        ``torch.arange(t0, t0 + T)``); each call attends the cache up to its positions."""
        if not self.causal:
            raise ValueError("DiffAttention: a KV cache is for causal self-attention (causal=True)")
        n = max_seq_len or self.cfg.max_seq_len
        w = next(self.core.parameters())
        self.core.kv_cache = KVCache(batch_size, n, *self.core.cache_layout(), dtype=dtype or w.dtype,
                                     device=w.device)

    def reset_cache(self) -> None:
        """Drop the KV cache (back to whole-sequence calls)."""
        self.core.kv_cache = None


def _positions(p: Optional[torch.Tensor], T: int, device: torch.device, name: str) -> torch.Tensor:
    if p is None:
        return torch.arange(T, device=device)
    if p.is_floating_point() or p.shape[-1] != T or p.dim() not in (1, 2):
        raise ValueError(f"DiffAttention: {name} must be integer positions of shape ({T},) or (B, {T}), got "
                         f"{p.dtype} {tuple(p.shape)}")
    return p
