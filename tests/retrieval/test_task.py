import numpy as np
import pytest
import torch

from difftransformer.retrieval.config import Condition, RetrievalConfig
from difftransformer.retrieval.task import condition_batch, eval_rng, make_batch, train_stream


def _decode_fact(layout, tok):
    off = int(tok) - layout.fact(0, 0)
    return off // layout.n_values, off % layout.n_values


@pytest.mark.parametrize("kind", ["random", "near"])
def test_bookkeeping(kind):
    cfg = RetrievalConfig()
    L = cfg.layout
    b = make_batch(L, 20, 8, 24, 0, kind, cfg.key_group, np.random.default_rng(3))
    B, Q = b.query_pos.shape
    assert Q == 8 and b.context_end == 1 + 8 + 24
    for i in range(B):
        toks = b.tokens[i]
        assert len(set(b.keys[i].tolist())) == 8  # keys distinct
        ctx = toks[1:b.context_end]
        facts = ctx[ctx >= L.fact(0, 0)]
        assert len(facts) == 8  # exactly the facts, the filler is filler
        assert bool(((ctx < L.fact(0, 0)) <= (ctx >= L.filler_base())).all())
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
            assert len({int(k) // cfg.key_group for k in b.keys[i]}) == 1


def test_random_keys_span_groups():
    cfg = RetrievalConfig()
    b = make_batch(cfg.layout, 50, 8, 8, 0, "random", cfg.key_group, np.random.default_rng(0))
    groups = [len({int(k) // cfg.key_group for k in row}) for row in b.keys]
    assert max(groups) > 1


def test_deterministic_per_seed():
    cfg = RetrievalConfig()
    a, b = next(train_stream(cfg, 0)), next(train_stream(cfg, 0))
    c = next(train_stream(cfg, 1))
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    x = condition_batch(cfg, cfg.condition("p2f4"), 4, eval_rng(cfg, "test", "p2f4"))
    y = condition_batch(cfg, cfg.condition("p2f4"), 4, eval_rng(cfg, "test", "p2f4"))
    z = condition_batch(cfg, cfg.condition("p2f4"), 4, eval_rng(cfg, "val", "p2f4"))
    assert torch.equal(x.tokens, y.tokens) and not torch.equal(x.tokens, z.tokens)


def test_harder_grid_is_harder_by_its_knobs():
    cfg = RetrievalConfig()
    train = condition_batch(cfg, Condition("t"), 2, np.random.default_rng(0))
    for c in cfg.conditions:
        b = condition_batch(cfg, c, 2, np.random.default_rng(0))
        assert b.n_pairs == cfg.n_pairs * c.pairs_mult >= train.n_pairs
        assert b.filler == cfg.filler * c.filler_mult >= train.filler
        assert b.tokens.shape[1] >= train.tokens.shape[1]
    longest = max(cfg.conditions, key=lambda c: c.pairs_mult * 3 * cfg.n_pairs + c.filler_mult * cfg.filler)
    assert condition_batch(cfg, longest, 1, np.random.default_rng(0)).tokens.shape[1] + 1 == cfg.max_len()


@pytest.mark.parametrize("change, field", [({"distractors": "far"}, "distractors"), ({"n_pairs": 0}, "n_pairs"),
                                           ({"primary": "nope"}, "primary"), ({"lr_grid": ()}, "lr_grid"),
                                           ({"variants": ("gpt",)}, "variants"), ({"n_keys": 16}, "n_keys"),
                                           ({"lr_search_seed": 3}, "lr_search_seed")])
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        RetrievalConfig(**change)
