"""The Triton differential-attention kernels (forward + backward) against a float64 PyTorch oracle.

Without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set below before triton is
imported); small shapes and 16-wide blocks keep the file fast there. The oracle is written from the equations
(arXiv 2410.05258 eq. 1): materialised softmax maps with the causal + padding-mask rule, autograd for the
gradients. The kernel checks run in float64 in the interpreter (exact to 1e-10); on CUDA, where Triton cannot
compile float64 dots (sm_90), the same cases run the kernels in float32 (TF32 off) and bfloat16 against the float64
oracle (``KERNEL_RTOL``), and each dtype's case is collected everywhere and skipped where it does not apply.
"""

from __future__ import annotations

import importlib
import logging
import os
import warnings

import pytest
import torch

from triton_interp import (
    CUDA_ONLY,
    MODEL_DTYPE,
    NO_FP64_ON_CUDA,
    ON_CUDA,
    kernel_test_model,
    model_error,
    run_in_fresh_process,
    skip_unless_interpreting,
)

td = importlib.import_module("difftransformer.kernels.triton_diff")
tdd = importlib.import_module("difftransformer.kernels.triton_decode")


@pytest.fixture(autouse=True)
def _interpreter_or_fresh_process(request):
    skip_unless_interpreting(request)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 kernels (which follow it) and matmuls in IEEE fp32
    yield
    torch.backends.cuda.matmul.allow_tf32 = tf32


def test_in_fresh_interpreter_process(request):
    run_in_fresh_process(request)  # skipped by the autouse fixture where this process runs the kernels itself


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F64_TOL = 1e-10
F32_TOL = 1e-5
# On CUDA: max |kernel - float64 oracle| per tensor <= KERNEL_RTOL[dtype] * max(1, max |oracle|). The oracle runs on
# the kernel's own (rounded) inputs, so only the kernel's arithmetic is measured.
# * float32, IEEE dots (TF32 off): unit roundoff u = 2^-24 = 6e-8. The longest sums here are a d <= 64 dot, the
#   online softmax over T <= 70 keys and the dK/dV sums over T queries times a GQA group of up to 4 (<= 280 terms):
#   at most 280 u = 1.7e-5 of the summed magnitudes, plus the GPU's approximate exp2/log2/division (a few ulp each,
#   exp's scaled by |logit| <~ 20: ~3e-6). 1e-4 is ~5x that worst case (the interpreter measures at most 1.2e-6).
# * bfloat16 (float32 accumulation): u = 2^-8 = 3.9e-3. The kernels round P (forward) and P, dS (backward) to bf16
#   before their dots: each term is off by at most u relative, so a sum of them by at most u * max|v| ~ 0.015 for
#   N(0, 1) values (under the floor of 1 x 3e-2), and round-to-nearest errors mostly cancel in sums. 3e-2 (7.7 u) is
#   the bound test_bfloat16_cuda's T = 300 cases passed with on an H200 (Triton 3.6, 2026-11-26).
KERNEL_RTOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def kernel_dtypes():
    """The dtypes a kernel check runs in: float64 in the interpreter, float32 and bfloat16 on CUDA (each collected
    everywhere and skipped, with its reason, where it does not apply)."""
    return [pytest.param(torch.float64, id="float64", marks=pytest.mark.skipif(ON_CUDA, reason=NO_FP64_ON_CUDA)),
            pytest.param(torch.float32, id="float32", marks=pytest.mark.skipif(not ON_CUDA, reason=CUDA_ONLY)),
            pytest.param(torch.bfloat16, id="bfloat16", marks=pytest.mark.skipif(not ON_CUDA, reason=CUDA_ONLY))]


def kernel_tolerance(dtype: torch.dtype, ref: torch.Tensor) -> float:
    """The largest error a kernel output or gradient in ``dtype`` may have against the float64 oracle ``ref``."""
    if dtype == torch.float64:
        return F64_TOL
    return KERNEL_RTOL[dtype] * max(1.0, ref.double().abs().max().item())


# ------------------------------------------------------------------------------------------------ oracle


def visibility(b: int, t: int, key_mask):
    """(B, 1, T, T) bool: key j visible to query t iff j <= t and key_mask[b, j]; a row that sees nothing sees
    only itself."""
    causal = torch.ones(t, t, dtype=torch.bool).tril().expand(b, t, t)
    if key_mask is None:
        return causal[:, None]
    vis = causal & key_mask.cpu()[:, None, :]
    empty = ~vis.any(-1)  # (B, T)
    vis = vis | (empty[:, :, None] & torch.eye(t, dtype=torch.bool))
    return vis[:, None]


