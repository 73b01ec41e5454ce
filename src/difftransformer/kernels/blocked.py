"""Row-blocked differential attention: an exact, pure-PyTorch kernel with a hand-written backward.

Differential attention (Ye et al., "Differential Transformer", arXiv 2410.05258, eq. 1; DIFF V2 uses the
same form with a per-token, per-head lambda)::

    out = (softmax(q1 k1^T * s + causal) - lam * softmax(q2 k2^T * s + causal)) @ v

Two fused SDPA calls would multiply both maps by ``v`` (A1 v and A2 v) and combine afterwards. Here the
query rows are processed in blocks: a block of rows [i0, i1) only sees keys [0, i1) (causal), so it holds
*complete* softmax rows and needs no online softmax. Each block forms ``D = P1 - lam * P2`` first and
multiplies by ``v`` once, which saves a whole AV product (forward) and a whole dV/dD product pair's worth
of work in the backward. Peak extra memory is O(B * Hq * block_size * T); no T x T tensor is ever built.

The backward recomputes each block's maps from the saved inputs (nothing of size T^2 is kept) and applies
the analytic gradients::

    dD  = dO v^T                       dv  += D^T dO
    dlam = -rowsum(dD * P2)            (summed to lam's shape)
    dS1 = P1 * (dD - rowsum(dD * P1))  dS2 = -lam * P2 * (dD - rowsum(dD * P2))
    dq  = dS k * s                     dk  += dS^T q * s

Layout: grouped-query attention is handled without repeating k/v. Query head ``i`` reads kv head
``i // r`` (r = Hq / Hk); the r query heads of one kv head are laid out as extra *rows* of one matrix
(rows ordered (t, head)), so a single batched matmul over the B * Hk kv heads serves all of them.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

__all__ = ["blocked_diff_attention", "DEFAULT_BLOCK_SIZE"]

# Rows of queries per block. Measured on a 2-core AVX-512 CPU (fp32, d=64, T=512..4096): small blocks
# keep the per-block maps in cache, which makes the softmax / elementwise passes several times cheaper,
# while the matmuls are still large enough (rows = block * r) to run near peak. See the module tests.
DEFAULT_BLOCK_SIZE = 64


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax / gradient arithmetic precision: float32 for 16-bit inputs, else the input dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _acc_bmm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b (batched), accumulating in acc's dtype (which may be wider than a/b's)."""
    if a.dtype == acc.dtype:
        acc.baddbmm_(a, b)
    else:
        acc.add_(torch.bmm(a, b))


