"""One job of the language-model sweep: train one model (width, variant, seed, lr) and measure it.

The training is ``difftransformer train``'s: the preset's ``TrainConfig`` with the sweep's overrides
(``train_config``), the trainer's loop ``train.steps.optimizer_steps`` (AdamW, warmup + cosine, clipping, a
non-finite step skipped, the divergence rule) and the trainer's ``WindowSampler`` seeded by the seed, so at seed s
every variant and width sees the same windows in the same order. No checkpoint is written: the job's result is its
measures (PROTOCOL.md, "Seeds, learning rates and the choice": the two halves, the divergence rule and the floor;
"Endpoints and statistics": what each endpoint reads), journaled by the job runner (``difftransformer.jobs``).

Measures: the validation windows (non-overlapping, of ``seq_len`` tokens) split by parity into a *tuning half* (even
windows: the lr choice only) and a *test half* (odd windows: every endpoint); the test-half loss every
``eval_every`` steps (the curve of Fig. 3b) and at the end; both halves' loss at the end; the unigram floor (the
cross-entropy on the test half of the training tokens' unigram distribution, add-one smoothed); the largest
|attention logit| and |hidden state| over ``outlier_windows`` test windows (Table 5); the parameter counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from .config import LMSweepConfig


def train_config(cfg: LMSweepConfig, width: int, variant: str, seed: int, lr: float, data_dir: str,
                 device: str = "cpu", model_overrides: Optional[dict[str, Any]] = None):
    """The ``TrainConfig`` of one job: the preset with the sweep's model, data and optimizer settings
    (``model_overrides``: more ``ModelConfig`` fields, the V1 diagnostic's one change per arm)."""
    from ..train.config import load_config
    return load_config(cfg.preset, {
        "model": {"attention": variant, "d_model": width, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                  "max_seq_len": max(cfg.seq_len, 8), **(model_overrides or {})},
        "data": {"prepared_dir": data_dir, "seq_len": cfg.seq_len, **({"sources": list(cfg.data)} if cfg.data else {})},
        "train": {"steps": cfg.steps, "batch_size": cfg.batch, "micro_batch_size": cfg.batch, "lr": lr,
                  "min_lr": lr * cfg.min_lr_ratio, "warmup_steps": cfg.warmup_steps, "seed": seed, "device": device,
                  "precision": "float32", "compile": False, "eval_every": cfg.steps},
        "log": {"tensorboard": False, "progress": False},
    })


def validation_halves(n_val: int, seq_len: int):
    """(tuning starts, test starts): the non-overlapping validation windows, even ones and odd ones."""
    import torch
    # each window needs seq_len + 1 tokens; the starts index the token memmap, on the host
    if n_val - seq_len <= seq_len:  # fewer than two starts (none at all when n_val <= seq_len)
        raise ValueError(f"the validation split ({n_val} tokens) holds fewer than two windows of {seq_len} tokens")
    starts = torch.arange(0, n_val - seq_len, seq_len, device="cpu")
    return starts[0::2], starts[1::2]


def check_windows(cfg: LMSweepConfig, num_tokens: dict[str, int]) -> None:
    """What every job would fail on, refused before the first (one line, exit code 2): a ``seq_len`` window that
    the training split cannot hold (the trainer's sampler), or fewer than two in the validation split (the two
    halves). ``num_tokens``: the prepared data's tokens per split."""
    from ..data.shards import WindowSampler
    try:
        WindowSampler(num_tokens["train"], cfg.seq_len, cfg.seed_base)
        validation_halves(num_tokens["val"], cfg.seq_len)
    except ValueError as e:
        raise ValueError(f"--seq-len {cfg.seq_len}: the prepared tokens of the preset {cfg.preset!r} cannot hold it "
                         f"({e}); "
                         "every job would fail: give a shorter --seq-len or a preset with more text") from None


def mean_loss(model, tokens, starts, seq_len: int, chunk: int = 32) -> float:
    """Mean next-token loss over the windows at ``starts`` (every window has seq_len targets: a token mean)."""
    import torch

    from ..data.shards import windows
    total = 0.0
    dev = next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, starts.numel(), chunk):
            s = starts[i:i + chunk]
            x, y = windows(tokens, s, seq_len)
            total += float(model(x.to(dev), y.to(dev)).loss) * s.numel()
    return total / starts.numel()