def reference(q1, q2, k1, k2, v, lam, scale, key_mask=None):
    """float64 (softmax(q1 k1^T s + M) - lam softmax(q2 k2^T s + M)) v with repeated kv heads (GQA)."""
    b, hq, t, _ = q1.shape
    r = hq // k1.shape[1]
    k1, k2, v = (x.repeat_interleave(r, dim=1) for x in (k1, k2, v))
    vis = visibility(b, t, key_mask).to(q1.device)

    def probs(q, k):
        return (q @ k.transpose(-1, -2) * scale).masked_fill(~vis, float("-inf")).softmax(-1)

    return (probs(q1, k1) - lam * probs(q2, k2)) @ v


# ------------------------------------------------------------------------------------------------ cases


def make_case(*, b=1, hq=2, hk=1, t=17, d=16, dv_mult=2, shared_k=False, lam="scalar", lam_value=0.8,
              pads=None, dtype=torch.float64, strided_q=False, seed=0):
    """Inputs (leaf tensors on DEVICE) and the key mask. lam: 'scalar' (0-dim, lam_value) or 'row' (B, Hq, T, 1)
    with values of both signs, some > 1. pads: left-padding length per batch row (None: no mask)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(DEVICE, dtype)

    if strided_q:  # (B, T, Hq, d) projections viewed as (B, Hq, T, d): non-contiguous, unit last stride
        q1 = rnd(b, t, hq, d).transpose(1, 2)
        q2 = rnd(b, t, hq, d).transpose(1, 2)
    else:
        q1, q2 = rnd(b, hq, t, d), rnd(b, hq, t, d)
    k1 = rnd(b, hk, t, d)
    k2 = k1 if shared_k else rnd(b, hk, t, d)
    v = rnd(b, hk, t, dv_mult * d)
    if lam == "scalar":
        lam_t = torch.tensor(lam_value, dtype=dtype, device=DEVICE)
    else:  # per token and head, in [-1.5, 2.0]: negative, in (0, 1) and > 1
        lam_t = (torch.rand(b, hq, t, 1, generator=g, dtype=torch.float64) * 3.5 - 1.5).to(DEVICE, dtype)
    leaves = [q1, q2, k1] + ([] if shared_k else [k2]) + [v, lam_t]
    for x in leaves:
        x.requires_grad_(True)
    key_mask = None
    if pads is not None:
        key_mask = torch.ones(b, t, dtype=torch.bool)
        for i, p in enumerate(pads):
            key_mask[i, :p] = False
        key_mask = key_mask.to(DEVICE)
    return (q1, q2, k1, k2, v, lam_t), key_mask


def run_both(inputs, key_mask, *, block_m=16, block_n=16, ref_lam_shift=0.0, swap_ref_keys=False, seed=1):
    """Kernel output and gradients, and the float64 oracle's on the same (upcast) values.

    Returns dict name -> (kernel, reference) for 'out' and every input that has a gradient; for shared keys
    the single key gradient is reported as 'k' (both maps' contributions)."""
    q1, q2, k1, k2, v, lam = inputs
    d = q1.shape[-1]
    scale = d ** -0.5
    shared = k1 is k2
    out = td.triton_diff_attention(q1, q2, k1, k2, v, lam, scale, key_mask, block_m=block_m, block_n=block_n)
    assert out.dtype == q1.dtype and out.shape == q1.shape[:3] + (v.shape[-1],)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),
                           dtype=torch.float64).to(DEVICE, out.dtype)
    leaves = [q1, q2, k1] + ([] if shared else [k2]) + [v, lam]
    grads = torch.autograd.grad(out, leaves, grad_out)

    r = [x.detach().double().requires_grad_(True) for x in leaves]
    rq1, rq2, rk1 = r[0], r[1], r[2]
    rk2 = rk1 if shared else r[3]
    rv, rlam = r[-2], r[-1]
    if swap_ref_keys:
        rk1, rk2 = rk2, rk1
    ref = reference(rq1, rq2, rk1, rk2, rv, rlam + ref_lam_shift, scale, key_mask)
    rgrads = torch.autograd.grad(ref, r, grad_out.double())

    names = ["q1", "q2"] + (["k"] if shared else ["k1", "k2"]) + ["v", "lam"]
    res = {"out": (out, ref)}
    for name, a, e, leaf in zip(names, grads, rgrads, leaves):
        assert a.shape == leaf.shape and a.dtype == leaf.dtype, name
        res[name] = (a, e)
    return res


