"""``DiffAttention``: differential attention as one layer to put in any model (a GPT, a ViT, an encoder-decoder).

    from difftransformer import DiffAttention
    attn = DiffAttention(d_model=512, n_heads=8, variant="diff_v2", causal=False)   # "diff_v1", "baseline" too
    y = attn(x)                          # (B, T, d_model): self-attention
    y = attn(x, context=c)               # cross-attention: queries from x, keys and values from c (B, S, d_model)
    y = attn(x, key_padding_mask=m)      # m (B, S) bool, True where a key is PADDING (torch.nn.MultiheadAttention's)
    y = attn(x, attn_mask=a)             # a: SDPA's convention (bool True = may attend, or a float added to logits)
    y, maps = attn(x, return_maps=True)  # maps.attn1, maps.attn2, maps.attn: each head's A1, A2 and A1 - lambda A2

The masks follow PyTorch: ``key_padding_mask`` means what it means in ``torch.nn.MultiheadAttention`` (True: the
key is padding and is ignored), ``attn_mask`` what it means in ``F.scaled_dot_product_attention`` (bool True: the
query may attend the key; float: added to the logits), broadcastable to (B, heads, T, S) with ``heads`` the
layer's output heads (``layer.n_mask_heads``: DIFF V1's h = n_heads/2, DIFF V2's and the baseline's n_heads; one
mask serves both softmax maps of a differential head), combined with ``causal``. Every mask is built by
``model/attention/masks.py``, the model's own builder.

The math is the language model's own: the layer IS the variant's attention module (``model/attention/``:
``BaselineAttention``, ``DiffV1Attention``, ``DiffV2Attention``, or any registered variant), with this class's
conventions in front of it: ``DiffAttention(..., variant="diff_v1")`` is an instance of ``DiffV1Attention`` too,
built from an ``AttentionConfig`` as the language model's blocks are from their ``ModelConfig`` (which is one), so
one file per variant serves both. ``n_heads`` counts the baseline's heads, as ``ModelConfig`` does: DIFF V1 then has the
baseline's projection sizes exactly (plus its lambda vectors and norm weight), DIFF V2 the baseline's W_k, W_v and
W_o with a W_q twice as wide and W_lambda: **+25% parameters per attention layer** at n_kv_heads = n_heads (about
+5% in our language model, whose feed-forward layers are shared; more where a model's MLP is smaller).

  DIFF V1 (arXiv 2410.05258, eq. 1-3): h = n_heads / 2 heads of two d-wide query/key halves and a 2d-wide value;
      out_i = (1 - lambda_init) RMSNorm((softmax(Q1 K1^T/sqrt d) - lambda softmax(Q2 K2^T/sqrt d)) V),
      lambda = exp(l_q1 . l_k1) - exp(l_q2 . l_k2) + lambda_init, lambda_init = 0.8 - 0.6 exp(-0.3 layer_idx).
  DIFF V2 (January 2026): 2 n_heads query heads over the baseline's keys and values; query heads 2i and 2i+1 form
      pair i, out_i = attn_2i - sigmoid(W_lambda x)_i attn_2i+1; no norm; W_o the baseline's.
  baseline: softmax attention with n_heads query heads.

``attn_drop``: dropout on every softmax map while training, each of DIFF's two maps on its own before the pair is
combined (as timm's layer and SDPA's ``dropout_p``), so A1 - lambda A2 is formed from the dropped maps; off in eval.
``proj_drop``: dropout on the output. ``qkv_bias``/``proj_bias``: biases on W_q, W_k, W_v / on W_o (timm's names).

Every ``ModelConfig`` field that only some variant reads (the registry's options: ``headwise_norm``,
``lambda_init``, ``v1_layout``, ``v2_lambda``, ``head_gain``, ...) and ``backend`` are keyword arguments with the
model's names; a bad one is one ``ValueError`` or ``TypeError`` naming the argument and what it allows.

Weights: PyTorch's default ``nn.Linear`` initialisation (the layer lives in your model, whose own scheme may
re-initialise it); DIFF V1's lambda vectors N(0, 0.1), as the reference code. The parameters are named as in our
model (``wq.weight``, ..., ``lambda_q1``), so a layer's state dict is a ``DiffTransformerLM`` layer's ``attn.*``,
plus ``_extra_state``: the arguments that change the function without changing a shape (``layer_idx`` and with it
lambda_init, the options, ``causal``, RoPE), so that loading into a layer built otherwise fails loudly (a state dict
without it loads with a warning). A state dict saved before the layer was the variant's module (its names under
``core.``) loads as it is: the names are mapped on load. ``layer.core`` is the layer itself, kept for such code.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any, Optional, Union

import torch
from torch import nn

from .model import variants as registry
from .model.attention import Attention, AttentionMaps
from .model.attention.base import prefill_from_start
from .model.attention.layer_checks import LayerChecks, positive_int
from .model.attention.masks import build_mask, empty_rows
from .model.config import AttentionConfig
from .model.kv_cache import KVCache
from .model.rope import rotary


def attention_options() -> tuple[str, ...]:
    """The ``ModelConfig`` fields a layer takes as keyword arguments: every registered variant's options (read now,
    so a variant registered later is included) and ``backend``."""
    return (*registry.all_options(), "backend")


Output = Union[torch.Tensor, tuple[torch.Tensor, Optional[AttentionMaps]]]
_MADE: dict[type, type] = {}  # a variant's class -> its layer class (DiffAttention first, then the variant)


def layer_class(cls: type[Attention]) -> type[DiffAttention]:
    """The public layer over the variant class ``cls``: ``DiffAttention``'s conventions first in the method order,
    then the variant's module (made once per class, named in this module so that a pickled layer reads back)."""
    made = _MADE.get(cls)
    if made is None:
        name = f"DiffAttention_{cls.__name__}"
        made = type(name, (DiffAttention, cls), {"__module__": __name__, "__qualname__": name})
        _MADE[cls] = made
    return made


