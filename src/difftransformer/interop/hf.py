"""Hugging Face checkpoints in and out: ``DiffLlamaForCausalLM`` <-> our DIFF V1, ``LlamaForCausalLM`` <-> our
baseline, and our remote-code model (``remote_code``, any variant) read back. This module does the directory I/O;
``hf_layout.py`` maps configs and tensors (RoPE halves, V1's head pairing and head-wise norm).

Only ``config.json`` and safetensors files are read (``model.safetensors`` or a sharded
``model.safetensors.index.json``); a directory holding only ``pytorch_model.bin`` (pickle) is refused. Writing
needs no ``transformers``: the config is plain JSON that transformers 4.46+ and 5.x read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors.torch import save_file

from ..fileio import decode_text, parse_json, read_json
from ..model.pretrained import (
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    SIDE_FILES,
    TOKENIZER_CONFIG_NAME,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    atomic_directory,
    load_state_dict,
)
from ..model.transformer import DiffTransformerLM
from ..rundir import dir_kind
from .hf_layout import (
    ARCHITECTURES,
    HEADWISE_EPS,
    config_from_hf,
    config_to_hf,
    interleaved_to_neox,
    neox_to_interleaved,
    state_from_hf,
    state_to_hf,
)
from .model_card import MODEL_CARD_NAME, Provenance, export_card
from .remote_code import is_remote_config, state_from_remote

PathLike = Union[str, os.PathLike]

HF_CONFIG, HF_WEIGHTS = CONFIG_NAME, WEIGHTS_NAME  # the same names as our model directories
# Carried both ways by `convert`, byte for byte; for our own runs `side_files_for` writes the first and the third.
HF_SIDE_FILES = SIDE_FILES
HF_INDEX = WEIGHTS_NAME + ".index.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.bin")


def _require_dir(path: PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist")
    if not p.is_dir():
        raise NotADirectoryError(f"{p} is not a directory (expected a Hugging Face model directory)")
    return p


def read_hf_config(hf_dir: PathLike) -> dict[str, Any]:
    p = _require_dir(hf_dir) / HF_CONFIG
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist (a Hugging Face model directory needs a config.json)")
    cfg = read_json(p)
    if not isinstance(cfg, dict):
        raise ValueError(f"{p} must hold a JSON object")
    return cfg



def read_hf_weights(hf_dir: PathLike) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards listed in ``model.safetensors.index.json``."""
    d = _require_dir(hf_dir)
    if (d / HF_WEIGHTS).is_file():
        return load_state_dict(d / HF_WEIGHTS)
    if (d / HF_INDEX).is_file():
        try:
            weight_map = read_json(d / HF_INDEX)["weight_map"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{d / HF_INDEX} is not a valid safetensors index") from None
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if Path(shard).name != shard:
                raise ValueError(f"{d / HF_INDEX} names a shard outside the directory: {shard!r}")
            state.update(load_state_dict(d / shard))
        return state
    pickled = [n for n in PICKLE_WEIGHTS if (d / n).exists()]
    if pickled:
        raise ValueError(f"{d} holds only {pickled[0]} (a pickle, which can run code when loaded and is never "
                         "read here); re-save it as safetensors, e.g. model.save_pretrained(dir, "
                         "safe_serialization=True) in transformers")
    raise FileNotFoundError(f"{d} holds neither {HF_WEIGHTS} nor {HF_INDEX}")


def load_hf(hf_dir: PathLike, expect: Optional[str] = None) -> DiffTransformerLM:
    """Our model (DIFF V1 or baseline) from a saved DiffLlamaForCausalLM / LlamaForCausalLM directory, or any
    variant from our remote-code directory (``remote.py``, ``remote_code``).

    ``expect`` ("diff_v1", "diff_v2" or "baseline") refuses the other architectures.
    """
    hf_cfg = read_hf_config(hf_dir)
    cfg = config_from_hf(hf_cfg)
    if expect is not None and cfg.attention != expect:
        raise ValueError(f"{hf_dir} holds a {hf_cfg.get('model_type')} model (our {cfg.attention}), "
                         f"not the expected {expect}")
    if is_remote_config(hf_cfg):  # our remote-code export: a rename of our own state dict
        return DiffTransformerLM.from_state_dict(cfg, state_from_remote(cfg, read_hf_weights(hf_dir)),
                                                 where=str(hf_dir))
    return DiffTransformerLM.from_state_dict(cfg, state_from_hf(cfg, read_hf_weights(hf_dir)), where=str(hf_dir))


def side_files_of(directory: PathLike) -> dict[str, bytes]:
    """The ``HF_SIDE_FILES`` present in ``directory``, as bytes."""
    d = Path(directory)
    return {name: (d / name).read_bytes() for name in HF_SIDE_FILES if (d / name).is_file()}


def side_files_for(tokenizer_file: PathLike, max_seq_len: int) -> dict[str, bytes]:
    """tokenizer_config.json and generation_config.json for one of our own runs: its end token is
    ``<|endoftext|>`` (without them transformers assumes ids 1/2, which are ordinary tokens of our BPE)."""
    from tokenizers import Tokenizer

    from ..data.tokenizer import EOS

    eos = Tokenizer.from_file(str(tokenizer_file)).token_to_id(EOS)
    if eos is None:
        return {}
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "bos_token": EOS, "pad_token": EOS,
               "model_max_length": max_seq_len, "clean_up_tokenization_spaces": False}
    gen_cfg = {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}
    return {TOKENIZER_CONFIG_NAME: (json.dumps(tok_cfg, indent=2) + "\n").encode(),
            GENERATION_CONFIG_NAME: (json.dumps(gen_cfg, indent=2) + "\n").encode()}


