"""Every variant for transformers as *remote code*: a model directory that ``AutoModelForCausalLM.from_pretrained(DIR,
trust_remote_code=True)`` loads, and back.

DIFF V2, DIFF V1 in the per_head layout and the V1 options DiffLlama cannot hold (no head-wise norm, a constant
lambda_init, norm_eps other than 1e-5) have no native transformers class. For them (and for any variant with
``convert --to-hf --remote-code``) the export writes

* ``config.json`` with ``model_type`` "difftransformer" and ``auto_map``;
* ``configuration_difftransformer.py`` and ``modeling_difftransformer.py``, copied from ``remote_code/`` in this
  package (they import only torch and transformers);
* ``model.safetensors``: our state dict, renamed (``remote_code`` describes the layout);
* the tokenizer, generation config and chat template, as the native export (``hf.save_hf``) writes them;
* ``README.md``, the model card (``model_card``).

Reading (``load_remote``, or ``hf.load_hf``, which recognises the directory) needs no transformers: JSON and
safetensors only, also for a directory that transformers' save_pretrained wrote (after fine-tuning, a merged LoRA).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors.torch import save_file

from ..model.pretrained import CONFIG_NAME, TOKENIZER_NAME, WEIGHTS_NAME, atomic_directory
from ..model.transformer import DiffTransformerLM
from .hf import _token_ids, config_to_hf, read_hf_config, read_hf_weights, side_files_for
from .model_card import MODEL_CARD_NAME, Provenance, export_card
from .remote_code import (
    AUTO_MAP,
    CODE_DIR,
    CODE_FILES,
    REMOTE_ARCHITECTURE,
    REMOTE_MODEL_TYPE,
    config_from_remote,
    config_to_remote,
    is_remote_config,
    state_from_remote,
    state_to_remote,
)

PathLike = Union[str, os.PathLike]


def native_obstacle(cfg) -> Optional[str]:
    """The option that no native transformers class (DiffLlama for DIFF V1, Llama for the baseline) holds, e.g.
    "attention='diff_v2'" or "v1_layout='per_head'"; None when one holds the model (``hf.config_to_hf`` decides)."""
    try:
        config_to_hf(cfg, torch.float32)
    except ValueError as e:
        first = str(e).split(";")[0].split(": ")[0]
        return first.replace(" cannot be exported", "").replace(" has no Hugging Face class", "")
    return None


def load_remote(hf_dir: PathLike) -> DiffTransformerLM:
    """Our model from a remote-code directory (written by ``save_remote`` or by transformers' save_pretrained of
    the remote model)."""
    cfg = config_from_remote(read_hf_config(hf_dir))
    return DiffTransformerLM.from_state_dict(cfg, state_from_remote(cfg, read_hf_weights(hf_dir)),
                                             where=str(hf_dir))


def code_files() -> dict[str, bytes]:
    """The two remote-code source files, as bytes."""
    return {name: (CODE_DIR / name).read_bytes() for name in CODE_FILES}


def save_remote(model: DiffTransformerLM, out_dir: PathLike, tokenizer_file: Optional[PathLike] = None,
                side_files: Optional[dict[str, bytes]] = None, provenance: Optional[Provenance] = None) -> Path:
    """Write the remote-code directory of ``model`` (any variant) atomically: config.json with auto_map, the
    source files, model.safetensors (+ tokenizer.json and ``side_files``; without them, ones made for our
    tokenizer, as ``hf.save_hf`` does) and the model card (README.md; ``provenance``: where the weights came
    from). ``out_dir`` must not exist or be empty."""
    if not isinstance(model, DiffTransformerLM):
        raise TypeError(f"save_remote expects a DiffTransformerLM, got {type(model).__name__}")
    cfg = model.cfg
    hf_cfg = config_to_remote(cfg, model.output.weight.dtype)
    if not side_files and tokenizer_file is not None:
        side_files = side_files_for(tokenizer_file, cfg.max_seq_len)
    side_files = side_files or {}
    hf_cfg.update(_token_ids(side_files))
    state = {k: v.detach().contiguous().cpu() for k, v in state_to_remote(cfg, model.state_dict()).items()}
    code = code_files()
    card = export_card(model, REMOTE_ARCHITECTURE, remote=True, load_path=str(out_dir), provenance=provenance,
                       tokenizer=tokenizer_file is not None)
    with atomic_directory(out_dir, replace=False) as tmp:
        (tmp / CONFIG_NAME).write_text(json.dumps(hf_cfg, indent=2) + "\n")
        (tmp / MODEL_CARD_NAME).write_text(card, encoding="utf-8")
        save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        for name, data in code.items():
            (tmp / name).write_bytes(data)
        if tokenizer_file is not None:
            shutil.copyfile(tokenizer_file, tmp / TOKENIZER_NAME)
        for name, data in side_files.items():
            (tmp / name).write_bytes(data)
    return Path(out_dir)


__all__ = ["REMOTE_MODEL_TYPE", "AUTO_MAP", "is_remote_config", "native_obstacle", "config_to_remote",
           "config_from_remote", "state_to_remote", "state_from_remote", "load_remote", "save_remote", "code_files"]
