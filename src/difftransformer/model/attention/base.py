"""What the three attention variants share: the call signature, the maps they can return, and two kernels.

Every variant is called as ``attn(x, rope, mask, input_pos=None, return_maps=False)`` and returns
``(output, maps_or_None)``. ``mask`` is ``None`` for plain causal self-attention over the whole input (the fast
``is_causal`` path) or a boolean tensor (B or 1, 1, Tq, Tk), True where a query may attend a key; the model
builds it once per forward from the causal rule, the cache positions and an optional padding mask.

Backends: ``eager`` materialises the softmax maps (the test oracle and the analysis tool); ``sdpa`` runs
``torch.nn.functional.scaled_dot_product_attention`` and never builds an N x N tensor; ``triton`` runs DIFF's
fused Triton kernel (``triton_diff.py``: both maps in one FlashAttention-2-style pass, forward and backward) for
self-attention, with or without a padding mask, and for a KV cache's prefill from position 0 (the prompt sees only
itself: every backend attends over its own keys then, not the cache's length), head_dim 16/32/64/128, on CUDA
(compute capability 8.0 or newer; or in Triton's CPU interpreter under ``TRITON_INTERPRET=1``, for tests); it also
runs DIFF's KV-cache decode steps through a split-KV decode kernel; elsewhere (the baseline, later chunks of a KV
cache, other head sizes) it is ``sdpa``. Where Triton was wanted and cannot run (not installed, not on CUDA), one line
says so, once per process. When a Triton launch fails (out of shared memory, a compile error, a GPU older than sm_80),
one warning names the reason and that call, and every later call of the same kind (device, dtype, head sizes and pass:
``triton_kind``), runs the PyTorch path instead (a backward that fails recomputes its gradients in PyTorch).
``auto`` (the default) runs ``sdpa``, except for the (GPU, dtype, pass) entries of ``TRITON_AUTO_MEASURED``, where a
GPU measurement in BENCHMARKS.md showed the Triton kernel faster: none yet, so ``auto`` is ``sdpa`` everywhere.
``blocked`` runs
DIFF's row-blocked kernel (``blocked.py``) that forms A1 - lambda*A2 block by block before multiplying by V
(falls back to ``sdpa`` when a padding mask or a KV cache's decode is in play, for the baseline, and off the CPU:
the kernel is a CPU path; on CUDA the fused SDPA kernels are 4-7x faster than it, measured on an H100).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..kv_cache import KVCache

LogitsHook = Callable[[torch.Tensor], torch.Tensor]


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


class Attention(nn.Module):
    """Base class: holds the config, the layer index, an optional KV cache and an optional logits hook.

    Each variant also answers for its lambda, so training and the model never test for attribute names: which
    parameters are lambda parameters (kept out of weight decay), how to re-initialise them, the learned scalar
    lambda if it has one, and the per-layer summary that training logs under ``lambda_summary_name``.
    """

    # The metrics.jsonl key of this variant's per-layer lambda summary; None: the variant has no lambda.
    lambda_summary_name: Optional[str] = None

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        self.backend = cfg.backend
        self.scale = cfg.head_dim ** -0.5
        self.kv_cache: Optional[KVCache] = None
        # Set by evaluation (e.g. quantised attention logits, paper Fig. 8); forces the eager path.
        self.logits_hook: Optional[LogitsHook] = None

    def cache_layout(self) -> tuple[int, int, int, int]:
        """(key heads, key width, value heads, value width) that this variant caches."""
        raise NotImplementedError

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

    def use_eager(self, return_maps: bool) -> bool:
        return self.backend == "eager" or return_maps or self.logits_hook is not None

    def use_triton(self, x: torch.Tensor, return_maps: bool, head_dim: int,
                   input_pos: Optional[torch.Tensor] = None, value_dim: Optional[int] = None) -> bool:
        """Whether this DIFF call runs the fused Triton kernel (see the module docstring for when it does). Under a
        KV cache only a prefill from position 0 does: then the new keys and values are all the prompt sees."""
        if self.backend not in ("triton", "auto") or self.use_eager(return_maps):
            return False
        if self.kv_cache is not None and not prefill_from_start(x.shape[1], input_pos):
            return False
        if head_dim not in TRITON_HEAD_DIMS or x.shape[0] > TRITON_MAX_BATCH:
            return False
        return self._triton_runs(x, triton_pass(x), head_dim, head_dim if value_dim is None else value_dim)

    def use_triton_decode(self, x: torch.Tensor, mask: Optional[torch.Tensor], head_dim: int,
                          value_dim: Optional[int] = None) -> bool:
        """Whether a DIFF decode step (``use_decode``) runs the split-KV Triton kernel: with the ``triton`` backend
        (``auto`` only where ``TRITON_AUTO_MEASURED`` lists the decode pass), without autograd, on CUDA or in the
        interpreter, for the head sizes the kernel is built for."""
        if self.backend not in ("triton", "auto") or mask is None or torch.is_grad_enabled():
            return False
        if head_dim not in TRITON_HEAD_DIMS:
            return False
        return self._triton_runs(x, "decode", head_dim, head_dim if value_dim is None else value_dim)

    def _triton_runs(self, x: torch.Tensor, pass_: str, head_dim: int, value_dim: int) -> bool:
        on_cuda = x.device.type == "cuda"
        if self.backend == "auto":
            # CPU: sdpa (the Triton interpreter is a test tool, not a fast path); CUDA: only where measured faster
            if not on_cuda or not triton_importable():
                return False
            if not auto_runs_triton(cuda_capability(x.device), attention_dtype(x), pass_):
                return False
        usable = triton_importable() and (on_cuda or os.environ.get("TRITON_INTERPRET") == "1")
        if not usable:
            _say_once(f"difftransformer: backend {self.backend!r}: Triton "
                      f"{'cannot run on ' + x.device.type if triton_importable() else 'is not installed'}; "
                      "DIFF attention uses the sdpa path (pip install triton, on a CUDA machine, for the fused kernel)")
            return False
        kind = triton_kind(x.device, attention_dtype(x), head_dim, value_dim, pass_)
        if triton_kind_failed(kind):
            return False  # failed before in this process (warned then): the PyTorch path
        if on_cuda and cuda_capability(x.device) < MIN_TRITON_CAPABILITY:
            major, minor = cuda_capability(x.device)
            triton_failed(kind, f"compute capability {major}.{minor} is older than "
                                f"{MIN_TRITON_CAPABILITY[0]}.{MIN_TRITON_CAPABILITY[1]}, the oldest the kernels are "
                                "built and compile-tested for")
            return False
        return True

    def run_triton(self, x: torch.Tensor, pass_: str, head_dim: int, value_dim: int,
                   launch: Callable[[], torch.Tensor], fallback: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``launch()`` (a Triton kernel call); if a launch fails (``is_triton_launch_error``), one warning, and this
        call and every later one of the same ``triton_kind`` run ``fallback()`` (the PyTorch path) instead. Under
        torch.compile the launch is traced as it is (the compiled graph launches it later, outside this frame)."""
        if torch.compiler.is_compiling():
            return launch()
        try:
            return launch()
        except Exception as exc:
            if not is_triton_launch_error(exc):
                raise
            triton_failed(triton_kind(x.device, attention_dtype(x), head_dim, value_dim, pass_), exc)
        return fallback()

    def use_decode(self, T: int, return_maps: bool) -> bool:
        """The KV-cache decode step (one new token per row): ``grouped_attention``, no copies of the cache."""
        return self.kv_cache is not None and T == 1 and not self.use_eager(return_maps)

    def update_cache(self, input_pos: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor):
        if self.kv_cache is None:
            return k, v
        if input_pos is None:
            raise ValueError("input_pos is required when a KV cache is set up")
        k_all, v_all = self.kv_cache.update(input_pos, k, v)
        if prefill_from_start(k.shape[2], input_pos):
            return k, v  # a prompt from position 0 sees only itself: its own T keys, not the cache's length
        return k_all, v_all


