"""The one hook between the model and the fused kernels: ``fused_kernel``, registered into the model's table
(``model/attention/fused.py``) when this module is imported (the package's ``__init__`` imports it; the model imports
nothing from ``kernels/``).

The model's dispatcher (``model/attention/dispatch.py``) asks it for each DIFF call whose heads are paired the way
the kernels take them (within a GQA group) and that the default path's table lookup did not settle (a kernel backend
named, a KV cache). The rules below decide once per case (``case_of``: device, dtypes, head sizes, pass, the cache's
part, the mask); later calls of that case are one dict lookup. It answers None, and the model's PyTorch paths run, or
the ``Kernel`` that takes the call, which the dispatcher runs on the split pairs (q1, q2, k1, k2, v; pair i reads
key head i // (h / h_kv), k1 is k2 for DIFF V2's shared keys) with the PyTorch path as its ``fallback``:

* ``triton-decode`` -- a KV-cache decode step (one new token per row) through the split-KV Triton kernel
  (``triton_decode.py``): with the ``triton`` backend (``auto`` only where ``TRITON_AUTO_MEASURED`` lists the decode
  pass), without autograd, on CUDA or in Triton's CPU interpreter, for the head sizes the kernel is built for.
* ``triton`` -- the fused Triton kernel (``triton_diff.py``: both maps in one FlashAttention-2-style pass, forward
  and backward) for a call that attends only to its own keys (self-attention, with or without a padding mask, or a
  KV cache's prefill from position 0); head_dim 16/32/64/128, on CUDA (compute capability 8.0 or newer) or in
  Triton's CPU interpreter (``TRITON_INTERPRET=1``, for tests). Where Triton was wanted and cannot run (not
  installed, not on CUDA), one line says so, once per process.
* ``blocked`` -- the row-blocked kernel (``blocked.py``), which forms A1 - lambda*A2 block by block before
  multiplying by V; with ``backend="blocked"`` (``auto`` where ``CPU_AUTO_BLOCKED`` lists the case), on the CPU
  only (on an H100, DIFF's own SDPA path was 2.7-5.2x faster than it: BENCHMARKS.md) and only without a mask (no
  padding, no KV cache other than a prefill from 0).

When a Triton launch fails (out of shared memory, a compile error, a GPU older than sm_80), one RuntimeWarning names
the reason and that call, and every later call of the same kind (device, dtype, head sizes and pass:
``launches.triton_kind``), runs the fallback instead (a backward that fails recomputes its gradients in PyTorch).

``auto`` (the model's default backend) runs a kernel only where a measurement in BENCHMARKS.md showed it faster:
the Triton kernel for the (GPU, dtype, head_dim, pass) entries of ``TRITON_AUTO_MEASURED`` (none yet), the blocked
kernel for the CPU cases of ``CPU_AUTO_BLOCKED`` (DIFF's training and inference passes at the head sizes and
lengths measured).

This module imports neither triton nor a kernel: each kernel module is imported when its path first runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Optional

import torch

from ..model.attention.fused import KERNEL_PATHS as MODEL_KERNEL_PATHS
from ..model.attention.fused import Kernel, register
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

# Where ``auto`` runs the row-blocked kernel for DIFF on the CPU (an unmasked call: causal self-attention, or a
# prefill from 0): (dtype, head_dim, value_dim, pass) -> the shortest sequence length from which `bench attention`
# measured it at least 5% faster than DIFF's sdpa path at every length measured (BENCHMARKS.md, "auto on the CPU":
# the command, commit and machine). value_dim tells the variants apart (DIFF V1's values are 2 head_dim wide). The
# training pass (forward and backward, on an AVX-512 machine) and the inference pass were measured; everywhere else
# ``auto`` on the CPU is sdpa.
CPU_AUTO_BLOCKED: dict[tuple[torch.dtype, int, int, str], int] = {
    (torch.float32, 16, 32, "train"): 128,  # DIFF V1: 0.90x sdpa's time at 128, 0.53-0.55x at 512-1024
    (torch.float32, 32, 64, "train"): 128,  # DIFF V1: 0.88x at 128, 0.53-0.56x at 512-1024
    (torch.float32, 32, 32, "train"): 512,  # DIFF V2: 0.82x at 512, 0.93x at 1024 (slower up to 256)
    (torch.float32, 64, 128, "train"): 64,  # DIFF V1: 0.93x at 64, 0.59x at 512
    # the inference pass (forward under no_grad: a prefill, an evaluation), measured on another 2-core machine (an
    # AVX2 EPYC); a length kept only where the 5% holds with the printed ratios' rounding (0.005) against it
    (torch.float32, 16, 32, "prefill"): 256,  # DIFF V1: 0.81x at 256, 0.61-0.78x at 512-1024 (0.95x at 128)
    (torch.float32, 32, 64, "prefill"): 256,  # DIFF V1: 0.82x at 256, 0.72-0.73x at 512-1024 (0.95x at 128)
    (torch.float32, 64, 128, "prefill"): 128,  # DIFF V1: 0.86x at 128, 0.70-0.81x at 256-1024
    (torch.float32, 64, 64, "prefill"): 512,  # DIFF V2: 0.82x at 512, 0.87x at 1024
}

Fallback = Callable[[], torch.Tensor]


# Each case's answer (``fused_kernel``): the rules below run once per case, not in every forward
_DECIDED: dict[tuple, Optional[Kernel]] = {}


def case_of(backend: str, x: torch.Tensor, head_dim: int, value_dim: int, mask: Optional[torch.Tensor], *,
            decode: bool, own_keys: bool) -> tuple:
    """Everything the rules below read of a call, as one key: the backend, x's device, dtype and the attention's
    (autocast), the head sizes, the pass and grad mode, the cache's part (decode step, own keys), masked or not,
    whether the batch fits the Triton grid and the length reaches ``CPU_AUTO_BLOCKED``'s entry, the interpreter
    switch, and whether this case's Triton kind already failed in this process (so a failure changes the answer)."""
    pass_ = "decode" if decode else triton_pass(x)
    dtype = attention_dtype(x)
    shortest = CPU_AUTO_BLOCKED.get((x.dtype, head_dim, value_dim, pass_))
    triton_may_run = backend == "triton" or (backend == "auto" and x.device.type == "cuda")  # auto on a CPU: never
    failed = triton_may_run and triton_kind_failed(triton_kind(x.device, dtype, head_dim, value_dim, pass_))
    return (backend, x.device, x.dtype, dtype, head_dim, value_dim, pass_, torch.is_grad_enabled(), decode, own_keys,
            mask is None, x.shape[0] > TRITON_MAX_BATCH, shortest is not None and x.shape[1] >= shortest,
            os.environ.get("TRITON_INTERPRET") == "1", failed)


