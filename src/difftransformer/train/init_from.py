"""`train --init-from DIR`: continue training a model that already exists, with its own tokenizer.

DIR is one of our model directories, a run directory (its newest complete checkpoint), or a Hugging Face Llama /
DiffLlama directory. The run takes the source's model config (only ``model.backend`` may be chosen, and
``model.attention diff_v2`` or ``diff_v1`` on a baseline source converts it with ``model.upcycle`` first, the same
function; V1 in the per_head layout, its negative branch warmed up over ``train.v1_negative_warmup`` steps),
encodes the corpus with the source's ``tokenizer.json`` (``data.tokenizer``; no BPE is trained) and starts from
the source's weights. Everything else (data, optimizer, checkpoints, resume, torchrun) is a normal run: the
source's path and tokenizer are recorded in ``run_config.json``, and ``--resume`` reads the run's own
checkpoints, not the source.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from .. import rundir
from ..interop.hf import config_from_hf, load_hf, read_hf_config
from ..model.config import ModelConfig
from ..model.pretrained import CONFIG_NAME
from ..model.transformer import DiffTransformerLM
from ..model.upcycle import (baseline_to_diff_v1, baseline_to_diff_v2, diff_v1_config_from_baseline,
                             diff_v2_config_from_baseline)
from .config import TrainConfig

# What a run started from a source may still choose about its model (the shape is the source's).
FREE_MODEL_KEYS = ("backend", "attention")


def _source(path: Path) -> tuple[str, Path]:
    kind = rundir.dir_kind(path)
    if kind is None:
        raise ValueError(f"--init-from {path}: not a run, a model directory of ours or a Hugging Face "
                         "Llama/DiffLlama directory (no config.json, or one naming neither attention nor model_type)")
    return kind, (rundir.resolve_checkpoint(path) if kind == "run" else path)


def source_config(path: Path) -> ModelConfig:
    """The source's model config, without reading its weights."""
    kind, where = _source(path)
    if kind == "hf":
        return config_from_hf(read_hf_config(where))
    return ModelConfig.from_json(where / CONFIG_NAME)


def source_tokenizer(path: Path) -> Path:
    """The source's tokenizer.json: the model directory's, else its run's (a Hugging Face directory's own)."""
    kind, where = _source(path)
    run = path if kind == "run" else rundir.run_of_checkpoint(where)
    return rundir.find_tokenizer(where, run)


def apply_init_from(cfg: TrainConfig, path: Path, model_overrides: Mapping[str, Any]) -> TrainConfig:
    """``cfg`` with the source's model config, tokenizer and vocabulary size, and ``train.init_from`` set."""
    path = Path(path).resolve()
    bad = sorted(set(model_overrides) - set(FREE_MODEL_KEYS))
    if bad:
        raise ValueError(f"--init-from takes the model's shape from {path}; --model.{bad[0]} cannot change it "
                         f"(only {', '.join('--model.' + k for k in FREE_MODEL_KEYS)})")
    src = source_config(path)
    attention = model_overrides.get("attention", src.attention)
    if attention != src.attention:
        if src.attention != "baseline" or attention not in ("diff_v1", "diff_v2"):
            raise ValueError(f"--init-from {path} holds a {src.attention} model; --model.attention {attention} is "
                             "not a conversion that keeps its function (only baseline -> diff_v1 or diff_v2)")
        src = diff_v1_config_from_baseline(src) if attention == "diff_v1" else diff_v2_config_from_baseline(src)
    model = src.replace(backend=model_overrides.get("backend", cfg.model.backend))
    tok = source_tokenizer(path).resolve()
    rundir.read_tokenizer(tok, model.vocab_size, where=path)  # refuse one that does not fit before any work
    data = dataclasses.replace(cfg.data, tokenizer=str(tok), vocab_size=model.vocab_size)
    train = dataclasses.replace(cfg.train, init_from=str(path))
    out = dataclasses.replace(cfg, model=model, data=data, train=train)
    out.validate()
    return out


def load_source_weights(cfg: TrainConfig) -> dict:
    """The state dict to start from: the source's weights, converted to DIFF V2 when the run asks for it."""
    path = Path(cfg.train.init_from)
    kind, where = _source(path)
    src = load_hf(where) if kind == "hf" else DiffTransformerLM.from_pretrained(where)
    if cfg.model.attention == "diff_v2" and src.cfg.attention == "baseline":
        src = baseline_to_diff_v2(src, cfg.model.v2_lambda)
    elif cfg.model.attention == "diff_v1" and src.cfg.attention == "baseline":
        src = baseline_to_diff_v1(src, cfg.model.headwise_norm, seed=cfg.train.seed)
    if src.cfg.replace(backend=cfg.model.backend) != cfg.model:
        raise ValueError(f"train.init_from={path} no longer matches the run's model config (was it replaced?)")
    return src.state_dict()
