"""Token-level key-value retrieval contexts (no BPE, no prose): the lookup behind paper Fig. 1 / Table 2 / Fig. 5.

One sequence::

    BOS  c_1 .. c_{P+F}  q_{k1} v_{k1}  q_{k2} v_{k2} ...   (facts and filler shuffled in the context)

where each fact c = fact(k, v) is ONE token, q_k asks for key k and v_k is the value token it must be answered
by. The model reads ``tokens[:, :-1]``; ``targets`` holds the value id at each query position and -100 elsewhere,
so the loss (and the accuracy) is on the answers only. Deterministic per ``seed`` (numpy PCG64).
"""

from __future__ import annotations

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
    keys: torch.Tensor  # (B, P) the keys of the context's facts, in fact order
    context_end: int  # positions [1, context_end) are the context (facts + filler); 0 is BOS
    n_pairs: int
    filler: int

    @property
    def context_mask(self) -> torch.Tensor:
        """(T,) True on context keys (facts and filler), False on BOS and the query/answer section."""
        pos = torch.arange(self.tokens.shape[1])
        return (pos >= 1) & (pos < self.context_end)


def make_batch(layout: Layout, n_contexts: int, n_pairs: int, filler: int, queries: int, distractors: str,
               key_group: int, rng: np.random.Generator) -> Batch:
    """``n_contexts`` sequences of ``n_pairs`` facts among ``filler`` filler tokens, ``queries`` asked (0: all)."""
    B, P, F = n_contexts, n_pairs, filler
    Q = queries or P
    if P > layout.n_keys:
        raise ValueError(f"n_pairs={P} exceeds the {layout.n_keys} keys of the vocabulary")
    if distractors == "random":
        keys = np.argsort(rng.random((B, layout.n_keys)), axis=1)[:, :P]  # (B, P) distinct keys
    elif distractors == "near":
        # every key of a context from one group: each asked key among its near-duplicates
        if P > key_group:
            raise ValueError(f"'near' contexts need n_pairs={P} <= key_group={key_group}")
        group = rng.integers(0, layout.n_keys // key_group, size=(B, 1))
        keys = group * key_group + np.argsort(rng.random((B, key_group)), axis=1)[:, :P]
    else:
        raise ValueError(f"distractors={distractors!r} is not allowed; choose one of random, near")
    values = rng.integers(0, layout.n_values, size=(B, P))  # (B, P)
    facts = layout.fact(keys, values)  # (B, P)
    fill = layout.filler_base() + rng.integers(0, layout.n_filler, size=(B, F))  # (B, F)
    ctx = np.concatenate([facts, fill], axis=1)  # (B, P+F), facts first
    perm = np.argsort(rng.random((B, P + F)), axis=1)  # ctx position j holds unshuffled item perm[j]
    ctx = np.take_along_axis(ctx, perm, axis=1)
    where = np.argsort(perm, axis=1)[:, :P] + 1  # (B, P) sequence position of fact i (+1 for BOS)
    asked = np.argsort(rng.random((B, P)), axis=1)[:, :Q]  # (B, Q) which facts are asked, in order
    q_keys = np.take_along_axis(keys, asked, axis=1)
    q_vals = np.take_along_axis(values, asked, axis=1)
    qa = np.stack([layout.query(q_keys), layout.value(q_vals)], axis=2).reshape(B, 2 * Q)  # (B, Q, 2) -> (B, 2Q)
    seq = np.concatenate([np.full((B, 1), layout.bos), ctx, qa], axis=1)  # (B, 1 + P + F + 2Q)
    ctx_end = 1 + P + F
    query_pos = ctx_end + 2 * np.arange(Q)[None, :].repeat(B, 0)  # (B, Q)
    tokens = torch.from_numpy(seq[:, :-1].astype(np.int64))
    targets = torch.full_like(tokens, -100)
    targets.scatter_(1, torch.from_numpy(query_pos), torch.from_numpy(layout.value(q_vals).astype(np.int64)))
    return Batch(tokens=tokens, targets=targets, query_pos=torch.from_numpy(query_pos),
                 answer_pos=torch.from_numpy(np.take_along_axis(where, asked, axis=1)),
                 answers=torch.from_numpy(layout.value(q_vals).astype(np.int64)),
                 keys=torch.from_numpy(keys.astype(np.int64)), context_end=ctx_end, n_pairs=P, filler=F)


def condition_batch(cfg: RetrievalConfig, cond: Condition, n_contexts: int, rng: np.random.Generator) -> Batch:
    """A batch of the test condition ``cond`` (the training condition scaled by its multipliers); all keys asked."""
    return make_batch(cfg.layout, n_contexts, cfg.n_pairs * cond.pairs_mult, cfg.filler * cond.filler_mult, 0,
                      cond.distractors, cfg.key_group, rng)


def train_stream(cfg: RetrievalConfig, seed: int):
    """The training stream of seed ``seed``: the SAME batches, in the same order, for every variant and lr.

    Seeds differ in data as well as in initialisation, so the spread over seeds covers both.
    """
    rng = np.random.default_rng([cfg.data_seed, seed])
    while True:
        yield make_batch(cfg.layout, cfg.batch, cfg.n_pairs, cfg.filler, cfg.queries, cfg.distractors,
                         cfg.key_group, rng)


def eval_rng(cfg: RetrievalConfig, split: str, cond_name: str = "") -> np.random.Generator:
    """Held-out generator seeds: "val" (data_seed+1, for the lr choice) and "test" (data_seed+2), per condition."""
    offset = {"val": 1, "test": 2}[split]
    return np.random.default_rng([cfg.data_seed + offset, sum(map(ord, cond_name)), len(cond_name)])
