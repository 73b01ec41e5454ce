"""The attention call of every variant, and every backend rule, in one place.

``diff_attention`` runs differential attention (DIFF V1 and V2) and ``softmax_attention`` the baseline's; each
variant computes its projections, pairing and lambda and calls one of them. Which path runs (``diff_path``):

* ``eager`` -- the softmax maps materialised (``torch_paths.eager_diff``): with ``backend="eager"``, whenever the
  maps are asked for (``return_maps``), and whenever a logits hook is set (quantised logits, paper Fig. 8).
* ``triton-decode`` -- a DIFF KV-cache decode step (one new token per row) through the split-KV Triton kernel
  (``triton_decode.py``): with the ``triton`` backend (``auto`` only where ``TRITON_AUTO_MEASURED`` lists the decode
  pass), without autograd, on CUDA or in Triton's CPU interpreter, for the head sizes the kernel is built for.
* ``decode`` -- any other KV-cache decode step: the PyTorch step (``torch_paths.decode_diff``,
  ``grouped_attention``), each cached key and value read once, no copies of the cache.
* ``triton`` -- DIFF's fused Triton kernel (``triton_diff.py``: both maps in one FlashAttention-2-style pass, forward
  and backward) for self-attention, with or without a padding mask, and for a KV cache's prefill from position 0
  (the prompt sees only itself: every backend attends over its own keys then, not the cache's length); head_dim
  16/32/64/128, on CUDA (compute capability 8.0 or newer) or in Triton's CPU interpreter (``TRITON_INTERPRET=1``,
  for tests). Where Triton was wanted and cannot run (not installed, not on CUDA), one line says so, once per
  process. When a launch fails (out of shared memory, a compile error, a GPU older than sm_80), one RuntimeWarning
  names the reason and that call, and every later call of the same kind (device, dtype, head sizes and pass:
  ``launches.triton_kind``) runs the PyTorch path instead (a backward that fails recomputes its gradients in
  PyTorch).
* ``blocked`` -- DIFF's row-blocked kernel (``blocked.py``), which forms A1 - lambda*A2 block by block before
  multiplying by V; on the CPU only (on CUDA the fused SDPA kernels are 4-7x faster than it, measured on an H100)
  and only without a mask (no padding, no KV cache other than a prefill from 0).
* ``sdpa`` -- ``torch.nn.functional.scaled_dot_product_attention`` (``torch_paths.sdpa_diff``); never an N x N
  tensor. Everything else: ``backend="sdpa"``, ``auto`` (except where measured, below), and the cases the backend
  chosen does not cover.

``auto`` (the default) runs ``sdpa``, except for the (GPU, dtype, head_dim, pass) entries of ``TRITON_AUTO_MEASURED``,
where a GPU measurement in BENCHMARKS.md showed the Triton kernel faster: none yet, so ``auto`` is ``sdpa`` everywhere.
The fused kernels (triton, triton-decode, blocked) take the pairs within a GQA group (``pairing="interleaved"``);
DIFF V2's "halves" ablation runs the PyTorch paths. The baseline runs eager, decode or sdpa.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Optional

import torch

from .base import Attention, AttentionMaps, prefill_from_start
from .launches import (
    TRITON_HEAD_DIMS,
    TRITON_MAX_BATCH,
    TRITON_PASSES,
    attention_dtype,
    cuda_capability,
    is_triton_launch_error,
    say_once,
    triton_failed,
    triton_importable,
    triton_kind,
    triton_kind_failed,
    triton_pass,
)
from .torch_paths import (
    KEY_LAYOUTS,
    PAIRINGS,
    decode_diff,
    eager_attention,
    eager_diff,
    grouped_attention,
    repeat_kv,
    sdpa,
    sdpa_diff,
    split_keys,
    split_pairs,
)

# The oldest GPU the kernels are compiled for and checked against (tests/model/test_triton_aot.py: sm_80, sm_90).
MIN_TRITON_CAPABILITY = (8, 0)

# Where ``auto`` runs the fused Triton kernel for DIFF: (CUDA compute capability, dtype, head_dim, pass) for which
# BENCHMARKS.md holds a GPU measurement showing the kernel faster than sdpa (the same run, the same shapes).
# Everywhere else ``auto`` is sdpa. Keyed by head width because it decides: on an H200 (2026-11-26, Triton 3.6, the
# tiles before autotuning) DIFF V2's training step ran faster with the kernel at head_dim 64 and slower at 128.
# EMPTY on purpose: those numbers predate the tuned kernels. Fill it ONLY from numbers measured by `make gpu-check`
# on the GPU named (its summary's ratios, copied into BENCHMARKS.md with card and commit), e.g.
# ``((9, 0), torch.bfloat16, 64, "train")`` where that check shows the kernel faster there.
TRITON_AUTO_MEASURED: frozenset[tuple[tuple[int, int], torch.dtype, int, str]] = frozenset()

PATHS = ("eager", "triton-decode", "decode", "triton", "blocked", "sdpa")

Output = tuple[torch.Tensor, Optional[AttentionMaps]]


# ---------------------------------------------------------------------------------------------- the two calls
def diff_attention(attn: Attention, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   lam: Optional[torch.Tensor], mask: Optional[torch.Tensor], input_pos: Optional[torch.Tensor],
                   return_maps: bool, *, keys: str, pairing: str = "interleaved") -> Output:
    """Differential attention (A1 - lam A2) V on the path ``diff_path`` picks; returns ((B, h, T, dv), maps or None).

    attn: the calling layer (its ``backend``, ``scale``, KV cache and logits hook); x: its input (B, T, d_model),
    whose device, dtype and autograd state the rules read. q (B, 2h, T, d): the 2h softmax query heads, two per
    differential head as ``pairing`` says ("interleaved": heads 2i and 2i+1; "halves": i and h+i). k: ``keys=
    "paired"`` (DIFF V1) (B, 2h_kv, Tk, d) with K1 and K2 of group g at 2g and 2g+1, or ``"shared"`` (DIFF V2)
    (B, H_kv, Tk, d), standard GQA over the 2h query heads. v (B, h_kv, Tk, dv). lam: 0-dim (V1), (B, h, T, 1) (V2)
    or None (A1 - A2). The layouts in detail: ``torch_paths``' docstring.
    """
    if keys not in KEY_LAYOUTS or pairing not in PAIRINGS or (keys == "paired" and pairing != "interleaved"):
        raise ValueError(f"keys={keys!r}, pairing={pairing!r} is not allowed; keys one of {KEY_LAYOUTS}, pairing one "
                         f"of {PAIRINGS} (paired keys pair interleaved heads)")
    B, T = x.shape[:2]
    d, dv, scale = q.shape[-1], v.shape[-1], attn.scale
    # the fused kernels take paired keys with one lambda per layer (DIFF V1) and shared keys with any lambda (DIFF V2);
    # paired keys with a lambda per token (DIFF V2's v2_keys="separate" arm) run the PyTorch paths
    per_token = lam is not None and lam.dim() > 0
    path = diff_path(attn, x, d, dv, mask, input_pos, return_maps,
                     fused=pairing == "interleaved" and not (keys == "paired" and per_token))
    if path == "eager":
        return eager_diff(q, k, v, lam, mask, scale, attn.logits_hook, keys, pairing, x.dtype, return_maps)
    if path == "decode":
        assert mask is not None  # a decode step under a KV cache always has one (the model builds it)
        return decode_diff(q, k, v, lam, mask, scale, keys, pairing), None
    if path == "sdpa":
        return sdpa_diff(q, k, v, lam, mask, scale, keys, pairing), None
    # the fused kernels: (q1, q2, k1, k2) with pair i reading key head i // (h / h_kv); k1 is k2 for shared keys
    (q1, q2), (k1, k2) = split_pairs(q, pairing), split_keys(k, keys)
    if path == "blocked":
        from .blocked import blocked_diff_attention  # imported here: only this path needs it

        lam_b = torch.ones((), dtype=x.dtype, device=x.device) if lam is None else lam.to(x.dtype)
        return blocked_diff_attention(q1, q2, k1, k2, v, lam_b, scale=scale), None
    lam_t = torch.ones((), dtype=torch.float32, device=x.device) if lam is None else lam
    if path == "triton-decode":
        from .triton_decode import triton_diff_decode  # imported here: only this path needs triton

        assert mask is not None
        key_mask = mask[:, 0, -1, :].expand(B, -1)
        return run_triton(x, "decode", d, dv,  # (B, h, 1, dv) split over the cache; the PyTorch step if it fails
                          lambda: triton_diff_decode(q1, q2, k1, k2, v, lam_t, scale, key_mask),
                          lambda: decode_diff(q, k, v, lam, mask, scale, keys, pairing)), None
    from .triton_diff import triton_diff_attention  # imported here: only this path needs triton

    return run_triton(x, triton_pass(x), d, dv,  # (B, h, T, dv); sdpa if a launch fails
                      lambda: triton_diff_attention(q1, q2, k1, k2, v, lam_t, scale, key_padding(mask, B, T)),
                      lambda: sdpa_diff(q, k, v, lam, mask, scale, keys, pairing)), None


def softmax_attention(attn: Attention, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: Optional[torch.Tensor], return_maps: bool) -> Output:
    """Plain (GQA) softmax attention for the baseline: q (B, H, T, d), k/v (B, H_kv, Tk, d) -> (B, H, T, d).
    Eager with maps (as for DIFF), the decode step, else sdpa (the Triton and blocked kernels are DIFF's)."""
    if uses_eager(attn, return_maps):
        rep = q.shape[1] // k.shape[1]
        return eager_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), mask, attn.scale, attn.logits_hook, x.dtype,
                               return_maps)
    if attn.kv_cache is not None and x.shape[1] == 1:
        assert mask is not None  # a decode step under a KV cache always has one (the model builds it)
        return grouped_attention(q, k, v, mask, attn.scale), None  # (B, H, 1, d), the cache read once
    rep = q.shape[1] // k.shape[1]
    return sdpa(q, repeat_kv(k, rep), repeat_kv(v, rep), mask, attn.scale), None


