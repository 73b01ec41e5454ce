"""`difftransformer bench attention`: forward+backward time and peak memory of one attention module of each
variant, relative to the baseline with SDPA, measured in the same run.

Each (variant, backend, N) runs in a fresh child process, so that its peak memory is its own: on CPU the peak is
the rise of the process's resident-set high-water mark during the measured steps; on CUDA it is
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
from typing import Optional

import torch

from ..model.attention import build_attention
from ..model.config import ModelConfig
from ..model.rope import rope_cos_sin, rope_frequencies
from .timing import median_time

# (label, attention, backend). "eager" V1 materialises both maps: the official plain computation.
CASES: tuple[tuple[str, str, str], ...] = (
    ("baseline sdpa", "baseline", "sdpa"),
    ("V1 blocked", "diff_v1", "blocked"),
    ("V1 sdpa", "diff_v1", "sdpa"),
    ("V1 eager", "diff_v1", "eager"),
    ("V2 blocked", "diff_v2", "blocked"),
    ("V2 sdpa", "diff_v2", "sdpa"),
)


def _measure(attention: str, backend: str, n: int, d_model: int, head_dim: int, n_kv_heads: Optional[int],
             batch: int, repeats: int, device: str, dtype: str, queue) -> None:
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    cfg = ModelConfig(vocab_size=256, d_model=d_model, n_layers=1, n_heads=d_model // head_dim, head_dim=head_dim,
                      n_kv_heads=n_kv_heads, attention=attention, backend=backend, max_seq_len=n)
    attn = build_attention(cfg, layer_idx=0).to(device=device, dtype=dt)
    x = torch.randn(batch, n, d_model, device=device, dtype=dt, requires_grad=True)
    rope = rope_cos_sin(torch.arange(n, device=device), rope_frequencies(head_dim, cfg.rope_theta, device))

    def step():
        out, _ = attn(x, rope, None)
        out.float().square().mean().backward()

    step()  # warm-up outside the memory window too
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t = median_time(step, repeats=repeats, warmup=1)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    queue.put((t, peak))


def measure(label_case, n: int, args) -> tuple[float, float]:
    _, attention, backend = label_case
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_measure, args=(attention, backend, n, args.d_model, args.head_dim, args.kv_heads,
                                           args.batch, args.repeats, args.device, args.dtype, q))
    p.start()
    res = q.get()
    p.join()
    return res


def run(args: argparse.Namespace) -> int:
    if args.d_model % args.head_dim:
        raise ValueError(f"--d-model {args.d_model} must be a multiple of --head-dim {args.head_dim}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    cases = [c for c in CASES if args.eager or c[2] != "eager"]
    print(f"# attention fwd+bwd, d_model={args.d_model} head_dim={args.head_dim} kv_heads={args.kv_heads or 'all'} "
          f"batch={args.batch} {args.dtype} on {args.device} ({torch.get_num_threads()} threads); median of "
          f"{args.repeats} after warm-up; time and peak memory relative to baseline sdpa of the same N")
    header = f"{'N':>6} " + " ".join(f"{c[0]:>20}" for c in cases)
    print(header)
    for n in args.seq_lens:
        res = [measure(c, n, args) for c in cases]
        t0, m0 = res[0]
        cells = [f"{t0 * 1e3:8.1f}ms {m0 / 2**20:7.1f}MB"]
        for t, m in res[1:]:
            cells.append(f"{t / t0:8.2f}x {m / max(m0, 1):8.2f}xM")
        print(f"{n:>6} " + " ".join(f"{c:>20}" for c in cells), flush=True)
    return 0


def register(sub) -> None:
    p = sub.add_parser("attention", help="attention module fwd+bwd time and peak memory vs baseline SDPA",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096], metavar="N",
                   help="sequence lengths to measure (default: 512 1024 2048 4096)")
    p.add_argument("--d-model", type=int, default=512, help="model width (default 512)")
    p.add_argument("--head-dim", type=int, default=64, help="head dimension d (default 64)")
    p.add_argument("--kv-heads", type=int, default=None, help="the baseline's KV heads (default: as many as heads)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per cell, median reported (default 5)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="device (default cpu)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="dtype (default float32)")
    p.add_argument("--eager", action="store_true",
                   help="also time V1's eager path (the official plain computation with materialised maps)")
    p.set_defaults(func=run)
