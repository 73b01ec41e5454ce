import types

import torch

from difftransformer.retrieval.config import RetrievalConfig
from difftransformer.retrieval.evaluate import accuracy, condition_metrics
from difftransformer.retrieval.task import condition_batch, eval_rng
from difftransformer.retrieval.train import build_paired

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

    def forward(self, tokens, return_maps=False):
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
        return types.SimpleNamespace(logits=logits)


def test_oracle_scores_one_and_constant_scores_chance():
    cond = CFG.condition("p2f4")
    b = condition_batch(CFG, cond, 32, eval_rng(CFG, "test", cond.name))
    assert accuracy(Oracle(CFG.layout), b) == 1.0
    const = accuracy(Oracle(CFG.layout, right=False), b)
    assert abs(const - 1 / CFG.n_values) < 0.05
    assert condition_metrics(Oracle(CFG.layout), b, with_maps=False)["n_queries"] == 32 * 16


def test_untrained_model_maps_and_chance():
    m, _ = build_paired(CFG, "diff_v1", 0)
    b = condition_batch(CFG, CFG.condition("p1f1"), 8, eval_rng(CFG, "test", "p1f1"))
    r = condition_metrics(m, b)
    assert len(r["attention"]) == CFG.n_layers
    for layer in r["attention"]:
        # untrained: attention near uniform; the answer share is about 1 / context length
        assert abs(layer["answer_share"] - 1 / (b.context_end - 1)) < 0.05
        assert 0 <= layer["noise_share"] <= 1
