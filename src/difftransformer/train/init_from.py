"""`train --init-from DIR`: continue training a model that already exists, with its own tokenizer.

DIR is one of our model directories, a run directory (its newest complete checkpoint), or a Hugging Face Llama /
DiffLlama directory, read by the package's one loader (``difftransformer.loading``). The run takes the source's
model config (only ``model.backend`` may be chosen, and ``model.attention diff_v2`` or ``diff_v1`` on a baseline
source converts it with ``model.upcycle.convert`` first, the same function; V1 in the per_head layout, its negative
branch warmed up over ``train.v1_negative_warmup`` steps),
encodes the corpus with the source's ``tokenizer.json`` (``data.tokenizer``; no BPE is trained) and starts from
the source's weights. Everything else (data, optimizer, checkpoints, resume, torchrun) is a normal run: the
source's path and tokenizer are recorded in ``run_config.json``, and ``--resume`` reads the run's own
checkpoints, not the source.

With ``train.lora_rank`` > 0 (``train.lora``) the source is frozen and only low-rank adapters train; the model must
then be the source as it is (no ``--model.attention`` conversion), so that the saved adapters fit it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import rundir
from ..loading import ModelSource, locate
from ..model.config import ModelConfig
from ..model.upcycle import convert
from .config import TrainConfig

# What a run started from a source may still choose about its model (the shape is the source's).
FREE_MODEL_KEYS = ("backend", "attention")


def _source(path: Path) -> ModelSource:
    try:
        return locate(path)
    except ValueError as e:
        raise ValueError(f"--init-from {e}") from None


def _converted(src: ModelConfig, attention: str, path: Path) -> ModelConfig:
    try:
        return convert(src, attention)
    except ValueError as e:
        raise ValueError(f"--init-from {path}: --model.{e}") from None


def apply_init_from(cfg: TrainConfig, path: Path, model_overrides: Mapping[str, Any]) -> TrainConfig:
    """``cfg`` with the source's model config, tokenizer and vocabulary size, and ``train.init_from`` set."""
    path = Path(path).resolve()
    bad = sorted(set(model_overrides) - set(FREE_MODEL_KEYS))
    if bad:
        raise ValueError(f"--init-from takes the model's shape from {path}; --model.{bad[0]} cannot change it "
                         f"(only {', '.join('--model.' + k for k in FREE_MODEL_KEYS)})")
    source = _source(path)
    src = source.config()
    attention = model_overrides.get("attention", src.attention)
    if cfg.train.lora_rank and attention != src.attention:
        raise ValueError(f"train.lora_rank={cfg.train.lora_rank} trains adapters for {path} as it is, a "
                         f"{src.attention} model; --model.attention {attention} would convert it first, and the "
                         "adapters' base would exist nowhere else: convert it once (difftransformer convert "
                         "--attention), then --init-from the converted model")
    src = _converted(src, attention, path)
    model = src.replace(backend=model_overrides.get("backend", cfg.model.backend))
    tok = source.tokenizer_file().resolve()
    rundir.read_tokenizer(tok, model.vocab_size, where=f"--init-from {path}")  # one that does not fit: refused now
    data = dataclasses.replace(cfg.data, tokenizer=str(tok), vocab_size=model.vocab_size)
    train = dataclasses.replace(cfg.train, init_from=str(path))
    out = dataclasses.replace(cfg, model=model, data=data, train=train)
    out.validate()
    return out


def load_source_weights(cfg: TrainConfig) -> dict:
    """The state dict to start from: the source's weights, converted to the run's attention when it asks for it."""
    path = Path(cfg.train.init_from)
    src = _source(path).load().model
    src = convert(src, cfg.model.attention, v2_lambda=cfg.model.v2_lambda, headwise_norm=cfg.model.headwise_norm,
                  seed=cfg.train.seed)
    if src.cfg.replace(backend=cfg.model.backend) != cfg.model:
        raise ValueError(f"train.init_from={path} no longer matches the run's model config (was it replaced?)")
    return src.state_dict()
