"""`difftransformer bench pretrained --hf-dir DIR`: a real pretrained Llama (e.g. SmolLM2-135M from
`convert --from-gguf smollm2`) as our baseline and as DIFF V2 and DIFF V1 (per_head layout) with the same
function, against transformers on the same weights: prefill time and end-to-end greedy generation (prefill
included, transformers' static cache), the generated tokens checked identical. Prints ours / transformers as
speed ratios (> 1: ours faster), median of --rounds after one warm-up, all in one run. ``--decode-mode compile``
runs our per-token step under torch.compile (as ``generate --decode compile``; the warm-up round compiles it).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch

from .common import print_load, table_row


def _median_time(fn: Callable[[], object], rounds: int) -> tuple[float, object]:
    fn()  # warm-up
    times, out = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def run(args: argparse.Namespace) -> int:
    for name in ("prompt_len", "new_tokens", "rounds"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    batches = [int(b) for b in args.batch.split(",") if b.strip()]
    if not batches or min(batches) < 1:
        raise ValueError(f"--batch needs one or more positive integers, got {args.batch!r}")
    from transformers import LlamaForCausalLM

    from ..inference.generate import SamplingConfig, generate
    from ..loading import load_model
    from ..model.upcycle import convert, targets
    from ..model.variants import reference

    torch.manual_seed(0)
    base = load_model(args.hf_dir, kinds=("hf",)).model
    if base.cfg.attention != reference().name:
        raise ValueError(f"{args.hf_dir} holds a {base.cfg.attention} model, not a Llama (our {reference().name})")
    hf = LlamaForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
    ours = {name: convert(base, name).eval() for name in targets(base.cfg)}  # every variant, the same function
    gen_cfg = copy.deepcopy(hf.generation_config)
    T, N = args.prompt_len, args.new_tokens
    gen_cfg.eos_token_id, gen_cfg.pad_token_id = None, 0
    gen_cfg.max_new_tokens, gen_cfg.do_sample, gen_cfg.cache_implementation = N, False, "static"
    if T + N > base.cfg.max_seq_len:
        raise ValueError(f"--prompt-len + --new-tokens = {T + N} exceeds the model's {base.cfg.max_seq_len} positions")
    print_load("before")
    print(f"{args.hf_dir}: prompt {T} tokens, {N} new tokens, float32, {torch.get_num_threads()} threads, median of "
          f"{args.rounds}; our decode step: {args.decode_mode}")
    widths = (6, 10, 12, 14, 12, 10)
    print(table_row(["batch", "what", "model", "ours s", "hf s", "ours/hf"], widths))
    for B in batches:
        ids = torch.randint(0, base.cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(B))

        def hf_prefill(ids=ids):  # the loop's values bound now (each closure is timed in its own step)
            with torch.no_grad():
                return hf(ids, use_cache=True, logits_to_keep=1).logits

        def hf_generate(ids=ids):  # exactly N tokens, no end token (ours runs without stop tokens too)
            with torch.no_grad():
                return hf.generate(ids, generation_config=gen_cfg)[:, T:].tolist()

        t_hf_pre, _ = _median_time(hf_prefill, args.rounds)
        t_hf_gen, ref = _median_time(hf_generate, args.rounds)
        for name, model in ours.items():
            def our_prefill(m=model, ids=ids, B=B):
                m.setup_caches(B, T, dtype=torch.float32)
                with torch.no_grad():
                    out = m(ids, input_pos=torch.arange(T), logits_to_keep=1).logits
                m.clear_caches()
                return out

            def our_generate(m=model, ids=ids):
                return generate(m, ids.tolist(), SamplingConfig(max_new_tokens=N, temperature=0.0),
                                decode=args.decode_mode).tokens

            t_pre, _ = _median_time(our_prefill, args.rounds)
            t_gen, toks = _median_time(our_generate, args.rounds)
            same = "same tokens" if toks == ref else "TOKENS DIFFER"
            print(table_row([B, "prefill", name, f"{t_pre:.3f}", f"{t_hf_pre:.3f}", f"{t_hf_pre / t_pre:.3f}x"],
                            widths))
            print(table_row([B, "generate", name, f"{t_gen:.3f}", f"{t_hf_gen:.3f}", f"{t_hf_gen / t_gen:.3f}x"],
                            widths) + f"  {same}")
    print_load("after")
    return 0


def register(sub) -> None:
    p = sub.add_parser("pretrained", help="a real Llama as ours (baseline, DIFF V2, DIFF V1) vs transformers: "
                                          "prefill and generation", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--hf-dir", required=True, help="a Hugging Face Llama directory (e.g. from convert --from-gguf)")
    p.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default 1,8)")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens per row (default 512)")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens generated per row (default 32)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up; the median is shown")
    p.add_argument("--decode-mode", choices=("eager", "compile"), default="eager",
                   help="how our per-token step runs, as generate --decode (default eager)")
    p.set_defaults(func=run)
