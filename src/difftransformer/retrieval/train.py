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
from collections.abc import Sequence
from typing import Any, Optional, cast

import torch
import torch.nn.functional as F

from ..model import DiffTransformerLM, ModelConfig
from ..model import variants as registry
from ..model.config import Backend
from .config import RetrievalConfig
from .task import Batch, train_stream


def model_config(cfg: RetrievalConfig, variant: str, backend: Optional[Backend] = None) -> ModelConfig:
    return ModelConfig(vocab_size=cfg.layout.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
                       n_heads=cfg.n_heads, attention=variant, backend=backend or cast(Backend, cfg.backend),
                       max_seq_len=cfg.max_len())


def optimizer(cfg: RetrievalConfig, params, lr: float) -> torch.optim.Optimizer:
    """AdamW as PROTOCOL.md says (betas 0.9/0.98, the config's weight decay); fused on the CPU when configured."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay,
                             fused=cfg.fused_adamw or None)


def build_paired(cfg: RetrievalConfig, variant: str, seed: int) -> tuple[DiffTransformerLM, list[str]]:
    """The model of ``variant`` for ``seed``, and the names of the tensors copied from the seed's baseline."""
    torch.manual_seed(seed)
    base = DiffTransformerLM(model_config(cfg, registry.reference().name))
    if registry.variant(variant).reference:
        return base, [n for n, _ in base.state_dict().items()]
    torch.manual_seed(seed)
    model = DiffTransformerLM(model_config(cfg, variant))
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
                rows_only: bool = True) -> dict[str, Any]:
    """Train and return {'model', 'params', 'losses' (every 25 steps), 'train_s' (wall), 'train_cpu_s' (this
    process's CPU time: on a shared box the wall time grows with the load, the CPU time much less), 'copied'}.
    ``rows_only=False``: every block at every position (the path before protocol version 3; bench retrieval)."""
    model, copied = build_paired(cfg, variant, seed)
    model.rows_only_last_block = rows_only
    model.train()
    opt = optimizer(cfg, model.parameters(), lr)
    stream = train_stream(cfg, seed)
    losses = []
    t0, c0 = time.perf_counter(), time.process_time()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=cfg.steps, desc=f"{variant} s{seed} lr{lr:g}", leave=False)
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg, lr)
        b = next(stream)
        loss = answer_loss(model, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == cfg.steps - 1:
            losses.append([step, float(loss.detach())])
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    model.eval()
    return {"model": model, "params": model.num_parameters(), "losses": losses,
            "train_s": time.perf_counter() - t0, "train_cpu_s": time.process_time() - c0, "copied": copied}


def stacked_batch(batches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The members' batches as one: (tokens (S*B, T_max), query_pos (S*B, Q), answers (S*B, Q)). A shorter
    member's sequences are padded on the right with BOS: under causal attention no real position sees a pad, and
    the answers are read at the query positions only, so the padding changes nothing but the work."""
    T = max(b.tokens.shape[1] for b in batches)
    tokens = torch.cat([F.pad(b.tokens, (0, T - b.tokens.shape[1]), value=0) for b in batches])
    return tokens, torch.cat([b.query_pos for b in batches]), torch.cat([b.answers for b in batches])


def train_group(cfg: RetrievalConfig, variant: str, seeds: Sequence[int], lr: float) -> dict[str, Any]:
    """Train the models of ``variant`` for ``seeds`` at ``lr`` as ONE stacked model (``train/stacked.py``): each
    member with its own paired initialisation and training stream, exactly as ``train_model`` trains it alone
    except for float rounding. Returns {'models' (plain models, eval mode), 'params', 'losses' (per member),
    'copied', 'train_s', 'train_cpu_s'} (the times are the group's)."""
    from ..train.stacked import clip_grad_norm_per_member, member_model, stack_models
    built = [build_paired(cfg, variant, s) for s in seeds]
    model = stack_models([m for m, _ in built])
    del built[1:]
    model.train()
    S = len(seeds)
    opt = optimizer(cfg, model.parameters(), lr)
    streams = [train_stream(cfg, s) for s in seeds]
    losses: list[list[list[float]]] = [[] for _ in seeds]
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg, lr)
        tokens, query_pos, answers = stacked_batch([next(st) for st in streams])
        logits = model(tokens, logits_at=query_pos).logits  # (S*B, Q, vocab)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), answers.flatten(), reduction="none")
        per_member = nll.view(S, -1).mean(1)  # (S,): each member's mean answer loss, as answer_loss alone
        opt.zero_grad(set_to_none=True)
        per_member.sum().backward()  # members share no parameter: each gets its own loss's gradient
        clip_grad_norm_per_member(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == cfg.steps - 1:
            for i, x in enumerate(per_member.detach().tolist()):
                losses[i].append([step, x])
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    models = [member_model(model, i) for i in range(S)]
    return {"models": models, "params": models[0].num_parameters(), "losses": losses, "copied": built[0][1],
            "train_s": train_s, "train_cpu_s": train_cpu_s}
