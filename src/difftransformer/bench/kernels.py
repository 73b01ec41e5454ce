"""`difftransformer bench kernels`: where the fused Triton kernel loses -- its forward, dK/dV and dQ kernels timed
one by one against SDPA's forward and backward at one shape, with the FLOP rate each achieves.

One attention call per case, on inputs laid out as each variant's layer passes them to its attention path (the
heads, KV heads and value width of the layer ``bench_config`` builds for ``--shape``; paper-3b: the baseline 24
heads of 128; DIFF V1 12 differential heads of 128 over two key maps, values 256 wide; DIFF V2 24 of 128 over one
shared key map), batch ``--batch``, in ``--dtype``, causal:

* ``baseline sdpa``: ``dispatch.sdpa`` over the baseline's heads (FlashAttention on an H100);
* ``V1 sdpa``, ``V2 sdpa``: the same differential maps by SDPA (``dispatch.sdpa_diff``, what the ``sdpa``
  backend runs);
* ``V1 triton``, ``V2 triton``: the fused kernels through ``triton_diff``'s autograd Function with the tuner's
  tiles, as a layer runs them (``bench attention``), each kernel launch bracketed by CUDA events: rows ``fwd
  kernel``, ``dK/dV kernel``, ``dQ kernel``; its ``fwd`` and ``bwd`` rows are the whole passes (the backward's
  Delta preprocessing kernel and its allocations included).

Times: median over ``--repeats`` calls after one warm-up call (which tunes the tiles), GPU time between CUDA events
(on the CPU, wall time in Triton's interpreter: the plumbing, not a measurement). ``x base``: the time over the
baseline's same pass (a backward kernel over the whole baseline backward); ``x sdpa``: over the same variant's
SDPA pass.

FLOPs, matmul work of a causal call, B N^2 / 2 (query, key) pairs per head, a product of width x costing
2 (B N^2 / 2) x = B N^2 x:

* a pass row (fwd, bwd) counts FlashAttention's convention for every softmax map (the baseline's heads; two per
  differential head) of key width d and value width dv: forward B N^2 (d + dv) (QK^T and PV; 4 B H N^2 d / 2 at
  dv = d), backward 2.5 times that. One count per case and pass, whatever an implementation recomputes (V1's SDPA
  path splits its values in two and so computes its scores twice), so the rates compare useful work.
* a kernel row counts the products that kernel computes, per differential head: fwd 2 B N^2 (d + dv) (both maps'
  QK^T and PV; V1's value-split tiles recompute the scores, not counted); dK/dV B N^2 (4d + 2dv) (both maps'
  scores again, dP and dV once for both maps, dK1 and dK2); dQ B N^2 (4d + dv) (both scores, dP, dQ1 and dQ2).

Each row is also printed as a ``# kernels row: {json}`` line (``gpucheck/gpu_readers.py`` reads them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ..kernels.triton_tuning import config_lines
from ..model import variants
from ..model.attention import build_attention, dispatch
from ..model.config import FLAVOURS
from .common import bench_config, shape_config, table_row

ROW_PREFIX = "# kernels row: "
KERNEL_ROWS = {"fwd": "fwd kernel", "bwd_dkdv": "dK/dV kernel", "bwd_dq": "dQ kernel"}
BWD_SHARE = 2.5  # FlashAttention's backward / forward FLOP ratio (5 products against 2 at dv = d)


def layout(shape: str, attention: str) -> dict[str, Any]:
    """The tensors ``attention``'s layer passes to its attention path at ``shape`` (built on the meta device): query
    heads (2 per differential head), key heads, value heads, d, dv, and the key layout ("paired" / "shared")."""
    flavour = shape_config(shape)
    cfg = bench_config(attention, "sdpa", d_model=flavour.d_model, head_dim=flavour.head_dim, n_layers=1,
                       vocab_size=256, max_seq_len=256, n_kv_heads=FLAVOURS[shape].get("n_kv_heads"), shape=shape)
    with torch.device("meta"):
        layer = build_attention(cfg, 0)
    k_heads, d, v_heads, dv = layer.cache_layout()
    reference = variants.variant(attention).reference
    h: Any = layer.n_heads  # V1: its differential heads; V2: H (a module attribute to the type checker)
    h = int(h)
    return {"h": h, "q_heads": h if reference else 2 * h, "k_heads": k_heads, "v_heads": v_heads, "d": d, "dv": dv,
            "keys": None if reference else ("shared" if k_heads == v_heads else "paired")}


def flops(lay: dict[str, Any], batch: int, n: int) -> dict[str, float]:
    """The module docstring's counts for one call: per pass ("fwd", "bwd") and per fused kernel."""
    d, dv, maps = lay["d"], lay["dv"], lay["q_heads"]
    pairs = batch * n * n  # B N^2: a product of width x over the visible pairs costs pairs * x
    out = {"fwd": maps * pairs * (d + dv)}
    out["bwd"] = BWD_SHARE * out["fwd"]
    if lay["keys"] is not None:
        h = lay["h"]
        out.update({"fwd kernel": out["fwd"], "dK/dV kernel": h * pairs * (4 * d + 2 * dv),
                    "dQ kernel": h * pairs * (4 * d + dv)})
    return out