# head_dim values the Triton kernel is built for (triton_diff.py checks them too).
TRITON_HEAD_DIMS = (16, 32, 64, 128)
# The kernels put the batch on CUDA grid axis 2, at most 65,535 (triton_diff.py checks it too); more rows: sdpa.
TRITON_MAX_BATCH = 65_535
# The oldest GPU the kernels are compiled for and checked against (tests/model/test_triton_aot.py: sm_80, sm_90).
MIN_TRITON_CAPABILITY = (8, 0)
# What a Triton call computes: "train" (forward and backward: autograd records the call), "prefill" (forward only,
# a prompt or an evaluation) or "decode" (one KV-cache step).
TRITON_PASSES = ("train", "prefill", "decode")

# Where ``auto`` runs the fused Triton kernel for DIFF: (CUDA compute capability, dtype, pass) for which BENCHMARKS.md
# holds a GPU measurement showing the kernel faster than sdpa (the same run, the same shapes). Everywhere else
# ``auto`` is sdpa. EMPTY: the kernels have never been timed on a GPU. Add an entry only with the BENCHMARKS.md rows
# that measured it, e.g. ``((9, 0), torch.bfloat16, "train")`` after `make gpu-bench` on an H100 shows it.
TRITON_AUTO_MEASURED: frozenset[tuple[tuple[int, int], torch.dtype, str]] = frozenset()

