"""`difftransformer bench decode`: decoding tokens/s with the static KV cache, DIFF V1 and DIFF V2 relative to the
baseline, and our DIFF V1 relative to Hugging Face DiffLlama's ``generate`` on the same weights.

For each batch size B and context C, every model first runs a prefill of C random tokens (untimed: the context
is the prompt already in the cache when decoding starts), then each timed call decodes ``--new-tokens`` N tokens
per row greedily: N one-token forwards at positions C..C+N-1, the argmax of each feeding the next, exactly as
``generate()`` does after its prefill (the same ``decode_step`` / ``torch.compile`` / CUDA-graph step chosen by
``--decode-mode``). Each call starts again at position C, overwriting the same cache slots. tokens/s = B*N / time.

Models are matched as in `bench train`: d_model 512, 8 layers, 8 baseline heads of 64 (DIFF V1: 4 differential
heads, parameters matched; DIFF V2: 16 query heads). The HF column is transformers' DiffLlamaForCausalLM built
offline from our DIFF V1 weights exported by our converter (``save_hf`` then ``from_pretrained`` of that local
directory, nothing downloaded); its call is ``model.generate(max_new_tokens=N, min_new_tokens=N, greedy)`` on a
DynamicCache already holding the context (cropped back to C before each call), so it also runs N one-token
forwards. Ours and HF see the same weights in the same dtype: the prefill logits' largest difference is printed.

The cases run round-robin in one process (each round decodes once with every model), after one untimed warm-up
round (which also compiles or captures the graph); tokens/s is the median over ``--rounds`` rounds and each ratio
is the median over rounds of the per-round ratio, so a change of machine load hits all cases alike. Beside the
table: a ``# decode setup: {json}`` line and a ``# decode row: {json}`` line per row (as the table rounds them;
``common.data_line``), which ``make gpu-check`` reads.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch

from ..inference.generate import DECODE_MODES, SamplingConfig, decode_function, sample_next
from ..kernels.triton_tuning import config_lines
from ..model import variants
from ..model.config import ModelConfig
from ..model.transformer import DiffTransformerLM
from .common import SHAPE, bench_config, data_line, hf_diff_variant, print_load, table_row
from .timing import median_ratio, paired_times

HF_LABEL = "HF DiffLlama"
DTYPES = ("float32", "bfloat16", "float16")


def cases() -> list[tuple[str, str]]:
    """(label, attention) of every registered variant, the reference (baseline) first: the reference of the
    ``<label>/base`` ratios; "HF" (DiffLlama) is compared with the variant it holds (V1)."""
    return [(v.short, v.name) for v in variants.variants()]


def _labels() -> tuple[str, str, list[str]]:
    """(reference label, the HF-compared variant's label, the compared variants' labels)."""
    return (variants.reference().short, variants.variant(hf_diff_variant()).short,
            [v.short for v in variants.compared()])


def columns() -> tuple[str, ...]:
    ref, hv, others = _labels()
    return ("batch", "context", f"{ref} tok/s", *(c for o in others for c in (f"{o} tok/s", f"{o}/base")),
            f"{HF_LABEL} tok/s", f"ours {hv}/HF")
DEFAULT_NEW_TOKENS = 32


def resolve_dtype(args: argparse.Namespace) -> torch.dtype:
    name = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    return getattr(torch, name)


def model_config(args: argparse.Namespace, attention: str, max_seq_len: int) -> ModelConfig:
    """The matched config of one variant: the baseline's heads are d_model / head_dim."""
    backend = "sdpa" if variants.variant(attention).reference else args.backend
    return bench_config(attention, backend, d_model=args.d_model, head_dim=args.head_dim, n_layers=args.layers,
                        vocab_size=args.vocab_size, max_seq_len=max_seq_len, n_kv_heads=args.kv_heads)


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag for every value the benchmark cannot run with."""
    for flag, name in (("--new-tokens", "new_tokens"), ("--layers", "layers"), ("--d-model", "d_model"),
                       ("--head-dim", "head_dim"), ("--rounds", "rounds"), ("--vocab-size", "vocab_size")):
        v = getattr(args, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{flag} must be a positive integer, got {v!r}")
    for flag, name in (("--batch", "batch"), ("--contexts", "contexts")):
        vals = getattr(args, name)
        if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in vals):
            raise ValueError(f"{flag} needs one or more positive integers, got {vals!r}")
    if args.kv_heads is not None and (isinstance(args.kv_heads, bool) or not isinstance(args.kv_heads, int)
                                      or args.kv_heads < 1):
        raise ValueError(f"--kv-heads must be a positive integer or unset, got {args.kv_heads!r}")
    if args.d_model % args.head_dim:
        raise ValueError(f"--d-model {args.d_model} must be a multiple of --head-dim {args.head_dim}")
    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    if args.dtype is not None and args.dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    if args.decode_mode not in DECODE_MODES:
        raise ValueError(f"--decode-mode must be one of {', '.join(DECODE_MODES)}, got {args.decode_mode!r}")
    if getattr(args, "backend", "sdpa") == "triton" and args.device != "cuda":
        raise ValueError("--backend triton needs --device cuda (the Triton kernels run on a GPU)")
    if args.decode_mode == "cuda-graph" and args.device != "cuda":
        raise ValueError("--decode-mode cuda-graph needs --device cuda")
    max_len = max(args.contexts) + args.new_tokens
    for _, attention in cases():  # every variant must be buildable at this shape (V1 needs even head counts)
        try:
            model_config(args, attention, max_len)
        except ValueError as e:
            raise ValueError(f"--d-model {args.d_model} / --head-dim {args.head_dim} / --kv-heads {args.kv_heads} "
                             f"give no valid {attention} model: {e}") from None
    if not args.no_hf:
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise ValueError("the HF DiffLlama column needs transformers (pip install 'difftransformer[hf]'); "
                             "or pass --no-hf") from None


# ---------------------------------------------------------------------------------------------- our models
def build_models(args: argparse.Namespace, max_len: int) -> dict[str, DiffTransformerLM]:
    """One freshly initialised fp32 model per variant on the CPU (seed 0), in eval mode."""
    models = {}
    for label, attention in cases():
        torch.manual_seed(0)
        models[label] = DiffTransformerLM(model_config(args, attention, max_len)).eval()
    return models


class OurDecoder:
    """Our model with a prefilled static cache; ``__call__`` decodes N tokens from position C (a timed call)."""

    def __init__(self, model: DiffTransformerLM, prompt: torch.Tensor, first: torch.Tensor, new_tokens: int,
                 mode: str) -> None:
        B, C = prompt.shape
        device = prompt.device
        self.model, self.new_tokens, self.context = model, new_tokens, C
        self.decode = decode_function(mode)  # one per model: a CUDA graph serves one cache set-up
        self.sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=0)
        self.cache_mask = torch.ones(B, C + new_tokens, dtype=torch.bool, device=device)
        model.setup_caches(B, C + new_tokens, dtype=model.output.weight.dtype, device=device)
        with torch.inference_mode():
            self.prefill_logits = model(prompt, input_pos=torch.arange(C, device=device),
                                        attention_mask=self.cache_mask).logits[:, -1].float()
        self.first = first  # (B,) the token at position C, fed first (the same for every model)

    @torch.inference_mode()
    def __call__(self) -> torch.Tensor:
        token = self.first
        input_pos = torch.full((1,), self.context, dtype=torch.long, device=token.device)
        for _ in range(self.new_tokens):
            logits = self.decode(self.model, token[:, None], input_pos, self.cache_mask)
            input_pos += 1
            token = sample_next(logits, self.sampling)
        return token


# ---------------------------------------------------------------------------------------------- HF DiffLlama
def export_to_hf(model: DiffTransformerLM, directory: Path, device: str, dtype: torch.dtype):
    """Our V1 weights through our converter into transformers' DiffLlamaForCausalLM (a local directory only)."""
    from transformers import DiffLlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from ..interop.hf import save_hf

    save_hf(model, directory)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        # Any: transformers types its to() through functools.wraps, which a type checker sees unbound
        hf: Any = DiffLlamaForCausalLM.from_pretrained(str(directory), dtype=dtype, local_files_only=True)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return hf.to(device).eval()


