"""The table of fused DIFF kernels: the model's side of the door to ``kernels/``.

The model imports nothing from ``kernels/``. The kernels package registers its rule here when it is imported
(``kernels/hook.py``, imported by the package's ``__init__``, so any process that imports ``difftransformer`` has
it): ``fused_kernel`` asks each registered rule, in order, whether a kernel takes a DIFF call, and answers the first
``Kernel`` or None (the model's PyTorch paths run). With nothing registered every call runs the PyTorch paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Optional, Protocol

import torch

# The fused paths' names, as ``dispatch.PATHS`` lists them (the kernels' ``Kernel.path`` values)
KERNEL_PATHS = ("triton-decode", "triton", "blocked")


class Kernel(NamedTuple):
    """A fused kernel that takes a DIFF call: its ``path`` (one of ``KERNEL_PATHS``) and ``run(x, q1, q2, k1, k2, v,
    lam, mask, scale, fallback)`` -> (B, h, T, dv). x: the layer input (B, T, d_model; its device, dtype and autograd
    state name the kind of launch); lam: 0-dim, (B, h, T, 1) or None (A1 - A2); mask: the model's boolean (B or 1, 1,
    T, Tk) mask or None (causal); fallback: the PyTorch path, run where a launch fails."""

    path: str
    run: Callable[..., torch.Tensor]


class Rule(Protocol):
    def __call__(self, backend: str, x: torch.Tensor, head_dim: int, value_dim: int, mask: Optional[torch.Tensor], *,
                 decode: bool, own_keys: bool) -> Optional[Kernel]: ...


# Whether a rule may take a call at all: ``serves(backend, x, head_dim, value_dim)`` (x: the layer input, whose
# device, dtype, length and autograd state name the case); a table lookup, never a launch
Serves = Callable[[str, torch.Tensor, int, int], bool]
_RULES: list[Rule] = []
_SERVES: list[Serves] = []  # per rule (its other conditions, the mask and the cache, are the rule's own)


def register(rule: Rule, serves: Optional[Serves] = None) -> None:
    """Add a rule (once: registering the same function again is a no-op). ``serves(backend, x, head_dim,
    value_dim)``: whether the rule may take any call of that backend in that case (default: every one); where no
    registered rule serves a call's, the model's PyTorch paths decide alone, without asking the rules
    (``may_take``)."""
    if rule not in _RULES:
        _RULES.append(rule)
        _SERVES.append(serves or (lambda backend, x, head_dim, value_dim: True))


def may_take(backend: str, x: torch.Tensor, head_dim: int, value_dim: int) -> bool:
    """Whether any registered kernel may take a DIFF call of ``backend`` on the input ``x`` with these head sizes."""
    return any(serves(backend, x, head_dim, value_dim) for serves in _SERVES)


def fused_kernel(backend: str, x: torch.Tensor, head_dim: int, value_dim: int, mask: Optional[torch.Tensor], *,
                 decode: bool, own_keys: bool) -> Optional[Kernel]:
    """The kernel that takes this DIFF call, or None. ``decode``: a KV-cache decode step (one new token per row);
    ``own_keys``: the call attends only to its own keys (no KV cache, or a prefill from 0)."""
    for rule in _RULES:
        kernel = rule(backend, x, head_dim, value_dim, mask, decode=decode, own_keys=own_keys)
        if kernel is not None:
            if kernel.path not in KERNEL_PATHS:
                raise ValueError(f"a registered kernel's path must be one of {KERNEL_PATHS}, got {kernel.path!r}")
            return kernel
    return None
