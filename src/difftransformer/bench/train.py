"""`difftransformer bench train`: training throughput (tokens/s) of DIFF V1 and DIFF V2 relative to the baseline.

One full optimizer step of the whole LM as the trainer runs it (forward, loss, backward, gradient clipping, AdamW
with the trainer's parameter groups, bf16 autocast where the trainer would use it) on random tokens. The default
shape is the issue's: sequence 1024, d_model 512, 8 layers, 8 baseline heads of 64 (DIFF V1: 4 differential heads,
parameters matched to the baseline; DIFF V2: 16 query heads, its extra query projection and W_lambda included).
``--shape`` picks another named shape of ``model.config.FLAVOURS`` (``paper-3b``: d_model 3072, 28 layers, 24
heads of 128, FFN 8192, vocab 100288); ``--layers``, ``--d-model``, ``--heads``, ``--kv-heads`` and
``--vocab-size`` override it (``--shape paper-3b --layers 4``: the 3B width with as many layers as fit).

With ``--hf-difflama``, transformers' ``DiffLlamaForCausalLM`` (DIFF V1 as Hugging Face ships it) is timed too, at
the same shape (hidden size d_model, the layers, heads, KV heads, head_dim, intermediate size = our FFN width,
vocab), with the same step: the same tokens, our loss on its logits, clipping at 1.0, AdamW with our parameter
groups, the same autocast; its attention is transformers' "sdpa" where DiffLlama supports it, else "eager".

Each case runs in a fresh child process, one after the other (with ``--in-process``: in this process, one after
the other, each model and optimizer freed before the next is built: one interpreter start and one CUDA context
for all of them, as gpu-check runs it); the step time is the median of ``--steps`` steps after ``--warmup``
untimed ones; with ``--rounds R`` the cases are measured R times interleaved and the median
of the R medians is reported (use it on a shared machine). The 1-minute load average is printed before and after.
Beside the table: a ``# train setup: {json}`` line and a ``# train row: {json}`` line per case (as the table rounds
them; ``common.data_line``), which ``make gpu-check`` reads.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue as queue_module
import statistics
import time
from typing import Optional

import torch

from ..kernels.triton_tuning import chosen_configs, config_lines
from ..model import variants
from ..model.config import ModelConfig
from .common import (
    add_model_flags,
    bench_cases,
    bench_config,
    data_line,
    hf_diff_variant,
    print_load,
    resolve_shape,
    shape_config,
    shape_fields,
    table_row,
)
from .timing import median_time

# The baseline has one attention path worth timing (SDPA); each of --backends is timed for V1 and V2.
DEFAULT_BACKENDS = ("sdpa", "blocked")
HF_LABEL = "HF DiffLlama"
SHAPE_DESTS = ("d_model", "layers", "heads", "kv_heads", "vocab_size")
# The Triton configs the children ran with (triton_tuning.chosen_configs of each), printed after the table.
CHOSEN_CONFIGS: dict[str, dict[str, int]] = {}


def cases(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(label, attention, backend): the baseline with SDPA, then V1 and V2 with each of ``--backends``."""
    return bench_cases(args.backends)


def model_config(args: argparse.Namespace, attention: str, backend: str) -> ModelConfig:
    """The matched config of one variant. head_dim is the shape's where --d-model and --heads are its own, else
    d_model / heads."""
    if args.heads < 1 or args.d_model % args.heads:
        raise ValueError(f"--heads {args.heads} must be a positive divisor of --d-model {args.d_model}")
    flavour = shape_config(args.shape)
    own = (args.d_model, args.heads) == (flavour.d_model, flavour.n_heads)
    head_dim = flavour.head_dim if own else args.d_model // args.heads
    try:
        return bench_config(attention, backend, d_model=args.d_model, head_dim=head_dim, n_heads=args.heads,
                            n_layers=args.layers, vocab_size=args.vocab_size, max_seq_len=args.seq_len,
                            n_kv_heads=args.kv_heads, shape=args.shape)
    except ValueError as e:
        raise ValueError(f"--d-model {args.d_model} / --heads {args.heads} / --kv-heads {args.kv_heads} give no "
                         f"valid {attention} model: {e}") from None


def hf_attn_implementation() -> str:
    """transformers' attention for DiffLlama: "sdpa" where DiffLlama supports it, else "eager"; a ValueError naming
    --hf-difflama where transformers (or its DiffLlama) cannot be imported."""
    try:
        from transformers import DiffLlamaForCausalLM
    except ImportError as e:
        raise ValueError(f"--hf-difflama needs transformers with DiffLlamaForCausalLM (>= 4.48; pip install "
                         f"'difftransformer[hf]'): {e}") from None
    return "sdpa" if getattr(DiffLlamaForCausalLM, "_supports_sdpa", False) else "eager"