# ---------------------------------------------------------------------------------------------- the rules
def uses_eager(attn: Attention, return_maps: bool) -> bool:
    return attn.backend == "eager" or return_maps or attn.logits_hook is not None


def diff_path(attn: Attention, x: torch.Tensor, head_dim: int, value_dim: int, mask: Optional[torch.Tensor],
              input_pos: Optional[torch.Tensor], return_maps: bool, fused: bool = True) -> str:
    """Which of ``PATHS`` runs this DIFF call (the module docstring says when each does). ``fused``: whether the
    heads are paired the way the fused kernels take them (within a GQA group)."""
    if uses_eager(attn, return_maps):
        return "eager"
    backend, cached = attn.backend, attn.kv_cache is not None
    if cached and x.shape[1] == 1:  # a KV-cache decode step: one new token per row
        return "triton-decode" if fused and use_triton_decode(backend, x, mask, head_dim, value_dim) else "decode"
    if fused and use_triton(backend, x, head_dim, value_dim, cached=cached, input_pos=input_pos):
        return "triton"
    if backend == "blocked" and fused and mask is None and x.device.type == "cpu":  # no mask: no cache, or a prefill
        return "blocked"
    return "sdpa"


def use_triton(backend: str, x: torch.Tensor, head_dim: int, value_dim: int, *, cached: bool = False,
               input_pos: Optional[torch.Tensor] = None) -> bool:
    """Whether a (non-eager, non-decode) DIFF call runs the fused Triton kernel. Under a KV cache (``cached``) only a
    prefill from position 0 does: then the new keys and values are all the prompt sees."""
    if backend not in ("triton", "auto"):
        return False
    if cached and not prefill_from_start(x.shape[1], input_pos):
        return False
    if head_dim not in TRITON_HEAD_DIMS or x.shape[0] > TRITON_MAX_BATCH:
        return False
    return _triton_runs(backend, x, triton_pass(x), head_dim, value_dim)