def _token_ids(side: dict[str, bytes]) -> dict[str, Any]:
    """bos/eos/pad ids for config.json, from generation_config.json when there is one."""
    if GENERATION_CONFIG_NAME not in side:
        return {}
    gen = parse_json(decode_text(side[GENERATION_CONFIG_NAME], GENERATION_CONFIG_NAME), GENERATION_CONFIG_NAME)
    return {k: gen[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if isinstance(gen, dict) and k in gen}


def save_hf(model: DiffTransformerLM, out_dir: PathLike, tokenizer_file: Optional[PathLike] = None,
            side_files: Optional[dict[str, bytes]] = None, provenance: Optional[Provenance] = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json`` and ``side_files``, e.g. carried from
    an import by ``side_files_of``; without them, ones made for our tokenizer) for transformers, atomically, with
    a model card (``README.md``: ``model_card.export_card``; ``provenance`` says where the weights came from)."""
    if not isinstance(model, DiffTransformerLM):
        raise TypeError(f"save_hf expects a DiffTransformerLM, got {type(model).__name__}")
    dtype = model.output.weight.dtype
    hf_cfg = config_to_hf(model.cfg, dtype)  # validates first: nothing is written for an unsupported model
    if not side_files and tokenizer_file is not None:
        side_files = side_files_for(tokenizer_file, model.cfg.max_seq_len)
    side_files = side_files or {}
    hf_cfg.update(_token_ids(side_files))
    state = {k: v.cpu() for k, v in state_to_hf(model).items()}
    card = export_card(model, hf_cfg["architectures"][0], remote=False, load_path=str(out_dir),
                       provenance=provenance, tokenizer=tokenizer_file is not None)
    with atomic_directory(out_dir, replace=False) as tmp:
        (tmp / HF_CONFIG).write_text(json.dumps(hf_cfg, indent=2) + "\n")
        (tmp / MODEL_CARD_NAME).write_text(card, encoding="utf-8")
        save_file(state, str(tmp / HF_WEIGHTS), metadata={"format": "pt"})
        if tokenizer_file is not None:
            shutil.copyfile(tokenizer_file, tmp / TOKENIZER_NAME)
        for name, data in side_files.items():
            (tmp / name).write_bytes(data)
    return Path(out_dir)


def is_hf_dir(path: PathLike) -> bool:
    """True when ``path`` holds a Hugging Face config.json (it names a ``model_type``)."""
    return dir_kind(path) == "hf"


__all__ = ["load_hf", "save_hf", "config_from_hf", "config_to_hf", "state_from_hf", "state_to_hf",
           "read_hf_config", "read_hf_weights", "is_hf_dir", "neox_to_interleaved", "interleaved_to_neox",
           "ARCHITECTURES", "HEADWISE_EPS"]
