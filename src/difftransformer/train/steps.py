"""The optimizer step and loop every training shares: ``train`` (one process or every torchrun rank) and the
language-model sweep's jobs (``lmsweep.job``) run the same ``optimizer_steps``, so a sweep job trains exactly as
``difftransformer train`` would with the same settings."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import NamedTuple

import torch

from ..data.shards import PreparedData, WindowSampler, windows
from .config import TrainConfig
from .distributed import DistInfo, mean_across, no_grad_sync
from .optim import lr_at, negative_weight_at

# Consecutive non-finite steps after which the run stops: one can be a bad batch, this many is a diverged model.
MAX_NONFINITE_STREAK = 5


def new_model(cfg: TrainConfig, device: torch.device):
    """A fresh model of ``cfg.model`` drawn from ``train.seed`` on the CPU, then moved to ``device`` (so every rank and
    every device starts from the same weights): the first step of every training's setup."""
    from ..model.transformer import DiffTransformerLM
    torch.manual_seed(cfg.train.seed)
    return DiffTransformerLM(cfg.model).to(device)


def new_sampler(cfg: TrainConfig, data: PreparedData) -> WindowSampler:
    """The training windows' sampler, seeded by ``train.seed`` alone (every variant and width sees the same
    windows in the same order at a seed)."""
    return WindowSampler(data.num_tokens["train"], cfg.data.seq_len, cfg.train.seed)


def autocast_for(device: torch.device, precision: str):
    """bf16 autocast where the device supports it (CUDA with bf16); float32 elsewhere unless asked."""
    use_bf16 = precision == "bfloat16" or (
        precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported())
    if not use_bf16:
        return nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def rank_slice(starts: torch.Tensor, accum: int, info: DistInfo) -> torch.Tensor:
    """(batch,) global starts -> (accum, micro) starts of this rank; layout (accum, ranks, micro)."""
    return starts.view(accum, info.world_size, -1)[:, info.rank]  # (accum, micro)


def train_step(model, raw, optimizer, data: PreparedData, starts: torch.Tensor, cfg: TrainConfig, info: DistInfo,
               autocast) -> tuple[float, float, bool]:
    """One optimizer step over this rank's micro-batches; returns (mean loss over all ranks, grad norm, whether
    the update was made). A non-finite loss or norm makes no update: one NaN would poison every weight. Both are
    the same on every rank (an all-reduced mean, a norm of all-reduced gradients), so all ranks skip together."""
    accum, T = starts.shape[0], cfg.data.seq_len
    tokens = data.tokens("train")
    loss_sum = torch.zeros((), device=info.device)
    for i in range(accum):
        x, y = (t.to(info.device, non_blocking=True) for t in windows(tokens, starts[i], T))
        with no_grad_sync(model, skip=i < accum - 1), autocast():
            loss = model(x, y).loss
        (loss / accum).backward()
        loss_sum += loss.detach()
    clip = cfg.train.grad_clip if cfg.train.grad_clip > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), clip)
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
        norm = norm.full_tensor()
    mean_loss, grad_norm = mean_across(float(loss_sum) / accum, info), float(norm)
    ok = math.isfinite(mean_loss) and math.isfinite(grad_norm)
    if ok:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return mean_loss, grad_norm, ok


class Step(NamedTuple):
    """One optimizer step of ``optimizer_steps``: ``done`` steps so far, its lr, loss, gradient norm, whether the
    update was made, the skipped steps so far, its seconds; ``diverged``: the last of a non-finite streak."""
    done: int
    lr: float
    loss: float
    grad_norm: float
    ok: bool
    skipped: int
    seconds: float
    diverged: bool


def optimizer_steps(model, raw, optimizer, data: PreparedData, sampler: WindowSampler, cfg: TrainConfig,
                    info: DistInfo, autocast, start: int = 0, accum: int = 1) -> Iterator[Step]:
    """The optimizer loop of every training (``train`` and the language-model sweep's jobs), steps ``start`` to
    ``cfg.train.steps``: the scheduled lr, DIFF V1's negative-branch weight (not under LoRA: the base stays as
    loaded), one ``train_step`` on the sampler's next global batch. After ``MAX_NONFINITE_STREAK`` non-finite steps in
    a row it yields a ``diverged`` step and stops. Evaluation, logs and checkpoints are the caller's, between steps."""
    skipped = streak = 0
    for step in range(start, cfg.train.steps):
        lr = lr_at(step, cfg.train)
        for g in optimizer.param_groups:
            g["lr"] = lr
        if not cfg.train.lora_rank:
            raw.set_negative_weight(negative_weight_at(step, cfg.train))  # DIFF V1 per_head only; else a no-op
        t0 = time.perf_counter()
        starts = rank_slice(sampler.next_starts(cfg.train.batch_size), accum, info)
        loss, gnorm, ok = train_step(model, raw, optimizer, data, starts, cfg, info, autocast)
        skipped, streak = skipped + (not ok), (0 if ok else streak + 1)
        yield Step(step + 1, lr, loss, gnorm, ok, skipped, time.perf_counter() - t0, streak >= MAX_NONFINITE_STREAK)
        if streak >= MAX_NONFINITE_STREAK:
            return
