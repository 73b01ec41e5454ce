"""Fused causal differential attention in Triton (FlashAttention-2 style), forward and backward.

Differential attention (Ye et al., "Differential Transformer", arXiv 2410.05258, eq. 1; DIFF V2 uses the same
form with one shared key map and a per-token, per-head lambda). For every batch ``b``, query head ``i`` and
query row ``t``::

    S1 = q1 k1^T * scale + M          P1 = softmax(S1)        (row-wise)
    S2 = q2 k2^T * scale + M          P2 = softmax(S2)
    out = (P1 - lam * P2) @ v  =  O1 - lam * O2,   O1 = P1 v,  O2 = P2 v

``M`` is 0 where key ``j`` is visible to query ``t`` and -inf elsewhere. Key ``j`` is visible when
``j <= t and key_mask[b, j]``; a query row that would see no key at all (a left-padded prefix) sees only itself
(``j == t``), so every softmax row is finite. Without ``key_mask`` this is plain causal attention.

Forward (``_diff_fwd_kernel``, one program per (query block, query head i, batch row b); a tuned config may also
split the value width over programs, each recomputing the scores for its BLOCK_DV columns)
    The program loops over the key blocks up to its causal limit and runs TWO online softmaxes at once
    (running max m, normaliser l and un-normalised accumulator acc for each map); each K tile is loaded once
    (only once for both maps when k1 is k2) and each V tile once for both maps. At the end it writes
    ``out = acc1 / l1 - lam * acc2 / l2`` in the input dtype and saves, per query row, the log-sum-exps
    ``LSE1 = m1 + log l1`` and ``LSE2`` and the row ``O2 = P2 v`` (accumulation dtype), all O(T) per head:
    no T x T tensor is ever stored.

Backward (recomputation). With ``dO`` the output gradient and ``dD = dO v^T`` the gradient of the
differential map ``D = P1 - lam * P2``::

    dv    = D^T dO = (P1 - lam P2)^T dO
    dP1   = dD,    dP2 = -lam * dD          (lam per row broadcasts over the key axis)
    softmax backward, dS = P * (dP - rowsum(P * dP)), and rowsum(P1 * dD) = rowsum(dO * (P1 v)):
    Delta1 = rowsum(dO * O1),  O1 = out + lam * O2          Delta2 = rowsum(dO * O2)
    dS1   = P1 * (dD - Delta1) * scale      -> dq1 = dS1 k1,   dk1 = dS1^T q1
    dS2   = -lam * P2 * (dD - Delta2) * scale -> dq2 = dS2 k2,   dk2 = dS2^T q2
    dlam  = -rowsum(dD * P2) = -Delta2      (per row; summed to lam's shape)

    (``scale`` multiplies dS because S = q k^T * scale.) P1 and P2 are recomputed tile by tile from the saved
    LSEs: ``P = exp(S - LSE)``.

    * ``_diff_bwd_preprocess_kernel`` computes Delta1 and Delta2 per row (and so dlam).
    * ``_diff_bwd_dkdv_kernel``: one program per (key block, kv head, b). It keeps dk1, dk2 (one dk
      when k1 is k2: the sum of both maps' contributions) and dv in registers and loops over the Hq / Hk query
      heads of its group and over the query blocks at or after its keys (causal), so no atomics are needed.
    * ``_diff_bwd_dq_kernel``: one program per (query block, query head i, b), looping over its key blocks.

    Grids are (blocks, heads, batch): CUDA allows 2^31 - 1 programs on axis 0 and 65,535 on axes 1 and 2, so any
    B x Hq launches while B <= 65,535 (checked). Row offsets (row index times row stride) are int64, so a tensor of
    more than 2^31 elements is addressed correctly.

Layout
    q1, q2: (B, Hq, T, d); k1, k2: (B, Hk, T, d); v: (B, Hk, T, dv), any strides with a unit last stride
    (others are copied). Query head ``i`` reads kv head ``i // (Hq / Hk)`` (grouped-query attention).
    The output, the saved LSE / O2 rows and all gradients are contiguous. Inputs in float16 / bfloat16 /
    float32 accumulate in float32 (matmul operands stay in the input dtype); float32 dots follow
    ``torch.backends.cuda.matmul.allow_tf32`` as PyTorch's own matmuls do (False, PyTorch's default: IEEE fp32 FMA,
    no tensor cores; True: TF32 tensor cores, ~1e-3 relative error), unless ``allow_tf32`` is passed; float64
    inputs accumulate in float64 (for exact oracle tests).

This module imports ``triton`` at top level; set ``TRITON_INTERPRET=1`` *before* importing it to run the
kernels on CPU tensors with Triton's interpreter (tests). The default block sizes and stages (``default_config``)
fit each GPU's shared memory (checked by compiling for sm_80 and sm_90 in ``tests/model/test_triton_aot.py``); on
sm_80/sm_90 in 16 bits at d 64 and 128, unless tiles are passed, each kernel times the candidates that fit that GPU
on the first call of a shape and keeps the fastest (``triton_tuning``; ``chosen_configs()`` says what it chose).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

__all__ = ["triton_diff_attention", "triton_available", "default_config", "chosen_configs", "smem_limit",
           "dot_precision", "ALLOWED_HEAD_DIMS", "SMEM_LIMITS", "CONSUMER_SMEM_LIMIT"]

from . import triton_tuning as tuning
from .launches import TRITON_HEAD_DIMS as ALLOWED_HEAD_DIMS
from .launches import TRITON_MAX_BATCH as MAX_BATCH
from .launches import is_triton_launch_error, triton_failed, triton_kind, triton_kind_failed
from .triton_tuning import chosen_configs

_ALLOWED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Shared memory one program (thread block) may use, in bytes, by compute capability (major * 10 + minor): A100
# (and Orin) 163 KB, H100 227 KB. Any other GPU (sm_86, sm_89 and sm_120 consumer and workstation cards) gets 99 KB.
SMEM_LIMITS = {80: 166_912, 87: 166_912, 90: 232_448}
CONSUMER_SMEM_LIMIT = 101_376
# Initial running max: finite, so a tile in which a row sees no key gives exp(-inf - m) = 0, not NaN.
_NEG_INIT = tl.constexpr(-1.0e30)


def triton_available() -> bool:
    """True when triton imports and can run here: a CUDA device, or ``TRITON_INTERPRET=1`` (CPU interpreter)."""
    try:
        import triton  # noqa: F401  (re-import: cheap, keeps the check honest if the module is vendored)
    except Exception:  # pragma: no cover - this module already needs triton to import
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def smem_limit(arch: int) -> int:
    """Shared memory per program (bytes) on a GPU of compute capability ``arch`` (major * 10 + minor)."""
    return SMEM_LIMITS.get(arch, CONSUMER_SMEM_LIMIT)


def _device_arch(device: torch.device) -> int:
    """Compute capability (major * 10 + minor) of the device the kernels will run on; 80 off CUDA (the interpreter
    ignores warps and stages, and tests pass their own tiles)."""
    if device.type != "cuda":
        return 80
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


# (block_m, block_n, num_warps, num_stages) per kernel, for a dtype's operand width and (d, dv). block_m tiles the
# queries and block_n the keys in every kernel ("decode": block_n keys per tile, its rows are the query heads).
# Chosen WITHOUT timing (no GPU was available): the largest tiles, from a small grid compiled for sm_80 and sm_90
# with Triton 3.9's ptxas, that need at most 99 KB of shared memory (16-bit dtypes; so they launch on consumer GPUs
# too) and spill at most a few dozen bytes per thread. float32 with IEEE dots runs on CUDA cores (FMA): its operands
# are twice as wide and whole rows of them sit in registers, so its tiles are smaller. The kernels keep two maps'
# worth of state (two online softmaxes; dk1, dk2 and dv), so tiles are smaller than single-softmax FlashAttention's.
# They are the safe default: the interpreter and GPUs other than sm_80/sm_90 use them, and on those two each is the
# first candidate of the measured choice (triton_tuning.py). tests/model/test_triton_aot.py checks every entry fits.
_CONFIGS_16BIT = {  # float16 / bfloat16: tensor cores
    "d32": {"fwd": (64, 64, 4, 2), "bwd_dkdv": (64, 16, 4, 2), "bwd_dq": (32, 64, 4, 2), "decode": (0, 64, 4, 2)},
    "d64": {"fwd": (64, 64, 8, 2), "bwd_dkdv": (64, 32, 8, 2), "bwd_dq": (32, 64, 8, 2), "decode": (0, 64, 4, 2)},
    "d128": {"fwd": (32, 32, 8, 2), "bwd_dkdv": (32, 32, 8, 2), "bwd_dq": (32, 32, 8, 2), "decode": (0, 64, 4, 2)},
    "d128v256": {"fwd": (32, 32, 8, 2), "bwd_dkdv": (64, 16, 8, 2), "bwd_dq": (32, 32, 8, 2), "decode": (0, 64, 4, 2)},
}
_CONFIGS_FP32 = {  # float32 (IEEE: FMA on CUDA cores; TF32: tensor cores, fits the same tiles)
    "d32": {"fwd": (32, 16, 8, 2), "bwd_dkdv": (32, 16, 8, 2), "bwd_dq": (32, 32, 8, 2), "decode": (0, 32, 8, 2)},
    "d64": {"fwd": (32, 16, 8, 2), "bwd_dkdv": (32, 16, 8, 2), "bwd_dq": (32, 32, 8, 2), "decode": (0, 32, 8, 2)},
    "d128": {"fwd": (16, 32, 8, 2), "bwd_dkdv": (32, 16, 8, 2), "bwd_dq": (16, 32, 8, 2), "decode": (0, 16, 8, 2)},
    "d128v256": {"fwd": (16, 32, 8, 2), "bwd_dkdv": (32, 16, 8, 2), "bwd_dq": (16, 32, 8, 2),
                 "decode": (0, 16, 8, 2)},
}
# float64 (tests; no GPU target of ours): the smallest tiles, one stage.
_CONFIG_FP64 = {"fwd": (16, 16, 4, 1), "bwd_dkdv": (16, 16, 4, 1), "bwd_dq": (16, 16, 4, 1), "decode": (0, 16, 4, 1)}
# GPUs with at least 163 KB per program (sm_80, sm_87, sm_90): the 16-bit decode keeps Triton's default of three
# stages, which fits there (at most 141 KB at d 128, dv 256) and not in 99 KB.
_BIG_SMEM_DECODE_STAGES_16BIT = 3
_BIG_SMEM = 163 * 1024


def default_config(d: int, dv: int, dtype: torch.dtype = torch.bfloat16,
                   arch: int = 90) -> dict[str, tuple[int, int, int, int]]:
    """Default (block_m, block_n, num_warps, num_stages) per kernel: keys "fwd", "bwd_dkdv", "bwd_dq", "decode"
    (decode's block_m is unused: 0), for head width ``d``, value width ``dv`` (d or 2d), the inputs' ``dtype`` and
    a GPU of compute capability ``arch`` (major * 10 + minor; its shared memory is ``smem_limit(arch)``)."""
    if d not in ALLOWED_HEAD_DIMS:
        raise ValueError(f"d={d!r} is not allowed; use one of {ALLOWED_HEAD_DIMS}")
    if dv not in (d, 2 * d):
        raise ValueError(f"dv={dv!r} is not allowed; use d={d} (DIFF V2, V1 per_head) or 2d={2 * d} (DIFF V1)")
    if dtype not in _ALLOWED_DTYPES:
        raise TypeError(f"dtype={dtype} is not allowed; use one of float16, bfloat16, float32, float64")
    if dtype == torch.float64:
        return dict(_CONFIG_FP64)
    key = "d32" if d <= 32 else "d64" if d <= 64 else ("d128" if dv <= 128 else "d128v256")
    table = _CONFIGS_FP32 if dtype == torch.float32 else _CONFIGS_16BIT
    cfg = dict(table[key])
    if dtype != torch.float32 and smem_limit(arch) >= _BIG_SMEM:
        bm, bn, nw, _ = cfg["decode"]
        cfg["decode"] = (bm, bn, nw, _BIG_SMEM_DECODE_STAGES_16BIT)
    return cfg


# ----------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _visible(qi, kj, T, km, first, HAS_MASK: tl.constexpr):
    """Visibility of key kj to query qi (broadcastable index tensors); km: key_mask of kj (bool, same shape
    as kj), first: index of the first real key of this batch row (T if none)."""
    vis = (kj <= qi) & (qi < T)
    if HAS_MASK:
        vis = (vis & km) | ((kj == qi) & (qi < first) & (qi < T))
    return vis


@triton.jit
def _load_lam(LAM, row_off, offs_m, row_ok, ACC: tl.constexpr, BLOCK_M: tl.constexpr,
              LAM_PER_ROW: tl.constexpr):
    """lam for the rows offs_m as a (BLOCK_M,) vector: per-row entries or the broadcast scalar."""
    if LAM_PER_ROW:
        lam = tl.load(LAM + row_off + offs_m, mask=row_ok, other=0.0).to(ACC)
    else:
        lam = tl.zeros([BLOCK_M], dtype=ACC) + tl.load(LAM).to(ACC)
    return lam


@triton.jit
def _load_kv_tile(k1_base, k2_base, v_base, sk1_t, sk2_t, sv_t, offs_n, offs_d, offs_dv, T, KM, skm_b, b,
                  SHARED_K: tl.constexpr, HAS_MASK: tl.constexpr):
    """The keys offs_n of both maps (k2 is k1 when shared), their values, and which of them are real keys
    (bool (BLOCK_N,)): row b of the key mask KM (row stride skm_b) where HAS_MASK; positions past T load as zeros
    and are not real."""
    col_ok = offs_n < T
    k1 = tl.load(k1_base + offs_n[:, None].to(tl.int64) * sk1_t + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    if SHARED_K:
        k2 = k1
    else:
        k2 = tl.load(k2_base + offs_n[:, None].to(tl.int64) * sk2_t + offs_d[None, :], mask=col_ok[:, None],
                     other=0.0)
    v = tl.load(v_base + offs_n[:, None].to(tl.int64) * sv_t + offs_dv[None, :], mask=col_ok[:, None], other=0.0)
    if HAS_MASK:
        km = tl.load(KM + b * skm_b + offs_n, mask=col_ok, other=0) != 0
    else:
        km = col_ok
    return k1, k2, v, km


@triton.jit
def _load_row_stats(LSE1, LSE2, DELTA1, DELTA2, row_off, row_ok):
    """The forward's log-sum-exps and the backward's Delta1/Delta2 of the rows row_off."""
    lse1 = tl.load(LSE1 + row_off, mask=row_ok, other=0.0)
    lse2 = tl.load(LSE2 + row_off, mask=row_ok, other=0.0)
    delta1 = tl.load(DELTA1 + row_off, mask=row_ok, other=0.0)
    delta2 = tl.load(DELTA2 + row_off, mask=row_ok, other=0.0)
    return lse1, lse2, delta1, delta2


@triton.jit
def _online_softmax_step(q, k, v, vis, m, l, acc, scale, ACC: tl.constexpr, PRECISION: tl.constexpr):
    """One key tile of an online softmax: the running max m, normaliser l and unnormalised accumulator acc of
    softmax(q k^T * scale) v, updated with the keys k and values v that vis (bool, broadcast to rows x keys) shows."""
    s = tl.dot(q, tl.trans(k), out_dtype=ACC, input_precision=PRECISION) * scale
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, out_dtype=ACC, input_precision=PRECISION)
    return m_new, l, acc


@triton.jit
def _diff_fwd_kernel(
    Q1, Q2, K1, K2, V, LAM, SCALE, KM, FIRST, OUT, O2, LSE1, LSE2,
    sq1_b, sq1_h, sq1_t, sq2_b, sq2_h, sq2_t,
    sk1_b, sk1_h, sk1_t, sk2_b, sk2_h, sk2_t, sv_b, sv_h, sv_t,
    T, HQ, GROUP,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
    SHARED_K: tl.constexpr, LAM_PER_ROW: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
):
    """One query block of one head, value columns [pid_v * BLOCK_DV, +BLOCK_DV): BLOCK_DV < DV splits the value
    width over DV // BLOCK_DV programs (each recomputes both maps' scores; only the first stores the LSEs), so two
    accumulators of BLOCK_DV columns, not DV, sit in registers (DIFF V1's dv = 2d)."""
    ACC: tl.constexpr = LSE1.dtype.element_ty
    N_DV: tl.constexpr = DV // BLOCK_DV
    pid_m = tl.program_id(0) // N_DV
    pid_v = tl.program_id(0) % N_DV
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    bh = b * HQ + h
    hk = h // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_dv = pid_v * BLOCK_DV + tl.arange(0, BLOCK_DV)
    row_ok = offs_m < T

    q1 = tl.load(Q1 + b * sq1_b + h * sq1_h + offs_m[:, None].to(tl.int64) * sq1_t + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    q2 = tl.load(Q2 + b * sq2_b + h * sq2_h + offs_m[:, None].to(tl.int64) * sq2_t + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    k1_base = K1 + b * sk1_b + hk * sk1_h
    k2_base = K2 + b * sk2_b + hk * sk2_h
    v_base = V + b * sv_b + hk * sv_h
    scale = tl.load(SCALE).to(ACC)
    lam = _load_lam(LAM, bh * T, offs_m, row_ok, ACC, BLOCK_M, LAM_PER_ROW)
    if HAS_MASK:
        first = tl.load(FIRST + b)
    else:
        first = T

    m1 = tl.full([BLOCK_M], _NEG_INIT, dtype=ACC)
    m2 = tl.full([BLOCK_M], _NEG_INIT, dtype=ACC)
    l1 = tl.zeros([BLOCK_M], dtype=ACC)
    l2 = tl.zeros([BLOCK_M], dtype=ACC)
    acc1 = tl.zeros([BLOCK_M, BLOCK_DV], dtype=ACC)
    acc2 = tl.zeros([BLOCK_M, BLOCK_DV], dtype=ACC)

    end_n = tl.minimum(start_m + BLOCK_M, T)  # causal limit of this query block
    for start_n in range(0, end_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k1, k2, v, km = _load_kv_tile(k1_base, k2_base, v_base, sk1_t, sk2_t, sv_t, offs_n, offs_d, offs_dv, T, KM,
                                      T, b, SHARED_K, HAS_MASK)
        vis = _visible(offs_m[:, None], offs_n[None, :], T, km[None, :], first, HAS_MASK)

        # both maps against the same K (when shared) and V tiles
        m1, l1, acc1 = _online_softmax_step(q1, k1, v, vis, m1, l1, acc1, scale, ACC, PRECISION)
        m2, l2, acc2 = _online_softmax_step(q2, k2, v, vis, m2, l2, acc2, scale, ACC, PRECISION)

    # Rows past T see nothing (l = 0); they are never stored, the guard only keeps them finite.
    l1 = tl.where(l1 > 0, l1, 1.0)
    l2 = tl.where(l2 > 0, l2, 1.0)
    o1 = acc1 / l1[:, None]
    o2 = acc2 / l2[:, None]
    out = o1 - lam[:, None] * o2
    row_off = bh * T + offs_m
    tl.store(OUT + row_off[:, None] * DV + offs_dv[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    tl.store(O2 + row_off[:, None] * DV + offs_dv[None, :], o2, mask=row_ok[:, None])
    if pid_v == 0:  # every value split computed the same statistics; one stores them
        tl.store(LSE1 + row_off, m1 + tl.log(l1), mask=row_ok)
        tl.store(LSE2 + row_off, m2 + tl.log(l2), mask=row_ok)


@triton.jit
def _diff_bwd_preprocess_kernel(
    OUT, O2, DO, LAM, DELTA1, DELTA2,
    sdo_b, sdo_h, sdo_t,
    T, HQ,
    DV: tl.constexpr, BLOCK_M: tl.constexpr, LAM_PER_ROW: tl.constexpr,
):
    """Delta1 = rowsum(dO * (out + lam * O2)), Delta2 = rowsum(dO * O2) (dlam = -Delta2)."""
    ACC: tl.constexpr = DELTA1.dtype.element_ty
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    bh = b * HQ + h
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, DV)
    row_ok = offs_m < T
    row_off = bh * T + offs_m
    out = tl.load(OUT + row_off[:, None] * DV + offs_dv[None, :], mask=row_ok[:, None], other=0.0).to(ACC)
    o2 = tl.load(O2 + row_off[:, None] * DV + offs_dv[None, :], mask=row_ok[:, None], other=0.0).to(ACC)
    do = tl.load(DO + b * sdo_b + h * sdo_h + offs_m[:, None].to(tl.int64) * sdo_t + offs_dv[None, :],
                 mask=row_ok[:, None], other=0.0).to(ACC)
    lam = _load_lam(LAM, bh * T, offs_m, row_ok, ACC, BLOCK_M, LAM_PER_ROW)
    o1 = out + lam[:, None] * o2
    tl.store(DELTA1 + row_off, tl.sum(do * o1, 1), mask=row_ok)
    tl.store(DELTA2 + row_off, tl.sum(do * o2, 1), mask=row_ok)


@triton.jit
def _diff_bwd_dkdv_kernel(
    Q1, Q2, K1, K2, V, DO, LAM, SCALE, KM, FIRST, LSE1, LSE2, DELTA1, DELTA2, DK1, DK2, DV_OUT,
    sq1_b, sq1_h, sq1_t, sq2_b, sq2_h, sq2_t,
    sk1_b, sk1_h, sk1_t, sk2_b, sk2_h, sk2_t, sv_b, sv_h, sv_t, sdo_b, sdo_h, sdo_t,
    T, HQ, GROUP,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SHARED_K: tl.constexpr, LAM_PER_ROW: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
):
    """dk1, dk2 (or the shared dk) and dv for one key block of one kv head, transposed orientation (keys x
    queries) so that no tile needs a transpose before its dot with q / dO."""
    ACC: tl.constexpr = LSE1.dtype.element_ty
    pid_n = tl.program_id(0)
    hk = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    HK = HQ // GROUP
    bhk = b * HK + hk
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    col_ok = offs_n < T

    k1, k2, v, km = _load_kv_tile(K1 + b * sk1_b + hk * sk1_h, K2 + b * sk2_b + hk * sk2_h, V + b * sv_b + hk * sv_h,
                                  sk1_t, sk2_t, sv_t, offs_n, offs_d, offs_dv, T, KM, T, b, SHARED_K, HAS_MASK)
    scale = tl.load(SCALE).to(ACC)
    if HAS_MASK:
        first = tl.load(FIRST + b)
    else:
        first = T

    dk1 = tl.zeros([BLOCK_N, D], dtype=ACC)
    dk2 = tl.zeros([BLOCK_N, D], dtype=ACC)
    dv = tl.zeros([BLOCK_N, DV], dtype=ACC)
    lo = (start_n // BLOCK_M) * BLOCK_M  # first query block that can see these keys (causal)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        bh = b * HQ + h
        q1_base = Q1 + b * sq1_b + h * sq1_h
        q2_base = Q2 + b * sq2_b + h * sq2_h
        do_base = DO + b * sdo_b + h * sdo_h
        for start_m in range(lo, T, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < T
            row_off = bh * T + offs_m
            rows = offs_m[:, None].to(tl.int64)
            q1 = tl.load(q1_base + rows * sq1_t + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            q2 = tl.load(q2_base + rows * sq2_t + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            do = tl.load(do_base + rows * sdo_t + offs_dv[None, :], mask=row_ok[:, None], other=0.0)
            lse1, lse2, delta1, delta2 = _load_row_stats(LSE1, LSE2, DELTA1, DELTA2, row_off, row_ok)
            lam = _load_lam(LAM, bh * T, offs_m, row_ok, ACC, BLOCK_M, LAM_PER_ROW)
            vis = _visible(offs_m[None, :], offs_n[:, None], T, km[:, None], first, HAS_MASK)  # (N, M)

            st1 = tl.dot(k1, tl.trans(q1), out_dtype=ACC, input_precision=PRECISION) * scale
            pt1 = tl.exp(tl.where(vis, st1, float("-inf")) - lse1[None, :])
            st2 = tl.dot(k2, tl.trans(q2), out_dtype=ACC, input_precision=PRECISION) * scale
            pt2 = tl.exp(tl.where(vis, st2, float("-inf")) - lse2[None, :])
            dt = pt1 - lam[None, :] * pt2  # D^T
            dv += tl.dot(dt.to(do.dtype), do, out_dtype=ACC, input_precision=PRECISION)
            ddt = tl.dot(v, tl.trans(do), out_dtype=ACC, input_precision=PRECISION)  # dD^T
            dst1 = pt1 * (ddt - delta1[None, :]) * scale
            dst2 = (-lam[None, :]) * pt2 * (ddt - delta2[None, :]) * scale
            dk1 += tl.dot(dst1.to(q1.dtype), q1, out_dtype=ACC, input_precision=PRECISION)
            if SHARED_K:
                dk1 += tl.dot(dst2.to(q2.dtype), q2, out_dtype=ACC, input_precision=PRECISION)
            else:
                dk2 += tl.dot(dst2.to(q2.dtype), q2, out_dtype=ACC, input_precision=PRECISION)

    kv_row = bhk * T + offs_n
    tl.store(DK1 + kv_row[:, None] * D + offs_d[None, :], dk1.to(DK1.dtype.element_ty), mask=col_ok[:, None])
    if not SHARED_K:
        tl.store(DK2 + kv_row[:, None] * D + offs_d[None, :], dk2.to(DK2.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV_OUT + kv_row[:, None] * DV + offs_dv[None, :], dv.to(DV_OUT.dtype.element_ty),
             mask=col_ok[:, None])


@triton.jit
def _diff_bwd_dq_kernel(
    Q1, Q2, K1, K2, V, DO, LAM, SCALE, KM, FIRST, LSE1, LSE2, DELTA1, DELTA2, DQ1, DQ2,
    sq1_b, sq1_h, sq1_t, sq2_b, sq2_h, sq2_t,
    sk1_b, sk1_h, sk1_t, sk2_b, sk2_h, sk2_t, sv_b, sv_h, sv_t, sdo_b, sdo_h, sdo_t,
    T, HQ, GROUP,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SHARED_K: tl.constexpr, LAM_PER_ROW: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
):
    """dq1 and dq2 for one query block of one query head."""
    ACC: tl.constexpr = LSE1.dtype.element_ty
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    bh = b * HQ + h
    hk = h // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    row_ok = offs_m < T
    row_off = bh * T + offs_m

    q1 = tl.load(Q1 + b * sq1_b + h * sq1_h + offs_m[:, None].to(tl.int64) * sq1_t + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    q2 = tl.load(Q2 + b * sq2_b + h * sq2_h + offs_m[:, None].to(tl.int64) * sq2_t + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * sdo_b + h * sdo_h + offs_m[:, None].to(tl.int64) * sdo_t + offs_dv[None, :],
                 mask=row_ok[:, None], other=0.0)
    lse1, lse2, delta1, delta2 = _load_row_stats(LSE1, LSE2, DELTA1, DELTA2, row_off, row_ok)
    lam = _load_lam(LAM, bh * T, offs_m, row_ok, ACC, BLOCK_M, LAM_PER_ROW)
    scale = tl.load(SCALE).to(ACC)
    k1_base = K1 + b * sk1_b + hk * sk1_h
    k2_base = K2 + b * sk2_b + hk * sk2_h
    v_base = V + b * sv_b + hk * sv_h
    if HAS_MASK:
        first = tl.load(FIRST + b)
    else:
        first = T

    dq1 = tl.zeros([BLOCK_M, D], dtype=ACC)
    dq2 = tl.zeros([BLOCK_M, D], dtype=ACC)
    end_n = tl.minimum(start_m + BLOCK_M, T)
    for start_n in range(0, end_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k1, k2, v, km = _load_kv_tile(k1_base, k2_base, v_base, sk1_t, sk2_t, sv_t, offs_n, offs_d, offs_dv, T, KM,
                                      T, b, SHARED_K, HAS_MASK)
        vis = _visible(offs_m[:, None], offs_n[None, :], T, km[None, :], first, HAS_MASK)

        s1 = tl.dot(q1, tl.trans(k1), out_dtype=ACC, input_precision=PRECISION) * scale
        p1 = tl.exp(tl.where(vis, s1, float("-inf")) - lse1[:, None])
        s2 = tl.dot(q2, tl.trans(k2), out_dtype=ACC, input_precision=PRECISION) * scale
        p2 = tl.exp(tl.where(vis, s2, float("-inf")) - lse2[:, None])
        dd = tl.dot(do, tl.trans(v), out_dtype=ACC, input_precision=PRECISION)  # dD
        ds1 = p1 * (dd - delta1[:, None]) * scale
        ds2 = (-lam[:, None]) * p2 * (dd - delta2[:, None]) * scale
        dq1 += tl.dot(ds1.to(k1.dtype), k1, out_dtype=ACC, input_precision=PRECISION)
        dq2 += tl.dot(ds2.to(k2.dtype), k2, out_dtype=ACC, input_precision=PRECISION)

    tl.store(DQ1 + row_off[:, None] * D + offs_d[None, :], dq1.to(DQ1.dtype.element_ty), mask=row_ok[:, None])
    tl.store(DQ2 + row_off[:, None] * D + offs_d[None, :], dq2.to(DQ2.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _launch_opts(config: tuple[int, int, int, int]) -> dict:
    block_m, block_n, num_warps, num_stages = config
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages)


class _Cfg:
    """Launch configuration: per kernel (block_m, block_n, num_warps, num_stages), the dot precision and, when the
    tiles were not given, the shape the tuner keys its choice by (``triton_tuning``)."""

    def __init__(self, kernels: dict[str, tuple[int, int, int, int]], precision: Optional[str],
                 tune: Optional[tuple] = None):
        self.kernels, self.precision, self.tune = kernels, precision, tune

    def run(self, kernel: str, launch, device: torch.device) -> None:
        """``launch(config)`` with this kernel's config: the given one, or the tuner's choice among the fitting
        candidates for ``self.tune`` = (arch, dtype, d, dv, shared_k, seq_len) (the default first)."""
        if self.tune is None:
            launch(self.kernels[kernel])
            return
        arch, dtype, d, dv, shared_k, seq_len = self.tune
        options = tuning.candidates(arch, dtype, d, dv, shared_k, kernel, self.kernels[kernel])
        key = (arch, dtype, d, dv, tuning.variant_of(d, dv, shared_k), kernel, tuning.seq_bucket(seq_len))
        tuning.tuned_launch(key, options, launch, device)


def dot_precision(dtype: torch.dtype, allow_tf32: Optional[bool]) -> Optional[str]:
    """The kernels' ``input_precision`` for ``tl.dot``: float32 follows ``allow_tf32``, or when it is None
    ``torch.backends.cuda.matmul.allow_tf32`` (PyTorch's default False: IEEE); float64 is IEEE; 16-bit: the default."""
    if dtype == torch.float64:
        return "ieee"
    if dtype == torch.float32:
        tf32 = torch.backends.cuda.matmul.allow_tf32 if allow_tf32 is None else allow_tf32
        return "tf32" if tf32 else "ieee"
    return None


def _torch_diff_attention(q1, q2, k1, k2, v, lam, scale: float, km, first) -> torch.Tensor:
    """The same function in PyTorch (SDPA per map, GQA by repeating the kv heads, the kernels' visibility rule): the
    backward's fallback when a backward kernel cannot launch. lam: 1 entry or (B, Hq, T, 1); km (B, T) int8 or None."""
    _, HQ, T, _ = q1.shape
    r = HQ // k1.shape[1]
    k1, k2, v = (x.repeat_interleave(r, dim=1) if r > 1 else x for x in (k1, k2, v))
    mask = None
    if km is not None:
        t = torch.arange(T, device=q1.device)
        causal = t[None, :] <= t[:, None]  # (T, T): key j visible to query i when j <= i
        own = (t[None, :] == t[:, None])[None] & (t[None, :, None] < first[:, None, None])  # rows before first
        mask = ((causal[None] & (km[:, None, :] != 0)) | own)[:, None]  # (B, 1, T, T)

    def attend(q, k):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                                scale=scale)

    return attend(q1, k1) - lam.to(q1.dtype) * attend(q2, k2)


_SCALES: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}


def _scale_tensor(scale: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The softmax scale as a one-element tensor, made once per (scale, dtype, device) and reused.

    A new tensor per call is a host-to-device copy per layer and step, and one inside a CUDA graph capture is an
    error; the kernels only read it, so one tensor serves every call (a model has one or two scales).
    """
    key = (float(scale), dtype, torch.device(device))
    t = _SCALES.get(key)
    if t is None:
        t = _SCALES[key] = torch.tensor([scale], dtype=dtype, device=device)
    return t


class _TritonDiffAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q1, q2, k1, k2, v, lam, scale: float, key_mask, shared_k: bool, cfg: _Cfg):
        B, HQ, T, D = q1.shape
        HK, DV = k1.shape[1], v.shape[-1]
        group = HQ // HK
        acc = _acc_dtype(q1.dtype)
        dev = q1.device
        q1, q2, k1, v = _unit_last(q1), _unit_last(q2), _unit_last(k1), _unit_last(v)
        k2 = k1 if shared_k else _unit_last(k2)

        lam_per_row = lam.dim() != 0
        lam_acc = lam.detach().to(acc).reshape(-1).contiguous()  # 1 entry, or B*Hq*T rows (b, i, t)
        scale_t = _scale_tensor(scale, acc, dev)  # a tensor: a float kernel arg would be fp32
        if key_mask is not None:
            km = key_mask.to(torch.int8).contiguous()
            # first real key per batch row (T if none): rows t < first see only themselves
            idx = torch.arange(T, device=dev, dtype=torch.int32).expand(B, T)
            first = torch.where(key_mask, idx, torch.full_like(idx, T)).amin(dim=1).to(torch.int32).contiguous()
        else:
            km = first = None

        out = torch.empty(B, HQ, T, DV, dtype=q1.dtype, device=dev)
        o2 = torch.empty(B, HQ, T, DV, dtype=acc, device=dev)
        lse1 = torch.empty(B, HQ, T, dtype=acc, device=dev)
        lse2 = torch.empty(B, HQ, T, dtype=acc, device=dev)
        dummy = lse1  # stands in for absent mask pointers (never read: HAS_MASK is a constexpr)

        def fwd(config):  # rewrites out, o2, lse1 and lse2 whole: the tuner may launch it repeatedly
            block_dv = config[4] if len(config) > 4 else DV  # a 5th entry: the value width per program
            _diff_fwd_kernel[(triton.cdiv(T, config[0]) * (DV // block_dv), HQ, B)](
                q1, q2, k1, k2, v, lam_acc, scale_t, km if km is not None else dummy,
                first if first is not None else dummy, out, o2, lse1, lse2,
                *_strides(q1), *_strides(q2), *_strides(k1), *_strides(k2), *_strides(v),
                T, HQ, group,
                D=D, DV=DV, SHARED_K=shared_k, LAM_PER_ROW=lam_per_row, HAS_MASK=km is not None,
                PRECISION=cfg.precision, BLOCK_DV=block_dv, **_launch_opts(config[:4]),
            )

        cfg.run("fwd", fwd, dev)

        ctx.save_for_backward(q1, q2, k1, v, lam_acc, scale_t, km, first, out, o2, lse1, lse2,
                              None if shared_k else k2)
        ctx.shared_k, ctx.lam_per_row, ctx.cfg, ctx.scale = shared_k, lam_per_row, cfg, scale
        ctx.lam_shape, ctx.lam_dtype = lam.shape, lam.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q1, v = ctx.saved_tensors[0], ctx.saved_tensors[3]
        kind = triton_kind(q1.device, q1.dtype, q1.shape[-1], v.shape[-1], "train")
        if not triton_kind_failed(kind):  # (another layer's backward of this kind may have failed already)
            try:
                return _TritonDiffAttention._backward(ctx, dout)
            except Exception as exc:
                if not is_triton_launch_error(exc):
                    raise
                # one warning; later training calls of this kind run sdpa from their forward (hook.use_triton)
                triton_failed(kind, exc)
        return _TritonDiffAttention._fallback_backward(ctx, dout)

    @staticmethod
    def _fallback_backward(ctx, dout):
        """The gradients recomputed in PyTorch (SDPA under autograd) from the saved inputs."""
        q1, q2, k1, v, lam_acc, _, km, first, _, _, _, _, k2 = ctx.saved_tensors
        needs = ctx.needs_input_grad
        k2 = k1 if ctx.shared_k else k2
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(True) for x in (q1, q2, k1, k2, v, lam_acc.reshape(ctx.lam_shape))]
            if ctx.shared_k:
                leaves[3] = leaves[2]
            lq1, lq2, lk1, lk2, lv, llam = leaves
            out = _torch_diff_attention(lq1, lq2, lk1, lk2, lv, llam, ctx.scale, km, first)
            want = [i for i in range(6) if needs[i] and not (ctx.shared_k and i == 3)]
            grads = torch.autograd.grad(out, [leaves[i] for i in want], dout.to(out.dtype))
        res: list[Optional[torch.Tensor]] = [None] * 6
        for i, g in zip(want, grads):
            res[i] = g.to(ctx.lam_dtype) if i == 5 else g
        return (*res, None, None, None, None)

    @staticmethod
    def _backward(ctx, dout):
        q1, q2, k1, v, lam_acc, scale_t, km, first, out, o2, lse1, lse2, k2 = ctx.saved_tensors
        shared_k, cfg = ctx.shared_k, ctx.cfg
        if shared_k:
            k2 = k1
        B, HQ, T, D = q1.shape
        HK, DV = k1.shape[1], v.shape[-1]
        group = HQ // HK
        acc = lse1.dtype
        dev = q1.device
        dout = _unit_last(dout)
        if dout.dtype != q1.dtype:
            dout = dout.to(q1.dtype)
        has_mask = km is not None
        dummy = lse1
        km_arg = km if has_mask else dummy
        first_arg = first if has_mask else dummy

        # Delta1 = rowsum(dO * O1), Delta2 = rowsum(dO * O2)
        delta1 = torch.empty(B, HQ, T, dtype=acc, device=dev)
        delta2 = torch.empty(B, HQ, T, dtype=acc, device=dev)
        pre_bm = 64 if DV <= 128 else 32
        _diff_bwd_preprocess_kernel[(triton.cdiv(T, pre_bm), HQ, B)](
            out, o2, dout, lam_acc, delta1, delta2, *_strides(dout), T, HQ,
            DV=DV, BLOCK_M=pre_bm, LAM_PER_ROW=ctx.lam_per_row,
        )

        needs = ctx.needs_input_grad
        dq1 = dq2 = dk1 = dk2 = dv = dlam = None
        common = dict(D=D, DV=DV, SHARED_K=shared_k, LAM_PER_ROW=ctx.lam_per_row, HAS_MASK=has_mask,
                      PRECISION=cfg.precision)
        strides = (*_strides(q1), *_strides(q2), *_strides(k1), *_strides(k2), *_strides(v), *_strides(dout))

        if needs[2] or needs[3] or needs[4]:
            dk1_buf = torch.empty(B, HK, T, D, dtype=q1.dtype, device=dev)
            dk2_buf = dk1_buf if shared_k else torch.empty(B, HK, T, D, dtype=q1.dtype, device=dev)
            dv_buf = torch.empty(B, HK, T, DV, dtype=q1.dtype, device=dev)

            def dkdv(config):  # rewrites dk1, dk2 and dv whole (no atomics)
                _diff_bwd_dkdv_kernel[(triton.cdiv(T, config[1]), HK, B)](
                    q1, q2, k1, k2, v, dout, lam_acc, scale_t, km_arg, first_arg, lse1, lse2, delta1, delta2,
                    dk1_buf, dk2_buf, dv_buf, *strides, T, HQ, group, **common, **_launch_opts(config),
                )

            cfg.run("bwd_dkdv", dkdv, dev)
            dk1 = dk1_buf if needs[2] else None
            # shared k: the function got the same tensor twice; its gradient (both maps) goes to k1 only
            dk2 = None if shared_k else (dk2_buf if needs[3] else None)
            dv = dv_buf if needs[4] else None
        if needs[0] or needs[1]:
            dq1_buf = torch.empty(B, HQ, T, D, dtype=q1.dtype, device=dev)
            dq2_buf = torch.empty(B, HQ, T, D, dtype=q1.dtype, device=dev)

            def dq(config):  # rewrites dq1 and dq2 whole
                _diff_bwd_dq_kernel[(triton.cdiv(T, config[0]), HQ, B)](
                    q1, q2, k1, k2, v, dout, lam_acc, scale_t, km_arg, first_arg, lse1, lse2, delta1, delta2,
                    dq1_buf, dq2_buf, *strides, T, HQ, group, **common, **_launch_opts(config),
                )

            cfg.run("bwd_dq", dq, dev)
            dq1 = dq1_buf if needs[0] else None
            dq2 = dq2_buf if needs[1] else None
        if needs[5]:
            if ctx.lam_per_row:
                dlam = (-delta2).view(B, HQ, T, 1).to(ctx.lam_dtype)
            else:
                dlam = (-delta2.sum()).to(ctx.lam_dtype).reshape(ctx.lam_shape)
        return dq1, dq2, dk1, dk2, dv, dlam, None, None, None, None


def _check_pow2_block(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 16 or value & (value - 1):
        raise ValueError(f"{name}={value!r} is not allowed; use a power of two >= 16 (e.g. 16, 32, 64, 128)")


def _validate(q1, q2, k1, k2, v, lam, scale, key_mask) -> None:
    for name, x in (("q1", q1), ("q2", q2), ("k1", k1), ("k2", k2), ("v", v), ("lam", lam)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if key_mask is not None and not isinstance(key_mask, torch.Tensor):
        raise TypeError(f"key_mask must be a torch.Tensor or None, got {type(key_mask).__name__}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a Python float (e.g. d ** -0.5), got {type(scale).__name__}")
    if not (float(scale) > 0.0 and float(scale) < float("inf")):
        raise ValueError(f"scale={scale!r} is not allowed; use a finite positive float (e.g. d ** -0.5)")
    for name, x in (("q1", q1), ("q2", q2), ("k1", k1), ("k2", k2), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, T, dim), got shape {tuple(x.shape)}")
        if x.dtype not in _ALLOWED_DTYPES:
            raise TypeError(f"{name}.dtype={x.dtype} is not allowed; use one of float16, bfloat16, float32, float64")
    if q2.shape != q1.shape:
        raise ValueError(f"q2 shape {tuple(q2.shape)} must equal q1 shape {tuple(q1.shape)} (B, Hq, T, d)")
    if k2.shape != k1.shape:
        raise ValueError(f"k2 shape {tuple(k2.shape)} must equal k1 shape {tuple(k1.shape)} (B, Hk, T, d)")
    B, HQ, T, D = q1.shape
    HK = k1.shape[1]
    if D not in ALLOWED_HEAD_DIMS:
        raise ValueError(f"head dim d={D} (q1.shape[-1]) is not allowed; use one of {ALLOWED_HEAD_DIMS}")
    if T < 1:
        raise ValueError(f"sequence length T={T} (q1.shape[2]) must be >= 1")
    if k1.shape[0] != B or k1.shape[2] != T or k1.shape[3] != D:
        raise ValueError(f"k1 shape {tuple(k1.shape)} must be (B, Hk, T, d) = ({B}, Hk, {T}, {D}) to match "
                         f"q1 {tuple(q1.shape)} (causal self-attention: keys and queries have the same T)")
    if HK < 1 or HQ % HK != 0:
        raise ValueError(f"query heads Hq={HQ} must be a multiple of kv heads Hk={HK} (Hq % Hk == 0)")
    if B > MAX_BATCH or HQ > MAX_BATCH:
        raise ValueError(f"batch B={B} and query heads Hq={HQ} (q1.shape[:2]) must each be at most {MAX_BATCH} "
                         "(CUDA grid axes 1 and 2); split the batch")
    if v.shape[:3] != k1.shape[:3]:
        raise ValueError(f"v shape {tuple(v.shape)} must be (B, Hk, T, dv) = ({B}, {HK}, {T}, dv)")
    if v.shape[3] not in (D, 2 * D):
        raise ValueError(f"value dim dv={v.shape[3]} (v.shape[-1]) is not allowed; use d={D} (DIFF V2) or "
                         f"2d={2 * D} (DIFF V1)")
    for name, x in (("q2", q2), ("k1", k1), ("k2", k2), ("v", v)):
        if x.dtype != q1.dtype:
            raise TypeError(f"{name}.dtype={x.dtype} must equal q1.dtype={q1.dtype}")
        if x.device != q1.device:
            raise ValueError(f"{name} is on {x.device} but q1 is on {q1.device}; put all inputs on one device")
    if not lam.is_floating_point():
        raise TypeError(f"lam.dtype={lam.dtype} is not allowed; use a floating dtype")
    if lam.dim() != 0 and tuple(lam.shape) != (B, HQ, T, 1):
        raise ValueError(f"lam shape {tuple(lam.shape)} is not allowed; use a 0-dim tensor (DIFF V1) or "
                         f"(B, Hq, T, 1) = ({B}, {HQ}, {T}, 1) (DIFF V2)")
    if lam.device != q1.device:
        raise ValueError(f"lam is on {lam.device} but q1 is on {q1.device}")
    if key_mask is not None:
        if key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask.dtype={key_mask.dtype} is not allowed; use torch.bool (True = real token)")
        if tuple(key_mask.shape) != (B, T):
            raise ValueError(f"key_mask shape {tuple(key_mask.shape)} must be (B, T) = ({B}, {T})")
        if key_mask.device != q1.device:
            raise ValueError(f"key_mask is on {key_mask.device} but q1 is on {q1.device}")
    if q1.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"inputs are on {q1.device}; the triton kernels need CUDA tensors "
                         "(or TRITON_INTERPRET=1 set before importing this module, for CPU tests)")


def _is_shared_k(k1: torch.Tensor, k2: torch.Tensor) -> bool:
    """DIFF V2 passes one key tensor twice. Identical views of the same memory also qualify, but only when
    no gradient is needed for them (the merged dK would otherwise be credited to k1 alone)."""
    if k1 is k2:
        return True
    same_view = (k1.data_ptr() == k2.data_ptr() and k1.shape == k2.shape and k1.stride() == k2.stride()
                 and k1.dtype == k2.dtype)
    needs_grad = torch.is_grad_enabled() and (k1.requires_grad or k2.requires_grad)
    return same_view and not needs_grad


def triton_diff_attention(q1: torch.Tensor, q2: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor,
                          v: torch.Tensor, lam: torch.Tensor, scale: float,
                          key_mask: Optional[torch.Tensor] = None, *,
                          block_m: Optional[int] = None, block_n: Optional[int] = None,
                          num_warps: Optional[int] = None, num_stages: Optional[int] = None,
                          allow_tf32: Optional[bool] = None) -> torch.Tensor:
    """Causal differential attention ``(softmax(q1 k1^T s + M) - lam softmax(q2 k2^T s + M)) @ v`` (fused).

    Args:
        q1, q2: (B, Hq, T, d) the two query maps; d in {16, 32, 64, 128}.
        k1, k2: (B, Hk, T, d) keys, Hq % Hk == 0 (query head i reads kv head i // (Hq // Hk)). DIFF V2 passes
            the same tensor twice (``k2 is k1``): each K tile is then loaded once for both maps and the one
            key gradient (both maps' contributions) is returned for it.
        v: (B, Hk, T, dv), dv = d (DIFF V2) or 2d (DIFF V1).
        lam: 0-dim (DIFF V1, gradient summed over everything) or (B, Hq, T, 1) (DIFF V2, per token and head).
            Any floating dtype; its gradient comes back in its own dtype.
        scale: softmax scale (d ** -0.5).
        key_mask: optional (B, T) bool, True for real tokens. Key j is visible to query t when j <= t and
            key_mask[b, j]; a row that would see no key sees only itself (j == t).
        block_m, block_n: query / key tile sizes (powers of two >= 16) for ALL kernels; by default each
            kernel uses its entry of ``default_config(d, dv, dtype, arch)`` for the GPU it runs on (sized to fit
            that GPU's shared memory; an override may not fit, and then the launch fails), or on sm_80/sm_90 in
            float16/bfloat16 the fastest fitting candidate measured on the first call of the shape
            (``triton_tuning``). Passing any of block_m, block_n, num_warps, num_stages turns that choice off.
        num_warps: warps per program for all kernels (default: per kernel, as for the tiles).
        num_stages: software-pipelining stages for all kernels (default: per kernel, as for the tiles). Both
            are ignored by the interpreter.
        allow_tf32: float32 inputs only: True uses TF32 tensor-core dots (faster, ~1e-3 relative error), False
            IEEE fp32; None (default) follows ``torch.backends.cuda.matmul.allow_tf32`` like PyTorch's matmuls.

    Returns:
        (B, Hq, T, dv) in the input dtype; differentiable w.r.t. q1, q2, k1, k2, v and lam.
    """
    _validate(q1, q2, k1, k2, v, lam, scale, key_mask)
    if block_m is not None:
        _check_pow2_block("block_m", block_m)
    if block_n is not None:
        _check_pow2_block("block_n", block_n)
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps={num_warps!r} is not allowed; use one of 1, 2, 4, 8, 16")
    if num_stages is not None and (not isinstance(num_stages, int) or num_stages < 1):
        raise ValueError(f"num_stages={num_stages!r} is not allowed; use an int >= 1")
    if allow_tf32 is not None and not isinstance(allow_tf32, bool):
        raise TypeError(f"allow_tf32={allow_tf32!r} is not allowed; use True, False or None")
    arch = _device_arch(q1.device)
    kernels = {
        name: (bm if block_m is None else block_m, bn if block_n is None else block_n,
               nw if num_warps is None else num_warps, ns if num_stages is None else num_stages)
        for name, (bm, bn, nw, ns) in default_config(q1.shape[-1], v.shape[-1], q1.dtype, arch).items()
    }
    shared_k = _is_shared_k(k1, k2)
    given = (block_m, block_n, num_warps, num_stages) != (None, None, None, None)
    tune = None if given else (arch, q1.dtype, q1.shape[-1], v.shape[-1], shared_k, q1.shape[2])
    cfg = _Cfg(kernels, dot_precision(q1.dtype, allow_tf32), tune)
    return _TritonDiffAttention.apply(q1, q2, k1, k2, v, lam, float(scale), key_mask, shared_k, cfg)
