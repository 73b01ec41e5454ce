import math

import pytest
import torch

from difftransformer.eval.attention_mass import attention_shares

CTX = torch.tensor([False, True, True, True, True, False])  # BOS, 4 context keys, one question key
ANS = torch.tensor([False, False, True, False, False, False])


def test_softmax_row_known_answer():
    row = torch.tensor([0.1, 0.1, 0.4, 0.1, 0.1, 0.2], dtype=torch.float64)
    s = attention_shares(row, ANS, CTX)
    assert math.isclose(float(s["answer_share"]), 0.4 / 0.7)
    assert math.isclose(float(s["noise_share"]), 0.3 / 0.7)
    assert math.isclose(float(s["answer_raw"]), 0.4) and math.isclose(float(s["rest_raw"]), 0.3)
    assert math.isclose(float(s["context_fraction"]), 0.7)
    assert math.isclose(float(s["row_sum"]), 1.0)


@pytest.mark.parametrize("c", [0.2, 1.0, 7.5])
def test_scale_invariance(c):
    row = torch.tensor([0.05, -0.1, 0.3, 0.02, -0.05, 0.01], dtype=torch.float64)
    a, b = attention_shares(row, ANS, CTX), attention_shares(c * row, ANS, CTX)
    for k in ("answer_share", "noise_share", "context_fraction"):
        assert math.isclose(float(a[k]), float(b[k]), rel_tol=1e-12)
    assert math.isclose(float(b["answer_raw"]), c * 0.3, rel_tol=1e-12)


def test_negative_entries():
    # a differential row A1 - lambda*A2 with negative mass on distractors: the noise is their magnitude
    row = torch.tensor([0.0, -0.1, 0.3, 0.1, -0.1, 0.0], dtype=torch.float64)
    s = attention_shares(row, ANS, CTX)
    assert math.isclose(float(s["answer_share"]), 0.3 / 0.6)
    assert math.isclose(float(s["noise_share"]), 0.3 / 0.6)
    assert math.isclose(float(s["rest_raw"]), -0.1, abs_tol=1e-12)  # signed raw beside: cancels
    neg = attention_shares(-row, ANS, CTX)  # a negative weight on the answer counts against it
    assert math.isclose(float(neg["answer_share"]), -0.5)


def test_batched_per_row_masks_and_zero_row():
    rows = torch.tensor(dtype=torch.float64, data=[[0.0, 0.5, 0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    ans = torch.tensor([[False, True, False, False, False, False], [False, False, True, False, False, False]])
    s = attention_shares(rows, ans, CTX)
    assert s["answer_share"].shape == (2,)
    assert math.isclose(float(s["answer_share"][0]), 0.5)
    assert math.isnan(float(s["answer_share"][1]))  # nothing on the context: undefined, not 0


def test_bad_masks():
    with pytest.raises(ValueError):
        attention_shares(torch.ones(6), torch.ones(5, dtype=torch.bool), CTX)
    with pytest.raises(ValueError, match="inside"):
        attention_shares(torch.ones(6), torch.tensor([True, False, False, False, False, False]), CTX)