def _group_queries(q1: torch.Tensor, q2: torch.Tensor, hk: int, scale: float) -> torch.Tensor:
    """(B, Hq, T, d) x2 -> (2, B*Hk, T, r, d) contiguous, pre-multiplied by ``scale``.

    With rows ordered (t, head) inside each kv group, a row block [i0, i1) is a contiguous slab that views
    as (2, B*Hk, (i1-i0)*r, d) with no copy.
    """
    b, hq, t, d = q1.shape
    q = torch.stack((q1, q2))  # (2, B, Hq, T, d), a fresh tensor
    q = q.view(2, b * hk, hq // hk, t, d).transpose(2, 3).contiguous()  # (2, G, T, r, d); no copy when r == 1
    return q.mul_(scale)  # in place: one query-sized buffer instead of two


def _group_rows(x: torch.Tensor, hk: int) -> torch.Tensor:
    """(B, Hq, T, c) -> (B*Hk, T, r, c) contiguous: the per-row layout of _group_queries."""
    b, hq, t, c = x.shape
    return x.reshape(b * hk, hq // hk, t, c).transpose(1, 2).contiguous()


def _ungroup_rows(x: torch.Tensor, b: int, hk: int) -> torch.Tensor:
    """(B*Hk, T, r, c) -> (B, Hq, T, c): inverse of _group_rows."""
    _, t, r, c = x.shape
    return x.transpose(1, 2).reshape(b, hk * r, t, c)


class _Workspace:
    """Buffers reused by every block: allocating them per block costs page faults on CPU (~4x slower ops)."""

    def __init__(self, maps: tuple[int, ...], g: int, rows: int, t: int, dtype: torch.dtype, device: torch.device):
        self.g, self.rows = g, rows
        self.flat = [torch.empty(n * g * rows * t, dtype=dtype, device=device) for n in maps]

    def get(self, i: int, n: int, rows: int, m: int) -> torch.Tensor:
        """Buffer i viewed as a contiguous (n, G, rows, m) tensor (n = 2 for the two maps, else 1)."""
        return self.flat[i][: n * self.g * rows * m].view(n, self.g, rows, m)


class _Problem:
    """Inputs re-laid out for the block loop, shared by forward and backward."""

    def __init__(self, q1, q2, k1, k2, v, lam, scale: float, block_size: int):
        b, hq, t, d = q1.shape
        hk = k1.shape[1]
        self.b, self.hq, self.hk, self.t, self.d, self.dv = b, hq, hk, t, d, v.shape[-1]
        self.r, self.g = hq // hk, b * hk
        self.dtype, self.acc = q1.dtype, _acc_dtype(q1.dtype)
        self.scale, self.block_size = scale, block_size
        self.shared_k = k1 is k2
        self.q = _group_queries(q1, q2, hk, scale)  # (2, G, T, r, d), scaled
        # Keys per map, (G, T, d); the same tensor twice when k1 is k2 (DIFF V2).
        k1g = k1.reshape(self.g, t, d)
        self.k = (k1g, k1g) if self.shared_k else (k1g, k2.reshape(self.g, t, d))
        self.v = v.reshape(self.g, t, self.dv)  # (G, T, dv)
        lam = lam.to(self.acc)
        if lam.numel() == 1:
            self.neg_lam_rows = None  # scalar lambda: used as a 0-dim tensor, no per-row layout
            self.neg_lam = -lam.reshape(())
        else:
            lam_full = lam.expand(b, hq, t, 1)
            self.neg_lam_rows = -_group_rows(lam_full, hk).view(self.g, t * self.r)  # (G, T*r), rows (t, head)
            self.neg_lam = None
        # Additive causal bias for the diagonal (block x block) part of each block: -inf above the diagonal.
        n = min(block_size, t)
        self.tri = torch.full((n, n), float("-inf"), dtype=self.acc, device=q1.device).triu_(1)

    def blocks(self):
        for i0 in range(0, self.t, self.block_size):
            yield i0, min(i0 + self.block_size, self.t)

    def neg_lam_block(self, i0: int, i1: int) -> torch.Tensor:
        """-lam for the rows of block [i0, i1): a 0-dim tensor or (G, (i1-i0)*r, 1)."""
        if self.neg_lam_rows is None:
            return self.neg_lam
        return self.neg_lam_rows[:, i0 * self.r: i1 * self.r].unsqueeze(-1)

    def probs(self, ws: _Workspace, i0: int, i1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Both maps' softmax probabilities for query rows [i0, i1) and keys [0, i1).

        Returns (P, Qb): P (2, G, rows, i1) in the accumulation dtype (rows = (i1-i0)*r, ordered (t, head)),
        and the scaled query block Qb (2, G, rows, d).
        """
        n, m = i1 - i0, i1
        rows = n * self.r
        qb = self.q[:, :, i0:i1].view(2, self.g, rows, self.d)  # (2, G, n, r, d) -> (2, G, rows, d), no copy
        same = self.dtype == self.acc
        s = ws.get(0, 2, rows, m) if same else torch.empty(2, self.g, rows, m, dtype=self.dtype, device=qb.device)
        for j in range(2):
            torch.bmm(qb[j], self.k[j][:, :m].transpose(1, 2), out=s[j])  # (G, rows, m) logits, s already in q
        # Causal mask: only the last n key columns (the diagonal block) can be in the future of a row.
        diag = s.view(2, self.g, n, self.r, m)[..., i0:i1]  # (2, G, n, r, n)
        diag.add_(self.tri[:n, :n].unsqueeze(1).to(s.dtype))  # bias (n, 1, n) broadcast over heads
        if same:
            # Softmax in place in the workspace (aliasing is safe: the kernel works row by row).
            return torch.ops.aten._softmax.out(s, -1, False, out=s), qb
        return torch.softmax(s, dim=-1, dtype=self.acc), qb


class _BlockedDiffAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q1, q2, k1, k2, v, lam, scale: float, block_size: int):
        if k2 is None:  # DIFF V2's shared keys come in once: torch.compile refuses one tensor in two slots
            k2 = k1
        pb = _Problem(q1, q2, k1, k2, v, lam, scale, block_size)
        rows = min(block_size, pb.t) * pb.r
        ws = _Workspace((2,), pb.g, rows, pb.t, pb.acc, q1.device)
        out = torch.empty(pb.g, pb.t, pb.r, pb.dv, dtype=pb.dtype, device=q1.device)  # rows (t, head)
        for i0, i1 in pb.blocks():
            p, _ = pb.probs(ws, i0, i1)
            dmap = p[0].addcmul_(p[1], pb.neg_lam_block(i0, i1))  # D = P1 - lam * P2, in place over P1
            ob = torch.bmm(dmap.to(pb.dtype), pb.v[:, :i1])  # (G, rows, dv): the single AV product
            out[:, i0:i1].copy_(ob.view(pb.g, i1 - i0, pb.r, pb.dv))
        ctx.save_for_backward(q1, q2, k1, None if k1 is k2 else k2, v, lam)
        ctx.scale, ctx.block_size, ctx.shared_k = scale, block_size, k1 is k2
        return _ungroup_rows(out, pb.b, pb.hk)  # (B, Hq, T, dv)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q1, q2, k1, k2, v, lam = ctx.saved_tensors
        if ctx.shared_k:
            k2 = k1  # saved once; keep the identity the layout relies on
        need_q1, need_q2, need_k1, need_k2, need_v, need_lam = ctx.needs_input_grad[:6]
        need_q, need_k = need_q1 or need_q2, need_k1 or need_k2
        pb = _Problem(q1, q2, k1, k2, v, lam, ctx.scale, ctx.block_size)
        g, t, r, d, dv, acc = pb.g, pb.t, pb.r, pb.d, pb.dv, pb.acc
        rows = min(pb.block_size, t) * r
        dev = q1.device
        ws = _Workspace((2, 1, 1), g, rows, t, acc, dev)  # P (two maps), D, dD
        do = _group_rows(grad_out, pb.hk).to(pb.dtype)  # (G, T, r, dv), rows (t, head)

        dq = torch.zeros(2, g, t, r, d, dtype=acc, device=dev) if need_q else None
        n_k = 1 if pb.shared_k else 2  # shared keys: both maps accumulate into one gradient
        dk = torch.zeros(n_k, g, t, d, dtype=acc, device=dev) if need_k else None
        dvg = torch.zeros(g, t, dv, dtype=acc, device=dev) if need_v else None
        dlam_rows = torch.zeros(g, t * r, dtype=acc, device=dev) if need_lam else None  # (G, T*r)

        for i0, i1 in pb.blocks():
            n, m = i1 - i0, i1
            nr = n * r
            p, qb = pb.probs(ws, i0, i1)  # (2, G, nr, m), (2, G, nr, d)
            neg_lam = pb.neg_lam_block(i0, i1)
            dob = do[:, i0:i1].view(g, nr, dv)  # (G, n, r, dv) -> (G, nr, dv)
            vm = pb.v[:, :m]  # (G, m, dv)
            dd = ws.get(2, 1, nr, m)[0]
            if pb.dtype == acc:
                torch.bmm(dob, vm.transpose(1, 2), out=dd)  # dD = dO v^T, (G, nr, m)
            else:
                dd.copy_(torch.bmm(dob, vm.transpose(1, 2)))
            if dvg is not None:  # need_v
                dmap = torch.addcmul(p[0], p[1], neg_lam, out=ws.get(1, 1, nr, m)[0])  # D = P1 - lam * P2
                _acc_bmm(dvg[:, :m], dmap.transpose(1, 2).to(pb.dtype), dob)  # dv += D^T dO
            if dlam_rows is not None:  # need_lam
                # dlam = -rowsum(dD * P2); the D buffer is free again and serves as scratch.
                prod = torch.mul(dd, p[1], out=ws.get(1, 1, nr, m)[0])
                torch.sum(prod, dim=-1, out=dlam_rows[:, i0 * r: i1 * r])
            if not (need_q or need_k):
                continue
            # Softmax backward of each map with upstream dD, in place over P: dS' = P * (dD - rowsum(dD * P)).
            # The true dS2 is -lam * dS2'; that per-row factor is applied to the small operands below.
            for j in range(2):
                torch.ops.aten._softmax_backward_data.out(dd, p[j], -1, acc, grad_input=p[j])
            ds = p.to(pb.dtype)  # (2, G, nr, m)
            if dq is not None:  # need_q
                dqb = dq[:, :, i0:i1].view(2, g, nr, d)  # rows of this block, no copy
                for j in range(2):
                    dqb[j].copy_(torch.bmm(ds[j], pb.k[j][:, :m]))  # dq = dS k (times s at the end)
                dqb[1].mul_(neg_lam)
            if dk is not None:  # need_k
                q2_lam = (qb[1] * neg_lam.to(pb.dtype))  # (G, nr, d): -lam folded into q2's rows
                _acc_bmm(dk[0, :, :m], ds[0].transpose(1, 2), qb[0])  # dk1 += dS1^T q1 s (q is pre-scaled)
                _acc_bmm(dk[n_k - 1, :, :m], ds[1].transpose(1, 2), q2_lam)  # dk2 += dS2^T q2 s

        b, hk = pb.b, pb.hk
        grads: list[Optional[torch.Tensor]] = [None] * 6
        if dq is not None:  # need_q
            dq.mul_(pb.scale)
            grads[0] = _ungroup_rows(dq[0], b, hk).to(q1.dtype) if need_q1 else None
            grads[1] = _ungroup_rows(dq[1], b, hk).to(q2.dtype) if need_q2 else None
        if dk is not None:  # need_k
            grads[2] = dk[0].view(b, hk, t, d).to(k1.dtype)
            # Shared keys came in one slot; the sum of both maps' contributions is in dk[0].
            grads[3] = None if pb.shared_k else dk[1].view(b, hk, t, d).to(k2.dtype)
        if dvg is not None:  # need_v
            grads[4] = dvg.view(b, hk, t, dv).to(v.dtype)
        if dlam_rows is not None:  # need_lam
            dlam = -_ungroup_rows(dlam_rows.view(g, t, r, 1), b, hk)  # (B, Hq, T, 1)
            grads[5] = dlam.sum_to_size(lam.shape).to(lam.dtype)
        return (*grads, None, None)


def _check_inputs(q1, q2, k1, k2, v, lam, block_size) -> None:
    for name, x in (("q1", q1), ("q2", q2), ("k1", k1), ("k2", k2), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor, got {getattr(x, 'shape', type(x))}")
    b, hq, t, d = q1.shape
    hk = k1.shape[1]
    if q2.shape != q1.shape:
        raise ValueError(f"q2 must have q1's shape (B, Hq, T, d) = {tuple(q1.shape)}, got {tuple(q2.shape)}")
    if hk == 0 or hq % hk:
        raise ValueError(f"k1 must have shape (B, Hk, T, d) with Hq % Hk == 0 (Hq={hq}), got {tuple(k1.shape)}")
    if k1.shape != (b, hk, t, d):
        raise ValueError(f"k1 must have shape (B, Hk, T, d) = {(b, hk, t, d)}, got {tuple(k1.shape)}")
    if k2.shape != k1.shape:
        raise ValueError(f"k2 must have k1's shape (B, Hk, T, d) = {(b, hk, t, d)}, got {tuple(k2.shape)}")
    if v.shape[:3] != (b, hk, t):
        raise ValueError(f"v must have shape (B, Hk, T, dv) = {(b, hk, t)} + (dv,), got {tuple(v.shape)}")
    if not isinstance(lam, torch.Tensor):
        raise ValueError(f"lam must be a tensor broadcastable to (B, Hq, T, 1) = {(b, hq, t, 1)}, got {type(lam)}")
    try:
        ok = torch.broadcast_shapes(lam.shape, (b, hq, t, 1)) == (b, hq, t, 1)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"lam must be broadcastable to (B, Hq, T, 1) = {(b, hq, t, 1)}, got {tuple(lam.shape)}")
    dtypes = {x.dtype for x in (q1, q2, k1, k2, v)}
    if len(dtypes) != 1 or not q1.dtype.is_floating_point:
        raise ValueError(f"q1, q2, k1, k2, v must share one floating dtype, got {sorted(map(str, dtypes))}")
    if not lam.dtype.is_floating_point:
        raise ValueError(f"lam must be a floating-point tensor, got {lam.dtype}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")


def blocked_diff_attention(q1: torch.Tensor, q2: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor,
                           v: torch.Tensor, lam: torch.Tensor, *, scale: Optional[float] = None,
                           block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """Causal differential attention, eq. (1) of arXiv 2410.05258, computed block by block.

    ``(softmax(q1 k1^T * scale + causal) - lam * softmax(q2 k2^T * scale + causal)) @ v``

    Args:
        q1, q2: (B, Hq, T, d) queries of the two maps.
        k1, k2: (B, Hk, T, d) keys, Hq % Hk == 0 (query head i reads kv head i // (Hq // Hk)). They may be
            the same tensor (DIFF V2); its gradient is then the sum of both maps' contributions.
        v: (B, Hk, T, dv) values; dv may differ from d (DIFF V1: dv = 2d).
        lam: broadcastable to (B, Hq, T, 1): a 0-dim scalar (DIFF V1) or per token and head (DIFF V2).
            Its gradient comes back in its own shape and dtype.
        scale: logit scale, default 1/sqrt(d).
        block_size: query rows per block; memory is O(B * Hq * block_size * T).

    Returns:
        (B, Hq, T, dv) in the inputs' dtype. Softmax and gradient arithmetic run in float32 for 16-bit
        inputs (matmuls in the input dtype).
    """
    _check_inputs(q1, q2, k1, k2, v, lam, block_size)
    if scale is None:
        scale = 1.0 / math.sqrt(q1.shape[-1])
    return _BlockedDiffAttention.apply(q1, q2, k1, None if k2 is k1 else k2, v, lam, float(scale), block_size)
