"""`difftransformer bench layer`: the public layer (``from difftransformer import DiffAttention``) against timm's DIFF
V1 layer (``timm.layers.diff_attention.DiffAttention``) and our baseline with SDPA, forward and backward, at a ViT
shape and an LM shape, eager and under ``torch.compile``.

The cases of each table, all at the same d_model and head width d:

* ``timm V1``: timm's layer (DIFF V1, no biases, ``fused_attn`` on: two SDPA calls with a 2d-wide value);
* ``ours V1``: our DIFF V1 layer holding timm's weights (the same function: the same work; the largest output
  difference is printed), RoPE off, our default backend;
* ``ours V2``: our DIFF V2 layer, RoPE off;
* ``ours baseline``: our baseline layer (SDPA), RoPE off: the reference of the ``vs baseline`` column.

Shapes: ``vit`` (B=32, T=197 (a 14x14 patch grid and a class token), d_model 384, 6 baseline heads of 64,
bidirectional) and ``lm`` (B=4, T=512, d_model 512, 8 baseline heads of 64, causal; timm is called with
``is_causal=True``). ``n_heads`` counts the baseline's heads: DIFF V1 has n_heads/2 heads of width 2d, which is
timm's ``num_heads``. ``--batch`` and ``--seq-len`` override every shape's (the tests run a tiny one).

One step is the forward of a fixed random input, the sum of the output, and its backward to the input and every
weight. Each case runs once first (in ``compile`` mode: ``torch.compile``'s default inductor compiles then, so the
compile time is not timed), then ``--warmup`` untimed rounds, then ``--rounds`` timed rounds, round-robin in one
process (each round runs every case once). ``ms`` is a case's median time; each ratio is the median over rounds of
the per-round ratio of the two cases' times (> 1: slower than the other). ``--threads`` (default 1) fixes torch's
intra-op threads, so that runs on a machine with other work are comparable.

timm is an optional package here: its package ``__init__`` imports torchvision, whose compiled operators need a
torch build of their own, so ``timm_diff_attention`` loads the layer's file without running timm's ``__init__``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import statistics
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..layer import DiffAttention
from .common import print_load, table_row
from .timing import median_ratio, paired_times

TIMM_HINT = "pip install timm"


@dataclass(frozen=True)
class Shape:
    """One benchmark shape: batch, tokens, width, the baseline's heads, and whether the attention is causal."""

    name: str
    batch: int
    seq_len: int
    d_model: int
    n_heads: int
    causal: bool
    what: str

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


SHAPES = {
    "vit": Shape("vit", 32, 197, 384, 6, False, "ViT-S/16 at 224 px: 196 patches and a class token"),
    "lm": Shape("lm", 4, 512, 512, 8, True, "a language model's layer"),
}
MODES = ("eager", "compile")
TIMM, V1, V2, BASE = "timm V1", "ours V1", "ours V2", "ours baseline"
CASES = (TIMM, V1, V2, BASE)  # in the table's order; BASE is every "vs baseline" ratio's reference
WIDTHS = (-14, 11, 12, 8)  # the table's columns: case, ms fwd+bwd, vs baseline, vs timm


