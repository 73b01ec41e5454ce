"""The PyTorch paths behind the dispatcher (``dispatch.py``): eager (the softmax maps materialised: the tests' oracle
and the analysis tool), sdpa (``torch.nn.functional.scaled_dot_product_attention``, never an N x N tensor) and the
KV-cache decode step (each cached key and value read once), for plain and for differential attention.

Differential attention arrives as the 2h softmax query heads ``q`` (B, 2h, T, d), two per differential head, and
``pairing`` says which two: "interleaved" (heads 2i and 2i+1 are Q1 and Q2 of head i; both papers' layout) or
"halves" (heads i and h+i: DIFF V2's wrong-grouping ablation). The keys come in one of two layouts (``keys``):

  "paired" (DIFF V1): k (B, 2h_kv, Tk, d), K1 and K2 of KV group g at half-heads 2g and 2g+1; Q1 of head i reads
           K1 and Q2 reads K2 of group i // (h / h_kv). Interleaved pairing only.
  "shared" (DIFF V2): k (B, H_kv, Tk, d), ordinary GQA over the 2h query heads (query head j reads KV head
           j // (2h / H_kv)), so both maps of an interleaved pair read the same KV head.

Values v (B, h_kv, Tk, dv): differential head i reads value head i // (h / h_kv). lam is a 0-dim tensor (V1),
(B, h, T, 1) (V2) or None (V2's "none" ablation: A1 - A2). Every function returns (B, h, T, dv).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .base import AttentionMaps, LogitsHook

KEY_LAYOUTS = ("paired", "shared")
PAIRINGS = ("interleaved", "halves")


# ---------------------------------------------------------------------------------------------- shared pieces
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


# ---------------------------------------------------------------------------------------------- plain attention
def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
                    hook: Optional[LogitsHook], out_dtype: torch.dtype,
                    want_maps: bool) -> tuple[torch.Tensor, Optional[AttentionMaps]]:
    """softmax(q k^T * scale) v with the maps materialised; k/v already repeated to q's head count."""
    probs, logits = softmax_maps(q, k, mask, scale, hook)  # (B, H, T, Tk)
    out = torch.matmul(probs, v.to(torch.promote_types(out_dtype, torch.float32))).to(out_dtype)
    return out, AttentionMaps(attn=probs, logits=logits) if want_maps else None


# ---------------------------------------------------------------------------------------------- differential
def split_pairs(a: torch.Tensor, pairing: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 2h, ...) -> two (B, h, ...): the first and second member of each differential pair."""
    if pairing == "interleaved":
        return a[:, 0::2], a[:, 1::2]
    h = a.shape[1] // 2
    return a[:, :h], a[:, h:]  # "halves" (ablation): pairs cross GQA groups


def split_keys(k: torch.Tensor, keys: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(K1, K2): the two halves of a "paired" layout, or the one "shared" key tensor twice (the same object)."""
    return (k[:, 0::2], k[:, 1::2]) if keys == "paired" else (k, k)


def combine(a1: torch.Tensor, a2: torch.Tensor, lam: Optional[torch.Tensor]) -> torch.Tensor:
    """a1 - lam * a2 (a1 - a2 without a lambda), in a1's dtype."""
    return a1 - a2 if lam is None else a1 - lam.to(a1.dtype) * a2


