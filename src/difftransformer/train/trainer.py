"""The training loop: AdamW, warmup + cosine, clipping, accumulation, bf16 autocast, evaluation, checkpoints.

One function, ``train(cfg, run_dir)``, serves a single process and every rank under torchrun. The global batch
``train.batch_size`` is split as (accumulation, ranks, micro batch): each optimizer step draws all its window
starts from one seeded generator on every rank and each rank reads its slice, so 1 process x 4 sequences and
2 processes x 2 sequences see the same tokens and the same averaged gradient.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from .. import rundir
from ..data.shards import (
    PreparedData,
    check_fits,
    eval_starts,
    fingerprint,
    link_prepared,
    prepare_data,
    read_prepared,
    windows,
)
from ..fileio import atomic_copy
from ..log import progress_bar
from ..model import lora
from ..model.transformer import DiffTransformerLM
from . import checkpoint as ckpt_io
from .config import TrainConfig
from .distributed import (
    DistInfo,
    RankZeroFailed,
    all_ok,
    barrier,
    init_distributed,
    mean_across,
    shutdown,
    wrap,
)
from .metrics import LambdaProbe, MetricsLogger, require_tensorboard
from .optim import build_optimizer
from .steps import MAX_NONFINITE_STREAK, autocast_for, new_model, new_sampler, optimizer_steps


@dataclass
class TrainResult:
    run_dir: Path
    parameters: int
    steps: int
    tokens_per_s: float  # global training throughput, first step of this process excluded (warm-up)
    final_val_loss: float
    losses: list[float] = field(default_factory=list)  # training loss of every step this process ran
    skipped_steps: int = 0  # steps whose loss or gradient norm was not finite (no update made)


class TrainingDiverged(ValueError):
    """The loss or gradient norm stayed non-finite; nothing of it was saved."""


# ---------------------------------------------------------------------------------------------- setup
def same_data(a, b) -> bool:
    """Two [data] sections give the same training tokens and windows (where prepared shards live aside)."""
    return fingerprint(a) == fingerprint(b) and a.seq_len == b.seq_len


def check_run_dir(cfg: TrainConfig, run_dir: Path, resume: bool, warn: Callable[[str], None],
                  check_hashes: bool = True) -> Optional[Path]:
    """The checkpoint to resume from (None for a fresh run); refuses to overwrite or to mix two runs."""
    cfg_file = rundir.run_config_path(run_dir)
    if not resume:
        if cfg_file.exists():
            raise FileExistsError(f"--out {run_dir} already holds a run; pass --resume to continue it or choose "
                                  "another --out")
        return None
    if not cfg_file.is_file():
        raise FileNotFoundError(f"--resume: {run_dir} holds no {cfg_file.name} (not a run directory)")
    saved = TrainConfig.from_dict(rundir.read_run_config(run_dir))
    _check_same_lora(saved, cfg)
    if not rundir.list_checkpoints(run_dir):  # killed before its first checkpoint: nothing to keep but the data
        _check_same_data(saved, cfg, cfg_file)
        warn(f"--resume: {run_dir} has no checkpoint yet; starting it again from step 0")
        return None
    skipped: list[str] = []
    ckpt = ckpt_io.find_resumable(run_dir, warn=skipped.append, check_hashes=check_hashes)
    done = ckpt_io.checkpoint_step(ckpt)
    if done >= cfg.train.steps and not check_hashes:  # the refusal counts on this checkpoint: verify its weights
        skipped = []
        ckpt = ckpt_io.find_resumable(run_dir, warn=skipped.append, check_hashes=True)
        done = ckpt_io.checkpoint_step(ckpt)
    if skipped:  # a newer checkpoint is broken (a bad checksum, a missing file): say which one the run continues from
        warn(f"--resume: {'; '.join(skipped)}; continuing from {ckpt.name} (step {done}), the newest checkpoint "
             "that verifies")
    ckpt_io.check_same_model(ckpt, cfg.model)
    if done >= cfg.train.steps:
        raise ValueError(f"--resume: the run is already at step {done} >= train.steps={cfg.train.steps}; "
                         "raise --train.steps to train further")
    _check_same_data(saved, cfg, cfg_file)
    return ckpt


LORA_KEYS = ("lora_rank", "lora_alpha", "lora_targets")  # what the checkpoints' adapters were trained with


def _check_same_lora(saved: TrainConfig, cfg: TrainConfig) -> None:
    for key in LORA_KEYS:
        was, now = getattr(saved.train, key), getattr(cfg.train, key)
        if (sorted(was) != sorted(now)) if key == "lora_targets" else was != now:
            raise ValueError(f"--resume: train.{key}={now!r} differs from the run's {was!r}; a run keeps its LoRA "
                             "settings (start a new run with --init-from to change them)")


def _check_same_data(saved: TrainConfig, cfg: TrainConfig, cfg_file: Path) -> None:
    if not same_data(saved.data, cfg.data):
        raise ValueError(f"--resume: the [data] section differs from the run's {cfg_file}; resume with the same data")


def setup_data(cfg: TrainConfig, run_dir: Path, info: DistInfo, progress: bool) -> PreparedData:
    """Tokenise once (rank 0), shared through ``data.prepared_dir`` when set; every rank then reads the shards."""
    target = rundir.data_dir(run_dir)
    if info.is_main:
        try:
            if cfg.data.prepared_dir:
                link_prepared(prepare_data(cfg.data, cfg.data.prepared_dir, progress), target)
            else:
                prepare_data(cfg.data, target, progress)
        except Exception:
            all_ok(False, info)  # let the other ranks stop too instead of waiting at the barrier
            raise
    if not all_ok(True, info):
        raise RankZeroFailed(f"rank 0 failed to prepare the data in {target} (its error is printed above)")
    data = read_prepared(target, cfg.data)
    if data is None:
        raise FileNotFoundError(f"{target} holds no prepared data (rank {info.rank})")
    check_fits(data, cfg.data.seq_len)
    return data


# ---------------------------------------------------------------------------------------------- steps
def check_finite_weights(raw, step: int, info: DistInfo) -> None:
    """Refuse to checkpoint NaN or inf weights (finite steps can still overflow them). Under FSDP each rank
    checks its own shard and all ranks agree before any of them raises (the save is a collective)."""
    local = ((n, p.to_local() if hasattr(p, "to_local") else p) for n, p in raw.named_parameters())
    bad = [n for n, p in local if not bool(torch.isfinite(p.detach()).all())]
    if not all_ok(not bad, info):
        bad = bad or ["of another rank"]
        raise TrainingDiverged(f"training diverged: weights {', '.join(bad[:3])} are not finite at step {step}; "
                               "no checkpoint written (lower train.lr or raise train.warmup_steps)")


@torch.no_grad()
def evaluate(raw, data: PreparedData, cfg: TrainConfig, info: DistInfo, autocast) -> dict:
    """Validation loss on ``eval_batches`` global batches of fixed, evenly spaced windows (the same at every
    evaluation and for any number of ranks or micro-batch size), plus the lambda probes."""
    micro, T = cfg.batch_plan(info.world_size)[0], cfg.data.seq_len
    starts = eval_starts(data.num_tokens["val"], T, cfg.train.eval_batches * cfg.train.batch_size)
    starts = starts.view(-1, info.world_size, micro)[:, info.rank]  # (eval_batches * accum, micro)
    tokens = data.tokens("val")
    raw.eval()
    probe = LambdaProbe(raw.layers)
    total = 0.0
    for i in range(starts.shape[0]):
        x, y = (t.to(info.device) for t in windows(tokens, starts[i], T))
        with autocast():
            total += float(raw(x, y).loss)
        if i == 0:
            probe.remove()  # one batch is enough for the lambda statistics
    raw.train()
    return {"val_loss": mean_across(total / starts.shape[0], info), **probe.result()}


# ---------------------------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig, run_dir: str | Path, resume: bool = False, progress: Optional[bool] = None, *,
          on_checkpoint: Optional[Callable[[int, Path], None]] = None, desc: str = "train") -> TrainResult:
    """Train ``cfg`` into ``run_dir`` (alone or as one rank of torchrun).

    ``progress`` overrides ``log.progress``; ``on_checkpoint(step, path)`` runs on rank 0 after each complete
    checkpoint (the tests use it to kill a run right after one). Under torchrun every rank returns a result.
    """
    run_dir = Path(run_dir)
    info = init_distributed(cfg.train.device)
    try:
        # Refuse bad input before touching the directory (no lock file is made for a refused command) ...
        if cfg.log.tensorboard:  # a missing optional package said now, not after the data is prepared
            require_tensorboard(quiet=not info.is_main)
        lora.check_lora(cfg)
        check_run_dir(cfg, run_dir, resume, lambda m: None, check_hashes=False)
        with _writer_lock(run_dir, info):  # ... then decide again under the lock: another writer may have won
            return _train(cfg, run_dir, resume, on_checkpoint, info,
                          cfg.log.progress if progress is None else progress, desc)
    finally:
        shutdown(info)


@contextmanager
def _writer_lock(run_dir: Path, info: DistInfo):
    """Rank 0 holds the run directory's lock; the other ranks learn whether it got it (a collective)."""
    with ExitStack() as held:
        if info.is_main:
            try:
                held.enter_context(rundir.lock_run(run_dir))
            except BaseException:
                all_ok(False, info)  # the other ranks stop too instead of waiting at the next collective
                raise
        if not all_ok(True, info):
            raise RankZeroFailed(f"rank 0 could not lock {run_dir} (its error is printed above)")
        yield