_SAID: set[str] = set()
# Kinds of Triton call (``triton_kind``) whose launch failed in this process -> the reason (warned once, then sdpa).
_TRITON_FAILED: dict[tuple, str] = {}
_CAPABILITY: dict[int, tuple[int, int]] = {}


def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def attention_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the attention runs in for the layer input ``x``: autocast's where it is on (the projections cast
    to it), else x's own."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def triton_pass(x: torch.Tensor) -> str:
    """The pass of a (non-decode) DIFF call on the attention input ``x``: "train" when autograd records it."""
    return "train" if torch.is_grad_enabled() and x.requires_grad else "prefill"


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device, read once per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    cap = _CAPABILITY.get(index)
    if cap is None:
        cap = _CAPABILITY[index] = tuple(torch.cuda.get_device_capability(index))
    return cap


def auto_runs_triton(capability: tuple[int, int], dtype: torch.dtype, pass_: str) -> bool:
    """Whether ``auto`` runs the fused Triton kernel for this (GPU, dtype, pass): only where it was measured faster
    (``TRITON_AUTO_MEASURED``; empty today, so never)."""
    if pass_ not in TRITON_PASSES:
        raise ValueError(f"pass_={pass_!r} is not allowed; use one of {', '.join(TRITON_PASSES)}")
    return (tuple(capability), dtype, pass_) in TRITON_AUTO_MEASURED


def triton_kind(device: torch.device, dtype: torch.dtype, head_dim: int, value_dim: int, pass_: str) -> tuple:
    """What makes two Triton calls launch the same kernels with the same tiles: the GPU (its compute capability),
    dtype, head and value widths and the pass. A launch that fails for one call fails for all calls of its kind."""
    if pass_ not in TRITON_PASSES:
        raise ValueError(f"pass_={pass_!r} is not allowed; use one of {', '.join(TRITON_PASSES)}")
    gpu = cuda_capability(device) if device.type == "cuda" else device.type
    return gpu, dtype, head_dim, value_dim, pass_


def describe_kind(kind: tuple) -> str:
    gpu, dtype, head_dim, value_dim, pass_ = kind
    where = f"sm_{gpu[0]}{gpu[1]}" if isinstance(gpu, tuple) else gpu
    return f"{pass_}, {str(dtype).replace('torch.', '')}, head_dim {head_dim}, value_dim {value_dim} on {where}"


def is_triton_launch_error(exc: BaseException) -> bool:
    """A Triton kernel that cannot be compiled or launched here (out of shared memory or registers, a compile or
    ptxas error, a launch the driver refuses), as opposed to a bug in the arguments (ValueError, TypeError)."""
    for cls in type(exc).__mro__:
        if cls.__module__.startswith("triton.") and cls.__name__ in ("TritonError", "CompilationError"):
            return True
    return isinstance(exc, RuntimeError) and str(exc).startswith("Triton Error")


def triton_kind_failed(kind: tuple) -> bool:
    """Whether a Triton launch of this kind already failed in this process (then its calls use the PyTorch path)."""
    return kind in _TRITON_FAILED