def max_errors(res):
    return {k: (a.double() - e).abs().max().item() for k, (a, e) in res.items()}


def assert_close(res, tol):
    errs = max_errors(res)
    bad = {k: e for k, e in errs.items() if not e <= tol}
    assert not bad, f"max abs errors above {tol}: {bad} (all: {errs})"


def assert_kernel_close(res, dtype: torch.dtype):
    """Every tensor of ``run_both``'s result within ``kernel_tolerance`` of the oracle."""
    errs = max_errors(res)
    tols = {k: kernel_tolerance(dtype, e) for k, (_, e) in res.items()}
    bad = {k: (errs[k], tols[k]) for k in errs if not errs[k] <= tols[k]}
    assert not bad, f"{dtype}: (max abs error, tolerance) above tolerance: {bad} (all errors: {errs})"


# ------------------------------------------------------------------------------------------------ float64


ORACLE_CASES = {
    # DIFF V1: two key maps, dv = 2d, one 0-dim lambda; odd T spanning three 16-blocks
    "v1_gqa1_T37": dict(b=2, hq=2, hk=2, t=37, lam_value=0.8),
    # DIFF V2: shared keys, dv = d, per-token lambda of both signs (and > 1); strided queries
    "v2_shared_gqa2_T17": dict(b=2, hq=4, hk=2, t=17, dv_mult=1, shared_k=True, lam="row", strided_q=True),
    # GQA 4 with a negative scalar lambda
    "v1_gqa4_T17_neg_lam": dict(b=1, hq=4, hk=1, t=17, lam_value=-0.6),
    # lambda > 1, a single token
    "v1_T1_lam_gt1": dict(b=2, hq=2, hk=1, t=1, lam_value=1.7),
    "v2_T1": dict(b=1, hq=2, hk=2, t=1, dv_mult=1, shared_k=True, lam="row"),
    # left padding: 0 pads, 5 pads (rows 0..4 see only themselves), 20 pads (a whole 16-key block is
    # invisible to every row and rows 0..19 see only themselves), all pads (every row sees only itself)
    "v1_padding": dict(b=4, hq=2, hk=1, t=37, lam_value=0.5, pads=[0, 5, 20, 37]),
    "v2_padding_gqa2": dict(b=3, hq=4, hk=2, t=23, dv_mult=1, shared_k=True, lam="row", pads=[3, 0, 18]),
    # one wider head: d = 64
    "v2_d64": dict(b=1, hq=2, hk=1, t=17, d=64, dv_mult=1, shared_k=True, lam="row"),
}


@pytest.mark.parametrize("dtype", kernel_dtypes())
@pytest.mark.parametrize("name", list(ORACLE_CASES))
def test_kernel_matches_oracle(name, dtype):
    inputs, key_mask = make_case(**ORACLE_CASES[name], dtype=dtype)
    res = run_both(inputs, key_mask)
    expected = {"out", "q1", "q2", "v", "lam"} | ({"k"} if ORACLE_CASES[name].get("shared_k") else {"k1", "k2"})
    assert set(res) == expected
    assert_kernel_close(res, dtype)


@pytest.mark.parametrize("dtype", kernel_dtypes())
@pytest.mark.parametrize("block_m,block_n", [(32, 16), (16, 32)])
def test_unequal_blocks(block_m, block_n, dtype):
    """block_m != block_n exercises the causal loop limits of the forward, dQ and dK/dV kernels."""
    inputs, key_mask = make_case(b=2, hq=2, hk=1, t=45, lam="row", pads=[0, 7], dtype=dtype)
    assert_kernel_close(run_both(inputs, key_mask, block_m=block_m, block_n=block_n), dtype)


@pytest.mark.skipif(ON_CUDA, reason=NO_FP64_ON_CUDA)
def test_comparison_is_sensitive():
    """A wrong lambda or swapped key maps in the oracle must be caught by the same tolerance."""
    inputs, key_mask = make_case(b=1, hq=2, hk=1, t=17, lam_value=0.8)
    errs = max_errors(run_both(inputs, key_mask, ref_lam_shift=1e-3))
    assert errs["out"] > 1e3 * F64_TOL and errs["lam"] < F64_TOL * 1e2  # dlam does not depend on lam
    errs = max_errors(run_both(inputs, key_mask, swap_ref_keys=True))
    assert min(errs[k] for k in ("out", "q1", "q2", "k1", "k2")) > 1e-3