class HFDecoder:
    """HF ``generate`` continuing from a DynamicCache that holds the C-token context (cropped back each call)."""

    def __init__(self, hf, prompt: torch.Tensor, first: torch.Tensor, new_tokens: int) -> None:
        from transformers import DynamicCache

        self.hf, self.new_tokens, self.context = hf, new_tokens, prompt.shape[1]
        self.cache = DynamicCache()
        with torch.inference_mode():
            out = hf(input_ids=prompt, past_key_values=self.cache, use_cache=True)
        self.prefill_logits = out.logits[:, -1].float()
        self.ids = torch.cat([prompt, first[:, None]], dim=1)  # the cache holds all but the last token
        self.mask = torch.ones_like(self.ids)

    @torch.inference_mode()
    def __call__(self) -> torch.Tensor:
        extra = self.cache.get_seq_length() - self.context
        if extra > 0:
            self.cache.crop(-extra)  # negative: "remove that many" in every transformers version
        out = self.hf.generate(input_ids=self.ids, attention_mask=self.mask, past_key_values=self.cache,
                               max_new_tokens=self.new_tokens, min_new_tokens=self.new_tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=0, use_cache=True)
        if out.shape[1] != self.ids.shape[1] + self.new_tokens:
            raise RuntimeError(f"HF generate returned {out.shape[1] - self.ids.shape[1]} new tokens, "
                               f"not {self.new_tokens}")
        return out