def __getattr__(name: str) -> Any:
    """A layer class by its name (``DiffAttention_DiffV1Attention``), as unpickling asks for it."""
    for v in registry.variants():
        if name == f"DiffAttention_{v.cls.__name__}":
            return layer_class(v.cls)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DiffAttention(LayerChecks, Attention):
    """Differential (or baseline) multi-head attention over ``(B, T, d_model)`` inputs.

    Args:
        d_model: input and output width.
        n_heads: the baseline's query heads H (DIFF V1 uses H/2 heads of twice the width, DIFF V2 2H query heads).
        variant: any registered variant: "diff_v1", "diff_v2", "baseline" (``model.variants.names()``).
        causal: True: query t sees keys <= t (a decoder); False: every key (an encoder, a ViT). Self-attention only:
            cross-attention (``context=``) needs ``causal=False``.
        n_kv_heads: the baseline's key/value heads (grouped-query attention); default ``n_heads``.
        head_dim: d, the width of one softmax head; default ``d_model // n_heads``.
        layer_idx: the layer's 0-based depth, for DIFF V1's lambda_init schedule (and ``v2_headwise_norm_layers``).
        rope: rotary position embedding on the queries and keys (positions 0..T-1 unless given). Default: on for
            self-attention; cross-attention rotates only when ``rope=True`` was asked for. False: your model's own
            position scheme.
        rope_theta: RoPE's base.
        max_seq_len: the default length of the KV cache (``setup_cache``).
        qkv_bias, proj_bias: biases on W_q, W_k, W_v and on W_o.
        attn_drop: dropout on each softmax map while training. proj_drop: dropout on the output while training.
        **options: ``ModelConfig``'s attention fields, by their names (``attention_options()``).

    The instance is of the variant's class too (``isinstance(DiffAttention(64, 4, "diff_v1"), DiffV1Attention)``).
    """

    cfg: AttentionConfig

    def __new__(cls, *args: Any, **kwargs: Any) -> DiffAttention:
        if cls is not DiffAttention:  # a layer class already (a copy or an unpickled layer): as it is
            return super().__new__(cls)
        variant = args[2] if len(args) > 2 else kwargs.get("variant", "diff_v2")
        return super().__new__(layer_class(registry.variant(variant, "DiffAttention: variant").cls))

    def __init__(self, d_model: int, n_heads: int, variant: str = "diff_v2", *, causal: bool = True,
                 n_kv_heads: Optional[int] = None, head_dim: Optional[int] = None, layer_idx: int = 0,
                 rope: Optional[bool] = None, rope_theta: float = 10000.0, max_seq_len: int = 4096,
                 qkv_bias: bool = False, proj_bias: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 **options: Any) -> None:
        registry.variant(variant, "DiffAttention: variant")
        sizes: tuple[tuple[str, Optional[int]], ...] = (("d_model", d_model), ("n_heads", n_heads),
                                                         ("max_seq_len", max_seq_len), ("n_kv_heads", n_kv_heads),
                                                         ("head_dim", head_dim))
        for name, size in sizes:
            if size is not None or name in ("d_model", "n_heads", "max_seq_len"):
                positive_int(name, size)
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
            raise ValueError(f"DiffAttention: layer_idx must be an integer >= 0, got {layer_idx!r}")
        flags: tuple[tuple[str, Optional[bool], Any], ...] = (
            ("causal", causal, bool), ("rope", rope, (bool, type(None))), ("qkv_bias", qkv_bias, bool),
            ("proj_bias", proj_bias, bool))
        for name, flag, kind in flags:
            if not isinstance(flag, kind):
                raise TypeError(f"DiffAttention: {name} must be True or False, got {flag!r}")
        if isinstance(proj_drop, bool) or not isinstance(proj_drop, (int, float)) or not 0 <= proj_drop < 1:
            raise ValueError(f"DiffAttention: proj_drop must be a number in [0, 1), got {proj_drop!r}")
        if isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float)) or not 0 < rope_theta < math.inf:
            raise ValueError(f"DiffAttention: rope_theta must be a positive finite number, got {rope_theta!r}")
        if head_dim is None and d_model % n_heads:
            raise ValueError(f"DiffAttention: d_model={d_model} is not divisible by n_heads={n_heads} (or give "
                             "head_dim=)")
        allowed = attention_options()
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise TypeError(f"DiffAttention: unknown argument {unknown[0]!r}; the attention's fields are "
                            f"{', '.join(allowed)}")
        if options.get("headwise_norm") is False and "headwise_norm_weight" not in options:
            options["headwise_norm_weight"] = False  # no norm, so no norm weight
        try:  # AttentionConfig validates every field (head counts, widths, the options' allowed values)
            cfg = AttentionConfig(attention=variant, d_model=d_model, n_heads=n_heads,
                                  n_kv_heads=n_kv_heads, head_dim=head_dim,  # type: ignore[arg-type]  # None: default
                                  qkv_bias=qkv_bias, proj_bias=proj_bias, attn_dropout=attn_drop, **options)
        except (ValueError, TypeError) as e:
            msg = str(e).replace("AttentionConfig.", "").replace("attn_dropout", "attn_drop")
            if "must be even (RoPE" in msg and rope is False:
                msg += "; the layer's attention is the model's, which pairs channels even with rope=False"
            raise type(e)(f"DiffAttention: {msg}") from None
        super().__init__(cfg, layer_idx)  # the variant's module (the next class in the method order)
        self.variant, self.causal, self.rope = variant, causal, rope
        self.rope_theta, self.max_seq_len = float(rope_theta), max_seq_len
        self.options = {k: options[k] for k in sorted(options)}
        self.proj_drop = nn.Dropout(float(proj_drop))
        self._filled = 0  # under a KV cache: how many positions hold keys (the next call starts at or before it)

    # ------------------------------------------------------------------ what a caller may read
    @property
    def d_model(self) -> int:
        return self.cfg.d_model

    @property
    def core(self) -> DiffAttention:
        """The layer itself: its variant's module (``layer.core.wq`` is ``layer.wq``; code written when the layer
        held the module as ``core`` keeps working)."""
        return self

    def _get_name(self) -> str:  # its repr says DiffAttention(...), whatever the variant's class
        return "DiffAttention"

    def extra_repr(self) -> str:
        return (f"variant={self.variant!r}, d_model={self.cfg.d_model}, n_heads={self.cfg.n_heads}, "
                f"n_kv_heads={self.cfg.n_kv_heads}, head_dim={self.cfg.head_dim}, causal={self.causal}, "
                f"layer_idx={self.layer_idx}")

    # ------------------------------------------------------------------ what changes the function, kept with weights
    def _record(self) -> dict[str, Any]:
        lam = getattr(self, "lambda_init", None)
        return {"variant": self.variant, "layer_idx": self.layer_idx, "lambda_init": lam, "causal": self.causal,
                "rope": self.rope, "rope_theta": self.rope_theta, "options": self.options}

    def get_extra_state(self) -> torch.Tensor:
        """The record as UTF-8 JSON bytes in a uint8 tensor: a tensor, so that safetensors can hold it too."""
        data = json.dumps(self._record(), sort_keys=True).encode()
        return torch.tensor(list(data), dtype=torch.uint8)

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.dim() != 1:
            raise ValueError("DiffAttention: the state dict's _extra_state is not a DiffAttention record")
        try:
            saved = json.loads(bytes(state.tolist()).decode())
        except (UnicodeDecodeError, ValueError):
            raise ValueError("DiffAttention: the state dict's _extra_state is not a DiffAttention record") from None
        mine = self._record()
        diff = [f"{k}={saved.get(k)!r} (this layer: {mine[k]!r})" for k in mine if saved.get(k) != mine[k]]
        if diff:
            raise ValueError(f"DiffAttention: the state dict was saved from a layer built otherwise: {'; '.join(diff)}"
                             "; build the layer with the saved arguments")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        old = prefix + "core."  # saved while the layer held the variant's module as ``core``: the same names below
        for k in [k for k in state_dict if k.startswith(old)]:
            state_dict[prefix + k[len(old):]] = state_dict.pop(k)
        key = prefix + "_extra_state"
        if key not in state_dict and any(k.startswith(prefix) for k in state_dict):
            warnings.warn("DiffAttention: the state dict has no _extra_state (saved before it, or from a "
                          "DiffTransformerLM layer): layer_idx, lambda_init and the options are not checked",
                          stacklevel=2)
            state_dict[key] = self.get_extra_state()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ------------------------------------------------------------------ the call
    def forward(self, x: torch.Tensor, context: Optional[torch.Tensor] = None, *,
                key_padding_mask: Optional[torch.Tensor] = None, attn_mask: Optional[torch.Tensor] = None,
                positions: Optional[torch.Tensor] = None, context_positions: Optional[torch.Tensor] = None,
                return_maps: bool = False) -> Output:
        """x (B, T, d_model) -> (B, T, d_model); with ``return_maps=True``, (output, ``AttentionMaps``).

        context: (B, S, d_model), cross-attention (keys and values from it). key_padding_mask: (B, S) (S = T for
        self-attention) bool, True where a key is padding (ignored). attn_mask: bool (True: may attend) or float
        (added to the logits), broadcastable to (B, ``n_mask_heads``, T, S), combined with ``causal`` and the
        padding; a self-attention row left with no key attends itself (its output means nothing). positions: (T,) or
        (B, T) integer positions of x for RoPE (default 0..T-1; under a KV cache, where the new tokens go:
        required); context_positions: the context's (cross-attention with ``rope=True``; default 0..S-1).
        return_maps: also each head's maps (eager path: ``attn1`` = A1, ``attn2`` = A2, ``attn`` = A1 - lambda A2;
        the baseline's softmax as ``attn``), in float32 or the input's float64; while training, after dropout.
        """
        x = self._tensor("x", x)
        if x.dim() != 3 or x.shape[-1] != self.cfg.d_model:
            raise ValueError(f"DiffAttention: x must be (B, T, {self.cfg.d_model}), got {tuple(x.shape)}")
        self._check_dtype("x", x)
        if not isinstance(return_maps, bool):
            raise TypeError(f"DiffAttention: return_maps must be True or False, got {return_maps!r}")
        B, T, _ = x.shape
        cross = context is not None
        cached = self.kv_cache is not None
        if cross:
            context = self._tensor("context", context)
            if self.causal:
                raise ValueError("DiffAttention: context= (cross-attention) needs causal=False: queries see every "
                                 "context key (mask some with key_padding_mask or attn_mask)")
            if context.dim() != 3 or context.shape[0] != B or context.shape[-1] != self.cfg.d_model:
                raise ValueError(f"DiffAttention: context must be (B={B}, S, {self.cfg.d_model}), got "
                                 f"{tuple(context.shape)}")
            if context.shape[1] == 0:
                raise ValueError("DiffAttention: context has no keys (S = 0): each query's softmax needs one")
            if context.dtype != x.dtype:
                raise ValueError(f"DiffAttention: context is {context.dtype} but x is {x.dtype}")
            if cached:
                raise ValueError("DiffAttention: a KV cache is for causal self-attention; call reset_cache() first")
        kv = context if cross else x
        assert kv is not None
        S = kv.shape[1]
        rope_on = self.rope if self.rope is not None else not cross
        if context_positions is not None and not (cross and rope_on):
            raise ValueError("DiffAttention: context_positions goes with context= and rope=True (it places the "
                             "context's keys for RoPE)")
        if cached:
            if key_padding_mask is not None or attn_mask is not None:
                raise ValueError("DiffAttention: key_padding_mask and attn_mask do not go with a KV cache (decode "
                                 "unpadded rows; the cache's causal rule is the mask)")
            pos_q = self._cache_positions(positions, B, T)
        else:
            pos_q = self._positions("positions", positions, B, T, x.device)
        rope_q = rope_k = None
        if rope_on:
            rope_q = rotary(pos_q, self.cfg.head_dim, self.rope_theta)
            rope_k = rope_q
            if cross:
                rope_k = rotary(self._positions("context_positions", context_positions, B, S, x.device),
                                self.cfg.head_dim, self.rope_theta)
        kpm = None if key_padding_mask is None else self._padding(key_padding_mask, B, S)
        am = None if attn_mask is None else self._attn_mask(attn_mask, B, T, S)
        if cached:
            assert self.kv_cache is not None
            mask = None if prefill_from_start(T, pos_q) else build_mask(
                T, self.kv_cache.max_seq_len, causal=True, device=x.device, query_pos=pos_q)
        else:
            mask = build_mask(T, S, causal=self.causal and not cross, device=x.device,
                              key_valid=None if kpm is None else ~kpm, attn_mask=am, own_slot=not cross)
            if (cross and mask is not None and (kpm is not None or am is not None) and not mask.is_meta
                    and not torch.compiler.is_compiling() and empty_rows(mask)):
                raise ValueError("DiffAttention: key_padding_mask/attn_mask masks every context key of a row (its "
                                 "softmax has no key to read)")
        kind = "causal" if mask is None or (self.causal and not cross and am is None) else "general"
        attend = super().forward  # the variant's own forward: its projections, lambda, the attention call, W_o
        if cross:
            out, maps = attend(kv, rope_k, mask, query=(x, rope_q, mask), return_maps=return_maps, mask_kind=kind)
        else:
            out, maps = attend(x, rope_q, mask, input_pos=pos_q if cached else None, return_maps=return_maps,
                               mask_kind=kind)
        if cached and not pos_q.is_meta and not torch.compiler.is_compiling():
            self._filled = max(self._filled, int(pos_q[-1]) + 1)
        if self.proj_drop.p:
            out = self.proj_drop(out)
        return (out, maps) if return_maps else out

    # ------------------------------------------------------------------ KV cache (causal self-attention)
    def setup_cache(self, batch_size: int, max_seq_len: Optional[int] = None,
                    dtype: Optional[torch.dtype] = None) -> None:
        """A static KV cache for decoding: then call with ``positions=`` (the new tokens' positions, e.g.
        ``torch.arange(t0, t0 + T)``, consecutive from at most the positions filled so far); each call attends the
        cache up to its positions. dtype: the layer's (the default)."""
        if not self.causal:
            raise ValueError("DiffAttention: a KV cache is for causal self-attention (causal=True)")
        positive_int("batch_size", batch_size)
        n = self.max_seq_len if max_seq_len is None else max_seq_len
        positive_int("max_seq_len", n)
        w = next(self.parameters())
        if dtype is not None and dtype != w.dtype:
            raise ValueError(f"DiffAttention: the KV cache's dtype must be the layer's ({w.dtype}), got {dtype}")
        self.kv_cache = KVCache(batch_size, n, *self.cache_layout(), dtype=w.dtype, device=w.device)
        self._filled = 0

    def reset_cache(self) -> None:
        """Drop the KV cache (back to whole-sequence calls)."""
        self.kv_cache = None
        self._filled = 0

