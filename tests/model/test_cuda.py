"""The fast paths on a CUDA device against the float64 CPU eager model (skipped without a GPU).

CI has no GPU, so these run on the GPU machine (`pytest tests/model/test_cuda.py`): every variant and backend
(the fused Triton kernels included, checked not to have fallen back) forward and backward in float32 (TF32 off)
against the float64 CPU eager oracle, bf16 autocast within a loose bound, the KV-cache decode against the full
forward, and the decode modes (eager, compile, cuda-graph) against each other.
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

from difftransformer.inference.generate import SamplingConfig, generate
from difftransformer.model import DiffTransformerLM, ModelConfig
from difftransformer.kernels import launches

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

VARIANTS = ("baseline", "diff_v1", "diff_v2")
# "triton": DIFF's fused kernels (the baseline runs sdpa under it); skipped where the triton package is missing.
TRITON = pytest.param("triton", marks=pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                                        reason="the triton package is not installed"))


@pytest.fixture(autouse=True)
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def config(attention: str, backend: str, n_kv_heads: int = 2) -> ModelConfig:
    return ModelConfig(vocab_size=128, d_model=128, n_layers=3, n_heads=4, n_kv_heads=n_kv_heads, head_dim=32,
                       max_seq_len=256, attention=attention, backend=backend)


def pair(attention: str, backend: str, n_kv_heads: int = 2):
    """(float64 CPU eager oracle, float32 CUDA model of ``backend``) with the same weights."""
    torch.manual_seed(0)
    ref = DiffTransformerLM(config(attention, "eager", n_kv_heads)).double()
    fast = DiffTransformerLM(config(attention, backend, n_kv_heads))
    fast.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    return ref, fast.cuda()


def loss_and_grads(model, idx):
    model.zero_grad()
    out = model(idx[:, :-1], targets=idx[:, 1:])
    out.loss.backward()
    return out.loss.detach().double().cpu(), {n: p.grad.double().cpu() for n, p in model.named_parameters()}


@pytest.fixture
def no_triton_fallback():
    """Fails the test if a Triton launch fell back to the PyTorch path (the comparison would not test the kernel)."""
    launches._TRITON_FAILED.clear()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        yield
    said = [str(w.message) for w in record if "fused Triton kernel cannot run" in str(w.message)]
    assert not said and not launches._TRITON_FAILED, said


@pytest.mark.usefixtures("no_triton_fallback")
@pytest.mark.parametrize("backend", ["sdpa", "eager", TRITON])  # "blocked" is a CPU path: sdpa on CUDA
@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("attention", VARIANTS)
def test_cuda_float32_matches_float64_oracle(attention, backend, n_kv_heads):
    ref, fast = pair(attention, backend, n_kv_heads)
    idx = torch.randint(0, 128, (2, 200))
    loss_ref, g_ref = loss_and_grads(ref, idx)
    loss, g = loss_and_grads(fast, idx.cuda())
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-5)
    for name in g_ref:
        scale = g_ref[name].abs().max().item() + 1e-12
        err = (g[name] - g_ref[name]).abs().max().item()
        assert err <= 1e-4 * scale + 1e-9, f"{name}: max |grad error| {err:.3g} vs max |grad| {scale:.3g}"


@pytest.mark.usefixtures("no_triton_fallback")
@pytest.mark.parametrize("backend", ["sdpa", TRITON])
@pytest.mark.parametrize("attention", VARIANTS)
def test_cuda_bf16_autocast_close(attention, backend):
    ref, fast = pair(attention, backend)
    idx = torch.randint(0, 128, (4, 129))
    with torch.no_grad():
        loss_ref = ref(idx[:, :-1], targets=idx[:, 1:]).loss.item()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fast(idx[:, :-1].cuda(), targets=idx[:, 1:].cuda()).loss.item()
    assert abs(loss - loss_ref) < 2e-2, (loss, loss_ref)


@pytest.mark.parametrize("attention", VARIANTS)
def test_cuda_cached_decode_matches_full_forward(attention):
    _, model = pair(attention, "sdpa")
    model.eval()
    idx = torch.randint(0, 128, (2, 40), device="cuda")
    mask = torch.ones(2, 40, dtype=torch.bool, device="cuda")
    with torch.no_grad():
        full = model(idx).logits
        model.setup_caches(2, 40, dtype=torch.float32, device="cuda")
        try:
            steps = [model(idx[:, :24], input_pos=torch.arange(24, device="cuda"), attention_mask=mask).logits]
            for t in range(24, 40):
                steps.append(model(idx[:, t:t + 1], input_pos=torch.tensor([t], device="cuda"),
                                   attention_mask=mask).logits)
        finally:
            model.clear_caches()
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention", VARIANTS)
def test_cuda_decode_modes_agree(attention):
    _, model = pair(attention, "sdpa")
    with torch.no_grad():  # larger weights: greedy choices far apart, so the modes must agree token for token
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
    sampling = SamplingConfig(max_new_tokens=24, temperature=0)
    eager = generate(model, prompts, sampling, decode="eager").tokens
    assert generate(model, prompts, sampling, decode="cuda-graph").tokens == eager
    assert generate(model, prompts, sampling, decode="compile").tokens == eager
