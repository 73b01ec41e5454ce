"""`difftransformer bench attention`: forward+backward time (``--pass prefill``: the forward alone, without
autograd) and peak memory of one attention module of each variant, relative to the baseline with SDPA, measured in
the same run.

Times are taken round-robin in one process (each round runs every case once) and each ratio is the median over
rounds of the per-round ratio, so that a change of machine load hits all cases alike. Peak memory is measured
for each (variant, backend, N) in a fresh child process, so that it is its own: on CPU the rise of the process's
resident-set high-water mark over its first step (reset first); on CUDA ``torch.cuda.max_memory_allocated``.

``--shape`` picks the model shape (d_model, head_dim, KV heads) from ``model.config.FLAVOURS``: ``bench`` by
default, ``paper-3b`` for the paper's 3B width (d_model 3072, 24 heads of 128; on a GPU, with
``--seq-lens 2048 4096 8192 16384``); ``--d-model``, ``--head-dim`` and ``--kv-heads`` override it.

Beside the table: a ``# attention setup: {json}`` line and a ``# attention row: {json}`` line per N (the numbers as
the table rounds them; ``common.data_line``), which ``make gpu-check`` reads. ``--no-memory`` leaves memory out.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import queue as queue_module
import statistics
from collections.abc import Callable

import torch

from ..kernels.triton_tuning import config_lines
from ..model import variants
from ..model.attention import build_attention
from ..model.rope import rope_cos_sin, rope_frequencies
from .common import (
    add_shape_flag,
    bench_cases,
    bench_config,
    data_line,
    diff_backends,
    hf_diff_variant,
    resolve_shape,
    shape_default_help,
    shape_fields,
    table_row,
)
from .timing import median_ratio, paired_times

DEFAULT_BACKENDS = ("blocked", "sdpa")


def cases(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(label, attention, backend): the baseline with SDPA, then V1 and V2 with each of ``--backends``, and V1's
    eager path after V1's others with ``--eager`` (it materialises both maps: the official plain computation)."""
    chosen = bench_cases(args.backends)
    if not args.eager:
        return chosen
    v1 = variants.variant(hf_diff_variant())  # the paper's DIFF V1: its official code materialises both maps
    last_v1 = max(i for i, c in enumerate(chosen) if c[1] == v1.name)
    return [*chosen[:last_v1 + 1], (f"{v1.short} eager", v1.name, "eager"), *chosen[last_v1 + 1:]]


def _build(attention: str, backend: str, n: int, args) -> Callable[[], None]:
    """One step of a freshly built attention module on a fixed random input: forward and backward (``--pass
    train``), or the forward under ``torch.no_grad`` (``--pass prefill``: the inference pass, as ``auto`` reads it)."""
    torch.manual_seed(0)
    dt = getattr(torch, args.dtype)
    cfg = bench_config(attention, backend, d_model=args.d_model, head_dim=args.head_dim, n_layers=1,
                       vocab_size=256, max_seq_len=n, n_kv_heads=args.kv_heads,
                       shape=args.shape)  # one layer, no LM head: tiny vocab
    attn = build_attention(cfg, layer_idx=0).to(device=args.device, dtype=dt)
    train = args.pass_ == "train"
    x = torch.randn(args.batch, n, args.d_model, device=args.device, dtype=dt, requires_grad=train)
    rope = rope_cos_sin(torch.arange(n, device=args.device),
                        rope_frequencies(args.head_dim, cfg.rope_theta, args.device))

    def step() -> None:
        if not train:
            with torch.no_grad():
                attn(x, rope, None)
            return
        out, _ = attn(x, rope, None)
        out.float().square().mean().backward()
        x.grad = None
        attn.zero_grad(set_to_none=True)

    return step


def _status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS: resident now, VmHWM: its high-water mark)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} (the CPU memory measurement needs Linux)")


def _peak_child(attention: str, backend: str, n: int, args, queue, known: tuple) -> None:
    """In a fresh process: the rise of peak memory over the first step, from just after building."""
    variants.adopt(known)
    step = _build(attention, backend, n, args)
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        queue.put(torch.cuda.max_memory_allocated() - base)
    else:
        # The high-water mark of the resident set, reset just before the step (Linux: clear_refs 5), minus the
        # resident set then. ru_maxrss alone cannot be reset, and importing torch can leave it above the step's peak.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status_kib("VmRSS")
        step()
        queue.put((_status_kib("VmHWM") - base) * 1024)


