"""LoRA: low-rank adapters trained on a frozen model (``train --init-from DIR --train.lora_rank R``).

Each adapted linear layer (``train.lora_targets``, by the layer's own name: ``wq`` ``wk`` ``wv`` ``wo``, DIFF V2's
``wlambda``, the SwiGLU's ``w1`` ``w2`` ``w3``, the head ``output``) becomes a ``LoRALinear``:

  y = x W^T + (dropout(x) A^T B^T) * alpha / r,   A (r, in) kaiming-uniform(a=sqrt 5), B (out, r) zeros

as PEFT's LoRA computes and initialises it, so at step 0 the model is the source exactly. W keeps its name
(``layers.0.attn.wq.weight``) and is frozen with every other weight; A and B are ``...wq.lora_A.weight`` and
``...wq.lora_B.weight``, the only parameters with ``requires_grad``, so the optimizer sees only them.

What a LoRA run's checkpoints hold (``train.checkpoint``): ``model.safetensors`` holds the *merged* weights
W + (B A) alpha / r, a plain model directory that every command reads as the fine-tuned model; its
``training_state.safetensors`` also holds, under the prefix ``lora.``, the adapters and the frozen W of each adapted
layer (``split_state``), so ``--resume`` continues the unmerged model exactly (``unmerged_state``). The adapters in
PEFT's format (``RUN/adapter/``, its base ``RUN/adapter_base/``, ``load_adapter``, ``export_adapter``) are
``interop/peft.py``'s. This module is torch only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .transformer import DiffTransformerLM

# The names train.lora_targets may hold: every linear layer of the model, by its attribute name.
LORA_TARGETS = ("wq", "wk", "wv", "wo", "wlambda", "w1", "w2", "w3", "output")
DEFAULT_TARGETS = ("wq", "wk", "wv", "wo")
STATE_PREFIX = "lora."  # the adapters and the adapted layers' frozen weights in training_state.safetensors
LORA_A, LORA_B = "lora_A.weight", "lora_B.weight"  # an adapted layer's A and B, under its module name


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update: ``x W^T + b + dropout(x) A^T B^T * alpha / r``.

    ``weight`` (and ``bias``) are the wrapped ``nn.Linear``'s own parameters, under their own names."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0,
                 generator: Optional[torch.Generator] = None) -> None:
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {rank!r}")
        if not alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {alpha!r}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.rank, self.alpha, self.scaling = rank, float(alpha), float(alpha) / rank
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, **kw)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, **kw)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.reset_lora(generator)

    @torch.no_grad()
    def reset_lora(self, generator: Optional[torch.Generator] = None) -> None:
        """A kaiming-uniform (a = sqrt 5, as PEFT and nn.Linear), drawn on the CPU from ``generator`` (so every rank
        and device draws the same); B zeros: the update starts at exactly 0."""
        if self.lora_A.weight.device.type == "meta":
            return
        a = torch.empty(self.lora_A.weight.shape, dtype=torch.float32)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        self.lora_A.weight.copy_(a)
        self.lora_B.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    def merged_weight(self) -> torch.Tensor:
        return merge_weight(self.weight, self.lora_A.weight, self.lora_B.weight, self.scaling)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
                f"alpha={self.alpha:g}")


def merge_weight(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """W + (B A) * scaling (PEFT's delta weight), computed in at least float32, in W's dtype."""
    acc = torch.promote_types(w.dtype, torch.float32)
    return (w.detach().to(acc) + (b.detach().to(acc) @ a.detach().to(acc)) * scaling).to(w.dtype)


# ---------------------------------------------------------------------------------------------- applying
def linear_layers(model: nn.Module) -> dict[str, list[str]]:
    """{attribute name: [module names]} of every ``nn.Linear`` of ``model`` (``wq``: ``layers.0.attn.wq``, ...)."""
    out: dict[str, list[str]] = {}
    for name, m in model.named_modules():
        if type(m) is nn.Linear:
            out.setdefault(name.rpartition(".")[2], []).append(name)
    return out


def check_targets(model: nn.Module, targets: Iterable[str]) -> None:
    """Refuse a target no linear layer of ``model`` is called, and the head when it is tied to the embeddings."""
    have = linear_layers(model)
    cfg = getattr(model, "cfg", None)
    for t in targets:
        if t not in have:
            what = f" ({cfg.attention} attention)" if cfg is not None else ""
            raise ValueError(f"train.lora_targets: {t!r} matches no module of this model{what}; its linear layers "
                             f"are {', '.join(sorted(have))}")
        if t == "output" and cfg is not None and cfg.tie_embeddings:
            raise ValueError("train.lora_targets: 'output' is tied to the token embeddings (model.tie_embeddings), "
                             "so merging its adapter would change the embeddings too; leave it out")


def check_lora(cfg: Any) -> None:
    """The LoRA settings of a ``TrainConfig`` that depend on its model: a source to adapt (``train.init_from``)
    and targets that name layers of this model. Built on the meta device: nothing is allocated."""
    t = cfg.train
    if not t.lora_rank:
        return
    if not t.init_from:
        raise ValueError(f"train.lora_rank={t.lora_rank} needs --init-from DIR: LoRA adapts an existing model "
                         "(the adapters are saved for that model; a fresh initialisation has nothing to adapt)")
    with torch.device("meta"):
        model = DiffTransformerLM(cfg.model)
    check_targets(model, t.lora_targets)


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: Iterable[str], dropout: float = 0.0,
               seed: int = 0) -> list[str]:
    """Freeze every parameter of ``model`` and wrap each linear layer named in ``targets`` in a ``LoRALinear``
    (in place, in module order; A drawn from ``seed``). Returns the wrapped modules' names."""
    if lora_layers(model):
        raise ValueError("the model already has LoRA adapters")
    targets = list(targets)
    check_targets(model, targets)
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    wrapped = [n for t, names in linear_layers(model).items() if t in targets for n in names]
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    wrapped.sort(key=order.__getitem__)
    for name in wrapped:
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, leaf, LoRALinear(getattr(owner, leaf), rank, alpha, dropout, gen))
    return wrapped


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """{module name: LoRALinear} of ``model`` (empty for a model without adapters)."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every ``LoRALinear`` of ``model`` by a plain ``nn.Linear`` holding the merged weight (in place)."""
    for name, m in lora_layers(model).items():
        parent, _, leaf = name.rpartition(".")
        lin = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
        lin.weight = nn.Parameter(m.merged_weight(), requires_grad=False)
        if m.bias is not None:
            lin.bias = m.bias
        setattr(model.get_submodule(parent) if parent else model, leaf, lin)
    return model


