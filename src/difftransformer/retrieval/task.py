"""Token-level key-value retrieval contexts (no BPE, no prose): the lookup behind paper Fig. 1 / Table 2 / Fig. 5.

One sequence::

    BOS  c_1 .. c_{P+F}  q_{k1} v_{k1}  q_{k2} v_{k2} ...   (facts and filler shuffled in the context)

where each fact c = fact(k, v) is ONE token, q_k asks for key k and v_k is the value token it must be answered
by. The model reads ``tokens[:, :-1]``; ``targets`` holds the value id at each query position and -100 elsewhere,
so the loss (and the accuracy) is on the answers only. Deterministic per ``seed`` (numpy PCG64).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from .config import Condition, Layout, RetrievalConfig


@dataclass
class Batch:
    tokens: torch.Tensor  # (B, T) model input (the full sequence without its last token)
    targets: torch.Tensor  # (B, T) value id at query positions, -100 elsewhere
    query_pos: torch.Tensor  # (B, Q) position of each query token (it predicts the answer)
    answer_pos: torch.Tensor  # (B, Q) position in the context of the fact that answers it
    answers: torch.Tensor  # (B, Q) the value token id expected
    pairs: torch.Tensor  # (B,) facts in each context
    context_end: int  # positions [1, context_end) are the context (facts + filler); 0 is BOS

    @property
    def context_mask(self) -> torch.Tensor:
        """(T,) True on context keys (facts and filler), False on BOS and the query/answer section."""
        pos = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return (pos >= 1) & (pos < self.context_end)

    def rows(self, i: int, j: int) -> Batch:
        """Contexts i..j-1."""
        return Batch(self.tokens[i:j], self.targets[i:j], self.query_pos[i:j], self.answer_pos[i:j],
                     self.answers[i:j], self.pairs[i:j], self.context_end)


def make_batch(layout: Layout, n_contexts: int, pairs, context: int, queries: int, distractors: str,
               key_group: int, rng: np.random.Generator) -> Batch:
    """``n_contexts`` sequences of ``context`` tokens each: ``pairs`` facts (an int, or one per context) among
    filler, then ``queries`` of the facts' keys asked (distinct, in random order)."""
    B, C, Q = n_contexts, context, queries
    P = np.broadcast_to(np.asarray(pairs, dtype=np.int64), (B,)).copy()  # (B,) facts per context
    Pmax = int(P.max())
    if Pmax > layout.n_keys or Pmax > C or int(P.min()) < Q:
        raise ValueError(f"pairs {int(P.min())}..{Pmax} must lie in [queries={Q}, min(n_keys={layout.n_keys}, "
                         f"context={C})]")
    if distractors == "random":
        keys = np.argsort(rng.random((B, layout.n_keys)), axis=1)[:, :Pmax]  # (B, Pmax) distinct keys
    elif distractors == "near":
        # every key of a context from one group: each asked key among its near-duplicates
        if Pmax > key_group:
            raise ValueError(f"'near' contexts need pairs={Pmax} <= key_group={key_group}")
        group = rng.integers(0, layout.n_keys // key_group, size=(B, 1))
        keys = group * key_group + np.argsort(rng.random((B, key_group)), axis=1)[:, :Pmax]
    else:
        raise ValueError(f"distractors={distractors!r} is not allowed; choose one of random, near")
    values = rng.integers(0, layout.n_values, size=(B, Pmax))  # (B, Pmax)
    facts = np.zeros((B, C), dtype=np.int64)
    facts[:, :Pmax] = layout.fact(keys, values)
    fill = layout.filler_base() + rng.integers(0, layout.n_filler, size=(B, C))  # (B, C)
    is_fact = np.arange(C)[None, :] < P[:, None]  # (B, C): items 0..P-1 are the facts, the rest filler
    ctx = np.where(is_fact, facts, fill)
    perm = np.argsort(rng.random((B, C)), axis=1)  # ctx position j holds unshuffled item perm[j]
    ctx = np.take_along_axis(ctx, perm, axis=1)
    where = np.argsort(perm, axis=1)[:, :Pmax] + 1  # (B, Pmax) sequence position of fact i (+1 for BOS)
    order = rng.random((B, Pmax)) + (np.arange(Pmax)[None, :] >= P[:, None])  # absent facts sort last
    asked = np.argsort(order, axis=1)[:, :Q]  # (B, Q) which facts are asked, in order
    q_keys = np.take_along_axis(keys, asked, axis=1)
    q_vals = np.take_along_axis(values, asked, axis=1)
    qa = np.stack([layout.query(q_keys), layout.value(q_vals)], axis=2).reshape(B, 2 * Q)  # (B, Q, 2) -> (B, 2Q)
    seq = np.concatenate([np.full((B, 1), layout.bos), ctx, qa], axis=1)  # (B, 1 + C + 2Q)
    ctx_end = 1 + C
    query_pos = ctx_end + 2 * np.arange(Q)[None, :].repeat(B, 0)  # (B, Q)
    # as_tensor, not from_numpy: on the CPU the same tensors (no copy); under a job's default device (--device
    # cuda, retrieval/benchmark.py) they are made on the GPU
    tokens = torch.as_tensor(seq[:, :-1].astype(np.int64))
    answers = torch.as_tensor(layout.value(q_vals).astype(np.int64))
    targets = torch.full_like(tokens, -100)
    targets.scatter_(1, torch.as_tensor(query_pos), answers)
    return Batch(tokens=tokens, targets=targets, query_pos=torch.as_tensor(query_pos),
                 answer_pos=torch.as_tensor(np.take_along_axis(where, asked, axis=1)), answers=answers,
                 pairs=torch.as_tensor(P), context_end=ctx_end)


def condition_batch(cfg: RetrievalConfig, cond: Condition, n_contexts: int, rng: np.random.Generator) -> Batch:
    """A batch of the test condition ``cond``: its pairs and context length, ``cfg.queries`` keys asked."""
    return make_batch(cfg.layout, n_contexts, cond.pairs, cond.context, cfg.queries, cond.distractors,
                      cfg.key_group, rng)


def training_batch(cfg: RetrievalConfig, n_contexts: int, rng: np.random.Generator) -> Batch:
    """One batch of the training distribution: a context length drawn for the batch, the facts per example."""
    lo, hi = cfg.train_context
    C = int(rng.integers(lo, hi + 1))
    P = rng.integers(cfg.train_pairs[0], min(cfg.train_pairs[1], C) + 1, size=n_contexts)
    return make_batch(cfg.layout, n_contexts, P, C, cfg.queries, cfg.distractors, cfg.key_group, rng)


def train_stream(cfg: RetrievalConfig, seed: int):
    """The training stream of seed ``seed``: the SAME batches, in the same order, for every variant and lr.

    Seeds differ in data as well as in initialisation, so the spread over seeds covers both.
    """
    rng = np.random.default_rng([cfg.data_seed, seed])
    while True:
        yield training_batch(cfg, cfg.batch, rng)


def stream_key(name: str) -> int:
    """A 64-bit integer from a condition's name (SHA-256): distinct names give distinct example streams (a sum of
    character codes, used before, gave anagrams such as p1f2 and p2f1 the same stream)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def eval_rng(cfg: RetrievalConfig, split: str, cond_name: str = "") -> np.random.Generator:
    """Held-out generator seeds: "val" (data_seed+1, for the lr choice) and "test" (data_seed+2), per condition."""
    offset = {"val": 1, "test": 2}[split]
    return np.random.default_rng([cfg.data_seed + offset, stream_key(cond_name)])


def training_distribution_batches(cfg: RetrievalConfig, split: str, n_contexts: int, chunk: int = 16) -> list[Batch]:
    """Held-out contexts of the training distribution (the floor check): ``n_contexts`` in batches of ``chunk``,
    each batch with its own drawn context length, as in training."""
    rng = eval_rng(cfg, split, "training distribution")
    return [training_batch(cfg, min(chunk, n_contexts - i), rng) for i in range(0, n_contexts, chunk)]