def f64(*xs):
    return [x.detach().double() for x in xs]


@pytest.mark.parametrize("dtype", kernel_dtypes())
def test_no_grad_and_partial_grads(dtype):
    """Forward under no_grad, and a backward where only some inputs require gradients."""
    (q1, q2, k1, k2, v, lam), key_mask = make_case(b=1, hq=2, hk=1, t=17, lam_value=0.3, dtype=dtype)
    scale = q1.shape[-1] ** -0.5
    with torch.no_grad():
        out = td.triton_diff_attention(q1, q2, k1, k2, v, lam, scale, block_m=16, block_n=16)
        ref = reference(*f64(q1, q2, k1, k2, v, lam), scale)
    assert not out.requires_grad and (out.double() - ref).abs().max().item() <= kernel_tolerance(dtype, ref)
    vd = v.detach().requires_grad_(True)
    out = td.triton_diff_attention(q1.detach(), q2.detach(), k1.detach(), k2.detach(), vd, lam.detach(), scale,
                                   block_m=16, block_n=16)
    (gv,) = torch.autograd.grad(out.sum(), [vd])
    vr = v.detach().double().requires_grad_(True)
    (gr,) = torch.autograd.grad(reference(*f64(q1, q2, k1, k2), vr, lam.detach().double(), scale).sum(), [vr])
    assert gv.dtype == dtype and (gv.double() - gr).abs().max().item() <= kernel_tolerance(dtype, gr)


@pytest.mark.parametrize("dtype", kernel_dtypes())
def test_scale_tensor_is_reused_per_scale(dtype):
    """The scale tensor is made once per (scale, dtype, device); calls with two scales in turn each get their own."""
    (q1, q2, k1, k2, v, lam), _ = make_case(b=1, hq=2, hk=1, t=17, lam_value=0.3, dtype=dtype)
    acc = torch.float64 if dtype == torch.float64 else torch.float32  # the scale lives in the accumulation dtype
    with torch.no_grad():
        for scale in (0.125, 0.5, 0.125):
            out = td.triton_diff_attention(q1, q2, k1, k2, v, lam, scale, block_m=16, block_n=16)
            ref = reference(*f64(q1, q2, k1, k2, v, lam), scale)
            assert (out.double() - ref).abs().max().item() <= kernel_tolerance(dtype, ref)
    assert td._scale_tensor(0.5, acc, q1.device) is td._scale_tensor(0.5, acc, q1.device)
    assert td._scale_tensor(0.5, acc, q1.device).item() == 0.5


# ------------------------------------------------------------------------------------------------ float32 / bf16


