"""The attention call of every variant, every backend rule, and the PyTorch math of each path, in one place.

``diff_attention`` runs differential attention (DIFF V1 and V2) and ``softmax_attention`` the baseline's; each
variant computes its projections, pairing and lambda and calls one of them. Which path runs (``diff_path``):

* ``eager`` -- the softmax maps materialised (``eager_diff``): the tests' oracle and the analysis tool; with
  ``backend="eager"``, whenever the maps are asked for (``return_maps``), and whenever a logits hook is set
  (quantised logits, paper Fig. 8).
* a fused kernel (``triton-decode``, ``triton``, ``blocked``) -- where a rule registered in ``fused.py`` (by the
  kernels package, ``kernels/hook.py``; the model imports nothing from it) says one takes the call
  (``backend="triton"`` or ``"blocked"``, named; ``auto`` only where ``kernels.hook.TRITON_AUTO_MEASURED`` lists a
  GPU measurement: none yet). The rules and the launch-
  failure fallback are there; here only the pairs are split as the kernels take them (within a GQA group:
  ``pairing="interleaved"``, and not paired keys with a lambda per token).
* ``decode`` -- any other KV-cache decode step (one new token per row): ``decode_diff``, ``grouped_attention``,
  each cached key and value read once, no copies of the cache.
* ``sdpa`` -- ``torch.nn.functional.scaled_dot_product_attention`` (``sdpa_diff``), never an N x N tensor: what
  ``auto`` (the default) runs, ``backend="sdpa"``, and every case the backend chosen does not cover. Where nothing
  else could take a call (``sdpa_direct``: no maps, no KV cache, no kernel registered for the backend on x's
  device, ``fused.may_take``), DIFF V1 and V2 call ``sdpa_diff`` themselves: a block reaches SDPA in three hops
  (the variant, ``sdpa_diff``, SDPA), asking no rule.

The baseline runs eager, decode or sdpa (the kernels are DIFF's).

Differential attention arrives as the 2h softmax query heads ``q`` (B, 2h, T, d), two per differential head, and
``pairing`` says which two: "interleaved" (heads 2i and 2i+1 are Q1 and Q2 of head i; both papers' layout) or
"halves" (heads i and h+i: DIFF V2's wrong-grouping ablation). The keys come in one of two layouts (``keys``):

  "paired" (DIFF V1): k (B, 2h_kv, Tk, d), K1 and K2 of KV group g at half-heads 2g and 2g+1; Q1 of head i reads
           K1 and Q2 reads K2 of group i // (h / h_kv). Interleaved pairing only.
  "shared" (DIFF V2): k (B, H_kv, Tk, d), ordinary GQA over the 2h query heads (query head j reads KV head
           j // (2h / H_kv)), so both maps of an interleaved pair read the same KV head.

Values v (B, h_kv, Tk, dv): differential head i reads value head i // (h / h_kv). lam is a 0-dim tensor (V1),
(B, h, T, 1) (V2) or None (V2's "none" ablation: A1 - A2). Every path returns (B, h, T, dv).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .base import Attention, AttentionMaps, LogitsHook, prefill_from_start
from .fused import KERNEL_PATHS, Kernel, fused_kernel, may_take
from .masks import MASK_KINDS, expand_heads
from .pairs import combine, pair_combine, split_keys, split_pairs

KEY_LAYOUTS = ("paired", "shared")
PAIRINGS = ("interleaved", "halves")
PATHS = ("eager", *KERNEL_PATHS, "decode", "sdpa")

Output = tuple[torch.Tensor, Optional[AttentionMaps]]


# ---------------------------------------------------------------------------------------------- the two calls
def diff_attention(attn: Attention, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   lam: Optional[torch.Tensor], mask: Optional[torch.Tensor], input_pos: Optional[torch.Tensor],
                   return_maps: bool, *, keys: str, pairing: str = "interleaved", mask_kind: str = "causal") -> Output:
    """Differential attention (A1 - lam A2) V on the path ``diff_path`` picks; returns ((B, h, T, dv), maps or None).

    attn: the calling layer (its ``backend``, ``scale``, KV cache and logits hook); x: its input (B, T, d_model),
    whose device, dtype and autograd state the rules read. q (B, 2h, T, d): the 2h softmax query heads, two per
    differential head as ``pairing`` says ("interleaved": heads 2i and 2i+1; "halves": i and h+i). k: ``keys=
    "paired"`` (DIFF V1) (B, 2h_kv, Tk, d) with K1 and K2 of group g at 2g and 2g+1, or ``"shared"`` (DIFF V2)
    (B, H_kv, Tk, d), standard GQA over the 2h query heads. v (B, h_kv, Tk, dv). lam: 0-dim (V1), (B, h, T, 1) (V2)
    or None (A1 - A2). The layouts in detail: the module docstring. mask: ``masks.py``'s convention, with one entry
    per differential head where it has a head axis > 1; mask_kind: its form (``masks.MaskKind``: only "causal" ones
    go to the fused kernels). ``attn.attn_dropout``, while training: dropout on each softmax map before the pairs
    are combined (the fused kernels have none: a PyTorch path runs).
    """
    if keys not in KEY_LAYOUTS or pairing not in PAIRINGS or (keys == "paired" and pairing != "interleaved"):
        raise ValueError(f"keys={keys!r}, pairing={pairing!r} is not allowed; keys one of {KEY_LAYOUTS}, pairing one "
                         f"of {PAIRINGS} (paired keys pair interleaved heads)")
    if mask_kind not in MASK_KINDS:
        raise ValueError(f"mask_kind={mask_kind!r} is not allowed; use one of {', '.join(MASK_KINDS)}")
    d, dv, scale = q.shape[-1], v.shape[-1], attn.scale
    drop = attn.dropout_p
    # the fused kernels take paired keys with one lambda per layer (DIFF V1) and shared keys with any lambda (DIFF V2);
    # paired keys with a lambda per token (DIFF V2's v2_keys="separate" arm) run the PyTorch paths
    per_token = lam is not None and lam.dim() > 0
    fused = pairing == "interleaved" and not (keys == "paired" and per_token) and mask_kind == "causal" and not drop
    path, kernel = diff_route(attn, x, d, dv, mask, input_pos, return_maps, fused=fused)
    if keys == "shared":  # one mask per differential head -> one per softmax query head (both maps of a pair)
        mask = expand_heads(mask, pairing)
    if path == "eager":
        return eager_diff(q, k, v, lam, mask, scale, attn.logits_hook, keys, pairing, x.dtype, return_maps, drop)
    if path == "decode":
        assert mask is not None  # a decode step under a KV cache always has one (the model builds it)
        return decode_diff(q, k, v, lam, mask, scale, keys, pairing), None
    if path == "sdpa":
        return sdpa_diff(q, k, v, lam, mask, scale, keys, pairing, drop), None
    assert kernel is not None
    if path == "triton-decode":  # the PyTorch path a kernel falls back to where its launch fails
        assert mask is not None  # a decode step under a KV cache always has one (the model builds it)
        step_mask = mask
        fallback = lambda: decode_diff(q, k, v, lam, step_mask, scale, keys, pairing)  # noqa: E731
    else:
        fallback = lambda: sdpa_diff(q, k, v, lam, mask, scale, keys, pairing)  # noqa: E731
    # the kernels take (q1, q2, k1, k2) with pair i reading key head i // (h / h_kv); k1 is k2 for shared keys
    (q1, q2), (k1, k2) = split_pairs(q, pairing), split_keys(k, keys)
    return kernel.run(x, q1, q2, k1, k2, v, lam, mask, scale, fallback), None


def softmax_attention(attn: Attention, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: Optional[torch.Tensor], return_maps: bool) -> Output:
    """Plain (GQA) softmax attention for the baseline: q (B, H, T, d), k/v (B, H_kv, Tk, d) -> (B, H, T, d).
    Eager with maps (as for DIFF), the decode step, else sdpa (the fused kernels are DIFF's). ``attn.attn_dropout``
    while training: dropout on the softmax map."""
    drop = attn.dropout_p
    if uses_eager(attn, return_maps):
        rep = q.shape[1] // k.shape[1]
        return eager_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), mask, attn.scale, attn.logits_hook, x.dtype,
                               return_maps, drop)
    if attn.kv_cache is not None and x.shape[1] == 1:
        assert mask is not None  # a decode step under a KV cache always has one (the model builds it)
        return grouped_attention(q, k, v, mask, attn.scale), None  # (B, H, 1, d), the cache read once
    rep = q.shape[1] // k.shape[1]  # the KV heads repeated (the baseline's numbers as they have been)
    k, v, mask, gqa = sdpa_in(q, repeat_kv(k, rep), repeat_kv(v, rep), mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, is_causal=mask is None,
                                          scale=attn.scale, enable_gqa=gqa), None


# ---------------------------------------------------------------------------------------------- the rules
def uses_eager(attn: Attention, return_maps: bool) -> bool:
    return attn.backend == "eager" or return_maps or attn.logits_hook is not None


def sdpa_direct(attn: Attention, x: torch.Tensor, return_maps: bool) -> bool:
    """Whether this call runs the sdpa path with nothing to ask: no maps or logits hook (eager), no KV cache (the
    decode step and the prefill's rules), and no registered kernel serving this backend in this case
    (``fused.may_take``, a table lookup on x's device, dtype, length and pass and the head sizes: ``sdpa`` anywhere,
    ``auto`` except where ``kernels/hook.py``'s measured tables list the case: ``CPU_AUTO_BLOCKED``, and on CUDA
    ``TRITON_AUTO_MEASURED``, empty today). The variants then call ``sdpa_diff`` (the baseline SDPA) themselves;
    every other call goes through ``diff_attention`` and its rules (``diff_route``)."""
    backend = attn.backend
    return (backend != "eager" and not return_maps and attn.logits_hook is None and attn.kv_cache is None
            and not may_take(backend, x, attn.head_dim, attn.value_dim))


def diff_path(attn: Attention, x: torch.Tensor, head_dim: int, value_dim: int, mask: Optional[torch.Tensor],
              input_pos: Optional[torch.Tensor], return_maps: bool, fused: bool = True) -> str:
    """Which of ``PATHS`` runs this DIFF call (the module docstring says when each does). ``fused``: whether the
    heads are paired the way the fused kernels take them (within a GQA group)."""
    return diff_route(attn, x, head_dim, value_dim, mask, input_pos, return_maps, fused)[0]


def diff_route(attn: Attention, x: torch.Tensor, head_dim: int, value_dim: int, mask: Optional[torch.Tensor],
               input_pos: Optional[torch.Tensor], return_maps: bool,
               fused: bool = True) -> tuple[str, Optional[Kernel]]:
    """``diff_path``'s answer with the kernel behind it (None on the model's own paths)."""
    if uses_eager(attn, return_maps):
        return "eager", None
    cached = attn.kv_cache is not None
    decode = cached and x.shape[1] == 1  # a KV-cache decode step: one new token per row
    own_keys = not cached or prefill_from_start(x.shape[1], input_pos)  # a prefill from 0 sees only its prompt
    kernel = fused_kernel(attn.backend, x, head_dim, value_dim, mask, decode=decode, own_keys=own_keys) \
        if fused else None
    if kernel is not None:
        return kernel.path, kernel
    return ("decode" if decode else "sdpa"), None


# ---------------------------------------------------------------------------------------------- the PyTorch math
def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hk, T, d) -> (B, Hk*n_rep, T, d): KV head g serves query heads g*n_rep .. g*n_rep + n_rep - 1.

    A copy (and a sum in the backward): the eager oracle's; ``sdpa`` reads the KV heads in place instead.
    """
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def eager_dtype(x: torch.Tensor) -> torch.dtype:
    """The eager path's accumulation dtype: float32 for half inputs, float64 stays float64 (the tests' oracle)."""
    return torch.promote_types(x.dtype, torch.float32)


def softmax_maps(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
                 hook: Optional[LogitsHook] = None, dropout: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager softmax(q k^T * scale) in at least float32. q (B, Hq, Tq, d), k (B, Hq, Tk, d) -> (probs, logits).
    mask: None (causal), bool (True: attend) or float (added to the logits); dropout: on the probabilities."""
    acc = eager_dtype(q)
    logits = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale  # (B, Hq, Tq, Tk)
    if hook is not None:
        logits = hook(logits)
    if mask is None:
        tq, tk = logits.shape[-2:]
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
    # torch.where, not masked_fill(~mask, -inf): the same values forward and backward (a masked logit is -inf, its
    # gradient 0), without the inverted mask, and about 2x faster on the CPU at the retrieval models' (16, 8, 192, 192)
    logits = logits + mask.to(acc) if mask.is_floating_point() else torch.where(mask, logits, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return (F.dropout(probs, dropout) if dropout else probs), logits


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
    s = s + m.to(s.dtype) if m.is_floating_point() else torch.where(m, s, float("-inf"))
    return torch.softmax(s, dim=-1)


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


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
         dropout: float = 0.0) -> torch.Tensor:
    """Fused attention, q (B, Hq, T, d), k/v (B, Hk, Tk, d) with Hk dividing Hq: query head j reads KV head
    j // (Hq / Hk), as ``repeat_kv`` orders them, through SDPA's own GQA (``enable_gqa``), so the KV heads are
    not copied (nor their gradients summed). On the CPU (torch 2.13, 2 threads, B=2, T=1024, 16 query heads over
    8) fwd+bwd took the same time as with the copy, with 7 kernels instead of 12 (``bench ops``). With a mask on a
    GPU the KV heads are repeated, as before: the flash kernel takes no mask, and the memory-efficient kernel's GQA
    is not in every torch this package supports (>= 2.5). A float mask is added to the logits (in q's dtype, as SDPA
    wants it); dropout: SDPA's ``dropout_p`` on the probabilities."""
    k, v, mask, gqa = sdpa_in(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None,
                                          scale=scale, enable_gqa=gqa)


def sdpa_in(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            mask: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], bool]:
    """SDPA's operands as ``sdpa`` passes them: the KV heads repeated only on a GPU with a mask, a float mask in q's
    dtype, and whether SDPA's GQA reads the KV heads (``enable_gqa``). The callers call SDPA themselves."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1 and mask is not None and q.device.type != "cpu":
        k, v = repeat_kv(k, rep), repeat_kv(v, rep)
    if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)
    return k, v, mask, k.shape[1] != q.shape[1]


# ---------------------------------------------------------------------------------------------- plain attention
def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
                    hook: Optional[LogitsHook], out_dtype: torch.dtype,
                    want_maps: bool, dropout: float = 0.0) -> tuple[torch.Tensor, Optional[AttentionMaps]]:
    """softmax(q k^T * scale) v with the maps materialised; k/v already repeated to q's head count."""
    probs, logits = softmax_maps(q, k, mask, scale, hook, dropout)  # (B, H, T, Tk)
    out = torch.matmul(probs, v.to(torch.promote_types(out_dtype, torch.float32))).to(out_dtype)
    return out, AttentionMaps(attn=probs, logits=logits) if want_maps else None


# ---------------------------------------------------------------------------------------------- differential
def eager_diff(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: Optional[torch.Tensor],
               mask: Optional[torch.Tensor], scale: float, hook: Optional[LogitsHook], keys: str, pairing: str,
               out_dtype: torch.dtype, want_maps: bool,
               dropout: float = 0.0) -> tuple[torch.Tensor, Optional[AttentionMaps]]:
    """(A1 - lam A2) V with both softmax maps materialised (in at least float32); the maps if ``want_maps``, their
    logits in the projection's order of the 2h query heads. dropout: on each softmax map (A1 and A2 apart)."""
    acc = torch.promote_types(out_dtype, torch.float32)
    logits: Optional[torch.Tensor] = None
    if keys == "shared":  # one softmax over the 2h query heads (standard GQA), then the pairs
        probs, logits = softmax_maps(q, repeat_kv(k, q.shape[1] // k.shape[1]), mask, scale, hook, dropout)
        a1, a2 = split_pairs(probs, pairing)  # (B, h, T, Tk) each
    else:  # Q1 reads K1, Q2 reads K2: split, then repeat
        (q1, q2), (k1, k2) = split_pairs(q, pairing), split_keys(k, keys)
        rep = q1.shape[1] // k1.shape[1]
        a1, logits1 = softmax_maps(q1, repeat_kv(k1, rep), mask, scale, hook, dropout)  # (B, h, T, Tk)
        a2, logits2 = softmax_maps(q2, repeat_kv(k2, rep), mask, scale, hook, dropout)
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
              mask: Optional[torch.Tensor], scale: float, keys: str, pairing: str,
              dropout: float = 0.0) -> torch.Tensor:
    """(A1 - lam A2) V with standard fused attention, as A1 V - lam A2 V. dropout: SDPA's, on each map.

    "shared" keys: one call over the 2h query heads (DIFF V2: standard kernels, GQA). "paired" keys: A1 V and A2 V
    in one call too, the two maps stacked along the batch axis; fused CPU/CUDA kernels want value width == query
    width, so a 2d-wide V is split into its d-wide halves and the four products (A1 Va, A1 Vb, A2 Va, A2 Vb) are
    stacked (a d-wide V, V1's per_head layout: the two products A1 V and A2 V). Either way the pairs are combined
    by ``pair_combine``.
    """
    if keys == "shared":  # (B, 2h, T, d), standard GQA without copying the KV heads
        ks, vs, m, gqa = sdpa_in(q, k, v, mask)
        o = F.scaled_dot_product_attention(q, ks, vs, attn_mask=m, dropout_p=dropout, is_causal=m is None,
                                           scale=scale, enable_gqa=gqa)
        return pair_combine(o, lam, pairing)
    B, h2, T, d = q.shape  # "paired" keys pair interleaved heads: Q1, Q2 of head i at 2i, 2i+1
    if dropout or (mask is not None and q.device.type == "cpu" and v.shape[-1] != d):
        # With dropout: each map dropped once for its whole value (the stacked products below would drop A1 apart
        # for each half of a 2d-wide V).
        # On the CPU with a mask (bidirectional, padding, cross-attention) the fused kernel would run all 2n products
        # in full; two calls with the whole 2d-wide V (torch's math path: each map's QK^T and softmax once) cost less:
        # ViT shape (T 197, bidirectional) 1.10x -> 1.00x timm's time eager, 1.20x -> 1.02x compiled (`bench layer`,
        # BENCHMARKS.md).
        # Causal calls without a mask keep the fused path, whose causal kernel skips the masked half.
        a = []
        for s in (0, 1):  # (B, h, T, 2d): A1 V, then A2 V
            ks, vs, m, gqa = sdpa_in(q[:, s::2], k[:, s::2], v, mask)
            a.append(F.scaled_dot_product_attention(q[:, s::2], ks, vs, attn_mask=m, dropout_p=dropout,
                                                    is_causal=m is None, scale=scale, enable_gqa=gqa))
        return combine(a[0], a[1], lam)
    hkv2, Tk = k.shape[1], k.shape[2]
    n = v.shape[-1] // d  # V's d-wide parts: (va, vb), or V itself under per_head
    # the 2n products stacked along the batch axis in the order (map s, value part j, batch b), each operand
    # copied once by a broadcast view's reshape (its backward: one sum), not by cat of slices (whose backward
    # zero-fills, copies and adds); the key heads are not repeated (``sdpa``: GQA)
    qn = q.reshape(B, h2 // 2, 2, T, d).permute(2, 0, 1, 3, 4)[:, None]  # (2, 1, B, h, T, d)
    kn = k.reshape(B, hkv2 // 2, 2, Tk, d).permute(2, 0, 1, 3, 4)[:, None]  # (2, 1, B, hkv, Tk, d)
    vn = v.reshape(B, hkv2 // 2, Tk, n, d).permute(3, 0, 1, 2, 4)[None]  # (1, n, B, hkv, Tk, d)
    qn = qn.expand(2, n, *qn.shape[2:]).reshape(2 * n * B, h2 // 2, T, d)
    kn = kn.expand(2, n, *kn.shape[2:]).reshape(2 * n * B, hkv2 // 2, Tk, d)
    vn = vn.expand(2, n, *vn.shape[2:]).reshape(2 * n * B, hkv2 // 2, Tk, d)
    if mask is not None and mask.shape[0] > 1:
        mask = mask.repeat(2 * n, 1, 1, 1)
    kn, vn, mask, gqa = sdpa_in(qn, kn, vn, mask)
    o = F.scaled_dot_product_attention(qn, kn, vn, attn_mask=mask, is_causal=mask is None, scale=scale,
                                       enable_gqa=gqa)  # (2nB, h, T, d): A1 V parts, then A2 V parts
    if lam is not None and lam.dim():  # a lambda per row (B or 1, ...): the same for every value part
        lam = lam.expand(B, *lam.shape[1:]).repeat(n, *([1] * (lam.dim() - 1)))  # (nB, ...)
    diff = pair_combine(o.unsqueeze(0), lam, "halves")  # (1, nB, h, T, d): A1 V_j - lam A2 V_j
    # (B, h, T, n*d) = [(A1 - lam A2) Va, (A1 - lam A2) Vb]; contiguous, as V1's head-wise RMSNorm wants it
    return diff.view(n, B, h2 // 2, T, d).permute(1, 2, 3, 0, 4).reshape(B, h2 // 2, T, n * d)


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
    if lam is not None and lam.dim():  # a lambda per row and head (B, h, T, 1): head i = g*rep + r
        lam = lam.reshape(lam.shape[0], hkv, rep, *lam.shape[2:])
    diff = combine(p[:, :, 0], p[:, :, 1], lam)  # (B, hkv, rep, T, N)
    out = torch.matmul(diff.reshape(B, hkv, rep * T, N).to(v.dtype), v)  # (B, hkv, rep*T, dv)
    return out.view(B, hkv * rep, T, dv)
