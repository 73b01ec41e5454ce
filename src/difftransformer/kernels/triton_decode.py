"""Differential attention for one decode step against a KV cache in Triton: split-KV ("flash decoding").

A decode step has one query row per head, so the prefill kernel's query tiles would be almost empty and its grid
(one program per query tile and head) far too small to fill a GPU. Here one program takes one KV head, all R
query heads of its GQA group (the R rows of one tile, so each cached key and value is loaded once for every head
that reads it and for both maps) and one chunk of the cached positions; it keeps both maps' online softmax over
its chunk and writes the partial (max, sum, unnormalised V product) of each. A second kernel merges the chunks
of each head and forms out = A1 V - lam A2 V. Only positions below each row's ``kv_len`` are visited (the cache
is preallocated to its maximum length; later positions are never read).

The shared checks and helpers live in ``triton_diff`` (the prefill/training kernel); like it, this module imports
``triton`` at top level (set ``TRITON_INTERPRET=1`` before importing it to run the kernels on CPU).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from . import triton_tuning as tuning
from .triton_diff import (
    _ALLOWED_DTYPES,
    _NEG_INIT,
    ALLOWED_HEAD_DIMS,
    _acc_dtype,
    _check_pow2_block,
    _device_arch,
    _is_shared_k,
    _load_kv_tile,
    _online_softmax_step,
    _scale_tensor,
    _strides,
    _unit_last,
    default_config,
    dot_precision,
)

__all__ = ["triton_diff_decode", "DECODE_TARGET_PROGRAMS", "MERGE_BLOCK_S", "MERGE_NUM_WARPS"]


@triton.jit
def _diff_decode_split_kernel(
    Q1, Q2, K1, K2, V, KM, KVLEN, M1, L1, A1, M2, L2, A2, SCALE,
    sq1_b, sq1_h, sq2_b, sq2_h,
    sk1_b, sk1_h, sk1_t, sk2_b, sk2_h, sk2_t, sv_b, sv_h, sv_t, skm_b,
    HK, R, N, CHUNK,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    SHARED_K: tl.constexpr, PRECISION: tl.constexpr,
):
    ACC: tl.constexpr = M1.dtype.element_ty
    bk = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    b = bk // HK
    hk = bk % HK
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    row_ok = offs_r < R
    h = hk * R + offs_r  # query heads of this group
    q1 = tl.load(Q1 + b * sq1_b + h[:, None] * sq1_h + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    q2 = tl.load(Q2 + b * sq2_b + h[:, None] * sq2_h + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    scale = tl.load(SCALE).to(ACC)
    k1_base = K1 + b * sk1_b + hk * sk1_h
    k2_base = K2 + b * sk2_b + hk * sk2_h
    v_base = V + b * sv_b + hk * sv_h

    m1 = tl.full([BLOCK_R], _NEG_INIT, dtype=ACC)
    m2 = tl.full([BLOCK_R], _NEG_INIT, dtype=ACC)
    l1 = tl.zeros([BLOCK_R], dtype=ACC)
    l2 = tl.zeros([BLOCK_R], dtype=ACC)
    acc1 = tl.zeros([BLOCK_R, DV], dtype=ACC)
    acc2 = tl.zeros([BLOCK_R, DV], dtype=ACC)

    start = split * CHUNK
    end = tl.minimum(start + CHUNK, tl.load(KVLEN + b))
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k1, k2, v, vis = _load_kv_tile(k1_base, k2_base, v_base, sk1_t, sk2_t, sv_t, offs_n, offs_d, offs_dv, end, KM,
                                       skm_b, b, SHARED_K, True)

        m1, l1, acc1 = _online_softmax_step(q1, k1, v, vis[None, :], m1, l1, acc1, scale, ACC, PRECISION)
        m2, l2, acc2 = _online_softmax_step(q2, k2, v, vis[None, :], m2, l2, acc2, scale, ACC, PRECISION)

    # partials of row (b, h) at [(b * HQ + h) * n_split + split]; an empty chunk leaves (-1e30, 0, 0)
    row = (b * HK * R + h) * n_split + split
    tl.store(M1 + row, m1, mask=row_ok)
    tl.store(L1 + row, l1, mask=row_ok)
    tl.store(M2 + row, m2, mask=row_ok)
    tl.store(L2 + row, l2, mask=row_ok)
    tl.store(A1 + row[:, None] * DV + offs_dv[None, :], acc1, mask=row_ok[:, None])
    tl.store(A2 + row[:, None] * DV + offs_dv[None, :], acc2, mask=row_ok[:, None])


@triton.jit
def _diff_decode_merge_kernel(
    M1, L1, A1, M2, L2, A2, LAM, OUT,
    S, so_b, so_h, HQ,
    DV: tl.constexpr, BLOCK_S: tl.constexpr, LAM_PER_ROW: tl.constexpr,
):
    """out[b, h] = sum_s w1_s A1_s / sum_s w1_s L1_s - lam * (the same for map 2), w_s = exp(m_s - max m).

    Two passes over the S chunks' partials, BLOCK_S at a time (any S, a bounded tile in registers): the maxima,
    then the weighted sums."""
    ACC: tl.constexpr = M1.dtype.element_ty
    bh = tl.program_id(0).to(tl.int64)
    offs_dv = tl.arange(0, DV)
    mx1 = tl.full([BLOCK_S], _NEG_INIT, dtype=ACC)
    mx2 = tl.full([BLOCK_S], _NEG_INIT, dtype=ACC)
    for s0 in range(0, S, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        ok = offs_s < S
        mx1 = tl.maximum(mx1, tl.load(M1 + bh * S + offs_s, mask=ok, other=_NEG_INIT))
        mx2 = tl.maximum(mx2, tl.load(M2 + bh * S + offs_s, mask=ok, other=_NEG_INIT))
    top1 = tl.max(mx1, 0)
    top2 = tl.max(mx2, 0)
    l1 = tl.zeros([BLOCK_S], dtype=ACC)
    l2 = tl.zeros([BLOCK_S], dtype=ACC)
    a1 = tl.zeros([DV], dtype=ACC)
    a2 = tl.zeros([DV], dtype=ACC)
    for s0 in range(0, S, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        ok = offs_s < S
        base = bh * S + offs_s
        w1 = tl.exp(tl.load(M1 + base, mask=ok, other=_NEG_INIT) - top1)
        w2 = tl.exp(tl.load(M2 + base, mask=ok, other=_NEG_INIT) - top2)
        l1 += w1 * tl.load(L1 + base, mask=ok, other=0.0)
        l2 += w2 * tl.load(L2 + base, mask=ok, other=0.0)
        a1 += tl.sum(w1[:, None] * tl.load(A1 + base[:, None] * DV + offs_dv[None, :], mask=ok[:, None], other=0.0), 0)
        a2 += tl.sum(w2[:, None] * tl.load(A2 + base[:, None] * DV + offs_dv[None, :], mask=ok[:, None], other=0.0), 0)
    l1s = tl.sum(l1, 0)
    l2s = tl.sum(l2, 0)
    l1s = tl.where(l1s > 0, l1s, 1.0)  # a row that sees no key (not made by the model) gives 0, not NaN
    l2s = tl.where(l2s > 0, l2s, 1.0)
    if LAM_PER_ROW:
        lam = tl.load(LAM + bh).to(ACC)
    else:
        lam = tl.load(LAM).to(ACC)
    out = a1 / l1s - lam * (a2 / l2s)
    b = bh // HQ
    h = bh % HQ
    tl.store(OUT + b * so_b + h * so_h + offs_dv, out.to(OUT.dtype.element_ty))


DECODE_TARGET_PROGRAMS = 256  # splits are chosen so that B * Hk * splits reaches about this many programs
# The merge reads BLOCK_S chunks' partials (BLOCK_S x dv floats per map) at a time with 4 warps: at dv = 256, 16
# values per thread and map, no spills (a single 1-warp pass over up to 256 chunks spilled kilobytes per thread).
MERGE_BLOCK_S = 16
MERGE_NUM_WARPS = 4


def _decode_splits(n_keys: int, programs: int, block_n: int, num_splits: Optional[int]) -> tuple[int, int]:
    """(chunk, splits): chunk a multiple of block_n, splits = ceil(n_keys / chunk). Static for a given cache size
    and batch, so a CUDA graph captures one launch shape."""
    tiles = -(-n_keys // block_n)
    want = num_splits if num_splits is not None else max(1, -(-DECODE_TARGET_PROGRAMS // programs))
    want = max(1, min(want, tiles))
    chunk = -(-tiles // want) * block_n
    return chunk, -(-n_keys // chunk)


def triton_diff_decode(q1: torch.Tensor, q2: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor, v: torch.Tensor,
                       lam: torch.Tensor, scale: float, key_mask: torch.Tensor, *,
                       block_n: Optional[int] = None, num_splits: Optional[int] = None,
                       num_warps: Optional[int] = None, num_stages: Optional[int] = None,
                       allow_tf32: Optional[bool] = None) -> torch.Tensor:
    """One decode step of differential attention against a KV cache (inference only, no gradients):
    ``(softmax(q1 k1^T s + M) - lam softmax(q2 k2^T s + M)) @ v`` for a single query position.

    Args:
        q1, q2: (B, Hq, 1, d) the new token's two queries; d in {16, 32, 64, 128}.
        k1, k2: (B, Hk, N, d) the cached keys (views of the cache are fine; the last dim must be contiguous);
            DIFF V2 passes one tensor twice and each key is then loaded once for both maps.
        v: (B, Hk, N, dv), dv = d (DIFF V2) or 2d (DIFF V1).
        lam: 0-dim (DIFF V1) or (B, Hq, 1, 1) (DIFF V2).
        scale: softmax scale (d ** -0.5).
        key_mask: (B, N) bool, True where the query may attend (the cached positions up to the new one, padding
            excluded). Positions after a row's last True are not read at all.
        block_n: keys per tile (a power of two >= 16), num_warps, num_stages: default ``default_config(d, dv,
            dtype, arch)["decode"]`` for the GPU it runs on (sized to its shared memory; warps and stages are
            ignored by the interpreter), or on sm_80/sm_90 in float16/bfloat16 the fastest fitting candidate
            measured on the first step of a cache length (``triton_tuning``; passing any of the three turns that
            off). num_splits: chunks of the cached length (default: enough for about 256 programs).
        allow_tf32: float32 only: None (default) follows ``torch.backends.cuda.matmul.allow_tf32``.

    Returns:
        (B, Hq, 1, dv) in the input dtype.
    """
    for name, x in (("q1", q1), ("q2", q2), ("k1", k1), ("k2", k2), ("v", v), ("lam", lam), ("key_mask", key_mask)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q1, q2, k1, k2, v, lam)):
        raise ValueError("triton_diff_decode is inference-only: call it under torch.no_grad() (it has no backward)")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0.0 < float(scale) < float("inf"):
        raise ValueError(f"scale={scale!r} is not allowed; use a finite positive float (e.g. d ** -0.5)")
    for name, x in (("q1", q1), ("q2", q2), ("k1", k1), ("k2", k2), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(x.shape)}")
        if x.dtype not in _ALLOWED_DTYPES or x.dtype != q1.dtype:
            raise TypeError(f"{name}.dtype={x.dtype} is not allowed; use q1's dtype, one of float16, bfloat16, "
                            "float32, float64")
        if x.device != q1.device:
            raise ValueError(f"{name} is on {x.device} but q1 is on {q1.device}; put all inputs on one device")
    B, HQ, T, D = q1.shape
    HK, N = k1.shape[1], k1.shape[2]
    if T != 1 or q2.shape != q1.shape:
        raise ValueError(f"q1 and q2 must both be (B, Hq, 1, d) (one new token), got {tuple(q1.shape)} and "
                         f"{tuple(q2.shape)}")
    if D not in ALLOWED_HEAD_DIMS:
        raise ValueError(f"head dim d={D} (q1.shape[-1]) is not allowed; use one of {ALLOWED_HEAD_DIMS}")
    if k1.shape[0] != B or k1.shape[3] != D or k2.shape != k1.shape or HK < 1 or HQ % HK:
        raise ValueError(f"k1 and k2 must be (B, Hk, N, d) with Hq % Hk == 0, got {tuple(k1.shape)} and "
                         f"{tuple(k2.shape)} for q1 {tuple(q1.shape)}")
    if v.shape[:3] != k1.shape[:3] or v.shape[3] not in (D, 2 * D):
        raise ValueError(f"v shape {tuple(v.shape)} must be (B, Hk, N, d or 2d) = ({B}, {HK}, {N}, {D} or {2 * D})")
    if lam.dim() != 0 and tuple(lam.shape) != (B, HQ, 1, 1):
        raise ValueError(f"lam shape {tuple(lam.shape)} is not allowed; use a 0-dim tensor (DIFF V1) or "
                         f"(B, Hq, 1, 1) = ({B}, {HQ}, 1, 1) (DIFF V2)")
    if key_mask.dtype != torch.bool or tuple(key_mask.shape) != (B, N):
        raise ValueError(f"key_mask must be a (B, N) = ({B}, {N}) bool tensor, got {tuple(key_mask.shape)} "
                         f"{key_mask.dtype}")
    if q1.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"inputs are on {q1.device}; the triton kernels need CUDA tensors "
                         "(or TRITON_INTERPRET=1 set before importing this module, for CPU tests)")
    arch = _device_arch(q1.device)
    given = (block_n, num_warps, num_stages) != (None, None, None)
    default = default_config(D, v.shape[-1], q1.dtype, arch)["decode"]
    if block_n is not None:
        _check_pow2_block("block_n", block_n)
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps={num_warps!r} is not allowed; use one of 1, 2, 4, 8, 16")
    if num_stages is not None and (isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1):
        raise ValueError(f"num_stages={num_stages!r} is not allowed; use an int >= 1")
    if allow_tf32 is not None and not isinstance(allow_tf32, bool):
        raise TypeError(f"allow_tf32={allow_tf32!r} is not allowed; use True, False or None")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits={num_splits!r} is not allowed; use a positive int or None")

    dev, acc = q1.device, _acc_dtype(q1.dtype)
    R, DV = HQ // HK, v.shape[-1]
    q1, q2, k1, v = _unit_last(q1), _unit_last(q2), _unit_last(k1), _unit_last(v)
    shared_k = _is_shared_k(k1, k2)
    k2 = k1 if shared_k else _unit_last(k2)
    km = key_mask.to(torch.int8)
    pos = torch.arange(1, N + 1, device=dev, dtype=torch.int32)
    kv_len = (km.to(torch.int32) * pos).amax(dim=1).to(torch.int32).contiguous()  # last visible position + 1
    precision = dot_precision(q1.dtype, allow_tf32)
    out = torch.empty(B, HQ, 1, DV, dtype=q1.dtype, device=dev)
    lam_acc = lam.to(acc).reshape(-1).contiguous()
    scale_t = _scale_tensor(scale, acc, dev)

    def step(config) -> None:  # split and merge for one tile; the partials are its own, out is rewritten whole
        _, tile_n, warps, stages = config
        chunk, splits = _decode_splits(N, B * HK, tile_n, num_splits)
        m1 = torch.empty(B * HQ * splits, dtype=acc, device=dev)
        l1, m2, l2 = torch.empty_like(m1), torch.empty_like(m1), torch.empty_like(m1)
        a1 = torch.empty(B * HQ * splits, DV, dtype=acc, device=dev)
        a2 = torch.empty_like(a1)
        _diff_decode_split_kernel[(B * HK, splits)](
            q1, q2, k1, k2, v, km, kv_len, m1, l1, a1, m2, l2, a2, scale_t,
            q1.stride(0), q1.stride(1), q2.stride(0), q2.stride(1),
            *_strides(k1), *_strides(k2), *_strides(v), km.stride(0),
            HK, R, N, chunk,
            D=D, DV=DV, BLOCK_R=max(16, triton.next_power_of_2(R)), BLOCK_N=tile_n, SHARED_K=shared_k,
            PRECISION=precision, num_warps=warps, num_stages=stages,
        )
        _diff_decode_merge_kernel[(B * HQ,)](
            m1, l1, a1, m2, l2, a2, lam_acc, out, splits, out.stride(0), out.stride(1), HQ,
            DV=DV, BLOCK_S=MERGE_BLOCK_S, LAM_PER_ROW=lam.dim() != 0, num_warps=MERGE_NUM_WARPS,
        )

    if given:
        _, cfg_n, cfg_warps, cfg_stages = default
        step((0, cfg_n if block_n is None else block_n, cfg_warps if num_warps is None else num_warps,
              cfg_stages if num_stages is None else num_stages))
        return out
    # the tuner's choice among the fitting candidates for this GPU, cache length bucket and form (the default first)
    options = tuning.candidates(arch, q1.dtype, D, DV, shared_k, "decode", default)
    key = (arch, q1.dtype, D, DV, tuning.variant_of(D, DV, shared_k), "decode", tuning.seq_bucket(N))
    tuning.tuned_launch(key, options, step, dev)
    return out