def use_triton_decode(backend: str, x: torch.Tensor, mask: Optional[torch.Tensor], head_dim: int,
                      value_dim: int) -> bool:
    """Whether a DIFF decode step runs the split-KV Triton kernel: with the ``triton`` backend (``auto`` only where
    ``TRITON_AUTO_MEASURED`` lists the decode pass), without autograd, on CUDA or in the interpreter, for the head
    sizes the kernel is built for."""
    if backend not in ("triton", "auto") or mask is None or torch.is_grad_enabled():
        return False
    if head_dim not in TRITON_HEAD_DIMS:
        return False
    return _triton_runs(backend, x, "decode", head_dim, value_dim)


def auto_runs_triton(capability: tuple[int, int], dtype: torch.dtype, head_dim: int, pass_: str) -> bool:
    """Whether ``auto`` runs the fused Triton kernel for this (GPU, dtype, head width, pass): only where it was
    measured faster (``TRITON_AUTO_MEASURED``; empty today, so never)."""
    if pass_ not in TRITON_PASSES:
        raise ValueError(f"pass_={pass_!r} is not allowed; use one of {', '.join(TRITON_PASSES)}")
    if head_dim not in TRITON_HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim!r} is not allowed; use one of {TRITON_HEAD_DIMS}")
    return (tuple(capability), dtype, head_dim, pass_) in TRITON_AUTO_MEASURED


def _triton_runs(backend: str, x: torch.Tensor, pass_: str, head_dim: int, value_dim: int) -> bool:
    on_cuda = x.device.type == "cuda"
    if backend == "auto":
        # CPU: sdpa (the Triton interpreter is a test tool, not a fast path); CUDA: only where measured faster
        if not on_cuda or not triton_importable():
            return False
        if not auto_runs_triton(cuda_capability(x.device), attention_dtype(x), head_dim, pass_):
            return False
    usable = triton_importable() and (on_cuda or os.environ.get("TRITON_INTERPRET") == "1")
    if not usable:
        say_once(f"backend {backend!r}: Triton "
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


def run_triton(x: torch.Tensor, pass_: str, head_dim: int, value_dim: int,
               launch: Callable[[], torch.Tensor], fallback: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``launch()`` (a Triton kernel call); if Triton fails to compile or launch a kernel (any exception raised
    inside Triton: ``launches.is_triton_launch_error``), one warning names the kind and the reason, and this call and
    every later one of the same ``triton_kind`` run ``fallback()`` (the PyTorch path) instead. Our own argument
    checks (ValueError, TypeError before the kernel is entered) and any other bug of ours propagate. Under
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


def key_padding(mask: Optional[torch.Tensor], batch: int, T: int) -> Optional[torch.Tensor]:
    """The (B, T) real-key mask behind a self-attention mask built by the model (causal & real keys, a row that sees
    nothing sees itself): the first T keys of its last row, which sees every real key of the T queries (under a KV
    cache the mask spans the whole cache; a prefill from 0 reads its first T). None stays None (plain causal)."""
    if mask is None:
        return None
    return mask[:, 0, -1, :T].expand(batch, -1)
