"""torch.compile sees each variant as one graph: no graph break in the training forward (train.compile, bench train
--compile), so the small kernels around DIFF's attention can be fused. A counting backend runs the traced graph as
it is, so the loss and every gradient must equal the uncompiled model's."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from difftransformer.model import DiffTransformerLM, ModelConfig


@pytest.mark.parametrize("backend", ["sdpa", "blocked", "eager"])
@pytest.mark.parametrize("attention", ["baseline", "diff_v1", "diff_v2"])
def test_training_forward_is_one_graph(attention, backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = DiffTransformerLM(ModelConfig.from_flavour("tiny", attention=attention, backend=backend)).double()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    ref = model(ids, targets=ids)
    ref_grads = torch.autograd.grad(ref.loss, list(model.parameters()))
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)  # a graph break raises
    out = compiled(ids, targets=ids)
    grads = torch.autograd.grad(out.loss, list(model.parameters()))
    compiled(ids, targets=ids)  # a second call reuses the graph
    torch._dynamo.reset()
    assert counter.frame_count == 1
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-12, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