def eager_diff(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: Optional[torch.Tensor],
               mask: Optional[torch.Tensor], scale: float, hook: Optional[LogitsHook], keys: str, pairing: str,
               out_dtype: torch.dtype, want_maps: bool) -> tuple[torch.Tensor, Optional[AttentionMaps]]:
    """(A1 - lam A2) V with both softmax maps materialised (in at least float32); the maps if ``want_maps``, their
    logits in the projection's order of the 2h query heads."""
    acc = torch.promote_types(out_dtype, torch.float32)
    logits: Optional[torch.Tensor] = None
    if keys == "shared":  # one softmax over the 2h query heads (standard GQA), then the pairs
        probs, logits = softmax_maps(q, repeat_kv(k, q.shape[1] // k.shape[1]), mask, scale, hook)
        a1, a2 = split_pairs(probs, pairing)  # (B, h, T, Tk) each
    else:  # Q1 reads K1, Q2 reads K2: split, then repeat
        (q1, q2), (k1, k2) = split_pairs(q, pairing), split_keys(k, keys)
        rep = q1.shape[1] // k1.shape[1]
        a1, logits1 = softmax_maps(q1, repeat_kv(k1, rep), mask, scale, hook)  # (B, h, T, Tk)
        a2, logits2 = softmax_maps(q2, repeat_kv(k2, rep), mask, scale, hook)
        if want_maps:
            logits = torch.stack((logits1, logits2), dim=2).flatten(1, 2)  # (B, 2h, T, Tk), projection order
    diff = combine(a1, a2, None if lam is None else lam.to(acc))
    if keys == "shared" and pairing == "halves":  # the pair's heads read different KV heads: each map its own V
        v1, v2 = split_pairs(repeat_kv(v, q.shape[1] // v.shape[1]).to(acc), pairing)  # (B, h, Tk, d) each
        out = combine(torch.matmul(a1, v1), torch.matmul(a2, v2), None if lam is None else lam.to(acc))
        out = out.to(out_dtype)
    else:  # both maps of a pair meet the same values: (A1 - lam A2) V
        out = torch.matmul(diff, repeat_kv(v, a1.shape[1] // v.shape[1]).to(acc)).to(out_dtype)  # (B, h, T, dv)
    if not want_maps:
        return out, None
    assert logits is not None
    return out, AttentionMaps(attn=diff, logits=logits, attn1=a1, attn2=a2,
                              lam=None if lam is None else lam.detach())


def sdpa_diff(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: Optional[torch.Tensor],
              mask: Optional[torch.Tensor], scale: float, keys: str, pairing: str) -> torch.Tensor:
    """(A1 - lam A2) V with standard fused attention, as A1 V - lam A2 V.

    "shared" keys: one call over the 2h query heads (DIFF V2: standard kernels, GQA). "paired" keys: A1 V and A2 V
    in one call too, the two maps stacked along the batch axis; fused CPU/CUDA kernels want value width == query
    width, so a 2d-wide V is split into its d-wide halves and the four products (A1 Va, A1 Vb, A2 Va, A2 Vb) are
    stacked (a d-wide V, V1's per_head layout: the two products A1 V and A2 V).
    """
    if keys == "shared":
        rep = q.shape[1] // k.shape[1]
        o = sdpa(q, repeat_kv(k, rep), repeat_kv(v, rep), mask, scale)  # (B, 2h, T, d)
        return combine(*split_pairs(o, pairing), lam)
    (q1, q2), (k1, k2) = split_pairs(q, pairing), split_keys(k, keys)
    B, d, rep = q1.shape[0], q1.shape[-1], q1.shape[1] // k1.shape[1]
    vs = v.split(d, dim=-1)  # (va, vb) of (B, hkv, Tk, d); (v,) under per_head
    n = len(vs)
    qn = torch.cat((q1,) * n + (q2,) * n, dim=0)  # (2nB, h, T, d)
    kn = repeat_kv(torch.cat((k1,) * n + (k2,) * n, dim=0), rep)  # (2nB, h, Tk, d)
    vn = repeat_kv(torch.cat(vs + vs, dim=0), rep)  # (2nB, h, Tk, d)
    if mask is not None and mask.shape[0] > 1:
        mask = mask.repeat(2 * n, 1, 1, 1)
    o = sdpa(qn, kn, vn, mask, scale).split(B, dim=0)  # 2n x (B, h, T, d)
    a1v = torch.cat(o[:n], dim=-1)  # (B, h, T, dv) = A1 V
    a2v = torch.cat(o[n:], dim=-1)  # (B, h, T, dv) = A2 V
    return combine(a1v, a2v, lam)


def decode_diff(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: Optional[torch.Tensor], mask: torch.Tensor,
                scale: float, keys: str, pairing: str) -> torch.Tensor:
    """The KV-cache decode step, reading each cached key and value once.

    "shared" keys: standard GQA over the 2h query heads (``grouped_attention``), then A1 V - lam A2 V. "paired"
    keys: half-head 2i+s of the query (i = g*rep + r) meets key half-head 2g+s, so with the queries arranged as
    (group g, half s, r) both softmax maps of every group come from one batched product with the cache viewed as
    (B, h_kv, 2, N, d); then (A1 - lam A2) V, as in the blocked kernel.
    """
    if keys == "shared":
        return combine(*split_pairs(grouped_attention(q, k, v, mask, scale), pairing), lam)
    B, _, T, d = q.shape
    hkv, N, dv = v.shape[1], k.shape[2], v.shape[-1]
    rep = q.shape[1] // 2 // hkv
    q = q.view(B, hkv, rep, 2, T, d).transpose(2, 3)  # (B, hkv, 2, rep, T, d)
    p = grouped_probs(q, k.view(B, hkv, 2, N, d), mask, scale)  # (B, hkv, 2, rep, T, N)
    diff = combine(p[:, :, 0], p[:, :, 1], lam)  # (B, hkv, rep, T, N)
    out = torch.matmul(diff.reshape(B, hkv, rep * T, N).to(v.dtype), v)  # (B, hkv, rep*T, dv)
    return out.view(B, hkv * rep, T, dv)
