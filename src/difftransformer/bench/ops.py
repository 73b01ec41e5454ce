"""`difftransformer bench ops`: how many operators one training step runs, DIFF V1 and V2 against the baseline.

One step is the model's forward, the loss and the backward (no clipping, no optimizer: their operators scale with
the parameter tensors, not with the attention), at the bench shape by default (sequence 1024 x batch 8, d_model
512, 8 layers, 8 baseline heads of 64, FFN 1408, vocab 8192; the shape flags as in ``bench train``). The operator
count does not depend on the sequence length nor on a batch above 1, so ``--batch 2`` counts the bench shape's
operators in a quarter of the time (batch 1 does not: the CPU's embedding backward takes another kernel there).

Columns, per case (the baseline with SDPA, then V1 and V2 with each of ``--backends``):

* ``kernels``: operators that compute or copy, as recorded by ``torch.profiler`` on the CPU: the innermost aten
  operators, without views (an operator whose outputs alias its input, such as ``transpose`` or ``slice``),
  allocations (``empty``...), composites that dispatch to others (``linear``, ``reshape``, ``to``) and operators
  that return no tensor; an operator that only fills its output before computing (a reduction) counts once, and
  a fused attention operator counts besides the input copies it makes. On a GPU each is about one kernel launch.
  With ``--device cuda`` the column counts the GPU activities (kernels, copies, fills) that the profiler records
  instead.
* ``aten calls``: every aten operator the dispatcher ran, views and composites included: the host-side work of
  an eager step.
* ``GFLOP``: the floating-point operations of the step (``torch.utils.flop_counter``: matrix products and
  attention; elementwise work is not counted).
* ``ms/step`` and ``vs baseline``: the median over ``--steps`` steps measured round-robin (every case once per
  round, after ``--warmup`` rounds), and the median over rounds of the ratio of each case's time to the baseline's
  in the same round. On a shared machine the counts are the trustworthy numbers; the times move with the load.

``--top N`` adds the N kernels whose count differs most between the cases (every case's count of each): where
the extra operators of a variant come from.
"""

from __future__ import annotations

import argparse
import collections
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import torch

from ..model.config import ModelConfig
from . import train as bench_train
from .common import (
    add_model_flags,
    bench_cases,
    print_load,
    resolve_shape,
    table_row,
)
from .timing import median_ratio, paired_times

DEFAULT_BACKENDS = ("sdpa",)
# Operators that allocate without computing, and ``_unsafe_view`` (a view whose schema does not say so): no kernel.
NO_KERNEL = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "resize_",
                       "_unsafe_view"})
# Operators that only fill a tensor with a constant: inside another operator, part of that operator's kernel.
INITIALISERS = frozenset({"fill_", "zero_", "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones",
                          "full", "full_like", "new_full", "scalar_tensor"})


@dataclass
class OpCount:
    """The operators of one step: per-kernel counts (name -> calls), every aten call, and the FLOPs."""

    kernels: collections.Counter
    aten_calls: int
    flops: int


@cache
def launches_no_kernel(name: str) -> bool:
    """Whether the aten operator ``name`` (without the ``aten::`` prefix) never computes by itself: an allocation,
    a composite (CompositeImplicitAutograd: it only calls other operators), an operator that returns no tensor,
    or a view (every output aliases an input without writing it: ``transpose``, ``slice``, ``expand``...)."""
    if name in NO_KERNEL:
        return True
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return False
    # the out= overloads aside (``linear.out`` has a kernel of its own; the profiler names no overload)
    overloads = [getattr(packet, o) for o in packet.overloads() if o != "out" and not o.endswith("_out")]
    return bool(overloads) and all(_computes_nothing(op) for op in overloads)


def _computes_nothing(op: torch._ops.OpOverload) -> bool:
    returns = op._schema.returns
    if not any(isinstance(r.type, torch._C.TensorType) for r in returns):
        return True  # also TorchScript's list overloads (``select.t``), which the dispatcher does not hold
    if all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return True
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def count_cpu_kernels(events) -> tuple[collections.Counter, int]:
    """(kernel name -> count, aten calls) of a CPU profile. A kernel is an aten operator that computes
    (not ``launches_no_kernel``) and calls no other such operator (``linear`` counts as its ``mm``, ``to`` as its
    ``copy_``), except that an operator whose callees only fill its output first (``INITIALISERS``: a reduction's
    ``fill_``, the attention backward's ``zero_``) counts as one kernel, its own, and that a fused attention
    operator counts as one kernel besides the copies it makes of its inputs."""
    kernels: collections.Counter = collections.Counter()
    calls = 0

    def visit(event) -> list[str]:  # the kernels of event's subtree
        nonlocal calls
        inner = [name for child in event.cpu_children for name in visit(child)]
        if not event.name.startswith("aten::"):
            return inner
        calls += 1
        name = event.name[len("aten::"):]
        if launches_no_kernel(name):
            return inner
        if not inner:
            return [name]
        if name not in INITIALISERS and all(n in INITIALISERS for n in inner):
            return [name]  # a reduction filling its output, the attention backward zeroing its gradients
        if "attention" in name:  # the fused attention kernels: their own work besides the copies they make
            return [name, *(n for n in inner if n not in INITIALISERS)]
        return inner

    for event in events:
        if event.cpu_parent is None:
            kernels.update(visit(event))
    return kernels, calls