def peak_memory(attention: str, backend: str, n: int, args) -> float:
    """Peak extra memory (bytes) of one step, measured in a spawned child so that it is this case's alone."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_peak_child, args=(attention, backend, n, args, q, variants.variants()))
    p.start()
    try:
        while True:  # polled: a child that dies (out of memory, an error) is an error here, not a hang
            alive = p.is_alive()  # read before waiting: a result sent just before exiting is still read
            try:
                return q.get(timeout=1.0)
            except queue_module.Empty:
                if not alive:
                    raise RuntimeError(f"the memory-measuring child for {attention}/{backend} at {n} tokens exited "
                                       f"with {p.exitcode} without a result") from None
    finally:
        p.join(timeout=60)


def run(args: argparse.Namespace) -> int:
    shape = resolve_shape(args, ("d_model", "head_dim", "kv_heads"))
    # checked before any arithmetic: --head-dim 0 would divide by zero, --batch 0 time empty tensors
    for flag, v in (("--d-model", args.d_model), ("--head-dim", args.head_dim), ("--batch", args.batch),
                    ("--repeats", args.repeats), *(("--seq-lens", n) for n in args.seq_lens),
                    *((("--kv-heads", args.kv_heads),) if args.kv_heads is not None else ())):
        if v < 1:
            raise ValueError(f"{flag} must be a positive integer, got {v}")
    if args.d_model % args.head_dim:
        raise ValueError(f"--d-model {args.d_model} must be a multiple of --head-dim {args.head_dim}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    measured = cases(args)
    for _, attention, backend in measured:  # every case must be buildable at this shape (V1 needs even head counts)
        try:
            bench_config(attention, backend, d_model=args.d_model, head_dim=args.head_dim, n_layers=1,
                         vocab_size=256, max_seq_len=max(args.seq_lens), n_kv_heads=args.kv_heads, shape=args.shape)
        except ValueError as e:
            raise ValueError(f"--d-model {args.d_model} / --head-dim {args.head_dim} / --kv-heads {args.kv_heads} "
                             f"give no valid {attention} module: {e}") from None
    ref = measured[0][0]
    what = "fwd+bwd" if args.pass_ == "train" else "forward without autograd (prefill)"
    print(f"# attention {what}, {shape}: d_model={args.d_model} head_dim={args.head_dim} "
          f"kv_heads={args.kv_heads or 'all'} batch={args.batch} {args.dtype} on {args.device} "
          f"({torch.get_num_threads()} threads).\n"
          f"# time: median over {args.repeats} rounds (after a warm-up round) of the ratio to {ref} in the same "
          f"round; cases run round-robin in one process.\n"
          + (f"# memory (xM): peak extra memory of one step, each case in a fresh process, relative to {ref}."
             if not args.no_memory else "# memory: not measured (--no-memory; the MB and xM columns read nan)."))
    widths = (6, *(20 for _ in measured))
    print(table_row(("N", *(c[0] for c in measured)), widths), flush=True)
    print(data_line("attention", "setup", {**shape_fields(shape), "head_dim": args.head_dim, "dtype": args.dtype,
                                           "pass": args.pass_, "labels": [c[0] for c in measured[1:]]}), flush=True)
    for n in args.seq_lens:
        steps = {label: _build(attention, backend, n, args) for label, attention, backend in measured}
        times = paired_times(steps, repeats=args.repeats, warmup=1)
        del steps
        mems = {label: math.nan if args.no_memory else peak_memory(attention, backend, n, args)
                for label, attention, backend in measured}
        t0, m0 = statistics.median(times[ref]), mems[ref]
        cells = [f"{t0 * 1e3:8.1f}ms {m0 / 2**20:7.1f}MB"]
        row = {"n": n, "baseline_ms": float(f"{t0 * 1e3:.1f}")}
        for label, _, _ in measured[1:]:
            ratio = median_ratio(times, label, ref)
            cells.append(f"{ratio:8.2f}x {mems[label] / max(m0, 1):8.2f}xM")
            row[label] = float(f"{ratio:.2f}")
        print(table_row((n, *cells), widths), flush=True)
        print(data_line("attention", "row", row), flush=True)
    for line in config_lines():  # the Triton tiles chosen on this GPU (timed round-robin in this process)
        print(line)
    return 0


def register(sub) -> None:
    p = sub.add_parser("attention", help="attention module time (fwd+bwd, or --pass prefill) and peak memory vs "
                                         "baseline SDPA",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    p.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096], metavar="N",
                   help="sequence lengths to measure (default: 512 1024 2048 4096; for --shape paper-3b on a GPU: "
                        "2048 4096 8192 16384)")
    add_shape_flag(p, "--head-dim 64")
    p.add_argument("--d-model", type=int, default=None, help=shape_default_help("d_model", "model width"))
    p.add_argument("--head-dim", type=int, default=None, help=shape_default_help("head_dim", "head dimension d"))
    p.add_argument("--kv-heads", type=int, default=None,
                   help="the baseline's KV heads (default: the --shape's; as many as heads where it sets none)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed rounds, median of per-round ratios reported (default 5)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="device (default cpu)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="dtype (default float32)")
    p.add_argument("--backends", nargs="+", choices=diff_backends(), default=list(DEFAULT_BACKENDS), metavar="B",
                   help=f"DIFF backends to time, each as V1 and V2 (choices: {', '.join(diff_backends())}; default: "
                        f"{' '.join(DEFAULT_BACKENDS)}); the baseline always uses sdpa")
    p.add_argument("--pass", dest="pass_", choices=["train", "prefill"], default="train",
                   help="train: forward and backward (default); prefill: the forward alone under torch.no_grad, the "
                        "inference pass `auto` reads from its own table entries")
    p.add_argument("--eager", action="store_true",
                   help="also time V1's eager path (the official plain computation with materialised maps)")
    p.add_argument("--no-memory", action="store_true",
                   help="leave the memory columns out (they read nan): no fresh process per case and length; the "
                        "time ratios are the same (make gpu-check's attention steps)")
    p.set_defaults(func=run)
