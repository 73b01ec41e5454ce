"""A differential head's two members: how the 2h softmax heads split into pairs (``split_pairs``) and the keys into
K1 and K2 (``split_keys``), how a pair combines (``combine``: a1 - lambda a2), and ``pair_combine``, the same on
SDPA's output in fewer kernels forward and backward (``PairCombine``). ``dispatch.py``'s paths use them; so do the
kernels' callers and the tests."""

from __future__ import annotations

from typing import Optional

import torch


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


class PairCombine(torch.autograd.Function):
    """``combine(*split_pairs(o, pairing), lam)`` as one kernel forward and one gradient tensor backward.

    Through autograd the slices of ``split_pairs`` cost two zero-filled gradients of o's size, two strided copies
    into them and their sum, besides the combine's own mul and sub and their backward (9 kernels backward, 2
    forward). Here: forward ``addcmul`` (a1 + (-1) lam a2, one rounding where mul and sub round twice in bf16);
    backward, o's gradient written once (g and -lam g joined into the pairs, in SDPA's layout) and lam's as the
    sum of -g a2 over what lam broadcasts (6 kernels, two of them on lam's small size).
    """

    @staticmethod
    def forward(ctx, o: torch.Tensor, lam: Optional[torch.Tensor], pairing: str) -> torch.Tensor:
        a1, a2 = split_pairs(o, pairing)
        ctx.pairing = pairing
        ctx.save_for_backward(o, lam)  # o: SDPA keeps its output for its own backward anyway
        return torch.sub(a1, a2) if lam is None else torch.addcmul(a1, lam, a2, value=-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor):
        o, lam = ctx.saved_tensors  # (a grad of o written into o's slices would be an out= that compile refuses)
        grad_o = grad_lam = None
        if ctx.needs_input_grad[0]:
            g2 = g.neg() if lam is None else torch.mul(g, lam.neg())  # g2 takes g's layout
            if g.dim() == 4 and g.transpose(1, 2).is_contiguous():  # (B, T, h, d) in memory, as SDPA's output
                grad_o = join_pairs(g.transpose(1, 2), g2.transpose(1, 2), ctx.pairing, dim=2).transpose(1, 2)
            else:
                grad_o = join_pairs(g, g2, ctx.pairing, dim=1)
        if lam is not None and ctx.needs_input_grad[1]:
            grad_lam = torch.mul(g, split_pairs(o, ctx.pairing)[1]).sum_to_size(lam.shape).neg()
        return grad_o, grad_lam, None


def join_pairs(first: torch.Tensor, second: torch.Tensor, pairing: str, dim: int) -> torch.Tensor:
    """The inverse of ``split_pairs`` along ``dim``: (..., h, ...) twice -> (..., 2h, ...), one copy."""
    if pairing == "interleaved":
        return torch.stack((first, second), dim=dim + 1).flatten(dim, dim + 1)
    return torch.cat((first, second), dim=dim)


def pair_combine(o: torch.Tensor, lam: Optional[torch.Tensor], pairing: str) -> torch.Tensor:
    """(B, 2h, T, d) -> (B, h, T, d): ``combine(*split_pairs(o, pairing), lam)`` in fewer kernels (``PairCombine``)."""
    return PairCombine.apply(o, None if lam is None else lam.to(o.dtype), pairing)


__all__ = ["PairCombine", "combine", "join_pairs", "pair_combine", "split_keys", "split_pairs"]