# ---------------------------------------------------------------------------------------------- the benchmark
def measure(args: argparse.Namespace, emit: Optional[Callable[[dict], None]] = None) -> list[dict]:
    """Run every (batch, context) case and return one dict per row: ``batch``, ``context``, ``new_tokens``,
    ``tok_s`` (tokens/s per model label), the ratios ``V1/base``, ``V2/base`` and ``V1/HF`` (None with --no-hf),
    ``hf_logit_diff`` and ``cache_bytes`` per model. ``emit(row)`` is called as each row is done."""
    check_args(args)
    dtype = resolve_dtype(args)
    device = torch.device(args.device)
    max_len = max(args.contexts) + args.new_tokens
    if args.decode_mode == "compile":  # one compiled step per model and case: more than dynamo's default 8
        import torch._dynamo as dynamo

        dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit,
                                             4 * len(args.batch) * len(args.contexts) * len(cases()))
    models = build_models(args, max_len)
    ref, hv, others = _labels()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        hf = None
        if not args.no_hf:
            hf = export_to_hf(models[hv], Path(tmp) / "diffllama", args.device, dtype)
        models = {k: m.to(device=device, dtype=dtype) for k, m in models.items()}
        for B in args.batch:
            for C in args.contexts:
                g = torch.Generator().manual_seed(B * 100003 + C)
                prompt = torch.randint(0, args.vocab_size, (B, C), generator=g).to(device)
                first = torch.randint(0, args.vocab_size, (B,), generator=g).to(device)
                fns: dict[str, OurDecoder | HFDecoder] = {}
                for label, model in models.items():
                    fns[label] = OurDecoder(model, prompt, first, args.new_tokens, args.decode_mode)
                hf_diff = None
                if hf is not None:
                    fns[HF_LABEL] = HFDecoder(hf, prompt, first, args.new_tokens)
                    hf_diff = float((fns[HF_LABEL].prefill_logits - fns[hv].prefill_logits).abs().max())
                times = paired_times(fns, repeats=args.rounds, warmup=1)
                tokens = B * args.new_tokens
                row = {"batch": B, "context": C, "new_tokens": args.new_tokens,
                       "tok_s": {k: tokens / statistics.median(t) for k, t in times.items()},
                       **{f"{o}/base": median_ratio(times, ref, o) for o in others},
                       f"{hv}/HF": median_ratio(times, HF_LABEL, hv) if hf is not None else None,
                       "hf_logit_diff": hf_diff,
                       "cache_bytes": {k: m.cache_nbytes() for k, m in models.items()}}
                rows.append(row)
                if emit is not None:
                    emit(row)
                del fns
                for m in models.values():
                    m.clear_caches()
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def format_row(row: dict) -> str:
    t = row["tok_s"]
    ref, hv, others = _labels()
    hf = (f"{t[HF_LABEL]:>18,.1f} {row[f'{hv}/HF']:>10.3f}x" if row[f"{hv}/HF"] is not None
          else f"{'-':>18} {'-':>11}")
    return (f"{row['batch']:>5} {row['context']:>7} {t[ref]:>14,.1f} "
            + "".join(f"{t[o]:>10,.1f} {row[f'{o}/base']:>7.3f}x " for o in others) + hf)


def data_row(row: dict) -> dict:
    """The table's row as data, rounded as printed: batch, context, the baseline's tok/s, each variant's ratio."""
    ref, _, others = _labels()
    return {"batch": row["batch"], "context": row["context"], "baseline_tok_s": float(f"{row['tok_s'][ref]:.1f}"),
            **{o: float(f"{row[f'{o}/base']:.3f}") for o in others}}


