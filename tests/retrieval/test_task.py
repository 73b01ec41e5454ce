import numpy as np
import pytest
import torch

from difftransformer.retrieval.config import Condition, RetrievalConfig
from difftransformer.retrieval.task import (condition_batch, eval_rng, make_batch, train_stream,
                                            training_distribution_batches)


def _decode_fact(layout, tok):
    off = int(tok) - layout.fact(0, 0)
    return off // layout.n_values, off % layout.n_values


def _check_bookkeeping(cfg, b, kind="random"):
    L = cfg.layout
    B, Q = b.query_pos.shape
    for i in range(B):
        toks = b.tokens[i]
        ctx = toks[1:b.context_end]
        facts = ctx[ctx >= L.fact(0, 0)]
        assert len(facts) == int(b.pairs[i])  # exactly the facts, the filler is filler
        assert len({_decode_fact(L, t)[0] for t in facts}) == len(facts)  # keys distinct
        assert bool(((ctx < L.fact(0, 0)) <= (ctx >= L.filler_base())).all())
        assert len(set(b.answer_pos[i].tolist())) == Q  # distinct facts asked
        for q in range(Q):
            qp, ap = int(b.query_pos[i, q]), int(b.answer_pos[i, q])
            assert 1 <= ap < b.context_end  # the answer is always in the context
            k, v = _decode_fact(L, toks[ap])
            assert int(toks[qp]) == L.query(k)  # the query asks the key of the fact at answer_pos
            assert int(b.answers[i, q]) == L.value(v) == int(b.targets[i, qp])
            if qp + 1 < toks.shape[0]:
                assert int(toks[qp + 1]) == L.value(v)  # the sequence carries the answer after its query
        assert int((b.targets[i] != -100).sum()) == Q  # loss on the answers only
        if kind == "near":  # every key in one near-duplicate group
            assert len({_decode_fact(L, t)[0] // cfg.key_group for t in facts}) == 1


@pytest.mark.parametrize("kind", ["random", "near"])
def test_bookkeeping(kind):
    cfg = RetrievalConfig()
    b = make_batch(cfg.layout, 20, 12, 40, 8, kind, cfg.key_group, np.random.default_rng(3))
    assert b.query_pos.shape == (20, 8) and b.context_end == 1 + 40
    _check_bookkeeping(cfg, b, kind)


def test_training_distribution_draws_shapes_per_example_and_per_batch():
    cfg = RetrievalConfig()
    stream = train_stream(cfg, 0)
    lengths, pairs = set(), set()
    for _ in range(40):
        b = next(stream)
        _check_bookkeeping(cfg, b)
        C = b.context_end - 1
        assert cfg.train_context[0] <= C <= cfg.train_context[1]
        assert b.tokens.shape[1] == C + 2 * cfg.queries  # the input: BOS + context + Q (query, answer) - last
        assert int(b.pairs.min()) >= cfg.train_pairs[0] and int(b.pairs.max()) <= min(cfg.train_pairs[1], C)
        lengths.add(C)
        pairs.update(b.pairs.tolist())
    assert len(lengths) > 10 and pairs == set(range(cfg.train_pairs[0], cfg.train_pairs[1] + 1))


def test_primary_inside_trained_lengths_and_extrapolation_beyond():
    cfg = RetrievalConfig()
    prim, ext = cfg.condition(cfg.primary), cfg.condition(cfg.extrapolation)
    assert prim.context <= cfg.train_context[1] < ext.context
    assert condition_batch(cfg, prim, 2, np.random.default_rng(0)).tokens.shape[1] <= \
        cfg.train_context[1] + 2 * cfg.queries  # no query-answer distance the training never saw
    with pytest.raises(ValueError, match="primary"):
        cfg.replace(primary=cfg.extrapolation)
    with pytest.raises(ValueError, match="extrapolation"):
        cfg.replace(extrapolation=cfg.primary)


def test_deterministic_per_seed():
    cfg = RetrievalConfig()
    a, b = next(train_stream(cfg, 0)), next(train_stream(cfg, 0))
    c = next(train_stream(cfg, 1))
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    p = cfg.condition(cfg.primary)
    x = condition_batch(cfg, p, 4, eval_rng(cfg, "test", p.name))
    y = condition_batch(cfg, p, 4, eval_rng(cfg, "test", p.name))
    z = condition_batch(cfg, p, 4, eval_rng(cfg, "val", p.name))
    assert torch.equal(x.tokens, y.tokens) and not torch.equal(x.tokens, z.tokens)
    assert [torch.equal(u.tokens, w.tokens) for u, w in zip(training_distribution_batches(cfg, "test", 32),
                                                             training_distribution_batches(cfg, "test", 32))] == [True] * 2


def test_every_condition_has_its_own_example_stream():
    """Distinct names, distinct streams -- anagrams included (a sum of character codes gave p1f2 and p2f1 one)."""
    cfg = RetrievalConfig()
    names = [c.name for c in cfg.conditions] + ["p1f2", "p2f1", "training distribution"]
    for split in ("val", "test"):
        draws = [tuple(eval_rng(cfg, split, n).integers(0, 2**62, size=4)) for n in names]
        assert len(set(draws)) == len(names)
    same_shape = [Condition("ab", 8, 32), Condition("ba", 8, 32)]
    b1, b2 = (condition_batch(cfg, c, 4, eval_rng(cfg, "test", c.name)) for c in same_shape)
    assert not torch.equal(b1.tokens, b2.tokens)


def test_max_len_covers_every_input():
    cfg = RetrievalConfig()
    longest = max(cfg.conditions, key=lambda c: c.context)
    assert condition_batch(cfg, longest, 1, np.random.default_rng(0)).tokens.shape[1] == cfg.max_len()


@pytest.mark.parametrize("change, field", [({"distractors": "far"}, "distractors"), ({"train_pairs": (0, 4)}, "train_pairs"),
                                           ({"train_pairs": (2, 16)}, "train_pairs"),
                                           ({"train_context": (64, 16)}, "train_context"),
                                           ({"primary": "nope"}, "primary"), ({"lr_grid": ()}, "lr_grid"),
                                           ({"variants": ("gpt",)}, "variants"), ({"n_keys": 8}, "train_pairs"),
                                           ({"seed_base": -1}, "seed_base"), ({"matched_lr": "gpt"}, "matched_lr"),
                                           ({"cpu_code_path": "sse2"}, "cpu_code_path"),
                                           ({"floor": 0}, "floor"), ({"conditions": (Condition("x", 40, 30),)}, "x")])
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        RetrievalConfig(**change)


def test_version_3_test_seeds_are_fresh():
    """PROTOCOL.md version 3: 12 fresh test seeds, none of those looked at before (v2's 0..7, its tuning seed 100,
    the review's 101-102, the pilots' 1000-1001, the timing runs' 2000-2011)."""
    cfg = RetrievalConfig()
    assert cfg.test_seeds == tuple(range(3000, 3012))
    assert not set(cfg.test_seeds) & ({*range(8), 100, 101, 102, 1000, 1001} | set(range(2000, 2012)))