class Clock:
    """Marks on the device's timeline: CUDA events on a GPU (GPU time between two marks), else wall time."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def _triton_call(lay: dict[str, Any], q, k, v, lam, scale: float, spans: dict[str, list], clock: Clock
                 ) -> Callable[[], torch.Tensor]:
    """The fused kernels as a layer calls them (``triton_diff_attention``'s configuration: default tiles, tuned on
    sm_80/sm_90), with every kernel launch bracketed by two clock marks appended to ``spans[kernel]``."""
    from ..kernels import triton_diff as td

    class Timed(td._Cfg):
        def run(self, kernel: str, launch, device: torch.device) -> None:
            start = clock.mark()
            super().run(kernel, launch, device)
            spans.setdefault(kernel, []).append((start, clock.mark()))

    n, d, dv, shared = q.shape[2], lay["d"], lay["dv"], lay["keys"] == "shared"
    arch = td._device_arch(q.device)
    kernels = td.default_config(d, dv, q.dtype, arch)
    cfg = Timed(kernels, td.dot_precision(q.dtype, None), (arch, q.dtype, d, dv, shared, n))

    def call() -> torch.Tensor:
        (q1, q2), (k1, k2) = dispatch.split_pairs(q, "interleaved"), dispatch.split_keys(k, lay["keys"])
        return td._TritonDiffAttention.apply(q1, q2, k1, k2, v, lam, scale, None, shared, cfg)

    return call


def time_case(label: str, attention: str, backend: str, lay: dict[str, Any], args, n: int) -> dict[str, float]:
    """Median milliseconds of each pass ("fwd", "bwd") and, for the fused kernels, of each kernel."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device, dtype).requires_grad_(True)

    b, d, dv = args.batch, lay["d"], lay["dv"]
    q, k, v = randn(b, lay["q_heads"], n, d), randn(b, lay["k_heads"], n, d), randn(b, lay["v_heads"], n, dv)
    dout = torch.randn(b, lay["h"], n, dv, generator=g).to(device, dtype)
    scale, leaves = d ** -0.5, [q, k, v]
    clock = Clock(device)
    spans: dict[str, list] = {}  # kernel -> (start, end) marks of each launch
    if lay["keys"] is None:
        def call() -> torch.Tensor:
            return dispatch.sdpa(q, k, v, None, scale)
    else:
        # V1: one 0-dim float32 lambda; V2: a lambda per row and head in the activations' dtype (as the layers)
        lam = (torch.tensor(0.8, device=device) if lay["keys"] == "paired" else
               torch.rand(b, lay["h"], n, 1, generator=g).to(device, dtype)).requires_grad_(True)
        leaves.append(lam)
        call = (_triton_call(lay, q, k, v, lam, scale, spans, clock) if backend == "triton" else
                lambda: dispatch.sdpa_diff(q, k, v, lam, None, scale, lay["keys"], "interleaved"))
    marks = []
    for i in range(1 + args.repeats):  # the first: warm-up (compiles, tunes); its marks are dropped
        if i == 1:
            spans.clear()
        t0 = clock.mark()
        out = call()
        t1 = clock.mark()
        out.backward(dout)
        t2 = clock.mark()
        clock.sync()
        for x in leaves:
            x.grad = None
        if i:
            marks.append((t0, t1, t2))
    ms = {"fwd": statistics.median(clock.ms(a, b_) for a, b_, _ in marks),
          "bwd": statistics.median(clock.ms(b_, c) for _, b_, c in marks)}
    for kernel, row in KERNEL_ROWS.items():
        if spans.get(kernel):
            ms[row] = statistics.median(clock.ms(a, b_) for a, b_ in spans[kernel])
    order = ("fwd", "fwd kernel", "bwd", "dK/dV kernel", "dQ kernel")  # each pass, then its kernels
    return {k: ms[k] for k in order if k in ms}