# ---------------------------------------------------------------------------------------------- timm
@contextlib.contextmanager
def timm_modules() -> Iterator[type[nn.Module]]:
    """timm's ``DiffAttention`` class (``timm/layers/diff_attention.py``) without importing timm's package, for the
    ``with`` block: timm's ``__init__`` imports torchvision, whose compiled operators need a torch build other than
    the pinned CPU wheel. The package objects ``timm`` and ``timm.layers`` are empty modules, the layer's module and
    the ones it imports are loaded from timm's files, and they stay in ``sys.modules`` until the block ends (where
    ``torch.compile`` looks the layer's module up by name), which then leaves ``sys.modules`` as it was. timm
    missing (or too old to have the layer): a ``ValueError`` naming the pip install."""
    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"timm's DiffAttention needs timm, which is not installed: {TIMM_HINT}")
    root = next(iter(spec.submodule_search_locations))
    saved = {k: v for k, v in sys.modules.items() if k == "timm" or k.startswith("timm.")}
    try:
        for name, path in (("timm", root), ("timm.layers", f"{root}/layers")):
            m = types.ModuleType(name)
            m.__path__ = [path]
            sys.modules[name] = m
        try:
            cls: type[nn.Module] = importlib.import_module("timm.layers.diff_attention").DiffAttention
        except (ModuleNotFoundError, AttributeError) as e:
            if isinstance(e, ModuleNotFoundError) and e.name != "timm.layers.diff_attention":
                raise
            raise ValueError(f"timm {_timm_version()} has no timm.layers.diff_attention.DiffAttention: "
                             f"{TIMM_HINT} --upgrade") from None
        yield cls
    finally:
        for k in [k for k in sys.modules if k == "timm" or k.startswith("timm.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def timm_diff_attention() -> type[nn.Module]:
    """timm's ``DiffAttention`` class, loaded as :func:`timm_modules` does, with ``sys.modules`` left as it was
    (eager use; under ``torch.compile`` build and run it inside ``with timm_modules()``)."""
    with timm_modules() as cls:
        return cls


def _timm_version() -> str:
    try:
        return importlib.metadata.version("timm")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def copy_timm_weights(ours: DiffAttention, t: Any) -> None:
    """Load timm's weights into our DIFF V1 layer: timm's fused qkv is W_q, W_k, W_v in that order, with our head
    layout (query and key half-heads 2i, 2i+1 are Q1, Q2 of head i; a 2d-wide value per head)."""
    wq, wk, wv = t.qkv.weight.detach().chunk(3, dim=0)
    sd: dict[str, Any] = {"core.wq.weight": wq, "core.wk.weight": wk, "core.wv.weight": wv,
                          "core.wo.weight": t.proj.weight, "core.subln.weight": t.sub_norm.weight,
                          **{f"core.lambda_{n}": getattr(t, f"lambda_{n}") for n in ("q1", "k1", "q2", "k2")}}
    ours.load_state_dict({**{k: v.detach().clone() for k, v in sd.items()}, "_extra_state": ours.get_extra_state()})


# ---------------------------------------------------------------------------------------------- the cases
def _modules(Timm: type[nn.Module], shape: Shape, args: argparse.Namespace, rope: bool = False) -> dict[str, nn.Module]:
    """The four layers of one table, on the device and in the dtype asked for; ours V1 holds timm's weights. ``rope``:
    ours (all three) rotate their queries and keys; timm's layer has no RoPE, so it is then not the same work."""
    torch.manual_seed(0)
    t: Any = Timm(shape.d_model, num_heads=shape.n_heads // 2, qkv_bias=False, proj_bias=False)
    t.fused_attn = True  # timm's SDPA path (its default where torch has SDPA)
    kw: dict[str, Any] = {"causal": shape.causal, "rope": rope}
    v1 = DiffAttention(shape.d_model, shape.n_heads, "diff_v1", **kw)
    copy_timm_weights(v1, t)
    mods = {TIMM: t, V1: v1, V2: DiffAttention(shape.d_model, shape.n_heads, "diff_v2", **kw),
            BASE: DiffAttention(shape.d_model, shape.n_heads, "baseline", **kw)}
    dt = getattr(torch, args.dtype)
    return {label: m.to(device=args.device, dtype=dt) for label, m in mods.items()}


def _step(label: str, module: nn.Module, x: torch.Tensor, causal: bool) -> Callable[[], torch.Tensor]:
    """One forward + backward: the sum of the output, backward to ``x`` and the weights (then dropped)."""
    call = (lambda: module(x, is_causal=causal)) if label == TIMM else (lambda: module(x))

    def step() -> torch.Tensor:
        out = call()
        out.sum().backward()
        x.grad = None
        for p in module.parameters():
            p.grad = None
        return out.detach()

    return step


def measure(shape: Shape, mode: str, args: argparse.Namespace,
            rope: bool = False) -> tuple[dict[str, list[float]], float]:
    """Round-robin times (seconds per round) of the four cases at ``shape`` in ``mode``, and the largest absolute
    difference between ours V1's output and timm's (the same weights, the same input)."""
    torch.manual_seed(1)
    x = torch.randn(shape.batch, shape.seq_len, shape.d_model, device=args.device, dtype=getattr(torch, args.dtype),
                    requires_grad=True)
    with timm_modules() as Timm:
        mods = _modules(Timm, shape, args, rope)
        if mode == "compile":
            torch._dynamo.reset()  # each table compiles its own modules afresh (no recompiles, no dynamic shapes)
            mods = {label: torch.compile(m) for label, m in mods.items()}  # type: ignore[misc]
        steps = {label: _step(label, m, x, shape.causal) for label, m in mods.items()}
        first = {label: step() for label, step in steps.items()}  # allocates, picks kernels, compiles: not timed
        diff = float((first[V1].float() - first[TIMM].float()).abs().max())
        del first
        times = paired_times(steps, repeats=args.rounds, warmup=args.warmup)
    return times, diff


# ---------------------------------------------------------------------------------------------- the command
def _choices(flag: str, value: str, allowed: tuple[str, ...]) -> list[str]:
    """A comma-separated list of names from ``allowed`` (repeats dropped), or one ValueError naming the flag."""
    names = list(dict.fromkeys(v.strip() for v in value.split(",")))
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ValueError(f"{flag} {value!r}: {bad[0] if bad else value!r} is not one of {', '.join(allowed)} "
                         f"(give a comma-separated list)")
    return names


def _shapes(args: argparse.Namespace) -> list[Shape]:
    shapes = [SHAPES[n] for n in _choices("--shapes", args.shapes, tuple(SHAPES))]
    return [Shape(s.name, args.batch or s.batch, args.seq_len or s.seq_len, s.d_model, s.n_heads, s.causal, s.what)
            for s in shapes]


def check(args: argparse.Namespace) -> tuple[list[Shape], list[str]]:
    """Every flag checked before any work: the shapes and modes to run, or one ValueError naming the flag."""
    for flag, v, low in (("--rounds", args.rounds, 1), ("--warmup", args.warmup, 0), ("--threads", args.threads, 0),
                         ("--batch", args.batch, 0), ("--seq-len", args.seq_len, 0)):
        if isinstance(v, bool) or v < low:
            raise ValueError(f"{flag} must be an integer >= {low}, got {v}")
    shapes = _shapes(args)
    modes = _choices("--modes", args.modes, MODES)
    _choices("--rope", args.rope, ("off", "on"))
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    for shape in shapes:
        _refuse_what_cannot_fit(shape, args.device)
    timm_diff_attention()  # timm missing: one line naming the pip install, before any timing
    return shapes, modes


def _table(shape: Shape, mode: str, times: dict[str, list[float]], diff: float, rope: bool = False) -> list[str]:
    heads = (f"{shape.n_heads} baseline heads of {shape.head_dim} (DIFF V1: {shape.n_heads // 2} heads of "
             f"{2 * shape.head_dim}, timm num_heads={shape.n_heads // 2})")
    tag = ", RoPE on" if rope else ""
    lines = [f"## {shape.name}, {mode}{tag}: B={shape.batch} T={shape.seq_len} d_model={shape.d_model}, {heads}, "
             f"{'causal' if shape.causal else 'bidirectional'} ({shape.what})",
             table_row(("case", "ms fwd+bwd", "vs baseline", "vs timm"), WIDTHS)]
    for label in CASES:
        vs_timm = f"{median_ratio(times, label, TIMM):.3f}x" if label == V1 else ""
        lines.append(table_row((label, f"{statistics.median(times[label]) * 1e3:.2f}",
                                f"{median_ratio(times, label, BASE):.3f}x", vs_timm), WIDTHS))
    if rope:
        lines.append("# RoPE on in ours (all three), none in timm's layer: 'vs timm' is not the same work; 'vs "
                     "baseline' is (the baseline rotates too)")
    else:
        lines.append(f"# ours V1 holds timm's weights: largest |ours V1 - timm| over the output = {diff:.1e}")
    return lines


def _memory(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[1])
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _refuse_what_cannot_fit(shape: Shape, device: str) -> None:
    """An absurd --batch or --seq-len refused in one line before any work, not an allocator traceback: timm's manual
    path and our eager maps hold every softmax map of every head in float32 through the backward, about six such
    (B, 2h, T, T) tensors at once, plus the activations."""
    maps = shape.batch * shape.n_heads * shape.seq_len ** 2 * 4  # one (B, 2h, T, T) float32 set: 2h = n_heads
    need = 6 * maps + 16 * shape.batch * shape.seq_len * shape.d_model * 4
    have = _memory(device)
    if need > have:
        raise ValueError(f"--batch {shape.batch} --seq-len {shape.seq_len}: the {shape.name} shape needs about "
                         f"{need / 2**30:,.1f} GiB for its attention maps and activations, more than the "
                         f"{have / 2**30:,.1f} GiB of this {device}; lower --batch or --seq-len")


def run(args: argparse.Namespace) -> int:
    shapes, modes = check(args)
    ropes = [r == "on" for r in _choices("--rope", args.rope, ("off", "on"))]
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        print(f"# bench layer: torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype} on "
              f"{args.device}; one step = forward, sum of the output, backward to the input and every weight; ms: "
              f"median of {args.rounds} round-robin rounds after {args.warmup} warm-up rounds (and one untimed "
              f"first call: compile time excluded); ratios: median of the per-round time ratios (> 1: slower)",
              flush=True)
        print_load("before")
        for shape in shapes:
            for mode in modes:
                for rope in ropes:
                    times, diff = measure(shape, mode, args, rope)
                    print("\n".join(_table(shape, mode, times, diff, rope)), flush=True)
        print_load("after")
    finally:
        torch.set_num_threads(threads)
    return 0


def register(sub) -> None:
    p = sub.add_parser("layer", help="the DiffAttention layer fwd+bwd vs timm's DIFF V1 layer and baseline SDPA",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    shapes = "; ".join(f"{s.name}: B={s.batch} T={s.seq_len} d_model={s.d_model} {s.n_heads} heads "
                       f"{'causal' if s.causal else 'bidirectional'}" for s in SHAPES.values())
    p.add_argument("--shapes", default=",".join(SHAPES), metavar="S[,S]",
                   help=f"comma-separated shapes to time ({shapes}; default {','.join(SHAPES)})")
    p.add_argument("--rope", default="off", metavar="off|on|off,on",
                   help="RoPE in our three layers (timm's has none: with 'on' its column is not the same work, and "
                        "the ratio to read is ours against our baseline with RoPE); default off")
    p.add_argument("--modes", default=",".join(MODES), metavar="M[,M]",
                   help=f"comma-separated modes: eager, compile (torch.compile, default inductor; the compile time is "
                        f"not timed) (default {','.join(MODES)})")
    p.add_argument("--rounds", type=int, default=10, help="timed round-robin rounds (default 10)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed rounds before them, after each case's first (compiling) call (default 2)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: comparable on a busy machine; 0: torch's default)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="dtype (default float32)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="device (default cpu)")
    p.add_argument("--batch", type=int, default=0,
                   help="batch size for every shape (default 0: each shape's own, 32 for vit, 4 for lm; the tests "
                        "run a tiny one)")
    p.add_argument("--seq-len", type=int, default=0,
                   help="tokens per sequence for every shape (default 0: each shape's own, 197 for vit, 512 for lm)")
    p.set_defaults(func=run)