def build_hf_difflama(cfg: ModelConfig, attn_implementation: str) -> torch.nn.Module:
    """transformers' DiffLlamaForCausalLM (float32, random weights, training mode) at ``cfg``'s shape: the
    config our converter writes for this DIFF V1 model (``interop.hf.config_to_hf``), so the shapes agree."""
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    from ..interop.hf import config_to_hf

    hf_cfg = DiffLlamaConfig.from_dict(config_to_hf(cfg, torch.float32))
    hf_cfg.use_cache = False
    model = DiffLlamaForCausalLM._from_config(hf_cfg, attn_implementation=attn_implementation)
    return model.float().train()


def _measure(cfg: ModelConfig, hf: Optional[str], args: argparse.Namespace, queue, known: tuple = ()) -> None:
    """Child process: build the model and optimizer, time training steps, send back ("ok", (seconds/step,
    parameters)) or ("error", message). ``hf``: transformers' DiffLlama with this attention implementation
    instead of our model. ``known``: the parent's registered variants (``model.variants.adopt``)."""
    try:
        variants.adopt(known)
        queue.put(("ok", (*_time_steps(cfg, hf, args), chosen_configs())))
    except BaseException as e:  # the parent reads one message either way, instead of waiting for --timeout
        queue.put(("error", f"{type(e).__name__}: {e}"))
        raise


def _time_steps(cfg: ModelConfig, hf: Optional[str], args: argparse.Namespace) -> tuple[float, int]:
    from ..model.transformer import DiffTransformerLM, lm_loss
    from ..train.config import OptimConfig
    from ..train.optim import build_optimizer
    from ..train.steps import autocast_for

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    if hf:
        model = build_hf_difflama(cfg, hf).to(device)
    else:  # built and initialised on the device it trains on: the same init (init_weights under seed 0), drawn by
        with device:  # that device's generator; a 1.07B-parameter model (paper-3b) took ~20 s to build on the CPU
            model = DiffTransformerLM(cfg)

    optimizer = build_optimizer(model, OptimConfig())
    step_model = torch.compile(model) if args.compile else model
    autocast = autocast_for(device, args.precision)
    # drawn from their own generator: every case (ours and HF's, whatever their initialisation drew) the same tokens
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1),
                           generator=torch.Generator().manual_seed(0)).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def loss_of() -> torch.Tensor:
        if hf:  # our loss on its logits: the same float32 cross-entropy over the same targets
            return lm_loss(step_model(input_ids=x, use_cache=False).logits, y)
        return step_model(x, y).loss

    def step() -> None:
        with autocast():
            loss = loss_of()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = median_time(step, repeats=args.steps, warmup=args.warmup)
    return seconds, sum(p.numel() for p in model.parameters())


def measure_here(cfg: ModelConfig, args: argparse.Namespace, hf: Optional[str] = None) -> tuple[float, int]:
    """(seconds per step, parameters) of one case measured in this process (``--in-process``); its model and
    optimizer are gone, and the CUDA allocator's cache emptied, before the next case is built."""
    import gc

    try:
        return _time_steps(cfg, hf, args)
    finally:
        CHOSEN_CONFIGS.update(chosen_configs())
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def measure(cfg: ModelConfig, args: argparse.Namespace, hf: Optional[str] = None) -> tuple[float, int]:
    """(seconds per step, parameters) of one case, measured in a fresh spawned child (in this process with
    ``--in-process``)."""
    if args.in_process:
        return measure_here(cfg, args, hf)
    what = f"{HF_LABEL} ({hf})" if hf else f"{cfg.attention}/{cfg.backend}"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(cfg, hf, args, queue, variants.variants()))
    proc.start()
    deadline = time.monotonic() + args.timeout
    try:
        while True:  # polled, so that a child killed from outside (out of memory) is noticed at once
            alive = proc.is_alive()  # read before waiting: a result sent just before exiting is still read
            try:
                status, result = queue.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                break
            except queue_module.Empty:
                if not alive:
                    raise RuntimeError(f"the benchmark child for {what} exited with {proc.exitcode} "
                                       "without a result") from None
                if time.monotonic() >= deadline:
                    proc.kill()
                    raise RuntimeError(f"the benchmark child for {what} gave no result within --timeout "
                                       f"{args.timeout} s") from None
    finally:
        proc.join(timeout=60)
    if status != "ok":
        raise RuntimeError(f"the benchmark child for {what} failed: {result}")
    if proc.exitcode not in (0, None):
        raise RuntimeError(f"the benchmark child for {what} exited with {proc.exitcode}")
    seconds, params, configs = result
    CHOSEN_CONFIGS.update(configs)
    return seconds, params


