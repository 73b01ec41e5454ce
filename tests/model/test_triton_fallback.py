"""When `auto` runs the Triton kernel (only where measured faster: nowhere yet), and what `backend="triton"` does when
Triton fails to compile or launch a kernel: one warning naming the kind and the reason, then the PyTorch path for that
call and every later call of its kind; our own argument checks still raise. The failures are injected into the
kernels running in Triton's CPU interpreter (TRITON_INTERPRET=1, set below before triton is imported, as in
test_triton_diff.py): a kernel replaced by one that raises Triton's own error types, and the error an H200 really
raised (``RuntimeError: PassManager::run failed``) raised inside Triton's compile step (``fail_inside_triton``) for
every kernel: the forward, each backward kernel and both decode kernels. The model runs in float64 there and in
float32 (TF32 off) on CUDA, where Triton cannot compile float64 dots.
"""

from __future__ import annotations

import importlib
import types
import warnings

import pytest
import torch

from triton_interp import (
    MODEL_DTYPE,
    fail_inside_triton,
    kernel_test_model,
    model_error,
    run_in_fresh_process,
    skip_unless_interpreting,
)

from triton.runtime.errors import OutOfResources, PTXASError  # noqa: E402

from difftransformer.model import DiffTransformerLM, ModelConfig  # noqa: E402
from difftransformer.kernels import hook, launches  # noqa: E402

td = importlib.import_module("difftransformer.kernels.triton_diff")
tdd = importlib.import_module("difftransformer.kernels.triton_decode")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE_NAME = str(MODEL_DTYPE).replace("torch.", "")


@pytest.fixture(autouse=True)
def _interpreter_or_fresh_process(request):
    skip_unless_interpreting(request)
    launches._TRITON_FAILED.clear()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 kernels and matmuls in IEEE fp32 on CUDA
    yield
    torch.backends.cuda.matmul.allow_tf32 = tf32
    launches._TRITON_FAILED.clear()


def test_in_fresh_interpreter_process(request):
    run_in_fresh_process(request)  # skipped by the autouse fixture where this process runs the kernels itself


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
    return kernel_test_model(attention, opts, DEVICE, MODEL_DTYPE)