def fused_kernel(backend: str, x: torch.Tensor, head_dim: int, value_dim: int, mask: Optional[torch.Tensor], *,
                 decode: bool, own_keys: bool) -> Optional[Kernel]:
    """The kernel that takes this DIFF call, or None (the PyTorch paths). ``decode``: a KV-cache decode step (one new
    token per row); ``own_keys``: the call attends only to its own keys (no KV cache, or a prefill from 0).

    Decided once per case (``case_of``; ``_DECIDED``): a later call of the same case is a dict lookup. Under
    torch.compile the rules run as the graph is traced (once, by construction), with no cache to guard on."""
    if torch.compiler.is_compiling():
        return decide(backend, x, head_dim, value_dim, mask, decode=decode, own_keys=own_keys)
    case = case_of(backend, x, head_dim, value_dim, mask, decode=decode, own_keys=own_keys)
    try:
        return _DECIDED[case]
    except KeyError:  # the first call of this case
        kernel = _DECIDED[case] = decide(backend, x, head_dim, value_dim, mask, decode=decode, own_keys=own_keys)
        return kernel


def decide(backend: str, x: torch.Tensor, head_dim: int, value_dim: int, mask: Optional[torch.Tensor], *,
           decode: bool, own_keys: bool) -> Optional[Kernel]:
    """The rules behind ``fused_kernel``, asked afresh (``fused_kernel`` asks them once per case)."""
    if decode:
        return TRITON_DECODE if use_triton_decode(backend, x, mask, head_dim, value_dim) else None
    if own_keys and use_triton(backend, x, head_dim, value_dim):
        return TRITON
    if mask is None and x.device.type == "cpu" and (  # no mask: no cache, or a prefill
            backend == "blocked" or (backend == "auto" and auto_runs_blocked(x, head_dim, value_dim))):
        return BLOCKED
    return None


