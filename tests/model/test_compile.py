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


def _ops(gm) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")}


@pytest.mark.parametrize("build", ["model", "layer"])
def test_rope_tables_are_one_opaque_operator_of_the_graph(build):
    """Under torch.compile RoPE's tables come from one operator (``difftransformer::rope_tables``) that inductor
    cannot fuse into every rotated element (it did: float64 pow, cos and sin per element, the compiled baseline layer
    with RoPE 1.4-1.8x its time without); the graph holds no cos or sin, dynamic lengths trace too, and the graph run
    as traced equals the eager module in float64."""
    from difftransformer import DiffAttention

    torch._dynamo.reset()
    torch.manual_seed(0)
    graphs: list[set[str]] = []

    def record(gm, inputs):
        graphs.append(_ops(gm))
        return gm.forward

    if build == "model":
        module = DiffTransformerLM(ModelConfig.from_flavour("tiny", attention="baseline")).double()
        inputs = [torch.randint(0, module.cfg.vocab_size, (2, n)) for n in (9, 13)]
    else:
        module = DiffAttention(32, 4, variant="baseline", causal=True, rope=True).double()
        inputs = [torch.randn(2, n, 32, dtype=torch.float64) for n in (9, 13)]
    compiled = torch.compile(module, backend=record, fullgraph=True, dynamic=True)
    for x in inputs:
        out, ref = compiled(x), module(x)
        out, ref = (out.logits, ref.logits) if build == "model" else (out, ref)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch._dynamo.reset()
    assert graphs and all(any("rope_tables" in op for op in ops) for ops in graphs), graphs
    assert not any(op in ("cos", "sin") or op.endswith((".cos", ".sin")) or "method cos" in op or "method sin" in op
                   for ops in graphs for op in ops), graphs


def test_the_rope_operator_keeps_the_positions_device_and_its_fake_matches():
    """The operator's tables sit on the positions' device (a CUDA model's stay on CUDA: checked here on the CPU and on
    the meta device, which runs only the fake), and its fake (what torch.compile traces with) gives the real call's
    shape and dtype, for (T,) and (B, T) positions."""
    from difftransformer.model import rope

    for positions in (torch.arange(7), torch.arange(12).view(2, 6)):
        cos, sin = torch.ops.difftransformer.rope_tables(positions, 16, 10000.0, None)
        ref = rope._tables(positions, 16, 10000.0, None)
        assert cos.device == positions.device and torch.equal(cos, ref[0]) and torch.equal(sin, ref[1])
        meta_cos, meta_sin = torch.ops.difftransformer.rope_tables(positions.to("meta"), 16, 10000.0, None)
        assert meta_cos.device.type == "meta" and meta_cos.shape == cos.shape and meta_cos.dtype == cos.dtype
        assert meta_sin.shape == sin.shape and meta_sin.dtype == sin.dtype