def triton_failed(kind: tuple, reason) -> None:
    """Record that Triton calls of this kind cannot run here; the first time, ONE warning line names the reason."""
    if kind in _TRITON_FAILED:
        return
    if isinstance(reason, BaseException):
        text = str(reason).strip().splitlines()
        reason = f"{type(reason).__name__}: {text[0][:300] if text else ''}"
    _TRITON_FAILED[kind] = reason
    pass_ = kind[-1]
    fallback = "the PyTorch decode step" if pass_ == "decode" else "sdpa"
    warnings.warn(f"difftransformer: the fused Triton kernel cannot run for {describe_kind(kind)} ({reason}); "
                  f"this call and later ones of this kind use {fallback}", RuntimeWarning, stacklevel=3)


def _say_once(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr)


def prefill_from_start(T: int, input_pos: Optional[torch.Tensor]) -> bool:
    """Whether a cached forward writes positions 0..T-1 (T > 1): a prompt's prefill, which attends only to itself.
    One host read of two positions per call, so never under torch.compile (decode steps are T = 1 anyway)."""
    if T < 2 or input_pos is None or input_pos.shape != (T,) or torch.compiler.is_compiling():
        return False
    return input_pos[[0, -1]].tolist() == [0, T - 1]


def key_padding(mask: Optional[torch.Tensor], batch: int, T: int) -> Optional[torch.Tensor]:
    """The (B, T) real-key mask behind a self-attention mask built by the model (causal & real keys, a row that sees
    nothing sees itself): the first T keys of its last row, which sees every real key of the T queries (under a KV
    cache the mask spans the whole cache; a prefill from 0 reads its first T). None stays None (plain causal)."""
    if mask is None:
        return None
    return mask[:, 0, -1, :T].expand(batch, -1)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hk, T, d) -> (B, Hk*n_rep, T, d): KV head g serves query heads g*n_rep .. g*n_rep + n_rep - 1.

    On CPU an explicit copy is faster than SDPA's ``enable_gqa`` (measured 0.17 s vs 0.26 s fwd+bwd, T=2048).
    """
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def eager_dtype(x: torch.Tensor) -> torch.dtype:
    """The eager path's accumulation dtype: float32 for half inputs, float64 stays float64 (the tests' oracle)."""
    return torch.promote_types(x.dtype, torch.float32)


def softmax_maps(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
                 hook: Optional[LogitsHook] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager softmax(q k^T * scale) in at least float32. q (B, Hq, Tq, d), k (B, Hq, Tk, d) -> (probs, logits)."""
    acc = eager_dtype(q)
    logits = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale  # (B, Hq, Tq, Tk)
    if hook is not None:
        logits = hook(logits)
    if mask is None:
        tq, tk = logits.shape[-2:]
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
    logits = logits.masked_fill(~mask, float("-inf"))
    return torch.softmax(logits, dim=-1), logits


def grouped_probs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) with R query heads per key head, without repeating the keys (GQA by reshaping).

    q (B, *G, R, T, d), k (B, *G, N, d), mask (B or 1, 1, T, N) bool -> probabilities (B, *G, R, T, N) in at
    least float32. The R*T query rows of a key head form one matrix, so each cached key is read once: the
    decode step stays memory-bound on the cache like the baseline's, whatever the grouping.
    """
    *lead, R, T, d = q.shape
    N = k.shape[-2]
    s = torch.matmul(q.reshape(*lead, R * T, d), k.transpose(-1, -2)).view(*lead, R, T, N)
    s = s.to(eager_dtype(q)) * scale
    m = mask.reshape(mask.shape[0], *([1] * len(lead)), T, N)  # broadcast over *G and R
    return torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """Standard GQA attention for the decode step: q (B, Hq, T, d), k/v (B, Hk, N, d|dv) -> (B, Hq, T, dv).

    Query head j reads KV head j // (Hq / Hk), as ``repeat_kv`` orders them, but nothing is repeated.
    """
    B, Hq, T, _ = q.shape
    Hk, N = k.shape[1], k.shape[2]
    p = grouped_probs(q.view(B, Hk, Hq // Hk, T, -1), k, mask, scale)  # (B, Hk, R, T, N)
    out = torch.matmul(p.view(B, Hk, -1, N).to(v.dtype), v)  # (B, Hk, R*T, dv)
    return out.view(B, Hq, T, -1)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """Fused attention; k/v already repeated to q's head count."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale)
