"""`difftransformer bench train`: training throughput (tokens/s) of DIFF V1 and DIFF V2 relative to the baseline.

One full optimizer step of the whole LM as the trainer runs it (forward, loss, backward, gradient clipping, AdamW
with the trainer's parameter groups, bf16 autocast where the trainer would use it) on random tokens. The default
shape is the issue's: sequence 1024, d_model 512, 8 layers, 8 baseline heads of 64 (DIFF V1: 4 differential heads,
parameters matched to the baseline; DIFF V2: 16 query heads, its extra query projection and W_lambda included).

Each case runs in a fresh child process, one after the other; the step time is the median of ``--steps`` steps
after ``--warmup`` untimed ones; with ``--rounds R`` the cases are measured R times interleaved and the median
of the R medians is reported (use it on a shared machine). The 1-minute load average is printed before and after.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics

import torch

from ..model.config import ModelConfig
from .common import SHAPE, bench_config, print_load, table_row
from .timing import median_time

# (label, attention, backend). The baseline has one attention path worth timing (SDPA); "blocked" is DIFF's kernel.
CASES: tuple[tuple[str, str, str], ...] = (
    ("baseline sdpa", "baseline", "sdpa"),
    ("V1 sdpa", "diff_v1", "sdpa"),
    ("V1 blocked", "diff_v1", "blocked"),
    ("V2 sdpa", "diff_v2", "sdpa"),
    ("V2 blocked", "diff_v2", "blocked"),
)


def model_config(args: argparse.Namespace, attention: str, backend: str) -> ModelConfig:
    if args.heads < 1 or args.d_model % args.heads:
        raise ValueError(f"--heads {args.heads} must be a positive divisor of --d-model {args.d_model}")
    return bench_config(attention, backend, d_model=args.d_model, head_dim=args.d_model // args.heads,
                        n_layers=args.layers, vocab_size=args.vocab_size, max_seq_len=args.seq_len,
                        n_kv_heads=args.kv_heads)


def _measure(cfg: ModelConfig, args: argparse.Namespace, queue) -> None:
    """Child process: build the model and optimizer, time training steps, send back (seconds/step, parameters)."""
    from ..model.transformer import DiffTransformerLM
    from ..train.config import OptimConfig
    from ..train.optim import build_optimizer
    from ..train.trainer import autocast_for

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = DiffTransformerLM(cfg).to(device)
    optimizer = build_optimizer(model, OptimConfig())
    step_model = torch.compile(model) if args.compile else model
    autocast = autocast_for(device, args.precision)
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1), device=device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        with autocast():
            loss = step_model(x, y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = median_time(step, repeats=args.steps, warmup=args.warmup)
    queue.put((seconds, model.num_parameters()))


def measure(cfg: ModelConfig, args: argparse.Namespace) -> tuple[float, int]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(cfg, args, queue))
    proc.start()
    try:
        result = queue.get(timeout=args.timeout)
    finally:
        proc.join(timeout=60)
    if proc.exitcode not in (0, None):
        raise RuntimeError(f"the benchmark child for {cfg.attention}/{cfg.backend} exited with {proc.exitcode}")
    return result


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.steps, args.warmup = min(args.steps, 3), 1
    for name in ("steps", "warmup", "rounds", "batch", "seq_len", "timeout", "threads", "layers", "d_model",
                 "vocab_size"):
        low = 0 if name in ("warmup", "threads") else 1
        if getattr(args, name) < low:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    if args.kv_heads is not None and args.kv_heads < 1:
        raise ValueError(f"--kv-heads must be >= 1, got {args.kv_heads}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    cases = [c for c in CASES if c[1] == "baseline" or c[2] in args.backends]
    cfgs = [model_config(args, attention, backend) for _, attention, backend in cases]  # validates the shape
    threads = args.threads or torch.get_num_threads()
    print(f"# training step (fwd + bwd + clip + AdamW), seq {args.seq_len} x batch {args.batch}, d_model "
          f"{args.d_model}, {args.layers} layers, {args.heads} baseline heads (kv {cfgs[0].n_kv_heads}), vocab "
          f"{args.vocab_size}; {args.device} {args.precision}{' compiled' if args.compile else ''}, "
          f"{threads} threads; median of {args.steps} steps after {args.warmup} warm-up, {args.rounds} round(s)",
          flush=True)
    print_load("before")
    times: list[list[float]] = [[] for _ in cases]
    params = [0] * len(cases)
    for _ in range(args.rounds):
        for i, cfg in enumerate(cfgs):
            seconds, params[i] = measure(cfg, args)
            times[i].append(seconds)
    tokens = args.batch * args.seq_len
    base = statistics.median(times[0])
    widths = (-14, 12, 9, 10, 12)  # negative: left-aligned
    print(table_row(("case", "parameters", "ms/step", "tokens/s", "vs baseline"), widths))
    for (label, _, _), n, ts in zip(cases, params, times):
        t = statistics.median(ts)
        print(table_row((label, f"{n:,}", f"{t * 1e3:.1f}", f"{tokens / t:,.0f}", f"{base / t:.3f}x"), widths))
    print_load("after", "targets: V1 >= 0.92x, V2 >= 0.88x (tokens/s vs baseline)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="training tokens/s of DIFF V1 and V2 relative to the baseline",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    p.add_argument("--seq-len", type=int, default=1024, help="sequence length (default 1024)")
    p.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    p.add_argument("--d-model", type=int, default=SHAPE["d_model"], help=f"model width (default {SHAPE['d_model']})")
    p.add_argument("--layers", type=int, default=SHAPE["n_layers"],
                   help=f"number of layers (default {SHAPE['n_layers']})")
    p.add_argument("--heads", type=int, default=SHAPE["n_heads"],
                   help=f"the baseline's query heads (default {SHAPE['n_heads']}, head_dim {SHAPE['head_dim']})")
    p.add_argument("--kv-heads", type=int, default=None, help="the baseline's KV heads (default: as many as heads)")
    p.add_argument("--vocab-size", type=int, default=SHAPE["vocab_size"],
                   help=f"vocabulary size (default {SHAPE['vocab_size']}, the data default)")
    p.add_argument("--backends", nargs="+", choices=["sdpa", "blocked"], default=["sdpa", "blocked"],
                   help="DIFF backends to time (default: sdpa blocked); the baseline always uses sdpa")
    p.add_argument("--steps", type=int, default=5, help="timed steps per case, median reported (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps per case (default 2)")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure all cases R times, interleaved, and report the median (default 1)")
    p.add_argument("--quick", action="store_true", help="3 timed steps after 1 warm-up (a few minutes on 2 cores)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="device (default cpu)")
    p.add_argument("--precision", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="as train.precision: auto = bf16 autocast on CUDA, float32 on CPU (default auto)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (as train.compile)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per child (default: torch's default)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds to wait for one case (default 1800)")
    p.set_defaults(func=run)
