"""Evaluation of one trained model on the SAME queries as every other model (fixed generator seeds per condition).

* accuracy per condition (Table 2 / Fig. 5): argmax over the whole vocabulary at each query position, and on
  held-out contexts of the training distribution (the floor: below ``cfg.floor`` the run is a training failure);
* at the primary condition, the answering query's attention on the answer's position (Table 3), from the eager
  maps: the softmax map for the baseline, the differential map A1 - lambda*A2 for DIFF, as the scale-free
  ``answer_share`` of ``eval.attention_mass`` (DIFF rows sum to 1 - lambda; raw numbers reported beside). The
  pre-registered attention endpoint is ``attention_endpoint``: per query, the best head's answer share in each
  layer, averaged over layers, then over queries -- a number that does not grow with the head count (the
  baseline has twice V1's heads; a head mean would dilute the one head that retrieves);
* top-1 / top-10 / median |attention logit| and |hidden state| (Table 5), with ``eval.outliers.TopAbs``;
* accuracy with attention logits quantised (Fig. 8) at the primary condition, with
  ``eval.quantized.quantized_attention`` -- imported, not copied: if that module moves, fix this import;
* one query's attention row per layer (Fig. 1).
"""

from __future__ import annotations

from typing import Any

import torch

from ..eval.attention_mass import attention_shares
from ..eval.outliers import TopAbs
from ..eval.quantized import quantized_attention  # Fig. 8 hook; see the module docstring if this import breaks
from .config import RetrievalConfig
from .task import Batch, condition_batch, eval_rng, training_distribution_batches

CHUNK = 16  # contexts per eager forward: bounds the (B, heads, T, T) maps to tens of MB