def rows_of(cases: list[tuple[str, str, str]], times: dict[str, dict[str, float]], lays: dict[str, dict],
            args, n: int) -> list[dict[str, Any]]:
    """One row per (case, pass or kernel): ms, FLOPs, TFLOP/s, and the time over the baseline's and over the same
    variant's SDPA pass."""
    base = times[cases[0][0]]
    rows = []
    for label, attention, backend in cases:
        lay, count = lays[attention], flops(lays[attention], args.batch, n)
        sdpa = times.get(f"{label.split()[0]} sdpa", {})
        for what, ms in times[label].items():
            pass_ = "fwd" if what.startswith("fwd") else "bwd"
            rows.append({"case": label, "what": what, "n": n, "ms": ms, "flops": count[what],
                         "tflops": count[what] / (ms * 1e-3) / 1e12, "vs_base": ms / base[pass_],
                         "vs_sdpa": ms / sdpa[pass_] if backend != "sdpa" and pass_ in sdpa else None,
                         "d": lay["d"], "dv": lay["dv"], "maps": lay["q_heads"], "shape": args.shape})
    return rows


def run(args: argparse.Namespace) -> int:
    shape_config(args.shape)  # a ValueError naming --shape and the choices
    for flag, v in (("--batch", args.batch), ("--repeats", args.repeats), *(("--seq-lens", n) for n in args.seq_lens)):
        if v < 1:
            raise ValueError(f"{flag} must be a positive integer, got {v}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("--device cpu runs the Triton kernels only in Triton's interpreter: set TRITON_INTERPRET=1 "
                         "in the environment (a plumbing check, not a measurement)")
    if args.dtype == "bfloat16" and args.device == "cpu":
        raise ValueError("--dtype bfloat16 needs --device cuda (the interpreter has no bfloat16 arithmetic)")
    ref = variants.reference()
    cases = [(f"{ref.short} sdpa", ref.name, "sdpa"),
             *((f"{v.short} {b}", v.name, b) for v in variants.compared() for b in ("sdpa", "triton"))]
    lays = {attention: layout(args.shape, attention) for _, attention, _ in cases}
    print(f"# attention kernels, shape {args.shape}: "
          + "; ".join(f"{label.split()[0]} {lay['q_heads']} softmax maps, d {lay['d']}, dv {lay['dv']}"
                      for (label, _, _), lay in zip(cases[::2], lays.values()))
          + f"; batch {args.batch}, {args.dtype} on {args.device}, causal", flush=True)
    clock = "GPU time (CUDA events)" if args.device == "cuda" else "wall time"
    print(f"# median of {args.repeats} calls after 1 warm-up; {clock}; x base: time over the baseline's same "
          "pass; x sdpa: over the same variant's SDPA pass", flush=True)
    print("# FLOPs: a pass counts FlashAttention's convention per softmax map, fwd B N^2 (d + dv), bwd 2.5x; a kernel "
          "counts its own products (bench/kernels.py)", flush=True)
    widths = (-11, -13, 7, 9, 8, 9, 8, 8)
    print(table_row(("case", "what", "N", "ms", "TFLOP", "TFLOP/s", "x base", "x sdpa"), widths), flush=True)
    for n in args.seq_lens:
        times = {label: time_case(label, attention, backend, lays[attention], args, n)
                 for label, attention, backend in cases}
        for r in rows_of(cases, times, lays, args, n):
            vs_sdpa = "-" if r["vs_sdpa"] is None else f"{r['vs_sdpa']:.2f}x"
            print(table_row((r["case"], r["what"], n, f"{r['ms']:.2f}", f"{r['flops'] / 1e12:.3f}",
                             f"{r['tflops']:.1f}", f"{r['vs_base']:.2f}x", vs_sdpa), widths))
            print(ROW_PREFIX + json.dumps(r, sort_keys=True), flush=True)
    for line in config_lines():  # the Triton tiles the tuner chose (the kernel rows ran with them)
        print(line)
    return 0


def register(sub) -> None:
    p = sub.add_parser("kernels", help="the fused kernel's fwd, dK/dV and dQ kernels vs SDPA's fwd and bwd, TFLOP/s",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    p.add_argument("--shape", default="paper-3b", metavar="NAME",
                   help=f"named model shape whose layers' heads are timed ({', '.join(FLAVOURS)}; default paper-3b)")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[16384], metavar="N",
                   help="sequence lengths (default 16384)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per case, median reported (default 5)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda",
                   help="device (default cuda; cpu runs Triton's interpreter, TRITON_INTERPRET=1, at toy size)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16",
                   help="dtype (default bfloat16; the interpreter needs float32)")
    p.set_defaults(func=run)