@pytest.mark.parametrize("kind", ["v1", "v2_padding"])
def test_float32_matches_oracle(kind):
    if kind == "v1":
        inputs, key_mask = make_case(b=1, hq=4, hk=2, t=37, lam_value=0.8, dtype=torch.float32)
    else:
        inputs, key_mask = make_case(b=2, hq=2, hk=1, t=29, dv_mult=1, shared_k=True, lam="row", pads=[0, 9],
                                     dtype=torch.float32)
    assert_close(run_both(inputs, key_mask), F32_TOL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tensor-core path needs CUDA")
@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_bfloat16_cuda(kind):
    """bf16 operands, float32 accumulation. Tolerance: 3e-2 * max(1, max|ref|) per tensor, against the float64
    oracle evaluated on the same bf16-rounded inputs (bf16 has an 8-bit mantissa, ~4e-3 relative per rounding;
    the kernel rounds P and dS to bf16 before each dot). A fp32 0-dim lambda, as DIFF V1 passes it."""
    if kind == "v1":
        inputs, key_mask = make_case(b=2, hq=4, hk=2, t=300, d=64, dtype=torch.bfloat16)
        q1, q2, k1, k2, v, _ = inputs
        lam = torch.tensor(0.8, dtype=torch.float32, device=DEVICE, requires_grad=True)
        inputs = (q1, q2, k1, k2, v, lam)
    else:
        inputs, key_mask = make_case(b=2, hq=4, hk=1, t=300, d=128, dv_mult=1, shared_k=True, lam="row",
                                     pads=[0, 40], dtype=torch.bfloat16)
    res = run_both(inputs, key_mask, block_m=64, block_n=64)
    for name, (a, e) in res.items():
        tol = 3e-2 * max(1.0, e.abs().max().item())
        err = (a.double() - e).abs().max().item()
        assert err <= tol, f"{name}: max abs error {err} > {tol}"


# ------------------------------------------------------------------------------------------------ validation


def _valid(**over):
    (q1, q2, k1, k2, v, lam), _ = make_case(b=1, hq=2, hk=1, t=5)
    args = dict(q1=q1, q2=q2, k1=k1, k2=k2, v=v, lam=lam, scale=0.25, key_mask=None)
    args.update(over)
    return args


@pytest.mark.parametrize("over,exc,match", [
    (dict(v=torch.zeros(1, 1, 5, 24, dtype=torch.float64)), ValueError, "dv=24"),
    (dict(k1=torch.zeros(1, 3, 5, 16, dtype=torch.float64), k2=torch.zeros(1, 3, 5, 16, dtype=torch.float64),
          v=torch.zeros(1, 3, 5, 32, dtype=torch.float64)), ValueError, "Hq % Hk"),
    (dict(lam=torch.zeros(1, 2, 5, dtype=torch.float64)), ValueError, "lam shape"),
    (dict(q2=torch.zeros(1, 2, 4, 16, dtype=torch.float64)), ValueError, "q2 shape"),
    (dict(q1=torch.zeros(1, 2, 5, 24, dtype=torch.float64), q2=torch.zeros(1, 2, 5, 24, dtype=torch.float64)),
     ValueError, "head dim d=24"),
    (dict(key_mask=torch.ones(1, 5, dtype=torch.int64)), TypeError, "key_mask.dtype"),
    (dict(key_mask=torch.ones(1, 4, dtype=torch.bool)), ValueError, "key_mask shape"),
    (dict(v=torch.zeros(1, 1, 5, 32, dtype=torch.float32)), TypeError, "v.dtype"),
    (dict(lam=0.5), TypeError, "lam must be a torch.Tensor"),
    (dict(scale=-1.0), ValueError, "scale"),
])
def test_validation_errors(over, exc, match):
    args = _valid(**{k: (x.to(DEVICE) if isinstance(x, torch.Tensor) else x) for k, x in over.items()})
    with pytest.raises(exc, match=match):
        td.triton_diff_attention(**args)


def test_block_size_validation_and_available():
    args = _valid()
    with pytest.raises(ValueError, match="block_m=24"):
        td.triton_diff_attention(**args, block_m=24)
    assert td.triton_available()
    for d in td.ALLOWED_HEAD_DIMS:
        for dv in (d, 2 * d):
            for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                for arch in (80, 86, 90):
                    cfg = td.default_config(d, dv, dtype, arch)
                    assert set(cfg) == {"fwd", "bwd_dkdv", "bwd_dq", "decode"}
                    decode = cfg.pop("decode")
                    assert decode[0] == 0 and decode[1] >= 16 and decode[2] in (4, 8) and decode[3] in (1, 2, 3)
                    assert all(bm >= 16 and bn >= 16 and nw in (4, 8) and ns in (1, 2) for bm, bn, nw, ns in
                               cfg.values())


@pytest.mark.parametrize("dtype", kernel_dtypes())
def test_default_block_sizes(dtype):
    """No block override: each kernel runs with its default tiles for this dtype and GPU (here wider than T for
    some)."""
    inputs, key_mask = make_case(b=1, hq=2, hk=1, t=70, d=32, lam="row", pads=[3], dtype=dtype)
    assert_kernel_close(run_both(inputs, key_mask, block_m=None, block_n=None), dtype)


# ------------------------------------------------------------------------------------------------ inside the model
MODEL_CASES = [  # (attention, options): every DIFF form the backend serves
    ("diff_v1", {}), ("diff_v1", {"v1_layout": "per_head"}), ("diff_v2", {}), ("diff_v2", {"v2_lambda": "raw"}),
    ("diff_v2", {"v2_lambda": "none"}),
]


def no_fallback(record) -> None:
    """The kernels really ran: no launch of this test fell back (that would compare sdpa with eager)."""
    from difftransformer.kernels import launches

    said = [str(w.message) for w in record if "fused Triton kernel cannot run" in str(w.message)]
    assert not said and not launches._TRITON_FAILED, said


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("attention, opts", MODEL_CASES)
def test_triton_backend_in_the_model_matches_eager(attention, opts, padded, monkeypatch):
    """The `triton` backend inside the whole LM (GQA 2, head_dim 16, odd length, left padding; float64 in the
    interpreter, float32 on CUDA) against the eager backend on the same LM in float64: logits and every parameter's
    gradient (``model_error``), with the kernel called in both layers and no fallback."""
    from difftransformer.kernels import launches, triton_diff

    launches._TRITON_FAILED.clear()
    calls = []
    kernel = triton_diff.triton_diff_attention
    monkeypatch.setattr(triton_diff, "triton_diff_attention", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    model = kernel_test_model(attention, opts, DEVICE, MODEL_DTYPE)
    oracle = kernel_test_model(attention, opts, DEVICE)
    ids = torch.randint(0, 64, (2, 21), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    pad = torch.ones(2, 21, dtype=torch.bool, device=DEVICE)
    if padded:
        pad[0, :6] = False

    def run(m, backend):
        m.set_backend(backend)
        m.zero_grad()
        logits = m(ids, attention_mask=pad if padded else None).logits
        logits[pad].square().mean().backward()
        return logits[pad].detach(), {n: p.grad.clone() for n, p in m.named_parameters()}

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got, g_got = run(model, "triton")
    no_fallback(record)
    assert len(calls) == 2  # the kernel, in both layers
    want, g_want = run(oracle, "eager")
    err, tol = model_error(got, want, MODEL_DTYPE)
    assert err <= tol, ("logits", err, tol)
    for name in g_want:
        err, tol = model_error(g_got[name], g_want[name], MODEL_DTYPE)
        assert err <= tol, (name, err, tol)


@pytest.mark.parametrize("attention, opts", MODEL_CASES)
def test_triton_prefill_under_a_kv_cache(attention, opts, monkeypatch):
    """A KV cache's prefill from position 0 runs the fused kernel (counted) on the prompt's own keys, with left
    padding, and every decode step the split-KV decode kernel (counted), none falling back; the prefill's logits and
    the decode steps after it equal the eager backend's full forward of the same LM in float64 (``model_error``; the
    model in float64 in the interpreter, float32 on CUDA)."""
    from difftransformer.kernels import launches, triton_decode, triton_diff

    launches._TRITON_FAILED.clear()
    calls, decodes = [], []
    kernel, decode_kernel = triton_diff.triton_diff_attention, triton_decode.triton_diff_decode
    monkeypatch.setattr(triton_diff, "triton_diff_attention", lambda *a, **k: calls.append(a[0].shape) or kernel(*a, **k))
    monkeypatch.setattr(triton_decode, "triton_diff_decode",
                        lambda *a, **k: decodes.append(a[0].shape) or decode_kernel(*a, **k))
    model = kernel_test_model(attention, opts, DEVICE, MODEL_DTYPE).eval()
    oracle = kernel_test_model(attention, opts, DEVICE).eval()
    ids = torch.randint(0, 64, (2, 15), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    pad = torch.ones(2, 20, dtype=torch.bool, device=DEVICE)  # over the whole cache
    pad[0, :4] = False
    with torch.no_grad(), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.setup_caches(2, 20, dtype=MODEL_DTYPE)
        pre = model(ids[:, :11], input_pos=torch.arange(11, device=DEVICE), attention_mask=pad).logits
        steps = [model(ids[:, t:t + 1], input_pos=torch.tensor([t], device=DEVICE), attention_mask=pad).logits
                 for t in range(11, 15)]
        model.clear_caches()
        heads = 4 if attention == "diff_v2" or opts else 2
        assert calls == [(2, heads, 11, 16)] * 2  # the prefill, per layer
        assert decodes == [(2, heads, 1, 16)] * 2 * 4  # every decode step of every layer: the split-KV kernel
        oracle.set_backend("eager")
        full = oracle(ids, attention_mask=pad[:, :15]).logits
    no_fallback(record)
    got = torch.cat([pre, *steps], dim=1)
    real = pad[:, :15]
    err, tol = model_error(got[real], full[real], MODEL_DTYPE)
    assert err <= tol, (err, tol)


# ------------------------------------------------------------------------------------------------ decoding


def make_decode_case(*, b=2, hq=4, hk=2, n=45, d=16, dv_mult=2, shared_k=False, lam="scalar", lam_value=0.8,
                     lens=None, pads=None, dtype=torch.float64, seed=0):
    """A decode step: one query per head, a cache of n positions of which row i sees [pads[i], lens[i])."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(DEVICE, dtype)

    q1, q2 = rnd(b, hq, 1, d), rnd(b, hq, 1, d)
    k1 = rnd(b, hk, n, d)
    k2 = k1 if shared_k else rnd(b, hk, n, d)
    v = rnd(b, hk, n, dv_mult * d)
    if lam == "scalar":
        lam_t = torch.tensor(lam_value, dtype=dtype, device=DEVICE)
    else:
        lam_t = (torch.rand(b, hq, 1, 1, generator=g, dtype=torch.float64) * 3.5 - 1.5).to(DEVICE, dtype)
    lens = lens or [n] * b
    pads = pads or [0] * b
    key_mask = torch.zeros(b, n, dtype=torch.bool)
    for i, (p, length) in enumerate(zip(pads, lens)):
        key_mask[i, p:length] = True
    return (q1, q2, k1, k2, v, lam_t), key_mask.to(DEVICE)


def decode_reference(q1, q2, k1, k2, v, lam, scale, key_mask):
    r = q1.shape[1] // k1.shape[1]
    k1, k2, v = (x.double().repeat_interleave(r, dim=1) for x in (k1, k2, v))
    vis = key_mask[:, None, None, :]

    def probs(q, k):
        return (q.double() @ k.transpose(-1, -2) * scale).masked_fill(~vis, float("-inf")).softmax(-1)

    return (probs(q1, k1) - lam.double() * probs(q2, k2)) @ v


DECODE_CASES = {
    # DIFF V1: two key maps, dv = 2d, scalar lambda; cache of 45 with rows at different lengths
    "v1_gqa2": dict(lens=[45, 19]),
    # V1, GQA 4, negative lambda, left padding
    "v1_gqa4_pad_neg": dict(hq=4, hk=1, lam_value=-0.6, lens=[30, 45], pads=[7, 0]),
    # V2: shared keys, dv = d, per-row lambda of both signs, GQA 1
    "v2_gqa1": dict(hq=2, hk=2, dv_mult=1, shared_k=True, lam="row", lens=[1, 33]),
    # V2 with GQA 2 (its pairs in one group) and d = 64
    "v2_gqa2_d64": dict(hq=4, hk=2, d=64, dv_mult=1, shared_k=True, lam="row", n=20, lens=[20, 17], pads=[0, 3]),
}


@pytest.mark.parametrize("dtype", kernel_dtypes())
@pytest.mark.parametrize("splits", [1, 3, None])
@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_kernel_matches_oracle(name, splits, dtype):
    """The split-KV decode kernel against the float64 oracle: one chunk, several chunks (the merge), the default;
    16-key tiles so a chunk spans several tiles and the last one is partial."""
    inputs, key_mask = make_decode_case(**DECODE_CASES[name], dtype=dtype)
    q1, q2, k1, k2, v, lam = inputs
    scale = q1.shape[-1] ** -0.5
    with torch.no_grad():
        out = tdd.triton_diff_decode(q1, q2, k1, k2, v, lam, scale, key_mask, block_n=16, num_splits=splits)
    want = decode_reference(q1, q2, k1, k2, v, lam, scale, key_mask)
    assert out.shape == want.shape and out.dtype == q1.dtype
    tol = kernel_tolerance(dtype, want)
    assert (out.double() - want).abs().max().item() <= tol
    if dtype != torch.float64:  # the comparison can fail: the same tolerance catches a dropped second map
        dropped = decode_reference(q1, q2, k1, k2, v, torch.zeros_like(lam), scale, key_mask)
        assert (out.double() - dropped).abs().max().item() > tol
        return
    # the comparison can fail: a shifted lambda, or keys past a row's length made visible, are caught
    assert (out - decode_reference(q1, q2, k1, k2, v, lam + 1e-3, scale, key_mask)).abs().max().item() > 1e3 * F64_TOL
    if not key_mask.all():
        wider = key_mask | True
        assert (out - decode_reference(q1, q2, k1, k2, v, lam, scale, wider)).abs().max().item() > 1e-3


@pytest.mark.parametrize("dtype", kernel_dtypes())
def test_decode_kernel_skips_positions_past_the_last_visible(dtype):
    """Cached positions after a row's last visible one are never read: NaN there changes nothing."""
    (q1, q2, k1, k2, v, lam), key_mask = make_decode_case(lens=[20, 31], dtype=dtype)
    scale = q1.shape[-1] ** -0.5
    want = decode_reference(q1, q2, k1, k2, v, lam, scale, key_mask)
    for x in (k1, k2, v):
        x[0, :, 20:] = float("nan")
        x[1, :, 31:] = float("nan")
    with torch.no_grad():
        out = tdd.triton_diff_decode(q1, q2, k1, k2, v, lam, scale, key_mask, block_n=16, num_splits=2)
    assert (out.double() - want).abs().max().item() <= kernel_tolerance(dtype, want)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(q1=torch.zeros(2, 4, 2, 16, dtype=torch.float64)), ValueError, "one new token"),
    (dict(key_mask=torch.ones(2, 44, dtype=torch.bool)), ValueError, "key_mask must be a"),
    (dict(lam=torch.zeros(2, 4, dtype=torch.float64)), ValueError, "lam shape"),
    (dict(num_splits=0), ValueError, "num_splits=0"),
    (dict(block_n=24), ValueError, "block_n=24"),
])
def test_decode_validation(kw, exc, match):
    inputs, key_mask = make_decode_case()
    args = dict(zip(("q1", "q2", "k1", "k2", "v", "lam"), inputs), key_mask=key_mask)
    opts = {k: kw.pop(k) for k in ("num_splits", "block_n") if k in kw}
    args.update({k: x.to(DEVICE) for k, x in kw.items()})  # on the inputs' device: only the checked field is wrong
    with torch.no_grad(), pytest.raises(exc, match=match):
        tdd.triton_diff_decode(args["q1"], args["q2"], args["k1"], args["k2"], args["v"], args["lam"], 0.25,
                               args["key_mask"], **opts)
    with pytest.raises(ValueError, match="inference-only"):
        tdd.triton_diff_decode(*[x.detach().requires_grad_(True) for x in inputs], 0.25, key_mask)


def test_auto_backend_and_the_fallback_line(capsys):
    """`auto` is sdpa on CPU (no line); `triton` where it cannot run (no CUDA, no interpreter) says so once and falls
    back to sdpa; under a KV cache the triton backend's decode steps equal the full forward; auto never decodes with
    the (untimed) split-KV kernel."""
    from difftransformer.model import DiffTransformerLM, ModelConfig
    from difftransformer.kernels import hook, launches

    cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16, max_seq_len=32,
                      attention="diff_v1")
    assert cfg.backend == "auto"
    model = DiffTransformerLM(cfg).double()
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    attn = model.layers[0].attn
    x = torch.zeros(1, 12, 64, dtype=torch.float64)
    use_triton = hook.use_triton
    assert not use_triton(attn.backend, x, 16, 16)  # auto on CPU
    one = torch.ones(1, 1, 1, 12, dtype=torch.bool)
    with torch.no_grad():
        # auto: the PyTorch decode step, on every device
        assert not hook.use_triton_decode(attn.backend, x, one, 16, 16)
    model.set_backend("triton")
    assert attn.backend == "triton"  # the model's set_backend reaches every layer
    assert use_triton(attn.backend, x, 16, 16) == (os.environ.get("TRITON_INTERPRET") == "1")
    assert not use_triton(attn.backend, x, 24, 24)  # a head size the kernel is not built for
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        launches._SAID.clear()
        said: list[logging.LogRecord] = []
        grab = logging.Handler()
        grab.emit = said.append  # type: ignore[method-assign]
        logging.getLogger("difftransformer").addHandler(grab)  # the line is a warning of the package logger
        try:
            assert not use_triton(attn.backend, x, 16, 16) and not use_triton(attn.backend, x, 16, 16)
        finally:
            logging.getLogger("difftransformer").removeHandler(grab)
        assert len(said) == 1 and said[0].levelname == "WARNING" and "uses the sdpa path" in said[0].getMessage()
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
    full = model(ids).logits
    model.setup_caches(1, 16, dtype=torch.float64)
    with torch.no_grad():
        pre = model(ids[:, :8], input_pos=torch.arange(8)).logits
        steps = [model(ids[:, t:t + 1], input_pos=torch.tensor([t])).logits for t in range(8, 12)]
    assert (torch.cat([pre, *steps], 1) - full).abs().max() <= 1e-10