def score(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """(B, Q) bool: the argmax over the whole vocabulary at each query position is the expected value token;
    ``logits`` (B, Q, vocab) at the query positions (``model(tokens, logits_at=batch.query_pos)``)."""
    return logits.argmax(-1) == batch.answers


def _chunks(b: Batch):
    return (b.rows(i, i + CHUNK) for i in range(0, b.tokens.shape[0], CHUNK))


@torch.no_grad()
def hits(model, batches) -> torch.Tensor:
    """(N,) bool over every query of ``batches`` (one Batch or a list)."""
    batches = [batches] if isinstance(batches, Batch) else batches
    return torch.cat([score(model(c.tokens, logits_at=c.query_pos).logits, c).flatten()
                      for b in batches for c in _chunks(b)])


def accuracy(model, batches) -> float:
    return float(hits(model, batches).float().mean())


@torch.no_grad()
def attention_metrics(model, batch: Batch) -> dict[str, Any]:
    """The answering queries' scale-free attention at ``batch``: ``attention_endpoint`` (module docstring) and, per
    layer, the head-mean shares and raw masses (descriptive)."""
    per_layer: list[dict[str, list]] = []
    best: list[torch.Tensor] = []  # per chunk: (b, Q, layers) best head's answer share
    for c in _chunks(batch):
        out = model(c.tokens, return_maps=True)
        T = c.tokens.shape[1]
        keys = torch.arange(T, device=c.tokens.device)
        answer = keys[None, None, :] == c.answer_pos[..., None]  # (b, Q, T)
        if not per_layer:
            per_layer = [dict() for _ in out.maps]
        layer_best = []
        for layer, m in enumerate(out.maps):
            # (b, heads, T, T) -> the query rows (b, heads, Q, T) -> (b, Q, heads, T)
            rows = m.attn.gather(2, c.query_pos[:, None, :, None].expand(-1, m.attn.shape[1], -1, T)).transpose(1, 2)
            s = attention_shares(rows, answer[:, :, None, :], c.context_mask)  # each (b, Q, heads)
            layer_best.append(s["answer_share"].nan_to_num(float("-inf")).amax(-1))  # (b, Q)
            for k, v in s.items():
                per_layer[layer].setdefault(k, []).append(v.mean(-1).flatten())  # head mean, one per query
        best.append(torch.stack(layer_best, -1))
    b = torch.cat([x.flatten(0, 1) for x in best])  # (N, layers)
    b = torch.where(torch.isinf(b), torch.nan, b)
    return {"attention_endpoint": float(b.nanmean(-1).nanmean()),
            "best_head_share_per_layer": [float(x) for x in b.nanmean(0)],
            # nanmean: a row with nothing on the context has undefined shares (see attention_mass)
            "attention": [{k: float(torch.cat(v).nanmean()) for k, v in d.items()} for d in per_layer]}


@torch.no_grad()
def outlier_stats(model, batch: Batch) -> dict[str, Any]:
    """Table 5 on the given contexts: |attention logits| of every softmax map, |hidden| after each block."""
    logits, hidden = TopAbs(), TopAbs()
    for i in range(0, batch.tokens.shape[0], CHUNK):
        out = model(batch.tokens[i:i + CHUNK], return_maps=True, return_hidden=True)
        for m in out.maps:
            logits.add(m.logits)
        for h in out.hidden_states[1:]:
            hidden.add(h)
    pick = ("top1", "top10", "median")
    lr, hr = logits.result(), hidden.result()
    return {"attention_logits": {k: lr[k] for k in pick}, "hidden_states": {k: hr[k] for k in pick}}


@torch.no_grad()
def example_row(model, batch: Batch, fact_base: int) -> dict[str, Any]:
    """Fig. 1: the first context's first query, its head-mean attention row per layer over the whole prefix,
    with the positions of the other facts (the distractors) and whether the model answered it right."""
    c = batch.rows(0, 1)
    qp = int(c.query_pos[0, 0])
    out = model(c.tokens[:, :qp + 1], return_maps=True)
    rows = [m.attn[0, :, qp, :].mean(0).tolist() for m in out.maps]  # per layer: (qp+1,)
    toks = c.tokens[0, :qp + 1]
    ap = int(c.answer_pos[0, 0])
    facts = [i for i in range(1, c.context_end) if int(toks[i]) >= fact_base and i != ap]
    return {"rows": rows, "answer_pos": ap, "distractor_fact_pos": facts, "context_end": c.context_end,
            "query_pos": qp, "tokens": toks.tolist(),
            "correct": bool(out.logits[0, qp].argmax() == c.answers[0, 0])}


def evaluate_model(model, cfg: RetrievalConfig, with_extras: bool = True) -> dict[str, Any]:
    """Every condition and the training distribution on the test split; at the primary condition the attention
    endpoint, and (with_extras) outliers, quantisation and the example row."""
    model.eval()
    res: dict[str, Any] = {"conditions": {}}
    batches = {c.name: condition_batch(cfg, c, cfg.eval_contexts, eval_rng(cfg, "test", c.name))
               for c in cfg.conditions}
    for c in cfg.conditions:
        h = hits(model, batches[c.name])
        res["conditions"][c.name] = {"accuracy": float(h.float().mean()), "n_queries": int(h.numel()),
                                     "n_contexts": cfg.eval_contexts, "pairs": c.pairs, "context": c.context,
                                     "seq_len": int(batches[c.name].tokens.shape[1])}
    res["conditions"][cfg.primary].update(attention_metrics(model, batches[cfg.primary]))
    dist = hits(model, training_distribution_batches(cfg, "test", cfg.eval_contexts))
    res["training_distribution"] = {"accuracy": float(dist.float().mean()), "n_queries": int(dist.numel())}
    res["failed"] = res["training_distribution"]["accuracy"] < cfg.floor
    if not with_extras:
        return res
    prim = batches[cfg.primary]
    res["outliers"] = outlier_stats(model, prim)
    rows = [{"bits": None, "accuracy": res["conditions"][cfg.primary]["accuracy"]}]
    for bits in cfg.quant_bits:
        with quantized_attention(model, bits):
            rows.append({"bits": bits, "accuracy": accuracy(model, prim)})
    res["quantized"] = {cfg.primary: rows}
    res["example_row"] = example_row(model, prim, cfg.layout.fact(0, 0))
    return res


@torch.no_grad()
def validation(model, cfg: RetrievalConfig) -> dict[str, float]:
    """The lr choice's measures, on the validation generator seed: accuracy and answer NLL at the PRIMARY condition
    (not saturated, unlike the training distribution, where every variant reaches ~1.0), and the training
    distribution's accuracy (a floor check for the tuning runs)."""
    b = condition_batch(cfg, cfg.condition(cfg.primary), cfg.val_contexts, eval_rng(cfg, "val", cfg.primary))
    ok, nll = [], []
    for c in _chunks(b):
        lg = model(c.tokens, logits_at=c.query_pos).logits.float()  # (b, Q, V)
        ok.append(score(lg, c).flatten())
        nll.append(torch.nn.functional.cross_entropy(lg.flatten(0, 1), c.answers.flatten(), reduction="none"))
    return {"val_accuracy": float(torch.cat(ok).float().mean()), "val_loss": float(torch.cat(nll).mean()),
            "val_training_distribution": accuracy(model, training_distribution_batches(cfg, "val", cfg.val_contexts))}


DYNAMICS_CONTEXTS = 32  # validation contexts of the primary condition that ``head_dynamics`` reads


@torch.no_grad()
def head_dynamics(model, cfg: RetrievalConfig) -> list[dict[str, Any]]:
    """Per layer, on the first ``DYNAMICS_CONTEXTS`` validation contexts of the primary condition (every position):
    lambda (DIFF V1 and V2's scalar form: the layer's one value; V2: the mean and the standard deviation over tokens
    and heads of sigmoid(W_lambda x)), and each head's output RMS over its channels before any head-wise norm or fixed
    multiplier (mean over tokens), the retrieval diagnostic's records (retrieval/DIAGNOSTIC.md)."""
    b = condition_batch(cfg, cfg.condition(cfg.primary), DYNAMICS_CONTEXTS, eval_rng(cfg, "val", cfg.primary))
    seen: dict[int, torch.Tensor] = {}
    lam_in: dict[int, torch.Tensor] = {}
    handles = []
    for i, block in enumerate(model.layers):
        attn = block.attn
        handles.append(attn.register_forward_pre_hook(lambda m, a, i=i: lam_in.__setitem__(i, a[0])))
        norm = getattr(attn, "subln", None)
        if norm is not None:  # (B, h, T, dv): the heads before the norm
            handles.append(norm.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0])))
        else:  # wo's input (B, T, h*dv) over the fixed multiplier: the heads as the attention made them
            handles.append(attn.wo.register_forward_pre_hook(
                lambda m, a, i=i, attn=attn: seen.__setitem__(i, (a[0] / attn.output_scale()).view(
                    *a[0].shape[:-1], attn.n_heads, -1).transpose(1, 2))))
    try:
        model(b.tokens)
    finally:
        for h in handles:
            h.remove()
    out = []
    for i, block in enumerate(model.layers):
        attn, heads = block.attn, seen[i].float()
        row: dict[str, Any] = {"layer": i, "head_rms": heads.pow(2).mean(-1).sqrt().mean((0, 2)).tolist()}
        static = attn.static_lambda()
        values = getattr(attn, "lambda_values", None)
        if static is not None:
            row.update(lambda_mean=float(static), lambda_sd=0.0)
        elif values is not None:
            lam = values(lam_in[i])
            if lam is not None:
                row.update(lambda_mean=float(lam.float().mean()), lambda_sd=float(lam.float().std()))
        if hasattr(attn, "lambda_init"):
            row["lambda_init"] = float(attn.lambda_init)
        out.append(row)
    return out
