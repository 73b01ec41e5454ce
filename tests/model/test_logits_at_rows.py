"""forward(logits_at=...) runs the last block at the scored positions only (queries, output projection, residual and
FFN there; keys and values from every position): the same logits and gradients as every block at every position,
in float64, for every variant, both PyTorch attention paths, GQA and the ablations that change the attention."""

import pytest
import torch

from difftransformer.model import DiffTransformerLM, ModelConfig

CASES = [dict(attention="baseline"), dict(attention="diff_v1"), dict(attention="diff_v2"),
         dict(attention="baseline", n_kv_heads=2), dict(attention="diff_v1", n_kv_heads=2),
         dict(attention="diff_v2", n_kv_heads=1), dict(attention="diff_v1", v1_layout="per_head"),
         dict(attention="diff_v2", v2_pairing="halves", n_kv_heads=2), dict(attention="diff_v2", v2_lambda="none")]


def _pair(case: dict, backend: str):
    cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=3, n_heads=4, max_seq_len=32, backend=backend, **case)
    torch.manual_seed(0)
    a = DiffTransformerLM(cfg).double()
    b = DiffTransformerLM(cfg).double()
    b.load_state_dict(a.state_dict())
    b.rows_only_last_block = False  # every block at every position, then the rows gathered
    return a, b


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_rows_only_last_block_equals_the_full_forward(case, backend):
    a, b = _pair(case, backend)
    torch.manual_seed(1)
    idx = torch.randint(0, 40, (3, 20))
    pos = torch.tensor([[0, 5, 19], [2, 2, 11], [19, 18, 7]])  # any positions, repeated, unordered, the first
    la = a(idx, logits_at=pos).logits
    lb = b(idx, logits_at=pos).logits
    assert la.shape == (3, 3, 40)
    torch.testing.assert_close(la, lb, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(la)
    (la * w).sum().backward()
    (lb * w).sum().backward()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=n)


def test_rows_path_only_where_it_applies():
    a, _ = _pair({"attention": "diff_v2"}, "sdpa")
    idx = torch.randint(0, 40, (2, 10))
    pos = torch.tensor([[3, 9], [1, 4]])
    assert a._rows_path(idx, None, None, False, False)
    assert not a._rows_path(idx, torch.ones(2, 10), None, False, False)  # a padding mask: the full path
    assert not a._rows_path(idx, None, None, True, False) and not a._rows_path(idx, None, None, False, True)
    a.set_backend("blocked")
    assert not a._rows_path(idx, None, None, False, False)
    # the maps path still answers at the rows, from the full forward
    assert a(idx, logits_at=pos, return_maps=True).logits.shape == (2, 2, 40)
