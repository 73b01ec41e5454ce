"""The default attention path is short (issue 71 item 1): from a block to ``F.scaled_dot_product_attention`` at most
three hops (the block calls the variant, the variant ``sdpa_diff`` or the baseline's ``softmax_attention``, and that
SDPA), and on it no kernel rule is asked (``diff_route``, ``fused_kernel`` and the kernels' own rules do not run);
where a kernel's backend is chosen the rules still decide, and the maps still take the eager path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from suite_helpers import tiny_model_config

from difftransformer.model.transformer import DiffTransformerLM

PKG = str(Path(__import__("difftransformer").__file__).parent)
VARIANTS = ("diff_v1", "diff_v2", "baseline")


def _ours(frame) -> bool:  # a frame of the package's code
    return frame.f_code.co_filename.startswith(PKG)


WATCHED = ("diff_route", "diff_attention", "eager_diff", "sdpa_diff")  # dispatch's functions, by name


def _trace(model, idx, monkeypatch, **kw):
    """(hops of every SDPA call: the package's frames from the block's forward to SDPA's caller, plus one; the
    watched functions called and the kernel rules asked during the forward, by name)."""
    from difftransformer.model.attention import diff_v1, diff_v2, dispatch, fused
    hops: list[int] = []
    called: list[str] = []
    real = F.scaled_dot_product_attention

    def spy(*a, **k):
        f, n = sys._getframe(1), 0  # SDPA's caller, then up to the block's forward (model/transformer.py)
        while not (f.f_code.co_name == "forward" and f.f_code.co_filename.endswith("transformer.py")):
            n += _ours(f)  # torch.nn.Module's own call frames are not hops
            f = f.f_back
        hops.append(n + 1)  # our frames between the block and SDPA, and the call into SDPA
        return real(*a, **k)

    def watch(name, fn):
        def wrapped(*a, **k):
            called.append(name)
            return fn(*a, **k)
        return wrapped

    for name in WATCHED:  # where dispatch and the variants look them up
        wrapped = watch(name, getattr(dispatch, name))
        for mod in (dispatch, diff_v1, diff_v2):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, wrapped)
    monkeypatch.setattr(fused, "_RULES", [watch(getattr(r, "__name__", "rule"), r) for r in fused._RULES])
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model(idx, **kw)
    monkeypatch.undo()
    return hops, called


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_default_path_is_three_hops_and_asks_no_kernel_rule(variant, monkeypatch):
    model = DiffTransformerLM(tiny_model_config(variant)).train()
    hops, called = _trace(model, torch.randint(0, 64, (2, 16)), monkeypatch)
    assert hops and max(hops) <= 3, hops
    assert not {"diff_route", "diff_attention", "fused_kernel"} & set(called), called
    assert called.count("sdpa_diff") == (0 if variant == "baseline" else model.cfg.n_layers)


def test_a_kernel_backend_still_asks_the_rules_and_the_maps_still_run_eager(monkeypatch):
    model = DiffTransformerLM(tiny_model_config("diff_v1", backend="blocked")).eval()
    hops, called = _trace(model, torch.randint(0, 64, (2, 16)), monkeypatch)
    assert "fused_kernel" in called and not hops  # the blocked kernel took the call: no SDPA
    model = DiffTransformerLM(tiny_model_config("diff_v2")).eval()
    hops, called = _trace(model, torch.randint(0, 64, (2, 16)), monkeypatch, return_maps=True)
    assert not hops and "eager_diff" in called and "fused_kernel" not in called  # the maps: eager, no SDPA


def test_a_registered_rule_that_serves_the_default_backend_is_asked(monkeypatch):
    """``fused.may_take`` is how the model knows no kernel could take a call: a rule registered for ``auto`` on the
    CPU is asked again (the shortcut is the table's, not a guess of the model's)."""
    from difftransformer.model.attention import fused
    seen = []

    def rule(backend, x, head_dim, value_dim, mask, *, decode, own_keys):
        seen.append(backend)
        return None

    monkeypatch.setattr(fused, "_RULES", [*fused._RULES, rule])
    monkeypatch.setattr(fused, "_SERVES", [*fused._SERVES, lambda backend, x, d, dv: backend == "auto"])
    model = DiffTransformerLM(tiny_model_config("diff_v1")).eval()
    model(torch.randint(0, 64, (2, 16)))
    assert seen and set(seen) == {"auto"}


def test_auto_on_the_cpu_runs_the_blocked_kernel_where_the_table_says_and_sdpa_elsewhere(monkeypatch):
    """``auto``'s CPU choice is the committed table (``kernels/hook.CPU_AUTO_BLOCKED``, measured in BENCHMARKS.md):
    DIFF V1 at head_dim 16 trains through the blocked kernel from 128 tokens on, through SDPA (no rule asked) below
    it, and without autograd (the inference pass, its own entry) through SDPA below 256 tokens and the blocked kernel
    from there; the result is the same function either way."""
    from difftransformer.kernels import hook
    from difftransformer.model.attention import dispatch

    assert hook.CPU_AUTO_BLOCKED[(torch.float32, 16, 32, "train")] == 128
    model = DiffTransformerLM(tiny_model_config("diff_v1", max_seq_len=256)).train()
    attn = model.layers[0].attn
    x = torch.randn(1, 128, model.cfg.d_model, requires_grad=True)
    assert not dispatch.sdpa_direct(attn, x, False)
    assert dispatch.diff_path(attn, x, attn.head_dim, attn.value_dim, None, None, False) == "blocked"
    assert dispatch.sdpa_direct(attn, x[:, :127], False)  # shorter than the table's length: SDPA, no rule asked
    with torch.no_grad():  # the inference pass: its own entry, from 256 tokens at this head size
        assert hook.CPU_AUTO_BLOCKED[(torch.float32, 16, 32, "prefill")] == 256
        assert dispatch.sdpa_direct(attn, x.detach(), False)
        long = torch.randn(1, 256, model.cfg.d_model)
        assert not dispatch.sdpa_direct(attn, long, False)
        assert dispatch.diff_path(attn, long, attn.head_dim, attn.value_dim, None, None, False) == "blocked"
    assert dispatch.sdpa_direct(attn, x.double(), False)  # float64: not measured
    hops, called = _trace(model, torch.randint(0, 64, (2, 128)), monkeypatch)
    assert "fused_kernel" in called and not hops  # every layer: the blocked kernel, no SDPA
    idx = torch.randint(0, 64, (2, 128))
    torch.manual_seed(0)
    auto = model(idx)
    model.set_backend("sdpa")
    sdpa = model(idx)
    torch.testing.assert_close(auto.logits, sdpa.logits, rtol=1e-5, atol=1e-5)


def test_auto_on_cuda_asks_no_rule_unless_the_gpu_table_lists_the_case(monkeypatch):
    """``serves`` decides from the tables alone: ``auto`` on a GPU is sdpa with no rule asked while
    ``TRITON_AUTO_MEASURED`` is empty, and is served exactly where an entry names its (GPU, dtype, head_dim, pass).
    A stand-in for a CUDA tensor (this machine has none): what ``serves`` reads of x."""
    from types import SimpleNamespace

    from difftransformer.kernels import hook

    x = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16, shape=(2, 256, 512),
                        requires_grad=True)
    monkeypatch.setattr(hook, "cuda_capability", lambda device: (9, 0))
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type: False)
    assert hook.TRITON_AUTO_MEASURED == frozenset()
    assert not hook.serves("auto", x, 64, 64) and hook.serves("triton", x, 64, 64) and not hook.serves("sdpa", x, 64, 64)
    monkeypatch.setattr(hook, "TRITON_AUTO_MEASURED", frozenset({((9, 0), torch.bfloat16, 64, "train")}))
    assert hook.serves("auto", x, 64, 64)
    assert not hook.serves("auto", x, 128, 128) and not hook.serves("auto", x, 24, 24)  # another width; none built
    x.requires_grad = False  # the prefill pass: not listed
    assert not hook.serves("auto", x, 64, 64)


def test_a_kernel_backend_decides_once_per_case(monkeypatch):
    """Where the rules are asked (a kernel backend named, a KV cache), they decide once per case: a second forward of
    the same case, and every layer after the first, is a dict lookup (``hook.decide`` not called again); another case
    (the pass, the length against ``CPU_AUTO_BLOCKED``, the cache's decode step) is decided afresh."""
    from difftransformer.kernels import hook

    monkeypatch.setattr(hook, "_DECIDED", {})
    asked = []
    real = hook.decide

    def decide(*a, **k):
        asked.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(hook, "decide", decide)
    model = DiffTransformerLM(tiny_model_config("diff_v1", backend="blocked")).eval()
    assert model.cfg.n_layers > 1
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        first = model(idx).logits
        assert asked == ["blocked"]  # one case: every layer's call, decided at the first
        torch.testing.assert_close(model(idx).logits, first, rtol=0, atol=0)
    assert asked == ["blocked"]  # the same case again: no rule asked
    model(idx)
    assert asked == ["blocked", "blocked"]  # with autograd: the training pass, another case
    x = torch.randn(1, 127, 32, requires_grad=True)  # auto at DIFF V1's head_dim 16: blocked from 128 tokens
    assert hook.fused_kernel("auto", x, 16, 32, None, decode=False, own_keys=True) is None
    assert hook.fused_kernel("auto", torch.randn(1, 128, 32, requires_grad=True), 16, 32, None, decode=False,
                             own_keys=True) is hook.BLOCKED
    assert hook.fused_kernel("auto", x, 16, 32, None, decode=False, own_keys=True) is None  # cached, still None
    assert len(asked) == 4


def test_a_recorded_triton_failure_changes_the_cached_answer(monkeypatch):
    """The cache's key holds whether the case's Triton kind already failed in this process, so a failure recorded
    after the first answer sends the next call of that case to the PyTorch path (as the rules did per call)."""
    from difftransformer.kernels import hook, launches

    monkeypatch.setattr(hook, "_DECIDED", {})
    monkeypatch.setattr(hook, "triton_importable", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(launches, "_TRITON_FAILED", {})
    x = torch.randn(2, 8, 32, requires_grad=True)
    assert hook.fused_kernel("triton", x, 16, 16, None, decode=False, own_keys=True) is hook.TRITON
    with pytest.warns(RuntimeWarning, match="cannot run"):
        launches.triton_failed(launches.triton_kind(x.device, x.dtype, 16, 16, "train"), "a stand-in failure")
    assert hook.fused_kernel("triton", x, 16, 16, None, decode=False, own_keys=True) is None
    with torch.no_grad():  # the prefill kind did not fail: still the kernel
        assert hook.fused_kernel("triton", x, 16, 16, None, decode=False, own_keys=True) is hook.TRITON
    monkeypatch.delenv("TRITON_INTERPRET")
    assert hook.fused_kernel("triton", x.detach(), 16, 16, None, decode=False, own_keys=True) is None  # no interpreter