# ---------------------------------------------------------------------------------------------- checkpoints
def split_state(state: dict[str, torch.Tensor], scalings: dict[str, float]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A LoRA model's full state dict -> (the merged model's state dict, the ``lora.``-prefixed tensors resuming
    needs: each adapted layer's A, B and frozen W). ``scalings``: {module name: alpha / r}."""
    merged = dict(state)
    extra: dict[str, torch.Tensor] = {}
    for name, scaling in scalings.items():
        w, a, b = (merged.pop(f"{name}.{k}") for k in ("weight", LORA_A, LORA_B))
        extra.update({f"{STATE_PREFIX}{name}.weight": w, f"{STATE_PREFIX}{name}.{LORA_A}": a,
                      f"{STATE_PREFIX}{name}.{LORA_B}": b})
        merged[f"{name}.weight"] = merge_weight(w, a, b, scaling)
    return merged, extra


def unmerged_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """From a checkpoint's training-state tensors, the LoRA model's own entries (frozen W, A, B) that replace the
    merged weights when resuming; empty for a run without LoRA."""
    return {k[len(STATE_PREFIX):]: v for k, v in tensors.items() if k.startswith(STATE_PREFIX)}


def settings(model: nn.Module) -> tuple[int, float, float]:
    """(rank, alpha, dropout) of a LoRA model's adapters (``apply_lora`` gives them all the same)."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA adapters")
    first = next(iter(layers.values()))
    return first.rank, first.alpha, first.lora_dropout.p if isinstance(first.lora_dropout, nn.Dropout) else 0.0


def adapters_of(unmerged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The A and B entries of ``split_state``'s ``lora.`` tensors (or of ``unmerged_state``'s), prefix removed."""
    return {k.removeprefix(STATE_PREFIX): v for k, v in unmerged.items() if k.endswith((LORA_A, LORA_B))}


__all__ = ["LORA_TARGETS", "DEFAULT_TARGETS", "STATE_PREFIX", "LORA_A", "LORA_B", "LoRALinear", "merge_weight",
           "linear_layers", "check_targets", "check_lora", "apply_lora", "lora_layers", "trainable_parameters",
           "merge_lora", "split_state", "unmerged_state", "adapters_of", "settings"]
