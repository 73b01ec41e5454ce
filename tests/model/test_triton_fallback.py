"""When `auto` runs the Triton kernel (only where measured faster: nowhere yet), and what `backend="triton"` does when a
kernel launch fails: one warning naming the reason, then the PyTorch path for that call and every later call of its
kind. The failures are injected (a kernel replaced by one that raises Triton's own error) into the kernels running in
Triton's CPU interpreter (TRITON_INTERPRET=1, set below before triton is imported, as in test_triton_diff.py).
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

from triton_interp import NEEDS_FRESH_PROCESS, kernel_test_model, run_in_fresh_process, skip_unless_interpreting

from triton.runtime.errors import OutOfResources, PTXASError  # noqa: E402

from difftransformer.model import DiffTransformerLM, ModelConfig  # noqa: E402
from difftransformer.model.attention import dispatch, launches  # noqa: E402

td = importlib.import_module("difftransformer.model.attention.triton_diff")
tdd = importlib.import_module("difftransformer.model.attention.triton_decode")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _interpreter_or_fresh_process(request):
    skip_unless_interpreting(request)
    launches._TRITON_FAILED.clear()
    yield
    launches._TRITON_FAILED.clear()


@pytest.mark.skipif(not NEEDS_FRESH_PROCESS, reason="this process already runs the kernels directly")
def test_in_fresh_interpreter_process():
    run_in_fresh_process(__file__)


class Failing:
    """Stands in for a kernel: ``kernel[grid](...)`` raises ``error`` (as a launch that cannot fit would) and counts."""

    def __init__(self, error: Exception):
        self.error, self.calls = error, 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls += 1
            raise self.error
        return launch


class Counting:
    """Wraps a kernel and counts its launches."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls += 1
            return self.kernel[grid](*args, **kwargs)
        return launch


def model_for(attention: str, opts: dict) -> DiffTransformerLM:
    return kernel_test_model(attention, opts, DEVICE)


def step(model, backend: str, ids, pad):
    """Logits and every parameter's gradient of one forward and backward."""
    model.set_backend(backend)
    model.zero_grad()
    logits = model(ids, attention_mask=pad).logits
    logits[pad].square().mean().backward()
    return logits[pad].detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same(got, want, tol=1e-10):
    (lg, gg), (lw, gw) = got, want
    assert (lg - lw).abs().max() <= tol
    for name in gw:
        assert (gg[name] - gw[name]).abs().max() <= tol, name


def fallback_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "fused Triton kernel cannot run" in str(w.message)]


CASES = [("diff_v1", {}), ("diff_v1", {"v1_layout": "per_head"}), ("diff_v2", {})]


