"""The same training entry point alone or under ``torchrun``: process group, device, DDP or FSDP2.

Nothing here is model-specific (torchtitan's rule: the model file holds no parallelism). Under torchrun every
rank runs the whole trainer; rank 0 alone logs and writes files.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ..loading import pick_device as _pick_device

if TYPE_CHECKING:
    from ..model.transformer import DiffTransformerLM


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(name: str, local_rank: int) -> torch.device:
    """``train.device`` (and a study job's device) as a ``torch.device``: ``loading.pick_device``, the one place."""
    return _pick_device(name, local_rank, "train.device")


def init_distributed(device_name: str) -> DistInfo:
    """Join the torchrun process group when launched by torchrun (WORLD_SIZE > 1), else a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name, local)
    if world <= 1:
        return DistInfo(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), local, device)


def shutdown(info: DistInfo) -> None:
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def wrap(model: DiffTransformerLM, parallel: str, info: DistInfo) -> nn.Module:
    """DDP (default) or FSDP2 over ``model``; the model itself when single-process.

    FSDP2 shards each block, then the root (embeddings, final norm, head), as torchtitan does.
    """
    if not info.distributed:
        return model
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)


@contextmanager
def no_grad_sync(model: nn.Module, skip: bool):
    """Skip the gradient all-reduce on accumulation micro-steps that are not the last."""
    wrapped: Any = model  # DDP, an FSDP2-sharded module or the model itself: told apart by their methods
    if not skip:
        yield
    elif hasattr(wrapped, "no_sync"):  # DDP
        with wrapped.no_sync():
            yield
    elif hasattr(wrapped, "set_requires_gradient_sync"):  # FSDP2
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
    else:
        with nullcontext():
            yield


def mean_across(value: float, info: DistInfo) -> float:
    """The mean of a per-rank number over all ranks (the rank's own number when single-process)."""
    if not info.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return float(t.item()) / info.world_size


class RankZeroFailed(ValueError):
    """Raised on the other ranks when rank 0 refused its input or failed (rank 0 printed why): a ValueError, so
    each rank ends with one error line rather than a traceback."""


def all_ok(ok: bool, info: DistInfo) -> bool:
    """True when every rank passes ``ok=True`` (a collective: every rank must call it once)."""
    if not info.distributed:
        return ok
    t = torch.tensor([0 if ok else 1], dtype=torch.int64, device=info.device)
    dist.all_reduce(t)
    return int(t.item()) == 0