def run(args: argparse.Namespace) -> int:
    shape = resolve_shape(args, SHAPE_DESTS)
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
    measured = cases(args)
    cfgs = [model_config(args, attention, backend) for _, attention, backend in measured]  # validates the shape
    hf = hf_attn_implementation() if args.hf_difflama else None
    if hf:  # DiffLlama holds the paper's V1 only: refused here rather than in its child
        from ..interop.hf import config_to_hf

        try:
            config_to_hf(next(cfg for cfg in cfgs if cfg.attention == hf_diff_variant()), torch.float32)
        except ValueError as e:
            raise ValueError(f"--hf-difflama: {e}") from None
    threads = args.threads or torch.get_num_threads()
    print(f"# training step (fwd + bwd + clip + AdamW), {shape}: seq {args.seq_len} x batch {args.batch}, d_model "
          f"{args.d_model}, {args.layers} layers, {args.heads} baseline heads of {cfgs[0].head_dim} (kv "
          f"{cfgs[0].n_kv_heads}), FFN {cfgs[0].ffn_hidden}, vocab {args.vocab_size}; {args.device} "
          f"{args.precision}{' compiled' if args.compile else ''}, {threads} threads; median of {args.steps} steps "
          f"after {args.warmup} warm-up, {args.rounds} round(s); "
          f"{'every case in this process' if args.in_process else 'each case in a fresh process'}", flush=True)
    if hf:
        import transformers

        print(f"# {HF_LABEL}: transformers {transformers.__version__} DiffLlamaForCausalLM, attn_implementation "
              f"{hf!r}, at the same shape, the same tokens, loss, clipping, AdamW and autocast", flush=True)
    print_load("before")
    labels = [label for label, _, _ in measured]
    runs: list[tuple[ModelConfig, Optional[str]]] = [(cfg, None) for cfg in cfgs]
    if hf:
        v1_cfg = next(cfg for cfg in cfgs if cfg.attention == hf_diff_variant())  # its shape: hidden, heads, FFN, vocab
        labels.append(HF_LABEL)
        runs.append((v1_cfg, hf))
    times: list[list[float]] = [[] for _ in runs]
    params = [0] * len(runs)
    for _ in range(args.rounds):
        for i, (cfg, impl) in enumerate(runs):
            seconds, params[i] = measure(cfg, args, impl)
            times[i].append(seconds)
    tokens = args.batch * args.seq_len
    medians = [statistics.median(ts) for ts in times]
    base = medians[0]
    widths = (-14, 12, 9, 10, 12)  # negative: left-aligned
    print(table_row(("case", "parameters", "ms/step", "tokens/s", "vs baseline"), widths))
    print(data_line("train", "setup", {**shape_fields(shape), "head_dim": cfgs[0].head_dim,
                                       "dtype": args.precision if args.precision != "auto" else None,
                                       "seq": args.seq_len, "batch": args.batch, "layers": args.layers}))
    for label, n, t in zip(labels, params, medians):
        print(table_row((label, f"{n:,}", f"{t * 1e3:.1f}", f"{tokens / t:,.0f}", f"{base / t:.3f}x"), widths))
        print(data_line("train", "row", {"label": label, "params": n, "ms": float(f"{t * 1e3:.1f}"),
                                         "tokens_s": float(f"{tokens / t:.0f}"), "ratio": float(f"{base / t:.3f}")}))
    if hf:
        t_hf = medians[-1]
        for (label, attention, _), t in zip(measured, medians):
            if attention == hf_diff_variant():
                print(f"{label} vs {HF_LABEL}: {t_hf / t:.2f}x (tokens/s, ours / transformers')")
    print_load("after", "targets: V1 >= 0.92x, V2 >= 0.88x (tokens/s vs baseline)")
    for line in config_lines(CHOSEN_CONFIGS):  # the Triton tiles the children chose on this GPU
        print(line)
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="training tokens/s of DIFF V1 and V2 relative to the baseline",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    p.add_argument("--seq-len", type=int, default=1024, help="sequence length (default 1024)")
    p.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    add_model_flags(p, "--layers 4", verb="time", default_backends=DEFAULT_BACKENDS)
    p.add_argument("--hf-difflama", action="store_true",
                   help="also time transformers' DiffLlamaForCausalLM at the same shape and step (row 'HF DiffLlama', "
                        "and each V1 backend's tokens/s relative to it); needs transformers")
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
    p.add_argument("--timeout", type=int, default=1800,
                   help="seconds to wait for one case's child (default 1800; not used with --in-process)")
    p.add_argument("--in-process", action="store_true",
                   help="measure every case in this process, one after the other, instead of a fresh child process "
                        "per case (one interpreter start and CUDA context for all: what gpu-check runs)")
    p.set_defaults(func=run)
