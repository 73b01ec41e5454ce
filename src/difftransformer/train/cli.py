"""`difftransformer train`: train one model from a preset or TOML config into a run directory.

  difftransformer train --config demo --model.attention diff_v2 --out runs/v2
  difftransformer train --out runs/v2 --resume --train.steps 4000   # the run's own config, more steps
  python -m torch.distributed.run --nproc_per_node=2 -m difftransformer train --config tiny --out runs/ddp
  difftransformer train --config tiny --init-from hf-llama --model.attention diff_v2 --out runs/ft-v2

Every config key is also a flag --section.key VALUE (VALUE read as TOML: 3e-4, true, '["a.txt", "b/"]', or a
bare word). The run directory receives run_config.json, tokenizer.json, data/, metrics.jsonl, tb/ and
checkpoints/step_XXXXXXXX/ (and, for a LoRA run, adapter/ with a model card and adapter_base/, the frozen source as
transformers remote code, unless --train.lora_base names the base). Every value is UTF-8 text. Under torchrun the
same command runs DDP (or --train.parallel fsdp).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..fileio import text_arg
from .config import TrainConfig, list_presets, load_config, merge, override_keys, parse_value
from .init_from import apply_init_from

OVERRIDE_PREFIX = "override:"


def run(args: argparse.Namespace) -> int:
    from .. import rundir
    from .trainer import train

    overrides: dict[str, dict] = {}
    for dest, raw in vars(args).items():
        if dest.startswith(OVERRIDE_PREFIX) and raw is not None:
            section, key = dest[len(OVERRIDE_PREFIX):].split(".", 1)
            overrides.setdefault(section, {})[key] = parse_value(raw)
    from ..fileio import check_out_dir as check_out
    out = check_out(args.out)  # a file in the way: one line before the data is read or a model built
    if args.config is None:
        saved = rundir.read_run_config(out) if args.resume else {}
        if not saved:
            raise ValueError("--config is required (a preset: " + ", ".join(list_presets()) +
                             "; or a .toml file), unless --resume finds the run's run_config.json")
        cfg = merge(TrainConfig.from_dict(saved), overrides)
    else:
        init_from = args.init_from or overrides.get("train", {}).pop("init_from", None)
        model_overrides = overrides.pop("model", {}) if init_from else {}
        cfg = load_config(args.config, overrides)
        if init_from:
            cfg = apply_init_from(cfg, Path(init_from), model_overrides)
    result = train(cfg, out, resume=args.resume, progress=False if args.no_progress else None)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one summary line
        print(f"{cfg.model.attention}: {result.parameters:,} parameters, {result.tokens_per_s:,.0f} tokens/s, "
              f"final validation loss {result.final_val_loss:.4f} ({out})")
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="train a baseline / DIFF V1 / DIFF V2 model (alone or under torchrun)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    p.add_argument("--config", default=None, metavar="PRESET_OR_TOML",
                   help=f"a preset name ({', '.join(list_presets())}) or a path to a TOML file")
    p.add_argument("--out", default="runs/train", metavar="RUN_DIR", help="run directory (default runs/train)")
    p.add_argument("--resume", action="store_true",
                   help="continue RUN_DIR from its newest complete checkpoint (a corrupt newest one is skipped)")
    p.add_argument("--init-from", default=None, metavar="DIR",
                   help="continue training an existing model: one of our model or run directories, or a Hugging "
                        "Face Llama/DiffLlama directory. The run takes its model config and its tokenizer.json (no "
                        "BPE is trained) and starts from its weights; only --model.backend may change, and "
                        "--model.attention diff_v2 converts a baseline/Llama to DIFF V2 with the same function")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    g = p.add_argument_group("config overrides (--section.key VALUE, VALUE parsed as TOML)")
    for key, text in override_keys():
        g.add_argument(f"--{key}", dest=OVERRIDE_PREFIX + key, default=None, metavar="VALUE", help=text,
                       type=text_arg)  # TOML text: UTF-8 (a non-UTF-8 byte is refused naming the flag)
    p.set_defaults(func=run)