# ---------------------------------------------------------------------------------------------- the kernels
def _blocked(x, q1, q2, k1, k2, v, lam, mask, scale, fallback: Fallback) -> torch.Tensor:
    from .blocked import blocked_diff_attention  # imported here: only this path needs it

    lam_b = torch.ones((), dtype=x.dtype, device=x.device) if lam is None else lam.to(x.dtype)
    return blocked_diff_attention(q1, q2, k1, k2, v, lam_b, scale=scale)


def _triton_decode(x, q1, q2, k1, k2, v, lam, mask, scale, fallback: Fallback) -> torch.Tensor:
    from .triton_decode import triton_diff_decode  # imported here: only this path needs triton

    assert mask is not None  # a decode step under a KV cache always has one (the model builds it)
    lam_t = torch.ones((), dtype=torch.float32, device=x.device) if lam is None else lam
    key_mask = mask[:, 0, -1, :].expand(x.shape[0], -1)
    return run_triton(x, "decode", q1.shape[-1], v.shape[-1],  # (B, h, 1, dv) split over the cache
                      lambda: triton_diff_decode(q1, q2, k1, k2, v, lam_t, scale, key_mask), fallback)


def _triton(x, q1, q2, k1, k2, v, lam, mask, scale, fallback: Fallback) -> torch.Tensor:
    from .triton_diff import triton_diff_attention  # imported here: only this path needs triton

    B, T = x.shape[:2]
    lam_t = torch.ones((), dtype=torch.float32, device=x.device) if lam is None else lam
    return run_triton(x, triton_pass(x), q1.shape[-1], v.shape[-1],  # (B, h, T, dv)
                      lambda: triton_diff_attention(q1, q2, k1, k2, v, lam_t, scale, key_padding(mask, B, T)),
                      fallback)


TRITON_DECODE = Kernel("triton-decode", _triton_decode)
TRITON = Kernel("triton", _triton)
BLOCKED = Kernel("blocked", _blocked)
KERNEL_PATHS = tuple(k.path for k in (TRITON_DECODE, TRITON, BLOCKED))
assert KERNEL_PATHS == MODEL_KERNEL_PATHS, "the model's table names these paths"


# ---------------------------------------------------------------------------------------------- the rules
def use_triton(backend: str, x: torch.Tensor, head_dim: int, value_dim: int) -> bool:
    """Whether a (non-eager, non-decode) DIFF call that attends only to its own keys runs the fused Triton kernel."""
    if backend not in ("triton", "auto"):
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


def auto_runs_blocked(x: torch.Tensor, head_dim: int, value_dim: int) -> bool:
    """Whether ``auto`` runs the row-blocked kernel for this CPU call (``CPU_AUTO_BLOCKED``: its dtype, head sizes,
    pass and length measured faster there); a dict lookup."""
    shortest = CPU_AUTO_BLOCKED.get((x.dtype, head_dim, value_dim, triton_pass(x)))
    return shortest is not None and x.device.type == "cpu" and x.shape[1] >= shortest


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
               launch: Callable[[], torch.Tensor], fallback: Fallback) -> torch.Tensor:
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


def serves(backend: str, x: torch.Tensor, head_dim: int, value_dim: int) -> bool:
    """Whether ``fused_kernel`` may take a (non-cache) call of this backend and case at all, decided by the tables
    alone: ``triton`` and ``blocked`` anywhere (their rules check the device); ``auto`` on CUDA where
    ``TRITON_AUTO_MEASURED`` lists (GPU, dtype, head_dim, pass) and on the CPU where ``CPU_AUTO_BLOCKED`` lists the
    case. Everywhere else ``auto`` is sdpa and no rule is asked (the KV cache's calls always ask: ``sdpa_direct``)."""
    if backend in ("triton", "blocked"):
        return True
    if backend != "auto":
        return False
    if x.device.type == "cuda":
        return head_dim in TRITON_HEAD_DIMS and auto_runs_triton(cuda_capability(x.device), attention_dtype(x),
                                                                 head_dim, triton_pass(x))
    return auto_runs_blocked(x, head_dim, value_dim)


# the model's table (model/attention/fused.py) asks this rule; imported by the package
register(fused_kernel, serves)
