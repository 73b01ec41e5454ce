"""Evaluation of one trained model on the SAME queries as every other model (fixed generator seeds per condition).

* accuracy per condition (Table 2 / Fig. 5): argmax over the whole vocabulary at each query position;
* per layer, the answering query's attention on the answer's position vs the rest of the context (Table 3), from
  the eager maps: the softmax map for the baseline, the differential map A1 - lambda*A2 for DIFF, measured with the
  scale-free shares of ``eval.attention_mass`` (DIFF rows sum to 1 - lambda; raw numbers reported beside);
* top-1 / top-10 / median |attention logit| and |hidden state| (Table 5), with ``eval.outliers.TopAbs``;
* accuracy with attention logits quantised to 16/8/6/4 bits (Fig. 8), with ``eval.quantized.quantized_attention``
  -- imported, not copied: if that module moves, fix this import (the only coupling to the eval package's layout);
* one query's attention row per layer (Fig. 1).
"""

from __future__ import annotations

from typing import Any

import torch

from ..eval.attention_mass import attention_shares
from ..eval.outliers import TopAbs
from ..eval.quantized import quantized_attention  # Fig. 8 hook; see the module docstring if this import breaks
from .config import RetrievalConfig
from .task import Batch, condition_batch, eval_rng

CHUNK = 16  # contexts per eager forward: bounds the (B, heads, T, T) maps to tens of MB


def query_logits(logits: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), query_pos (B, Q) -> (B, Q, V): the prediction made at each query token."""
    return logits.gather(1, query_pos[..., None].expand(-1, -1, logits.shape[-1]))


def score(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """(B, Q) bool: the argmax over the whole vocabulary is the expected value token."""
    return query_logits(logits, batch.query_pos).argmax(-1) == batch.answers


def sub_batch(b: Batch, i: int, j: int) -> Batch:
    return Batch(b.tokens[i:j], b.targets[i:j], b.query_pos[i:j], b.answer_pos[i:j], b.answers[i:j], b.keys[i:j],
                 b.context_end, b.n_pairs, b.filler)


@torch.no_grad()
def accuracy(model, batch: Batch) -> float:
    hits = torch.cat([score(model(c.tokens).logits, c).flatten()
                      for c in (sub_batch(batch, i, i + CHUNK) for i in range(0, batch.tokens.shape[0], CHUNK))])
    return float(hits.float().mean())


@torch.no_grad()
def condition_metrics(model, batch: Batch, with_maps: bool = True) -> dict[str, Any]:
    """Accuracy and (with_maps) per-layer attention shares of the answering queries."""
    hits, per_layer = [], None
    for i in range(0, batch.tokens.shape[0], CHUNK):
        c = sub_batch(batch, i, i + CHUNK)
        out = model(c.tokens, return_maps=with_maps)
        hits.append(score(out.logits, c).flatten())
        if not with_maps:
            continue
        T = c.tokens.shape[1]
        keys = torch.arange(T)
        context = c.context_mask  # (T,)
        answer = keys[None, None, :] == c.answer_pos[..., None]  # (b, Q, T)
        if per_layer is None:
            per_layer = [dict() for _ in out.maps]
        for l, m in enumerate(out.maps):
            # (b, heads, T, T) -> the query rows (b, heads, Q, T) -> (b, Q, heads, T)
            rows = m.attn.gather(2, c.query_pos[:, None, :, None].expand(-1, m.attn.shape[1], -1, T)).transpose(1, 2)
            s = attention_shares(rows, answer[:, :, None, :], context)  # each (b, Q, heads)
            s["best_head_answer_share"] = s["answer_share"].amax(-1, keepdim=True)
            for k, v in s.items():
                per_layer[l].setdefault(k, []).append(v.mean(-1).flatten())  # head mean, one per query
    r: dict[str, Any] = {"accuracy": float(torch.cat(hits).float().mean()), "n_queries": int(torch.cat(hits).numel()),
                         "n_contexts": int(batch.tokens.shape[0]), "pairs": batch.n_pairs, "filler": batch.filler,
                         "seq_len": int(batch.tokens.shape[1])}
    if per_layer is not None:
        # nanmean: a row with nothing on the context has undefined shares (see attention_mass)
        r["attention"] = [{k: float(torch.cat(v).nanmean()) for k, v in d.items()} for d in per_layer]
    return r


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
    c = sub_batch(batch, 0, 1)
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
    """Every condition on the test split; outliers, quantisation and the example row on top when with_extras."""
    model.eval()
    res: dict[str, Any] = {"conditions": {}}
    batches = {c.name: condition_batch(cfg, c, cfg.eval_contexts, eval_rng(cfg, "test", c.name))
               for c in cfg.conditions}
    for name, b in batches.items():
        res["conditions"][name] = condition_metrics(model, b)
    if not with_extras:
        return res
    res["outliers"] = outlier_stats(model, batches[cfg.conditions[0].name])
    quant = {}
    for name in cfg.quant_conditions:
        rows = [{"bits": None, "accuracy": res["conditions"][name]["accuracy"]}]
        for bits in cfg.quant_bits:
            with quantized_attention(model, bits):
                rows.append({"bits": bits, "accuracy": accuracy(model, batches[name])})
        quant[name] = rows
    res["quantized"] = quant
    res["example_row"] = example_row(model, batches[cfg.primary], cfg.layout.fact(0, 0))
    return res


@torch.no_grad()
def validation(model, cfg: RetrievalConfig) -> dict[str, float]:
    """Accuracy and answer loss (mean NLL of the value tokens) at the training condition on the held-out
    validation generator seed. The lr is chosen on the loss: accuracy saturates at 1.0 there (measured: every
    variant 0.99-1.00 at both lrs), the loss still separates them; the harder conditions stay untouched."""
    from .config import Condition
    b = condition_batch(cfg, Condition("train", 1, 1, cfg.distractors), cfg.val_contexts,
                        eval_rng(cfg, "val", "train"))
    hits, nll = [], []
    for i in range(0, b.tokens.shape[0], CHUNK):
        c = sub_batch(b, i, i + CHUNK)
        lg = query_logits(model(c.tokens).logits, c.query_pos).float()  # (b, Q, V)
        hits.append((lg.argmax(-1) == c.answers).flatten())
        nll.append(torch.nn.functional.cross_entropy(lg.flatten(0, 1), c.answers.flatten(), reduction="none"))
    return {"val_accuracy": float(torch.cat(hits).float().mean()), "val_loss": float(torch.cat(nll).mean())}
