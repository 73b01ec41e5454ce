import types

import pytest
import torch

from difftransformer.retrieval.config import RetrievalConfig
from difftransformer.retrieval.evaluate import accuracy, attention_metrics, hits
from difftransformer.retrieval.task import condition_batch, eval_rng
from difftransformer.retrieval.train import answer_loss, build_paired

CFG = RetrievalConfig(d_model=32, n_heads=4)


def test_paired_init_equal_where_shapes_match():
    base, _ = build_paired(CFG, "baseline", 5)
    bs = base.state_dict()
    for variant in ("diff_v1", "diff_v2"):
        m, copied = build_paired(CFG, variant, 5)
        ms = m.state_dict()
        for name in ("tok_embeddings.weight", "output.weight", "norm.weight", "layers.0.ffn.w1.weight",
                     "layers.1.ffn_norm.weight", "layers.0.attn.wk.weight"):
            assert name in copied and torch.equal(ms[name], bs[name]), (variant, name)
        for name, t in ms.items():
            if name in bs and bs[name].shape == t.shape:
                assert torch.equal(t, bs[name]), name
    v2, copied = build_paired(CFG, "diff_v2", 5)
    assert "layers.0.attn.wq.weight" not in copied  # V2's query projection is twice as wide: its own
    other, _ = build_paired(CFG, "baseline", 6)
    assert not torch.equal(other.state_dict()["tok_embeddings.weight"], bs["tok_embeddings.weight"])


class Oracle(torch.nn.Module):
    """Reads the context like a perfect lookup: at each query token, the value of the fact with that key."""

    def __init__(self, layout, right=True):
        super().__init__()
        self.L, self.right = layout, right

    def forward(self, tokens, return_maps=False, logits_at=None):
        L = self.L
        B, T = tokens.shape
        logits = torch.zeros(B, T, L.vocab_size)
        for i in range(B):
            facts = {}
            for t in range(T):
                tok = int(tokens[i, t])
                if tok >= L.fact(0, 0):
                    k, v = divmod(tok - L.fact(0, 0), L.n_values)
                    facts[k] = v
                elif 1 <= tok < 1 + L.n_keys:
                    v = facts[tok - 1] if self.right else 0
                    logits[i, t, L.value(v)] = 1.0
        if logits_at is not None:
            logits = logits.gather(1, logits_at[..., None].expand(-1, -1, logits.shape[-1]))
        return types.SimpleNamespace(logits=logits)


def test_oracle_scores_one_and_constant_scores_chance():
    cond = CFG.condition(CFG.primary)
    b = condition_batch(CFG, cond, 32, eval_rng(CFG, "test", cond.name))
    assert accuracy(Oracle(CFG.layout), b) == 1.0
    const = accuracy(Oracle(CFG.layout, right=False), b)
    assert abs(const - 1 / CFG.n_values) < 0.05
    assert hits(Oracle(CFG.layout), b).numel() == 32 * CFG.queries


def test_logits_at_equals_the_full_forward_gathered():
    m, _ = build_paired(CFG, "diff_v1", 0)
    b = condition_batch(CFG, CFG.condition(CFG.primary), 4, eval_rng(CFG, "test", CFG.primary))
    full = m(b.tokens).logits
    at = m(b.tokens, logits_at=b.query_pos).logits
    assert torch.allclose(at, full.gather(1, b.query_pos[..., None].expand(-1, -1, full.shape[-1])), atol=1e-6)
    # and the answer loss equals the full forward's loss with -100 everywhere but the answers
    assert torch.allclose(answer_loss(m, b), m(b.tokens, b.targets).loss, atol=1e-6)


def test_untrained_model_attention_near_uniform():
    m, _ = build_paired(CFG, "diff_v1", 0)
    b = condition_batch(CFG, CFG.condition(CFG.primary), 8, eval_rng(CFG, "test", CFG.primary))
    r = attention_metrics(m, b)
    assert len(r["attention"]) == len(r["best_head_share_per_layer"]) == CFG.n_layers
    for layer in r["attention"]:
        # untrained: attention near uniform; the answer share is about 1 / context length
        assert abs(layer["answer_share"] - 1 / (b.context_end - 1)) < 0.05
        assert 0 <= layer["noise_share"] <= 1
    assert min(r["best_head_share_per_layer"]) >= max(l["answer_share"] for l in r["attention"]) - 0.05


class Attends(torch.nn.Module):
    """A fake model whose every head puts ``share`` of its row on the answer of each query in one head only: the
    endpoint must not depend on how many heads there are."""

    def __init__(self, heads, layers=2, good_layer=1):
        super().__init__()
        self.heads, self.layers, self.good = heads, layers, good_layer
        self.batch = None

    def forward(self, tokens, return_maps=False, logits_at=None):
        b = self.batch
        B, T = tokens.shape
        maps = []
        for l in range(self.layers):
            attn = torch.zeros(B, self.heads, T, T)
            ctx = torch.arange(T)
            attn[..., (ctx >= 1) & (ctx < b.context_end)] = 1.0 / (b.context_end - 1)  # uniform on the context
            if l == self.good:
                for i in range(B):
                    for q in range(b.query_pos.shape[1]):
                        qp, ap = int(b.query_pos[i, q]), int(b.answer_pos[i, q])
                        attn[i, 0, qp] = 0
                        attn[i, 0, qp, ap] = 1.0  # head 0 of the good layer retrieves
            maps.append(types.SimpleNamespace(attn=attn))
        return types.SimpleNamespace(maps=maps, logits=None)


@pytest.mark.parametrize("heads", [1, 2, 4, 8])
def test_attention_endpoint_does_not_depend_on_the_head_count(heads):
    b = condition_batch(CFG, CFG.condition(CFG.primary), 4, eval_rng(CFG, "test", CFG.primary))
    m = Attends(heads)
    m.batch = b
    r = attention_metrics(m, b)
    uniform = 1 / (b.context_end - 1)
    assert r["attention_endpoint"] == pytest.approx((1.0 + uniform) / 2)  # layer mean of the best heads
    assert r["best_head_share_per_layer"] == pytest.approx([uniform, 1.0])
