"""The interface every attention variant implements, and the maps it can return.

Every variant is called as ``attn(x, rope, mask, input_pos=None, return_maps=False)`` and returns
``(output, maps_or_None)``. ``mask`` is ``None`` for plain causal self-attention over the whole input (the fast
``is_causal`` path) or a boolean tensor (B or 1, 1, Tq, Tk), True where a query may attend a key; the model
builds it once per forward from the causal rule, the cache positions and an optional padding mask.

A variant's forward holds its projections, its pairing of heads and its lambda, and hands the attention itself to
``dispatch.py`` (``diff_attention`` for DIFF, ``softmax_attention`` for the baseline), which picks the backend's
path (eager with maps, sdpa, blocked, the fused Triton kernels, the KV-cache decode step). The backend is
``cfg.backend``, read through ``Attention.backend``: the config is the one place it is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _nn_module

from ..config import AttentionConfig
from ..kv_cache import KVCache

LogitsHook = Callable[[torch.Tensor], torch.Tensor]
# Queries at a subset of positions: (x at those rows (B, K, d_model), their RoPE (cos, sin), their mask (B, 1, K, T)).
QueryRows = tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class AttentionMaps:
    """Attention maps of one layer (eager path only), in float32 (float64 for a float64 model).

    attn:   (B, heads, Tq, Tk) the map that mixes the values: softmax for the baseline, A1 - lambda*A2 for DIFF.
    attn1:  (B, heads, Tq, Tk) DIFF's first softmax map (None for the baseline).
    attn2:  (B, heads, Tq, Tk) DIFF's second softmax map (None for the baseline).
    logits: (B, softmax_heads, Tq, Tk) pre-softmax scaled logits of every softmax map (masked entries -inf).
            Baseline: H maps; V1: the 2h half-head maps in projection order; V2: the 2H query-head maps.
    lam:    DIFF's lambda: a 0-dim tensor (V1) or (B, heads, Tq, 1) (V2, after the sigmoid when used).
    """

    attn: torch.Tensor
    logits: torch.Tensor
    attn1: Optional[torch.Tensor] = None
    attn2: Optional[torch.Tensor] = None
    lam: Optional[torch.Tensor] = None


def normal_init_(t: torch.Tensor, std: float) -> None:
    """``t`` drawn from N(0, std) in place, except on the meta device, where a model is only built to be filled (there
    are no values to draw, and torch's meta ``normal_`` imports ``torch._dynamo``: a second of every command's start
    that builds a model there). The draws on a real device are the same, in the same order."""
    if not t.is_meta:
        nn.init.normal_(t, mean=0.0, std=std)


class Attention(nn.Module):
    """Base class: holds the config, the layer index, an optional KV cache and an optional logits hook.

    Each variant also answers for its lambda, so training and the model never test for attribute names: which
    parameters are lambda parameters (kept out of weight decay), how to re-initialise them, the learned scalar
    lambda if it has one, and the per-layer summary that training logs under ``lambda_summary_name``.
    """

    # The metrics.jsonl key of this variant's per-layer lambda summary; None: the variant has no lambda.
    lambda_summary_name: Optional[str] = None
    # Whether forward takes ``query=(x_rows, rope_rows, mask_rows)``: queries at a subset of positions (B, K) while the
    # keys and values come from every position of x; the model's ``logits_at`` path runs its last layer so.
    takes_query_rows = False

    def __init__(self, cfg: AttentionConfig, layer_idx: int) -> None:
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        self.scale = cfg.head_dim ** -0.5
        # a query head's width and a value head's (DIFF V1's 2d-wide values set their own): the kernels' table key
        self.head_dim, self.value_dim = cfg.head_dim, cfg.head_dim
        self.kv_cache: Optional[KVCache] = None
        # Set by evaluation (e.g. quantised attention logits, paper Fig. 8); forces the eager path.
        self.logits_hook: Optional[LogitsHook] = None

    @property
    def backend(self) -> str:
        """The attention backend: ``cfg.backend``, the only copy (``auto``, ``eager``, ``sdpa``, ``blocked``,
        ``triton``; see ``dispatch.py`` for what each runs)."""
        return self.cfg.backend

    @backend.setter
    def backend(self, backend: str) -> None:
        self.cfg = self.cfg.replace(backend=backend)  # validates; the model's set_backend() comes through here

    @property
    def attn_dropout(self) -> float:
        """Dropout on every softmax map while training (``cfg.attn_dropout``, the only copy); off in eval."""
        return self.cfg.attn_dropout

    @property
    def dropout_p(self) -> float:
        """The dropout this call applies to each softmax map: ``attn_dropout`` while training, 0 in eval."""
        return self.cfg.attn_dropout if self.training else 0.0

    def cache_layout(self) -> tuple[int, int, int, int]:
        """(key heads, key width, value heads, value width) that this variant caches."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the projections
    wq: nn.Module
    wk: nn.Module
    wv: nn.Module

    def project(self, xq: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(xq W_q, x W_k, x W_v): the queries at ``xq``'s rows, the keys and values at ``x``'s.

        For self-attention (``xq is x``) through three plain ``nn.Linear`` layers with no hooks, one matmul over the
        three weights stacked (timm's one ``qkv`` layer; the parameters stay three, under their names): the same
        forward values, one pass over x instead of three. Its input gradient is one product over the stacked rows
        instead of the sum of three, so it rounds differently (float32: ~1e-7 relative). A LoRA- or otherwise
        wrapped projection, a hook on one, queries at other rows (``logits_at``, cross-attention) and calls under a
        KV cache run the three layers as they are: a decode step's few rows would pay for copying the weights."""
        wq, wk, wv = self.wq, self.wk, self.wv
        plain = all(type(m) is nn.Linear and not (m._forward_hooks or m._forward_pre_hooks) for m in (wq, wk, wv))
        if xq is not x or self.kv_cache is not None or not plain or _global_hooks():
            return wq(xq), wk(x), wv(x)
        assert isinstance(wq, nn.Linear) and isinstance(wk, nn.Linear) and isinstance(wv, nn.Linear)
        bias = None if wq.bias is None else torch.cat((wq.bias, wk.bias, wv.bias))
        qkv = F.linear(x, torch.cat((wq.weight, wk.weight, wv.weight)), bias)
        q, k, v = qkv.split((wq.out_features, wk.out_features, wv.out_features), dim=-1)
        return q, k, v

    # ------------------------------------------------------------------ lambda (none in the base class)
    def lambda_parameters(self) -> list[nn.Parameter]:
        """Parameters that only shape lambda: weight decay would pull lambda to an arbitrary value."""
        return []

    def reset_lambda(self) -> None:
        """Re-initialise the lambda parameters (called by the model's ``init_weights``)."""

    def static_lambda(self) -> Optional[torch.Tensor]:
        """The learned input-independent scalar lambda (DIFF V1 eq. 2), or None."""
        return None

    def lambda_summary(self, x: torch.Tensor) -> Optional[float]:
        """One number per layer for the metrics, from this layer's attention input ``x`` (B, T, d_model)."""
        return None

    def set_negative_weight(self, w: float) -> None:
        """The negative branch's warm-up weight in [0, 1] (DIFF V1's per_head layout only; a no-op elsewhere)."""

    def output_scale(self) -> float:
        """The fixed factor this layer multiplies its heads by before ``wo`` (after any head-wise norm): DIFF V1's
        (1 - lambda_init), eq. (3); 1 where there is none."""
        return 1.0

    # ------------------------------------------------------------------ the per-head gain (ModelConfig.head_gain)
    head_gain: Optional[nn.Parameter]  # DIFF V1 and V2 (``make_head_gain``): None unless cfg.head_gain is on
    gain_pending = False  # "norm_start": the gain is set from the first forward's head outputs
    lambda_init: float  # DIFF V1's and V2's (the paper's layer schedule); the gain's start reads it

    def make_head_gain(self, n_heads: int) -> None:
        """``cfg.head_gain`` != "off": a learnable fp32 gain per head (h,), started by ``reset_head_gain``."""
        on = self.cfg.head_gain != "off"
        self.register_parameter("head_gain", nn.Parameter(torch.ones(n_heads, dtype=torch.float32)) if on else None)
        self.reset_head_gain()

    def reset_head_gain(self) -> None:
        """1 ("one"), or 1 until the next forward sets it ("norm_start")."""
        if self.head_gain is not None:
            if not self.head_gain.is_meta:
                with torch.no_grad():
                    self.head_gain.fill_(1.0)
            self.gain_pending = self.cfg.head_gain == "norm_start"

    def apply_head_gain(self, out: torch.Tensor) -> torch.Tensor:
        """out (B, h, T, dv) times each head's gain. A pending "norm_start" gain is first set to (1 - lambda_init)
        / r_h, r_h head h's output RMS over its channels, mean over this call's tokens: where the head-wise norm
        (its weight at 1) would put that head's output RMS, on average instead of per token."""
        assert self.head_gain is not None
        if self.gain_pending and out.numel() and not out.is_meta:  # a call without tokens sets nothing
            if torch.compiler.is_compiling():
                raise RuntimeError("head_gain='norm_start' is set by the first forward: run one eager forward (the "
                                   "first training batch) before compiling")
            with torch.no_grad():
                acc = torch.promote_types(out.dtype, torch.float32)
                r = out.detach().to(acc).pow(2).mean(-1).sqrt().mean(dim=(0, 2))  # (h,)
                if not bool(torch.isfinite(r).all()):
                    raise ValueError("head_gain='norm_start' is set from the first forward's head outputs, which are "
                                     "not finite (NaN or inf in the input?); the gain stays pending for the next call")
                self.head_gain.copy_(((1.0 - self.lambda_init) / r.clamp_min(1e-12)).to(self.head_gain.dtype))
            self.gain_pending = False
        return out * self.head_gain.to(out.dtype)[:, None, None]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if prefix + "head_gain" in state_dict:
            self.gain_pending = False  # a trained or saved gain: set already

    # ------------------------------------------------------------------ KV cache
    def update_cache(self, input_pos: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor):
        """Write the new keys and values at ``input_pos``; return the keys and values this call attends over."""
        if self.kv_cache is None:
            return k, v
        if input_pos is None:
            raise ValueError("input_pos is required when a KV cache is set up")
        k_all, v_all = self.kv_cache.update(input_pos, k, v)
        if prefill_from_start(k.shape[2], input_pos):
            return k, v  # a prompt from position 0 sees only itself: its own T keys, not the cache's length
        return k_all, v_all


def _global_hooks() -> bool:
    """Whether a forward hook is registered for every module (``nn.modules.module.register_module_forward_hook``):
    the stacked projection would skip it for the three layers."""
    return bool(_nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks)


def prefill_from_start(T: int, input_pos: Optional[torch.Tensor]) -> bool:
    """Whether a cached forward writes positions 0..T-1 (T > 1): a prompt's prefill, which attends only to itself.
    One host read of two positions per call, so never under torch.compile (decode steps are T = 1 anyway)."""
    if T < 2 or input_pos is None or input_pos.shape != (T,) or torch.compiler.is_compiling():
        return False
    return input_pos[[0, -1]].tolist() == [0, T - 1]