log = logging.getLogger(__name__)


def _say(msg: str) -> None:
    """What rank 0 reports while training (the CLI shows it on stderr: ``difftransformer.log``)."""
    log.info(msg)


TRAIN_BYTES_PER_PARAM = 16  # float32 weights, gradients and AdamW's two moments; activations come on top


def estimated_parameters(model_cfg) -> int:
    """The parameter count of ``model_cfg`` without allocating it: a 1- and a 2-layer copy built on the meta
    device, extrapolated linearly in ``n_layers`` (every layer has the same shapes)."""
    import dataclasses

    def count(n_layers: int) -> int:
        with torch.device("meta"):
            return DiffTransformerLM(dataclasses.replace(model_cfg, n_layers=n_layers)).num_parameters()

    one = count(1)
    return one + (count(2) - one) * (model_cfg.n_layers - 1)


def check_fits_memory(model_cfg, info: DistInfo, parallel: str,
                      lower: str = "model.d_model, model.n_layers or data.vocab_size") -> None:
    """Refuse, before any data is prepared, a model whose weights, gradients and optimizer states alone exceed the
    device's memory (a ValueError naming the sizes, not an allocator abort minutes later). ``lower``: the settings
    the message tells the user to lower (the studies name their own flags)."""
    if info.device.type == "cuda":
        total = torch.cuda.get_device_properties(info.device).total_memory
    else:
        try:
            import os
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return
    n = estimated_parameters(model_cfg)
    need = n * TRAIN_BYTES_PER_PARAM // (info.world_size if parallel == "fsdp" else 1)
    if need > total:
        raise ValueError(f"the model has {n:,} parameters: training needs at least {need / 2**30:,.1f} GiB per "
                         f"{info.device.type.upper()} device for weights, gradients and AdamW states, more than its "
                         f"{total / 2**30:,.1f} GiB; lower {lower}")


