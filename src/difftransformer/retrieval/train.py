"""Training one variant on the retrieval stream, with initialisation paired across variants.

Pairing (so that a difference between variants is the attention's, not the draw's): for seed s we build the
baseline under ``torch.manual_seed(s)`` and copy every same-name, same-shape tensor of it into the DIFF model of
seed s. That covers the embeddings, the SwiGLU FFNs, the RMSNorms and the LM head, and also the attention
projections whose shapes agree (V1: W_q, W_k, W_v, W_o all match, since h = H/2 heads of 2d; V2: W_k, W_v, W_o).
What stays the variant's own: V1's lambda vectors and head-wise norm, V2's wider W_q and W_lambda.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional, cast

import torch

from ..model import DiffTransformerLM, ModelConfig
from ..model import variants as registry
from ..model.config import Backend
from .config import RetrievalConfig
from .task import train_stream

# The training-loss thresholds of the retrieval diagnostic (retrieval/DIAGNOSTIC.md, "Learning slowly or
# failing"): the first step at which the mean answer loss of the last LOSS_WINDOW steps falls below each. ln 8 = 2.08
# is a model that knows the answer is a value but not which; below 1.0 it has started retrieving; 0.3, it has learned.
LOSS_THRESHOLDS = (1.0, 0.3)
LOSS_WINDOW = 25


def model_config(cfg: RetrievalConfig, variant: str, backend: Optional[Backend] = None,
                 overrides: Optional[dict[str, Any]] = None) -> ModelConfig:
    """The benchmark's model of ``variant``; ``overrides``: ModelConfig fields changed (a diagnostic arm's)."""
    return ModelConfig(vocab_size=cfg.layout.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
                       n_heads=cfg.n_heads, attention=variant, backend=backend or cast(Backend, cfg.backend),
                       max_seq_len=cfg.max_len(), **(overrides or {}))


def optimizer(cfg: RetrievalConfig, params, lr: float) -> torch.optim.Optimizer:
    """AdamW as PROTOCOL.md says (betas 0.9/0.98, the config's weight decay); fused on the CPU when configured."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay,
                             fused=cfg.fused_adamw or None)


def build_paired(cfg: RetrievalConfig, variant: str, seed: int,
                 overrides: Optional[dict[str, Any]] = None) -> tuple[DiffTransformerLM, list[str]]:
    """The model of ``variant`` (with ``overrides``) for ``seed``, and the names of the tensors copied from the seed's
    baseline."""
    torch.manual_seed(seed)
    base = DiffTransformerLM(model_config(cfg, registry.reference().name))
    if registry.variant(variant).reference:
        return base, [n for n, _ in base.state_dict().items()]
    torch.manual_seed(seed)
    model = DiffTransformerLM(model_config(cfg, variant, overrides=overrides))
    src = base.state_dict()
    copied = []
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name in src and src[name].shape == t.shape:
                t.copy_(src[name])
                copied.append(name)
    return model, copied


def answer_loss(model: DiffTransformerLM, b) -> torch.Tensor:
    """Mean NLL of the answer tokens: the output layer runs at the query positions only (``logits_at``), the same
    loss as the full forward with -100 targets elsewhere, without the (B, T, vocab) logits and their softmax."""
    logits = model(b.tokens, logits_at=b.query_pos).logits  # (B, Q, vocab)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), b.answers.flatten())


def lr_at(step: int, cfg: RetrievalConfig, lr: float) -> float:
    """Linear warmup, then cosine decay to 10% (the paper's recipe, Appendix D, in miniature)."""
    if step < cfg.warmup:
        return lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train_model(cfg: RetrievalConfig, variant: str, seed: int, lr: float, progress: bool = False,
                rows_only: bool = True, overrides: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Train and return {'model', 'params', 'losses' (every 25 steps), 'loss_thresholds' (``LOSS_THRESHOLDS``: the
    first step whose last-``LOSS_WINDOW``-steps mean loss is below each, None if never), 'train_s' (wall),
    'train_cpu_s' (this process's CPU time: on a shared box the wall time grows with the load, the CPU time much
    less), 'copied'}. ``rows_only=False``: every block at every position (the path before protocol version 3; bench
    retrieval). ``overrides``: ModelConfig fields changed (a diagnostic arm)."""
    model, copied = build_paired(cfg, variant, seed, overrides)
    model.rows_only_last_block = rows_only
    model.train()
    opt = optimizer(cfg, model.parameters(), lr)
    stream = train_stream(cfg, seed)
    losses: list[list[float]] = []
    window: list[float] = []
    first_below: dict[str, Optional[int]] = {f"{t:g}": None for t in LOSS_THRESHOLDS}
    t0, c0 = time.perf_counter(), time.process_time()
    bar = None
    if progress:
        from ..log import progress_bar
        bar = progress_bar(total=cfg.steps, desc=f"{variant} s{seed} lr{lr:g}", leave=False)
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg, lr)
        b = next(stream)
        loss = answer_loss(model, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        window = [*window[-(LOSS_WINDOW - 1):], value]
        if len(window) == LOSS_WINDOW:
            mean = sum(window) / LOSS_WINDOW
            for t in LOSS_THRESHOLDS:
                if first_below[f"{t:g}"] is None and mean < t:
                    first_below[f"{t:g}"] = step
        if step % 25 == 0 or step == cfg.steps - 1:
            losses.append([step, value])
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    model.eval()
    return {"model": model, "params": model.num_parameters(), "losses": losses, "loss_thresholds": first_below,
            "final_window_loss": sum(window) / len(window),
            "train_s": time.perf_counter() - t0, "train_cpu_s": time.process_time() - c0, "copied": copied}
