"""Several models of one shape trained as one: parameters stacked on a leading model axis.

Small models pay for every operator call, whatever its size (at d_model 64 a training step is mostly call
overhead). ``stack_models`` turns S models of the same configuration into ONE ``DiffTransformerLM`` whose every
parameter has a leading axis of S members, and whose batch is S consecutive blocks of rows, member 0 first:

* the math that is per example (attention, RoPE, activations, the loss) runs unchanged on the S*B rows: the model
  axis is folded into the batch, so one sdpa call serves every member;
* each ``nn.Linear`` becomes a ``StackedLinear`` (one ``torch.bmm`` over the S weight matrices), the embedding a
  ``StackedEmbedding`` (one lookup into the S tables laid end to end);
* the per-model vectors (RMSNorm weights, DIFF V1's lambda vectors) broadcast along the model axis: ``RMSNorm``
  and DIFF V1's ``lambda_full`` read a leading S axis where they find one (``model/norm.py``,
  ``model/attention/diff_v1.py``). No attention variant is implemented twice: the forward is the model's own.

Members never mix: no operation reduces across the model axis, so the gradient of the sum of the members' losses
is each member's own gradient, and AdamW (elementwise) updates each member as if it were alone. Gradient clipping
is per member (``clip_grad_norm_per_member``). What differs from training alone is float rounding only (batched
matrix products block differently): tests/train/test_stacked.py bounds it over the first steps.

Used by the retrieval benchmark's scheduler (``retrieval/train.py``'s ``train_group``); the one-model path stays
as it was.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from ..model.transformer import DiffTransformerLM


class StackedLinear(nn.Module):
    """S bias-free linear maps: weight (S, out, in); input (S*B, ..., in), member s owning rows s*B .. s*B + B - 1."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        S = self.weight.shape[0]
        y = torch.bmm(x.reshape(S, -1, x.shape[-1]), self.weight.transpose(1, 2))  # (S, rows, out)
        return y.view(*x.shape[:-1], y.shape[-1])


class StackedEmbedding(nn.Module):
    """S embedding tables: weight (S, vocab, d); ids (S*B, T) looked up in their member's table."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        S, V, d = self.weight.shape
        offset = (torch.arange(S, device=idx.device) * V).repeat_interleave(idx.shape[0] // S)  # (S*B,)
        return F.embedding(idx + offset[:, None], self.weight.view(S * V, d))  # (S*B, T, d)


def _check_members(models: Sequence[DiffTransformerLM]) -> None:
    if not models:
        raise ValueError("stack_models needs at least one model")
    cfg = models[0].cfg
    for i, m in enumerate(models):
        if not isinstance(m, DiffTransformerLM):
            raise TypeError(f"stack_models: member {i} is a {type(m).__name__}, not a DiffTransformerLM")
        if m.cfg != cfg:
            raise ValueError(f"stack_models: member {i}'s config differs from member 0's (stacked members share one "
                             "shape and variant)")
    if cfg.tie_embeddings:
        raise ValueError("stack_models: tie_embeddings=True is not supported (the stacked head would need the "
                         "stacked table); use tie_embeddings=False")
    if cfg.backend not in ("sdpa", "eager", "auto"):
        raise ValueError(f"stack_models: backend {cfg.backend!r} is not supported; use sdpa, eager or auto (the fused "
                         "kernels take one model's lambda)")


def stack_models(models: Sequence[DiffTransformerLM]) -> DiffTransformerLM:
    """One model holding ``models``' parameters stacked on a leading axis (copies: the members are not changed)."""
    _check_members(models)
    stacked = copy.deepcopy(models[0])
    for name, module in list(stacked.named_modules()):
        for child, sub in list(module.named_children()):
            full = f"{name}.{child}" if name else child
            if not isinstance(sub, (nn.Linear, nn.Embedding)):
                continue
            ws = [cast(torch.Tensor, m.get_submodule(full).weight).detach() for m in models]
            if isinstance(sub, nn.Linear):
                if sub.bias is not None:
                    raise ValueError(f"stack_models: {full} has a bias; the models are bias-free")
                setattr(module, child, StackedLinear(torch.stack(ws).clone()))
            elif isinstance(sub, nn.Embedding):
                setattr(module, child, StackedEmbedding(torch.stack(ws).clone()))
    for name, p in list(stacked.named_parameters()):
        if p.dim() == 0 or p.shape[0] != len(models) or p.shape[1:] != models[0].get_parameter(name).shape:
            owner, _, attr = name.rpartition(".")
            value = torch.stack([m.get_parameter(name).detach() for m in models]).clone()
            setattr(stacked.get_submodule(owner) if owner else stacked, attr, nn.Parameter(value))
    stacked.members = len(models)  # type: ignore[assignment]
    return stacked


def member_state(stacked: DiffTransformerLM, i: int) -> dict[str, torch.Tensor]:
    """Member ``i``'s state dict (the names of a plain model's), detached copies."""
    params = dict(stacked.named_parameters())
    return {n: (t[i] if n in params else t).detach().clone() for n, t in stacked.state_dict().items()}


def member_model(stacked: DiffTransformerLM, i: int) -> DiffTransformerLM:
    """Member ``i`` as a plain model (the stacked model's config), in eval mode."""
    return DiffTransformerLM.from_state_dict(stacked.cfg, member_state(stacked, i), where=f"member {i}")


@torch.no_grad()
def clip_grad_norm_per_member(params: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for each member apart: (S,) total gradient norms before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    S = grads[0].shape[0]
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(S, -1), dim=1) for g in grads], dim=1)  # (S, n)
    total = torch.linalg.vector_norm(norms, dim=1)  # (S,)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # as clip_grad_norm_: max_norm / (norm + 1e-6), at most 1
    for g in grads:
        g.mul_(coef.view(S, *([1] * (g.dim() - 1))))
    return total