def _train(cfg, run_dir, resume, on_checkpoint, info: DistInfo, progress: bool, desc: str) -> TrainResult:
    try:
        micro, accum = cfg.batch_plan(info.world_size)
    except ValueError as e:
        e.quiet = not info.is_main  # type: ignore[attr-defined]  # the same refusal on every rank: rank 0 says it
        raise
    if info.world_size > 1 and info.is_main:
        _say(f"global batch {cfg.train.batch_size} = {info.world_size} processes x {micro} sequences x {accum} "
             f"micro-step(s) (train.micro_batch_size={cfg.train.micro_batch_size} caps the micro-batch)")
    check_fits_memory(cfg.model, info, cfg.train.parallel)
    ckpt = check_run_dir(cfg, run_dir, resume, log.warning if info.is_main else (lambda m: None))
    data = setup_data(cfg, run_dir, info, progress and info.is_main)
    if info.is_main:
        rundir.write_run_config(run_dir, cfg.to_json())
        atomic_copy(data.tokenizer_file, rundir.tokenizer_path(run_dir))

    raw = new_model(cfg, info.device)  # built on CPU by the seed, so every rank starts equal
    if ckpt is None and cfg.train.init_from:  # continued training: the source's weights (every rank, before wrap)
        from .init_from import load_source_weights
        raw.load_state_dict(load_source_weights(cfg))
    t = cfg.train
    if t.lora_rank:  # the source frozen, adapters on its target layers (loaded from the checkpoint on resume)
        total = raw.num_parameters()
        lora.apply_lora(raw, t.lora_rank, t.lora_alpha, t.lora_targets, t.lora_dropout, seed=t.seed)
        if info.is_main:
            _say(f"LoRA rank {t.lora_rank}, alpha {t.lora_alpha:g} on {', '.join(t.lora_targets)}: "
                 f"{lora.trainable_parameters(raw):,} trainable parameters; the model's {total:,} are frozen")
            if t.v1_negative_warmup and cfg.model.v1_layout == "per_head":
                _say(f"train.v1_negative_warmup={t.v1_negative_warmup} is not applied: under LoRA the model "
                     "stays as loaded, its DIFF V1 negative-branch weight included")
    model = wrap(raw, cfg.train.parallel, info)
    optimizer = build_optimizer(raw, cfg.train)
    sampler = new_sampler(cfg, data)
    start, tokens_seen = 0, 0
    if ckpt is not None:
        state = ckpt_io.load_checkpoint(ckpt, raw, optimizer, cfg.model)
        sampler.load_state_dict(state.sampler)
        start, tokens_seen = state.step, state.tokens_seen
        if info.is_main:
            _say(f"resuming from {ckpt} (step {start})")
    step_fn = torch.compile(model) if cfg.train.compile else model
    autocast = autocast_for(info.device, cfg.train.precision)
    # a resume with no checkpoint restarts at 0: the metrics the killed attempt logged are dropped as well
    logger = (MetricsLogger(run_dir, cfg.log.tensorboard, resume_step=start if resume else None)
              if info.is_main else None)

    tokens_per_step = cfg.train.batch_size * cfg.data.seq_len
    losses, val_loss = [], float("nan")
    window_t, window_tokens, total_t, total_tokens, first_t = 0.0, 0, 0.0, 0, 0.0
    bar = progress_bar(total=cfg.train.steps, initial=start, desc=desc, unit="step",
                       disable=not (progress and info.is_main), dynamic_ncols=True)
    raw.train()
    skipped = 0
    for st in optimizer_steps(step_fn, raw, optimizer, data, sampler, cfg, info, autocast, start, accum):
        if st.diverged:
            raise TrainingDiverged(f"training diverged: {MAX_NONFINITE_STREAK} steps in a row with a non-finite loss "
                                   f"or gradient norm (last: step {st.done}); stopped without saving (lower train.lr)")
        step, done, loss, skipped, dt = st.done - 1, st.done, st.loss, st.skipped, st.seconds
        tokens_seen += tokens_per_step
        losses.append(loss)
        window_t, window_tokens = window_t + dt, window_tokens + tokens_per_step
        if step > start:  # the first step pays for warm-up (allocations, compile)
            total_t, total_tokens = total_t + dt, total_tokens + tokens_per_step
        else:
            first_t = dt
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{window_tokens / max(window_t, 1e-9):,.0f}", refresh=False)
        bar.update(1)
        last = done == cfg.train.steps
        if logger and (done % cfg.log.every == 0 or last):
            logger.log({"step": done, "loss": loss, "lr": st.lr, "grad_norm": st.grad_norm, "tokens": tokens_seen,
                        "tokens_per_s": window_tokens / max(window_t, 1e-9), "skipped_steps": skipped})
            window_t, window_tokens = 0.0, 0
        if done % cfg.train.eval_every == 0 or last:
            ev = evaluate(raw, data, cfg, info, autocast)
            val_loss = ev["val_loss"]
            if logger:
                logger.log({"step": done, **ev})
        if done % cfg.checkpoint.every == 0 or last:
            check_finite_weights(raw, done, info)
            state = ckpt_io.TrainingState(done, tokens_seen, sampler.state_dict())
            path = ckpt_io.save_checkpoint(run_dir, raw, optimizer, cfg.model, state, data.tokenizer_file,
                                           info.is_main, adapter_base=t.init_from)  # LoRA: RUN/adapter too
            if info.is_main:
                ckpt_io.prune(run_dir, cfg.checkpoint.keep_last)
                if on_checkpoint is not None:
                    on_checkpoint(done, path)
            barrier(info)
    bar.close()
    if logger:
        logger.close()
    # One step run: only the warm-up step was timed, and nothing else (never a zero time: 64e9 tokens/s).
    tps = total_tokens / total_t if total_t > 0 else (tokens_per_step / first_t if first_t > 0 else math.nan)
    return TrainResult(run_dir, raw.num_parameters(), cfg.train.steps, tps, val_loss, losses, skipped)
