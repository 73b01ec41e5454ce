"""AdamW parameter groups and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..model.attention import Attention


def lambda_parameter_ids(model: nn.Module) -> set[int]:
    """ids of every parameter an attention variant declares a lambda parameter (``lambda_parameters()``)."""
    return {id(p) for m in model.modules() if isinstance(m, Attention) for p in m.lambda_parameters()}


def decays(p: nn.Parameter, lambda_ids: set[int]) -> bool:
    """Weight decay on matrices only: never on norms or biases (all 1-D), nor on any lambda parameter.

    DIFF V1's eq. (2) vectors (decay would pull lambda towards lambda_init) and DIFF V2's lambda projection
    (decay would pull sigmoid(lambda) towards 1/2) are left to the data.
    """
    return p.ndim >= 2 and id(p) not in lambda_ids


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    lambda_ids = lambda_parameter_ids(model)
    for p in model.parameters():
        if p.requires_grad:
            (decay if decays(p, lambda_ids) else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, t) -> torch.optim.AdamW:
    """AdamW over ``model`` with the ``[train]`` section's hyper-parameters (lr is set per step)."""
    return torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps)


def negative_weight_at(step: int, t) -> float:
    """DIFF V1 per_head layout: the negative branch's weight at optimizer step ``step`` (0-based), 0 at step 0
    rising linearly to 1 at ``t.v1_negative_warmup`` (so a converted model's first loss is the source's)."""
    if t.v1_negative_warmup <= 0:
        return 1.0
    return min(1.0, step / t.v1_negative_warmup)


def lr_at(step: int, t) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup, then cosine from lr to min_lr."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(1, t.steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + math.cos(math.pi * progress))