@pytest.mark.parametrize("attention, opts", CASES)
@pytest.mark.parametrize("failing", ["_diff_fwd_kernel", "_diff_bwd_dq_kernel"])
def test_a_failed_launch_falls_back_once_with_one_warning(attention, opts, failing, monkeypatch):
    """A forward kernel (or a backward kernel) that raises OutOfResources: the step's logits and gradients equal the
    sdpa and eager backends' (the backward recomputes in PyTorch), ONE warning names the reason, and the next step
    does not try the Triton kernels at all (none launched)."""
    model = model_for(attention, opts)
    ids = torch.randint(0, 64, (2, 21), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    pad = torch.ones(2, 21, dtype=torch.bool, device=DEVICE)
    pad[0, :6] = False
    want_sdpa, want_eager = step(model, "sdpa", ids, pad), step(model, "eager", ids, pad)

    bad = Failing(OutOfResources(232_449, 232_448, "shared memory"))
    fwd = Counting(td._diff_fwd_kernel)
    monkeypatch.setattr(td, "_diff_fwd_kernel", fwd)
    monkeypatch.setattr(td, failing, bad)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = step(model, "triton", ids, pad)
        launched = fwd.calls
        second = step(model, "triton", ids, pad)
    for got in (first, second):
        assert_same(got, want_sdpa)
        assert_same(got, want_eager)
    said = fallback_warnings(record)
    assert len(said) == 1, said
    assert "OutOfResources" in said[0] and "shared memory" in said[0] and "\n" not in said[0]
    assert "train, float64, head_dim 16" in said[0]
    assert bad.calls == 1  # the first layer's launch failed; nothing launched it again
    if failing == "_diff_fwd_kernel":
        assert launched == 0
    else:
        assert launched == 2  # both layers' forwards ran the kernel before the backward failed
    assert fwd.calls == launched  # the second step ran sdpa throughout
    assert list(launches._TRITON_FAILED) == [launches.triton_kind(torch.device(DEVICE), torch.float64, 16,
                                                         model.layers[0].attn.value_dim
                                                         if attention == "diff_v1" else 16, "train")]


def test_a_failed_kind_does_not_disable_other_kinds(monkeypatch):
    """The training kind failing leaves inference (prefill) calls on the kernel: kinds are (GPU, dtype, sizes, pass)."""
    model = model_for("diff_v2", {})
    ids = torch.randint(0, 64, (1, 17), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    monkeypatch.setattr(td, "_diff_bwd_dkdv_kernel", Failing(PTXASError("ptxas fatal: out of registers")))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model(ids).logits.sum().backward()
    said = fallback_warnings(record)
    assert len(said) == 1 and "PTXASError: PTXAS error: ptxas fatal" in said[0]
    fwd = Counting(td._diff_fwd_kernel)
    monkeypatch.setattr(td, "_diff_fwd_kernel", fwd)
    with torch.no_grad():
        got = model(ids).logits
    assert fwd.calls == 2  # prefill: still the kernel, in both layers
    model.set_backend("eager")
    with torch.no_grad():
        assert (got - model(ids).logits).abs().max() <= 1e-10


@pytest.mark.parametrize("attention, opts", CASES)
def test_a_failed_decode_launch_falls_back_to_the_pytorch_step(attention, opts, monkeypatch):
    """The split-KV decode kernel raising OutOfResources: every decode step equals the eager full forward, one warning,
    one failed launch (later steps do not try it)."""
    model = model_for(attention, opts).eval()
    ids = torch.randint(0, 64, (2, 15), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    bad = Failing(OutOfResources(141_312, 101_376, "shared memory"))
    monkeypatch.setattr(tdd, "_diff_decode_split_kernel", bad)
    with warnings.catch_warnings(record=True) as record, torch.no_grad():
        warnings.simplefilter("always")
        model.setup_caches(2, 20, dtype=torch.float64)
        pre = model(ids[:, :11], input_pos=torch.arange(11, device=DEVICE)).logits
        steps = [model(ids[:, t:t + 1], input_pos=torch.tensor([t], device=DEVICE)).logits for t in range(11, 15)]
        model.clear_caches()
        model.set_backend("eager")
        full = model(ids).logits
    assert (torch.cat([pre, *steps], dim=1) - full).abs().max() <= 1e-10
    said = fallback_warnings(record)
    assert len(said) == 1 and "decode" in said[0] and "PyTorch decode step" in said[0]
    assert bad.calls == 1


def test_argument_errors_are_not_swallowed(monkeypatch):
    """Only launch failures fall back: a ValueError from inside the kernel call propagates."""
    model = model_for("diff_v1", {})
    monkeypatch.setattr(td, "_diff_fwd_kernel", Failing(ValueError("a bug, not a launch failure")))
    with pytest.raises(ValueError, match="a bug"):
        model(torch.zeros(1, 5, dtype=torch.long, device=DEVICE))
    assert not launches._TRITON_FAILED


def test_which_errors_are_launch_failures():
    from triton.compiler.errors import CompilationError

    assert launches.is_triton_launch_error(OutOfResources(1, 0, "shared memory"))
    assert launches.is_triton_launch_error(PTXASError("ptxas failed"))
    assert launches.is_triton_launch_error(CompilationError("def f(): pass", None, "unsupported"))
    assert launches.is_triton_launch_error(RuntimeError("Triton Error [CUDA]: invalid argument"))
    assert not launches.is_triton_launch_error(RuntimeError("CUDA out of memory"))
    assert not launches.is_triton_launch_error(ValueError("head dim d=24"))


def test_auto_runs_triton_only_where_measured(monkeypatch):
    """`auto` picks the kernel for a (GPU, dtype, pass) only when TRITON_AUTO_MEASURED lists it; every entry there is
    well formed; a bad pass is refused by name."""
    for cap, dtype, pass_ in dispatch.TRITON_AUTO_MEASURED:
        assert isinstance(cap, tuple) and len(cap) == 2 and cap >= dispatch.MIN_TRITON_CAPABILITY
        assert dtype in (torch.float16, torch.bfloat16, torch.float32) and pass_ in launches.TRITON_PASSES
    if ((9, 0), torch.bfloat16, "train") not in dispatch.TRITON_AUTO_MEASURED:
        assert not dispatch.auto_runs_triton((9, 0), torch.bfloat16, "train")
    monkeypatch.setattr(dispatch, "TRITON_AUTO_MEASURED", frozenset({((9, 0), torch.bfloat16, "train")}))
    assert dispatch.auto_runs_triton((9, 0), torch.bfloat16, "train")
    assert not dispatch.auto_runs_triton((9, 0), torch.bfloat16, "decode")
    assert not dispatch.auto_runs_triton((8, 0), torch.bfloat16, "train")
    assert not dispatch.auto_runs_triton((9, 0), torch.float32, "train")
    with pytest.raises(ValueError, match="pass_='backward' is not allowed"):
        dispatch.auto_runs_triton((9, 0), torch.bfloat16, "backward")


def test_default_configs_are_chosen_per_dtype_and_arch():
    """16-bit decode keeps three stages only where 163 KB of shared memory allow it; float32 tiles are smaller than
    16-bit ones; bad arguments are refused by name."""
    big, small = td.default_config(128, 256, torch.bfloat16, 90), td.default_config(128, 256, torch.bfloat16, 86)
    assert big["decode"][3] == 3 and small["decode"][3] == 2 and big["fwd"] == small["fwd"]
    fp32 = td.default_config(128, 128, torch.float32, 90)
    bf16 = td.default_config(128, 128, torch.bfloat16, 90)
    assert fp32["fwd"][0] * fp32["fwd"][1] < bf16["fwd"][0] * bf16["fwd"][1]
    assert td.smem_limit(80) == 166_912 and td.smem_limit(90) == 232_448 and td.smem_limit(89) == 101_376
    with pytest.raises(ValueError, match="dv=96"):
        td.default_config(64, 96)
    with pytest.raises(ValueError, match="d=48"):
        td.default_config(48, 48)
    with pytest.raises(TypeError, match="dtype=torch.int32"):
        td.default_config(64, 64, torch.int32)


def test_fp32_dot_precision_follows_torch():
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert td.dot_precision(torch.float32, None) == "ieee" and td.dot_precision(torch.float32, True) == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert td.dot_precision(torch.float32, None) == "tf32" and td.dot_precision(torch.float32, False) == "ieee"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert td.dot_precision(torch.bfloat16, None) is None and td.dot_precision(torch.float64, True) == "ieee"


def test_grids_stay_within_cuda_limits_past_65535_batch_heads(monkeypatch):
    """B x Hq = 76,800 programs per query block: the launches put blocks on axis 0 (up to 2^31 - 1) and heads and
    batch on axes 1 and 2 (each up to 65,535); a batch over 65,535 is refused by name. Kernels recorded, not run."""
    grids = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **k: grids.append(grid)

    for name in ("_diff_fwd_kernel", "_diff_bwd_preprocess_kernel", "_diff_bwd_dkdv_kernel", "_diff_bwd_dq_kernel"):
        monkeypatch.setattr(td, name, Recorder())
    for name in ("_diff_decode_split_kernel", "_diff_decode_merge_kernel"):
        monkeypatch.setattr(tdd, name, Recorder())
    b, hq, hk, t, d = 600, 128, 64, 2, 16

    def leaf(*shape):
        return torch.zeros(*shape, device=DEVICE).requires_grad_(True)

    q1, q2, k1, k2 = leaf(b, hq, t, d), leaf(b, hq, t, d), leaf(b, hk, t, d), leaf(b, hk, t, d)
    v = leaf(b, hk, t, 2 * d)
    lam = torch.zeros((), device=DEVICE, requires_grad=True)
    td.triton_diff_attention(q1, q2, k1, k2, v, lam, 0.25).sum().backward()
    with torch.no_grad():
        tdd.triton_diff_decode(q1[:, :, :1], q2[:, :, :1], k1, k2, v, lam, 0.25,
                               torch.ones(b, t, dtype=torch.bool, device=DEVICE))
    assert len(grids) == 6
    for grid in grids:
        assert grid[0] <= 2 ** 31 - 1 and all(g <= 65_535 for g in grid[1:]), grid
    assert max(g[0] * (g[1] if len(g) > 1 else 1) * (g[2] if len(g) > 2 else 1) for g in grids) >= b * hq
    big = torch.zeros(65_536, 1, 1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="batch B=65536"):
        td.triton_diff_attention(big, big, big, big, big, torch.zeros((), device=DEVICE), 0.25)


def test_kinds_use_the_dtype_the_attention_runs_in():
    """Under autocast the projections, and so the kernels, run in autocast's dtype: a kind (and auto's table) is keyed
    by it, so a backward failure (keyed by the kernel's inputs) disables the forward of the same kind."""
    x = torch.zeros(2, 3)
    assert launches.attention_dtype(x) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert launches.attention_dtype(x) == torch.bfloat16
    kind = launches.triton_kind(x.device, torch.bfloat16, 64, 128, "train")
    assert kind == ("cpu", torch.bfloat16, 64, 128, "train")
    with pytest.raises(ValueError, match="pass_='fwd' is not allowed"):
        launches.triton_kind(x.device, torch.bfloat16, 64, 128, "fwd")