def count_ops(step: Callable[[], None], device: torch.device) -> OpCount:
    """Profile one ``step()`` and count its operators (``--device cuda``: the GPU activities as kernels)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    kernels, calls = count_cpu_kernels(prof.events())
    if device.type == "cuda":
        kernels = collections.Counter(e.name for e in prof.events()
                                      if e.device_type == torch.autograd.DeviceType.CUDA)
    with FlopCounterMode(display=False) as flop_counter:
        step()
    return OpCount(kernels, calls, flop_counter.get_total_flops())


def make_step(cfg: ModelConfig, args: argparse.Namespace) -> tuple[Callable[[], None], int]:
    """(one forward + loss + backward of a fresh model of ``cfg`` on fixed random tokens, its parameter count)."""
    from ..model.transformer import DiffTransformerLM
    from ..train.steps import autocast_for

    torch.manual_seed(0)
    device = torch.device(args.device)
    model = DiffTransformerLM(cfg).to(device)
    autocast = autocast_for(device, args.precision)
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1),
                           generator=torch.Generator().manual_seed(0)).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        with autocast():
            loss = model(x, y).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step, sum(p.numel() for p in model.parameters())


def top_differences(counts: Sequence[collections.Counter], n: int) -> list[str]:
    """The ``n`` kernel names whose counts differ most between the cases (largest max - min first)."""
    names = set().union(*counts)
    spread = {k: max(c[k] for c in counts) - min(c[k] for c in counts) for k in names}
    return sorted((k for k in names if spread[k]), key=lambda k: (-spread[k], k))[:n]


def run(args: argparse.Namespace) -> int:
    shape = resolve_shape(args, bench_train.SHAPE_DESTS)
    for name in ("steps", "batch", "seq_len", "layers", "d_model", "vocab_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("warmup", "threads", "top"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(args, name)}")
    if args.kv_heads is not None and args.kv_heads < 1:
        raise ValueError(f"--kv-heads must be >= 1, got {args.kv_heads}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    if args.threads:
        torch.set_num_threads(args.threads)
    measured = bench_cases(args.backends)
    cfgs = [bench_train.model_config(args, attention, backend) for _, attention, backend in measured]
    print(f"# one training step (forward + loss + backward), {shape}: seq {args.seq_len} x batch {args.batch}, "
          f"d_model {args.d_model}, {args.layers} layers, {args.heads} baseline heads of {cfgs[0].head_dim} (kv "
          f"{cfgs[0].n_kv_heads}), FFN {cfgs[0].ffn_hidden}, vocab {args.vocab_size}; {args.device} "
          f"{args.precision}, torch {torch.__version__}, {torch.get_num_threads()} threads; time: median of "
          f"{args.steps} round-robin rounds after {args.warmup}", flush=True)
    print_load("before")
    steps, params, counts = [], [], []
    for cfg in cfgs:
        step, n = make_step(cfg, args)
        step()  # the first call allocates and picks kernels: not what a step runs
        steps.append(step)
        params.append(n)
        counts.append(count_ops(step, torch.device(args.device)))
    labels = [label for label, _, _ in measured]
    times = paired_times(dict(zip(labels, steps)), repeats=args.steps, warmup=args.warmup)
    what = "GPU kernels" if args.device == "cuda" else "kernels"
    widths = (-14, 12, 11, 11, 8, 9, 12)
    print(table_row(("case", "parameters", what, "aten calls", "GFLOP", "ms/step", "vs baseline"), widths))
    base = counts[0]
    for label, n, c in zip(labels, params, counts):
        k = sum(c.kernels.values())
        print(table_row((label, f"{n:,}", f"{k:,} {k / sum(base.kernels.values()):.2f}x",
                         f"{c.aten_calls:,} {c.aten_calls / base.aten_calls:.2f}x", f"{c.flops / 1e9:.1f}",
                         f"{statistics.median(times[label]) * 1e3:.1f}",
                         f"{1 / median_ratio(times, label, labels[0]):.3f}x"), widths))
    if args.top:
        names = top_differences([c.kernels for c in counts], args.top)
        print(f"# the {len(names)} kernels whose count differs most between the cases (calls per step)")
        print(table_row(("kernel", *labels), (-44, *([14] * len(labels)))))
        for name in names:
            print(table_row((name, *(c.kernels[name] for c in counts)), (-44, *([14] * len(labels)))))
    print_load("after", "vs baseline: tokens/s ratio (baseline time / case time, per round)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("ops", help="operators (kernels), FLOPs and time of one training step vs the baseline",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    p.add_argument("--seq-len", type=int, default=1024, help="sequence length (default 1024)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    add_model_flags(p, "--layers 4", verb="count", default_backends=DEFAULT_BACKENDS)
    p.add_argument("--steps", type=int, default=3, help="timed rounds, median reported (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds before them (default 1)")
    p.add_argument("--top", type=int, default=0, metavar="N",
                   help="also list the N kernels whose count differs most between the cases (default 0: none)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="device (default cpu; cuda counts the GPU activities the profiler records)")
    p.add_argument("--precision", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="as train.precision: auto = bf16 autocast on CUDA, float32 on CPU (default auto)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's default)")
    p.set_defaults(func=run)
