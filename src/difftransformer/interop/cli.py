"""`difftransformer convert`: Hugging Face checkpoints in and out.

    difftransformer convert --from-hf HF_DIR --out MODEL_DIR   # DiffLlamaForCausalLM -> DIFF V1, Llama -> baseline
    difftransformer convert --to-hf RUN_OR_MODEL_DIR --out HF_DIR   # DIFF V1 -> DiffLlama, baseline -> Llama

Only config.json and safetensors are read (pytorch_model.bin is refused). DIFF V2 has no Hugging Face class and
stays in our own format. A tokenizer.json beside the weights is copied along.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..model.pretrained import is_model_dir, save_pretrained
from ..model.transformer import DiffTransformerLM
from ..rundir import TOKENIZER_NAME, resolve_checkpoint
from .hf import is_hf_dir, load_hf, save_hf

EXPECT = {"diff_v1": "diff_v1", "baseline": "baseline", "diffllama": "diff_v1", "llama": "baseline"}


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert checkpoints to and from Hugging Face DiffLlama / Llama",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-hf", type=Path, metavar="HF_DIR",
                     help="a saved DiffLlamaForCausalLM or LlamaForCausalLM directory (safetensors) to import")
    src.add_argument("--to-hf", type=Path, metavar="DIR",
                     help="our run or model directory (DIFF V1 or baseline) to export for transformers")
    p.add_argument("--out", type=Path, required=True, help="output directory (must not exist or be empty)")
    p.add_argument("--expect", choices=sorted(EXPECT), default=None,
                   help="refuse any other architecture (e.g. --expect diffllama)")
    p.set_defaults(func=run)


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {out} exists and is not an empty directory; choose a new one")


def run(args: argparse.Namespace) -> int:
    _check_out(args.out)
    expect = EXPECT[args.expect] if args.expect else None
    if args.from_hf is not None:
        if is_model_dir(args.from_hf):
            raise ValueError(f"{args.from_hf} is in our own format, not a Hugging Face checkpoint (its config.json "
                             "names no model_type); use --to-hf to export it")
        model = load_hf(args.from_hf, expect=expect)
        tok = args.from_hf / TOKENIZER_NAME
        if args.out.exists():
            args.out.rmdir()
        save_pretrained(model, args.out, tokenizer_file=tok if tok.is_file() else None)
        kind = model.cfg.attention
    else:
        if args.to_hf.is_dir() and is_hf_dir(args.to_hf):
            raise ValueError(f"{args.to_hf} is already a Hugging Face checkpoint (use --from-hf to import it)")
        model_dir = resolve_checkpoint(args.to_hf)
        model = DiffTransformerLM.from_pretrained(model_dir)
        if expect is not None and model.cfg.attention != expect:
            raise ValueError(f"{model_dir} holds attention={model.cfg.attention!r}, not the expected {expect}")
        tok = model_dir / TOKENIZER_NAME
        save_hf(model, args.out, tokenizer_file=tok if tok.is_file() else None)
        kind = "DiffLlamaForCausalLM" if model.cfg.attention == "diff_v1" else "LlamaForCausalLM"
    print(f"wrote {kind} ({model.num_parameters():,} parameters) to {args.out}")
    return 0