def step(model, backend: str, ids, pad):
    """Logits and every parameter's gradient of one forward and backward."""
    model.set_backend(backend)
    model.zero_grad()
    logits = model(ids, attention_mask=pad).logits
    logits[pad].square().mean().backward()
    return logits[pad].detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same(got, want):
    """Logits and gradients within ``model_error``'s tolerance (float64: 1e-10; float32 on CUDA: 1e-4 relative)."""
    (lg, gg), (lw, gw) = got, want
    err, tol = model_error(lg, lw, MODEL_DTYPE)
    assert err <= tol, ("logits", err, tol)
    for name in gw:
        err, tol = model_error(gg[name], gw[name], MODEL_DTYPE)
        assert err <= tol, (name, err, tol)


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
    assert f"train, {DTYPE_NAME}, head_dim 16" in said[0]
    assert bad.calls == 1  # the first layer's launch failed; nothing launched it again
    if failing == "_diff_fwd_kernel":
        assert launched == 0
    else:
        assert launched == 2  # both layers' forwards ran the kernel before the backward failed
    assert fwd.calls == launched  # the second step ran sdpa throughout
    assert list(launches._TRITON_FAILED) == [launches.triton_kind(torch.device(DEVICE), MODEL_DTYPE, 16,
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
        err, tol = model_error(got, model(ids).logits, MODEL_DTYPE)
    assert err <= tol


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
        model.setup_caches(2, 20, dtype=MODEL_DTYPE)
        pre = model(ids[:, :11], input_pos=torch.arange(11, device=DEVICE)).logits
        steps = [model(ids[:, t:t + 1], input_pos=torch.tensor([t], device=DEVICE)).logits for t in range(11, 15)]
        model.clear_caches()
        model.set_backend("eager")
        full = model(ids).logits
    err, tol = model_error(torch.cat([pre, *steps], dim=1), full, MODEL_DTYPE)
    assert err <= tol
    said = fallback_warnings(record)
    assert len(said) == 1 and "decode" in said[0] and "PyTorch decode step" in said[0]
    assert bad.calls == 1


def test_argument_errors_are_not_swallowed(monkeypatch):
    """Only failures inside Triton fall back: a ValueError raised by our code where the kernel call was (outside
    Triton's frames) propagates."""
    model = model_for("diff_v1", {})
    monkeypatch.setattr(td, "_diff_fwd_kernel", Failing(ValueError("a bug, not a launch failure")))
    with pytest.raises(ValueError, match="a bug"):
        model(torch.zeros(1, 5, dtype=torch.long, device=DEVICE))
    assert not launches._TRITON_FAILED


def raised_inside_triton(error: Exception) -> Exception:
    """``error`` as it arrives from a kernel launch that Triton's code raised it in: Triton's launch proxy
    (``kernel[grid](...)``, triton/runtime/jit.py) calls the kernel's ``run``, which raises."""
    from triton.runtime.jit import KernelInterface

    class Kernel(KernelInterface):
        def run(self, *args, grid, warmup, **kwargs):
            raise error

    try:
        Kernel()[(1,)]()
    except Exception as exc:
        return exc
    raise AssertionError("the kernel did not raise")


def raised_here(error: Exception) -> Exception:
    try:
        raise error
    except Exception as exc:
        return exc


def test_which_errors_are_launch_failures():
    """Launch failures are what Triton raises (any type, by where it was raised) and Triton's own error types; our own
    ValueError/TypeError and memory exhaustion are not."""
    from triton.compiler.errors import CompilationError

    assert launches.is_triton_launch_error(OutOfResources(1, 0, "shared memory"))
    assert launches.is_triton_launch_error(PTXASError("ptxas failed"))
    assert launches.is_triton_launch_error(CompilationError("def f(): pass", None, "unsupported"))
    # what an H200 raised from Triton's LLVM lowering, and the launcher's CUDA error: raised inside Triton
    assert launches.is_triton_launch_error(raised_inside_triton(RuntimeError("PassManager::run failed")))
    assert launches.is_triton_launch_error(raised_inside_triton(RuntimeError("Triton Error [CUDA]: invalid argument")))
    assert launches.is_triton_launch_error(raised_inside_triton(AssertionError("a backend's own assertion")))
    try:  # raised from a Triton error (``raise ... from``) counts as it does
        raise RuntimeError("wrapped") from OutOfResources(1, 0, "shared memory")
    except RuntimeError as exc:
        assert launches.is_triton_launch_error(exc)
    # the same messages raised by our code, and our argument checks: not launch failures
    assert not launches.is_triton_launch_error(raised_here(RuntimeError("PassManager::run failed")))
    assert not launches.is_triton_launch_error(RuntimeError("Triton Error [CUDA]: invalid argument"))
    assert not launches.is_triton_launch_error(RuntimeError("CUDA out of memory"))
    assert not launches.is_triton_launch_error(raised_here(ValueError("head dim d=24")))
    assert not launches.is_triton_launch_error(ValueError("head dim d=24"))
    # memory exhaustion propagates even from inside Triton (a state of the moment, not of the kind of launch)
    assert not launches.is_triton_launch_error(raised_inside_triton(torch.OutOfMemoryError("CUDA out of memory")))


TRAIN_KERNELS = ["_diff_fwd_kernel", "_diff_bwd_preprocess_kernel", "_diff_bwd_dkdv_kernel", "_diff_bwd_dq_kernel"]


@pytest.mark.parametrize("attention, opts", [CASES[0], CASES[2]])
@pytest.mark.parametrize("failing", TRAIN_KERNELS)
def test_a_compile_failure_inside_triton_falls_back(attention, opts, failing, monkeypatch):
    """The error an H200 raised (``RuntimeError: PassManager::run failed`` from Triton's LLVM lowering) raised inside
    Triton's compile step of the forward kernel or of each backward kernel: the training step's logits and gradients
    equal the sdpa and eager backends', ONE warning names the kind and the reason, the failing kernel is tried once,
    and the next step runs sdpa throughout (no forward kernel launched)."""
    model = model_for(attention, opts)
    ids = torch.randint(0, 64, (2, 21), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    pad = torch.ones(2, 21, dtype=torch.bool, device=DEVICE)
    pad[0, :6] = False
    want_sdpa, want_eager = step(model, "sdpa", ids, pad), step(model, "eager", ids, pad)

    attempts = fail_inside_triton(monkeypatch, td, failing)
    fwd = Counting(td._diff_fwd_kernel)
    monkeypatch.setattr(td, "_diff_fwd_kernel", fwd)
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
    assert "(RuntimeError: PassManager::run failed)" in said[0] and "\n" not in said[0]
    assert f"train, {DTYPE_NAME}, head_dim 16" in said[0] and "use sdpa" in said[0]
    assert attempts == [failing]  # the first layer's launch failed; nothing tried it again
    assert launched == (1 if failing == "_diff_fwd_kernel" else 2)  # (the failed attempt counts as a launch)
    assert fwd.calls == launched  # the second step ran sdpa throughout
    value_dim = model.layers[0].attn.value_dim if attention == "diff_v1" else 16
    assert list(launches._TRITON_FAILED) == [launches.triton_kind(torch.device(DEVICE), MODEL_DTYPE, 16, value_dim,
                                                                  "train")]


@pytest.mark.parametrize("attention, opts", [CASES[0], CASES[2]])
@pytest.mark.parametrize("failing", ["_diff_decode_split_kernel", "_diff_decode_merge_kernel"])
def test_a_compile_failure_inside_triton_falls_back_in_decode(attention, opts, failing, monkeypatch):
    """The same error inside the compile step of either decode kernel: every decode step equals the eager full
    forward, one warning names the decode kind and the reason, the kernel is tried once, the prefill kernel runs."""
    model = model_for(attention, opts).eval()
    ids = torch.randint(0, 64, (2, 15), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    attempts = fail_inside_triton(monkeypatch, tdd, failing)
    with warnings.catch_warnings(record=True) as record, torch.no_grad():
        warnings.simplefilter("always")
        model.setup_caches(2, 20, dtype=MODEL_DTYPE)
        pre = model(ids[:, :11], input_pos=torch.arange(11, device=DEVICE)).logits
        steps = [model(ids[:, t:t + 1], input_pos=torch.tensor([t], device=DEVICE)).logits for t in range(11, 15)]
        model.clear_caches()
        model.set_backend("eager")
        full = model(ids).logits
    err, tol = model_error(torch.cat([pre, *steps], dim=1), full, MODEL_DTYPE)
    assert err <= tol
    said = fallback_warnings(record)
    assert len(said) == 1, said
    assert f"decode, {DTYPE_NAME}, head_dim 16" in said[0] and "(RuntimeError: PassManager::run failed)" in said[0]
    assert "PyTorch decode step" in said[0]
    assert attempts == [failing]
    assert [kind[-1] for kind in launches._TRITON_FAILED] == ["decode"]  # the prefill kind still runs the kernel


def test_our_argument_checks_still_raise():
    """A ValueError/TypeError from the kernels' own argument checks (before Triton is entered) propagates through the
    dispatcher's fallback: no warning, nothing recorded, the fallback never runs."""
    x = torch.zeros(1, 5, 64, dtype=MODEL_DTYPE, device=DEVICE)
    q = torch.zeros(1, 2, 5, 16, dtype=MODEL_DTYPE, device=DEVICE)
    kv = torch.zeros(1, 1, 5, 16, dtype=MODEL_DTYPE, device=DEVICE)
    lam = torch.zeros((), dtype=MODEL_DTYPE, device=DEVICE)

    def never():
        raise AssertionError("the fallback ran")

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match=r"key_mask\.dtype"):
            hook.run_triton(x, "prefill", 16, 16, lambda: td.triton_diff_attention(
                q, q, kv, kv, kv, lam, 0.25, torch.ones(1, 5, dtype=torch.int64, device=DEVICE)), never)
        with pytest.raises(ValueError, match="head dim d=24"):
            bad = torch.zeros(1, 2, 5, 24, dtype=MODEL_DTYPE, device=DEVICE)
            hook.run_triton(x, "prefill", 24, 24, lambda: td.triton_diff_attention(
                bad, bad, bad[:, :1], bad[:, :1], bad[:, :1], lam, 0.25), never)
        with torch.no_grad(), pytest.raises(ValueError, match="key_mask must be a"):
            hook.run_triton(x[:, :1], "decode", 16, 16, lambda: tdd.triton_diff_decode(
                q[:, :, :1], q[:, :, :1], kv, kv, kv, lam, 0.25, torch.ones(1, 4, dtype=torch.bool, device=DEVICE)),
                never)
    assert not fallback_warnings(record)
    assert not launches._TRITON_FAILED


def test_auto_runs_triton_only_where_measured(monkeypatch):
    """`auto` picks the kernel for a (GPU, dtype, head_dim, pass) only when TRITON_AUTO_MEASURED lists it (empty
    until `make gpu-check` measures it); every entry there is well formed; a bad pass or width is refused by name."""
    assert hook.TRITON_AUTO_MEASURED == frozenset()  # filled only from `make gpu-check`'s numbers
    for cap, dtype, head_dim, pass_ in hook.TRITON_AUTO_MEASURED:
        assert isinstance(cap, tuple) and len(cap) == 2 and cap >= hook.MIN_TRITON_CAPABILITY
        assert dtype in (torch.float16, torch.bfloat16, torch.float32) and pass_ in launches.TRITON_PASSES
        assert head_dim in launches.TRITON_HEAD_DIMS
    assert not hook.auto_runs_triton((9, 0), torch.bfloat16, 64, "train")
    monkeypatch.setattr(hook, "TRITON_AUTO_MEASURED", frozenset({((9, 0), torch.bfloat16, 64, "train")}))
    assert hook.auto_runs_triton((9, 0), torch.bfloat16, 64, "train")
    assert not hook.auto_runs_triton((9, 0), torch.bfloat16, 128, "train")  # the head width decides
    assert not hook.auto_runs_triton((9, 0), torch.bfloat16, 64, "decode")
    assert not hook.auto_runs_triton((8, 0), torch.bfloat16, 64, "train")
    assert not hook.auto_runs_triton((9, 0), torch.float32, 64, "train")
    with pytest.raises(ValueError, match="pass_='backward' is not allowed"):
        hook.auto_runs_triton((9, 0), torch.bfloat16, 64, "backward")
    with pytest.raises(ValueError, match="head_dim=48 is not allowed"):
        hook.auto_runs_triton((9, 0), torch.bfloat16, 48, "train")


def test_auto_reads_the_head_width_of_the_call(monkeypatch):
    """`auto`'s rule gets the call's head width: an entry for head_dim 64 runs the kernel for a 64-wide call only."""
    seen = []
    monkeypatch.setattr(hook, "triton_importable", lambda: True)
    monkeypatch.setattr(hook, "cuda_capability", lambda device: (9, 0))
    monkeypatch.setattr(hook, "auto_runs_triton", lambda cap, dtype, hd, p: seen.append((cap, dtype, hd, p)))
    x = types.SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16)  # what the rule reads of x
    assert not hook._triton_runs("auto", x, "train", 128, 256)
    assert seen == [((9, 0), torch.bfloat16, 128, "train")]


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
