"""Several models trained as one (train/stacked.py): each member computes what it computes alone, up to float
rounding, forward, backward, clipping and AdamW steps; members never mix."""

import pytest
import torch

from difftransformer.model import DiffTransformerLM, ModelConfig
from difftransformer.train.stacked import clip_grad_norm_per_member, member_model, member_state, stack_models

VARIANTS = ("baseline", "diff_v1", "diff_v2")


def _models(variant: str, n: int, dtype=torch.float64) -> list[DiffTransformerLM]:
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, attention=variant, backend="sdpa",
                      max_seq_len=32)
    out = []
    for s in range(n):
        torch.manual_seed(s)
        out.append(DiffTransformerLM(cfg).to(dtype))
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_backward_equal_each_member_alone(variant):
    models = _models(variant, 3)
    stacked = stack_models(models)
    assert stacked.members == 3 and all(p.shape[0] == 3 for p in stacked.parameters())
    torch.manual_seed(0)
    idx = torch.randint(0, 50, (3 * 2, 12))  # member s owns rows 2s, 2s+1
    pos = torch.tensor([[3, 7, 11]]).repeat(6, 1)
    logits = stacked(idx, logits_at=pos).logits
    logits.square().sum().backward()
    for s, m in enumerate(models):
        alone = m(idx[2 * s:2 * s + 2], logits_at=pos[:2]).logits
        alone.square().sum().backward()
        torch.testing.assert_close(logits[2 * s:2 * s + 2], alone, rtol=1e-12, atol=1e-12)
        for name, p in m.named_parameters():
            torch.testing.assert_close(stacked.get_parameter(name).grad[s], p.grad, rtol=1e-10, atol=1e-12,
                                       msg=f"{variant} member {s} {name}")
    # the members' own tensors come back out unchanged
    for s, m in enumerate(models):
        state = member_state(stacked, s)
        assert all(torch.equal(state[k], v) for k, v in m.state_dict().items())
        assert torch.equal(member_model(stacked, s)(idx[:2]).logits, m.eval()(idx[:2]).logits)


def test_a_member_does_not_see_another_members_loss():
    models = _models("diff_v1", 2)
    stacked = stack_models(models)
    idx = torch.randint(0, 50, (4, 10))
    out = stacked(idx).logits
    out[2:].sum().backward()  # member 1's rows only
    assert all(float(p.grad[0].abs().max()) == 0 and float(p.grad[1].abs().max()) > 0
               for n, p in stacked.named_parameters() if p.grad is not None and "lambda" not in n)


def test_clip_per_member_equals_clip_grad_norm_alone():
    models = _models("diff_v2", 3)
    stacked = stack_models(models)
    for s, m in enumerate(models):
        for name, p in m.named_parameters():
            g = torch.randn_like(p) * (0.1 if s == 1 else 3.0)  # member 1 below the max norm: not clipped
            p.grad = g.clone()
            sp = stacked.get_parameter(name)
            if sp.grad is None:
                sp.grad = torch.zeros_like(sp)
            sp.grad[s] = g
    norms = clip_grad_norm_per_member(stacked.parameters(), 1.0)
    for s, m in enumerate(models):
        n = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        torch.testing.assert_close(norms[s], n, rtol=1e-12, atol=0)
        for name, p in m.named_parameters():
            torch.testing.assert_close(stacked.get_parameter(name).grad[s], p.grad, rtol=1e-12, atol=1e-15)


def test_training_steps_match_alone_in_float32():
    """Three AdamW steps with clipping, float32: a member's losses and weights stay within rounding of the same model
    trained alone (1e-5 relative here; later steps may drift further, as another CPU's rounding would)."""
    from difftransformer.retrieval.config import Condition, RetrievalConfig
    from difftransformer.retrieval.train import train_group, train_model
    cfg = RetrievalConfig(d_model=16, n_heads=2, n_layers=1, steps=3, batch=4, warmup=1, seeds=2, eval_contexts=4,
                          val_contexts=4, train_pairs=(2, 3), train_context=(4, 8), queries=2,
                          conditions=(Condition("p3c8", 3, 8), Condition("p3c12", 3, 12)), primary="p3c8",
                          extrapolation="p3c12", cpu_code_path="machine")
    for variant in VARIANTS:
        g = train_group(cfg, variant, [5, 6, 7], 4e-3)
        for i, seed in enumerate((5, 6, 7)):
            alone = train_model(cfg, variant, seed, 4e-3)
            assert [s for s, _ in g["losses"][i]] == [s for s, _ in alone["losses"]]
            for (_, a), (_, b) in zip(g["losses"][i], alone["losses"]):
                assert a == pytest.approx(b, rel=1e-5)
            for name, p in alone["model"].state_dict().items():
                torch.testing.assert_close(g["models"][i].state_dict()[name], p, rtol=1e-5, atol=1e-6)


def test_refusals():
    a, b = _models("baseline", 1)[0], _models("diff_v1", 1)[0]
    with pytest.raises(ValueError, match="config differs"):
        stack_models([a, b])
    with pytest.raises(ValueError, match="at least one"):
        stack_models([])
    tied = DiffTransformerLM(ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, tie_embeddings=True))
    with pytest.raises(ValueError, match="tie_embeddings"):
        stack_models([tied])