def unigram_floor(train_tokens, val_tokens, starts, seq_len: int, vocab: int) -> float:
    """Cross-entropy on the targets of the windows at ``starts`` of the training tokens' unigram distribution
    (add-one smoothed): the loss a model reaches without reading its context."""
    import numpy as np
    counts = np.bincount(np.asarray(train_tokens, dtype=np.int64), minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    targets = np.concatenate([np.asarray(val_tokens[s + 1:s + seq_len + 1], dtype=np.int64) for s in starts.tolist()])
    return float(-logp[targets].mean())


def non_embedding_parameters(model) -> int:
    """Parameters without the token embedding and the output head (Kaplan et al.'s count)."""
    return model.num_parameters() - model.tok_embeddings.weight.numel() - model.output.weight.numel()


def run_job(cfg_d: dict, data_dir: str, width: int, variant: str, seed: int, lr: float,
            device: str = "cpu") -> dict[str, Any]:
    """Train and measure one model (the module docstring), under the configured CPU code path, on ``device`` (the
    GPU this process was given, for "cuda"); the job runner gives it one torch thread."""
    return _run(LMSweepConfig.from_dict(cfg_d), data_dir, width, variant, seed, lr, device)


def _run(cfg: LMSweepConfig, data_dir: str, width: int, variant: str, seed: int, lr: float,
         device: str = "cpu", model_overrides: Optional[dict[str, Any]] = None,
         measure: Optional[Callable[[Any, Any], dict[str, Any]]] = None) -> dict[str, Any]:
    """``run_job``'s work; ``model_overrides`` and ``measure(model, windows)`` (more measures of the trained model on
    the outlier windows, added to the result) serve the V1 diagnostic (``diagnostic.py``)."""
    import torch

    from ..data.shards import read_prepared
    from ..eval.outliers import collect
    from ..jobs.codepath import check_code_path, cpu_model
    from ..train.distributed import DistInfo, pick_device
    from ..train.optim import build_optimizer
    from ..train.steps import autocast_for, new_model, new_sampler, optimizer_steps

    cap = check_code_path(cfg.cpu_code_path)
    tc = train_config(cfg, width, variant, seed, lr, data_dir, device, model_overrides)
    data = read_prepared(Path(data_dir), tc.data)
    if data is None:
        raise FileNotFoundError(f"{data_dir} holds no prepared data of the preset {cfg.preset!r}")
    info = DistInfo(device=pick_device(device, 0))  # the one place a device name becomes a device
    model = new_model(tc, info.device)  # the trainer's setup: the same seed, model, optimizer and windows
    opt = build_optimizer(model, tc.train)
    sampler = new_sampler(tc, data)
    autocast = autocast_for(info.device, "float32")
    val = data.tokens("val")
    tune, test = validation_halves(data.num_tokens["val"], cfg.seq_len)
    curve_steps, curve_loss, train_loss = [], [], []
    skipped, diverged = 0, False
    t0, c0 = time.perf_counter(), time.process_time()
    model.train()
    for st in optimizer_steps(model, model, opt, data, sampler, tc, info, autocast):  # ``train``'s loop
        skipped, diverged = st.skipped, st.diverged
        if diverged:
            break
        train_loss.append(st.loss)
        if st.done % cfg.eval_every == 0 or st.done == cfg.steps:  # the curve of Fig. 3b, between steps
            model.eval()
            curve_steps.append(st.done)
            curve_loss.append(mean_loss(model, val, test, cfg.seq_len))
            model.train()
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    model.eval()
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    out: dict[str, Any] = {
        "width": width, "variant": variant, "seed": seed, "lr": lr,
        "params": model.num_parameters(), "params_non_embedding": non_embedding_parameters(model),
        "tokens_per_step": cfg.batch * cfg.seq_len, "skipped_steps": skipped, "cpu_capability": cap,
        "cpu_model": cpu_model(),  # the same instruction set on another CPU model rounds differently
        "train_s": train_s, "train_cpu_s": train_cpu_s,
        # every 10th step's training loss (the journal stays small; the curve of record is the test half's)
        "train_loss": [x for i, x in enumerate(train_loss) if (i + 1) % 10 == 0],
        "floor": unigram_floor(data.tokens("train"), val, test, cfg.seq_len, tc.model.vocab_size),
    }
    if diverged or not finite:
        out.update(diverged=True, tune_loss=None, test_loss=None, outliers=None,
                   curve={"steps": curve_steps, "test_loss": curve_loss})
        return out
    from ..data.shards import windows
    x, _ = windows(val, test[:cfg.outlier_windows], cfg.seq_len)
    logit_stats, hidden_stats, _, _ = collect(model, x.to(info.device))
    out.update(diverged=False, tune_loss=mean_loss(model, val, tune, cfg.seq_len), test_loss=curve_loss[-1],
               curve={"steps": curve_steps, "test_loss": curve_loss},
               outliers={"attention_logit_top1": logit_stats["top1"], "hidden_state_top1": hidden_stats["top1"],
                         "attention_logit_median": logit_stats["median"],
                         "hidden_state_median": hidden_stats["median"]})
    if measure is not None:
        out.update(measure(model, x.to(info.device)))
    out["eval_s"] = time.perf_counter() - t0 - train_s
    if not all(math.isfinite(v) for v in (out["tune_loss"], out["test_loss"])):
        out.update(diverged=True, tune_loss=None, test_loss=None)
    return out
