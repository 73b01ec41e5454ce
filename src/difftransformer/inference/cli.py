"""`difftransformer generate`: sample from a trained model, streaming the text as it comes.

    difftransformer generate --run runs/tiny --prompt "In the beginning" --max-new-tokens 64
    difftransformer generate --checkpoint DIR --prompt "a" --prompt "b" --temperature 0   # a batch, greedy

The model directory (``--checkpoint``, or the newest complete checkpoint of ``--run``) must be in our own format
(config.json + model.safetensors); the tokenizer is its tokenizer.json (or the run's, or ``--tokenizer``).
Generation stops at the model's end tokens unless ``--ignore-eos``: the tokenizer's end-of-text token and those
its generation_config.json names (a converted Hugging Face model keeps its own, e.g. SmolLM2's <|im_end|>), plus
any ``--stop`` token. ``--chat`` wraps each prompt as one user message with the model's chat template
(chat_template.jinja or tokenizer_config.json's), as transformers' ``apply_chat_template`` does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from .. import rundir
from ..fileio import read_json, read_text, text_arg
from ..loading import locate
from .generate import DECODE_MODES, SamplingConfig, check_context, check_decode_device, generate, stream

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a trained model (streams as it comes)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", type=Path, help="a training run directory: its newest complete checkpoint is used")
    src.add_argument("--checkpoint", type=Path, help="a model directory (config.json + model.safetensors)")
    p.add_argument("--prompt", action="append", required=True, type=text_arg,
                   help="prompt text; repeat for a batch (a single prompt is streamed)")
    p.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: the checkpoint's, else the run's)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate per prompt (default 128)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="keep only the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: keep the smallest set with mass >= p")
    p.add_argument("--seed", type=int, default=None, help="random seed for reproducible sampling")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's end tokens")
    p.add_argument("--stop", action="append", default=[], metavar="TOKEN", type=text_arg,
                   help="also stop at this token (its text, e.g. '<|im_end|>'; one token of the tokenizer); repeatable")
    p.add_argument("--chat", action="store_true",
                   help="apply the model's chat template to each prompt (one user message, generation prompt added)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="weights dtype (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--decode", choices=DECODE_MODES, default="eager",
                   help="how the per-token step runs: eager, compile (torch.compile: a one-off compilation of tens of "
                        "seconds, then the fastest step on CPU, see BENCHMARKS.md) or cuda-graph (default eager)")
    p.set_defaults(func=run)


def load_model(path: Path, device: Optional[str], dtype: Optional[str]):
    """Our model from a model or run directory (``difftransformer.loading``); a Hugging Face directory is refused
    with the way to convert it. The device is checked after the path, before any weight is read."""
    source = locate(path, kinds=("run", "model"))
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dt = DTYPES[dtype] if dtype else (torch.bfloat16 if dev.startswith("cuda") else torch.float32)
    try:
        torch.empty(0, device=dev)
    except (RuntimeError, AssertionError) as e:
        raise ValueError(f"--device {dev} is not usable here: {str(e).splitlines()[0]}") from None
    return source.load(device=dev, dtype=dt).model, source.model_dir


def run(args: argparse.Namespace) -> int:
    from ..data.tokenizer import EOS

    sampling_kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, seed=args.seed)
    SamplingConfig(**sampling_kw)  # bad values fail before the model loads
    model, model_dir = load_model(args.run if args.run is not None else args.checkpoint, args.device, args.dtype)
    if args.tokenizer is not None:
        tok_file = args.tokenizer
    else:
        try:
            tok_file = rundir.find_tokenizer(model_dir, args.run)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{e}; pass --tokenizer") from None
    # No end-of-text token is fine here: generation then runs to --max-new-tokens.
    tok = rundir.read_tokenizer(tok_file, model.cfg.vocab_size, require_eos=False,
                                where="--tokenizer" if args.tokenizer is not None else
                                f"{'--run' if args.run is not None else '--checkpoint'} {model_dir}")
    side = _side_config(model_dir, args.run, "--run" if args.run is not None else "--checkpoint")
    texts = [_chat(text, side) for text in args.prompt] if args.chat else list(args.prompt)
    prompts = []
    for i, text in enumerate(texts):
        ids = tok.encode(text, add_special_tokens=False).ids
        if not ids:
            raise ValueError(f"prompt {i + 1} is empty: give some text")
        prompts.append(ids)
    # Refused up front: generation itself would refuse these only after the prompt was echoed or a token printed.
    check_context(model, max(len(p) for p in prompts), args.max_new_tokens)
    check_decode_device(model, args.decode)
    stops = [] if args.ignore_eos else [t for t in (tok.token_to_id(EOS), *_config_eos(side)) if t is not None]
    for text in args.stop:
        t = tok.token_to_id(text)
        if t is None:
            raise ValueError(f"--stop {text!r} is not one token of the tokenizer")
        stops.append(t)
    sampling = SamplingConfig(stop_tokens=tuple(dict.fromkeys(stops)), **sampling_kw)

    t0 = time.perf_counter()
    if len(prompts) == 1:
        n = _stream_one(model, tok, prompts[0], texts[0], sampling, args.decode)
    else:
        out = generate(model, prompts, sampling, decode=args.decode)
        for text, new in zip(texts, out.tokens):
            print(text + tok.decode(new), end="\n\n", flush=True)
        n = sum(len(t) for t in out.tokens)
    dt = time.perf_counter() - t0
    print(f"[{n} tokens in {dt:.2f} s, {n / dt:.1f} tokens/s, {model.cfg.attention} on "
          f"{model.output.weight.device.type}]", file=sys.stderr)
    return 0


def _side_config(model_dir: Path, run: Optional[Path], flag: str = "--checkpoint") -> dict:
    """generation_config.json, tokenizer_config.json and chat_template.jinja beside the weights (a converted
    Hugging Face model keeps them), as {"generation": {...}, "tokenizer": {...}, "chat_template": Path|str|None}:
    the template file is read (as UTF-8) only by ``--chat``. Errors name ``flag``, the option that named the
    directory."""
    from ..model.pretrained import CHAT_TEMPLATE_NAME, GENERATION_CONFIG_NAME, TOKENIZER_CONFIG_NAME

    out: dict = {"generation": {}, "tokenizer": {}, "chat_template": None}
    for d in (model_dir, run):
        if d is None:
            continue
        for key, name in (("generation", GENERATION_CONFIG_NAME), ("tokenizer", TOKENIZER_CONFIG_NAME)):
            if not out[key] and (Path(d) / name).is_file():
                value = read_json(Path(d) / name, flag)
                out[key] = value if isinstance(value, dict) else {}
        if out["chat_template"] is None and (Path(d) / CHAT_TEMPLATE_NAME).is_file():
            out["chat_template"] = Path(d) / CHAT_TEMPLATE_NAME
    if out["chat_template"] is None and isinstance(out["tokenizer"].get("chat_template"), str):
        out["chat_template"] = out["tokenizer"]["chat_template"]
    return out


def _config_eos(side: dict) -> list[int]:
    eos = side["generation"].get("eos_token_id")
    eos = eos if isinstance(eos, list) else [eos]
    return [int(t) for t in eos if isinstance(t, int) and not isinstance(t, bool)]


def _chat(prompt: str, side: dict) -> str:
    """``prompt`` as one user message through the model's chat template (rendered as transformers does: a
    sandboxed Jinja environment, trim_blocks and lstrip_blocks, the generation prompt added)."""
    template = side["chat_template"]
    if isinstance(template, Path):
        template = read_text(template, "--chat")
    if template is None:
        raise ValueError("--chat: the model has no chat template (chat_template.jinja or tokenizer_config.json's "
                         "chat_template)")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def _token(name: str) -> str:
        v = side["tokenizer"].get(name)
        return v.get("content", "") if isinstance(v, dict) else (v or "")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=[{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, bos_token=_token("bos_token"),
                                            eos_token=_token("eos_token"))


def _stream_one(model, tok, ids: list[int], text: str, sampling: SamplingConfig, decode: str) -> int:
    """Print the prompt, then each new piece of text as soon as it decodes to whole characters."""
    from .generate import decode_function

    print(text, end="", flush=True)
    new: list[int] = []
    shown = ""
    for token, done in stream(model, [ids], sampling, decode_fn=decode_function(decode)):
        if bool(done[0]):
            break
        new.append(int(token[0]))
        piece = tok.decode(new)
        if not piece.endswith("\ufffd"):  # an unfinished multi-byte character: wait for its next byte
            print(piece[len(shown):], end="", flush=True)
            shown = piece
    print(tok.decode(new)[len(shown):], flush=True)  # an unfinished character at the very end: as the batch prints
    return len(new)