def header() -> str:
    return table_row(columns(), (5, 7, 14, *(w for _ in _labels()[2] for w in (10, 8)), 18, 11))


def run(args: argparse.Namespace) -> int:
    check_args(args)
    dtype = resolve_dtype(args)
    cfgs = {label: model_config(args, attention, max(args.contexts) + args.new_tokens) for label, attention in cases()}
    with torch.device("meta"):
        params = {label: DiffTransformerLM(cfg).num_parameters() for label, cfg in cfgs.items()}
    base = cfgs[variants.reference().short]
    print(f"# decode tokens/s (greedy, static KV cache, {args.decode_mode} step): {args.new_tokens} new tokens per "
          f"row after a prefilled context; DIFF backend {args.backend}; d_model {args.d_model}, {args.layers} layers, "
          f"{base.n_heads} baseline "
          f"heads of {args.head_dim} (kv {base.n_kv_heads}), vocab {args.vocab_size}; {args.device} "
          f"{str(dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads", flush=True)
    print("# parameters: " + ", ".join(f"{k} {v:,}" for k, v in params.items())
          + ("" if args.no_hf else f"; {HF_LABEL} = our V1 weights exported by our converter"), flush=True)
    print(f"# median of {args.rounds} paired rounds after 1 warm-up round; ratios are medians of per-round "
          f"tokens/s ratios within the same run", flush=True)
    print_load("before")
    print(header(), flush=True)
    print(data_line("decode", "setup", {"shape": None, "overrides": None, "head_dim": args.head_dim,
                                        "dtype": str(dtype).removeprefix("torch."), "backend": args.backend,
                                        "labels": _labels()[2]}), flush=True)
    rows = measure(args, emit=lambda r: print(format_row(r) + "\n" + data_line("decode", "row", data_row(r)),
                                              flush=True))
    diffs = [r["hf_logit_diff"] for r in rows if r["hf_logit_diff"] is not None]
    if diffs:
        print(f"# same weights check: max |prefill logits HF - ours V1| = {max(diffs):.2e}")
    print_load("after")
    for line in config_lines():  # the Triton tiles chosen on this GPU (decode runs in this process)
        print(line)
    return 0


def register(sub) -> None:
    p = sub.add_parser("decode", help="decode tokens/s of DIFF V1/V2 vs the baseline and of our V1 vs HF DiffLlama",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="device (default cpu)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="weights and cache dtype (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--new-tokens", type=int, default=DEFAULT_NEW_TOKENS,
                   help=f"tokens decoded per row in each timed call (default {DEFAULT_NEW_TOKENS}: the default run "
                        "takes about 3 minutes on 2 CPU cores; use 128 or more on a GPU)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], metavar="B",
                   help="batch sizes (default: 1 8)")
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 2048], metavar="C",
                   help="context lengths already in the cache when decoding starts (default: 512 2048)")
    p.add_argument("--layers", type=int, default=SHAPE["n_layers"],
                   help=f"number of layers (default {SHAPE['n_layers']})")
    p.add_argument("--d-model", type=int, default=SHAPE["d_model"], help=f"model width (default {SHAPE['d_model']})")
    p.add_argument("--head-dim", type=int, default=SHAPE["head_dim"],
                   help=f"head dimension d; the baseline has d_model/d heads (default {SHAPE['head_dim']}, i.e. "
                        f"{SHAPE['n_heads']} heads)")
    p.add_argument("--kv-heads", type=int, default=None, help="the baseline's KV heads (default: as many as heads)")
    p.add_argument("--vocab-size", type=int, default=SHAPE["vocab_size"],
                   help=f"vocabulary size (default {SHAPE['vocab_size']}, the data default)")
    p.add_argument("--rounds", type=int, default=3,
                   help="timed rounds, each decoding once with every model; medians reported (default 3)")
    p.add_argument("--backend", choices=["sdpa", "triton"], default="sdpa",
                   help="DIFF V1/V2's attention backend (default sdpa: the PyTorch decode step that reads the cache "
                        "once for both maps; triton: the fused prefill and the split-KV Triton decode kernel, CUDA "
                        "only); the baseline is always sdpa")
    p.add_argument("--decode-mode", choices=DECODE_MODES, default="eager",
                   help="how our per-token step runs, as `generate --decode`: eager, compile (torch.compile) or "
                        "cuda-graph (CUDA only); HF always runs its default generate (default eager)")
    p.add_argument("--no-hf", action="store_true", help="skip the HF DiffLlama column (no transformers needed)")
    p.set_defaults(func=run)
