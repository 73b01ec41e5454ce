"""Our own model-directory format: one directory from (config, state_dict), and back.

A model directory holds ``config.json`` (the ``ModelConfig``), ``model.safetensors`` (the weights), usually
``tokenizer.json``, and ``manifest.json`` (file names, sizes, sha256) written last. The directory is built under a
temporary name and renamed, so a directory with a matching manifest is complete. Where such directories sit
inside a training run (``checkpoints/step_*``) is ``difftransformer.rundir``'s business, not this module's.

This module does not import the model class (``transformer.py`` imports it): loading goes through
``DiffTransformerLM.from_pretrained`` / ``from_state_dict``, which build on the meta device and call
``assign_weights`` here. Only JSON and safetensors are ever read from a user path (no pickle).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, TypeVar, Union, cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ..fileio import fault_point, fsync_dir, parse_json
from .config import ModelConfig

# A DiffTransformerLM (its ``cfg`` a ModelConfig), named by its base class: model.transformer imports this module.
M = TypeVar("M", bound=nn.Module)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_NAME = "tokenizer.json"
MANIFEST_NAME = "manifest.json"
# What a Hugging Face user expects beside the tokenizer (end tokens, chat template, generation defaults): carried
# both ways by `convert` (``interop.hf``), read by `generate`; spelled here once, like the names above.
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
SPECIAL_TOKENS_NAME = "special_tokens_map.json"
GENERATION_CONFIG_NAME = "generation_config.json"
CHAT_TEMPLATE_NAME = "chat_template.jinja"
SIDE_FILES = (TOKENIZER_CONFIG_NAME, SPECIAL_TOKENS_NAME, GENERATION_CONFIG_NAME, CHAT_TEMPLATE_NAME)
# With tie_embeddings the head is the embedding: saved once (safetensors refuses shared storage), re-tied on load.
TIED = {"output.weight": "tok_embeddings.weight"}

PathLike = Union[str, os.PathLike]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: PathLike) -> None:
    """Record every file's size and sha256; written last, it marks the directory complete."""
    d = Path(directory)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(d.iterdir()) if p.is_file() and p.name != MANIFEST_NAME}
    (d / MANIFEST_NAME).write_text(json.dumps({"files": files}, indent=1) + "\n")


def verify_manifest(directory: PathLike, check_hashes: bool = True,
                    only: Optional[tuple[str, ...]] = None) -> Optional[str]:
    """None when the directory matches its manifest (``only``: these of its files), else a sentence saying what
    is wrong."""
    d = Path(directory)
    mf = d / MANIFEST_NAME
    if not mf.is_file():
        return f"{d} has no {MANIFEST_NAME} (an incomplete checkpoint)"
    try:
        files = parse_json(mf.read_text(), mf)["files"]
        items = [(name, int(info["bytes"]), str(info["sha256"])) for name, info in files.items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"{mf} is not a valid manifest"
    for name, size, sha in items:
        if only is not None and name not in only:
            continue
        p = d / name
        if Path(name).name != name or not p.is_file():  # a manifest naming ../x is not ours
            return f"{p} is missing"
        if p.stat().st_size != size:
            return f"{p} is truncated ({p.stat().st_size} bytes, manifest says {size})"
        if check_hashes and _sha256(p) != sha:
            return f"{p} is corrupted (sha256 differs from the manifest)"
    return None


def check_manifest(directory: PathLike) -> None:
    """Refuse a directory whose config or weights differ from its manifest (a flipped byte would load as NaN
    weights); a directory without a manifest (a Hugging Face export, a hand-made one) is read as is. The tokenizer
    is left to the tokenizer checks: swapping in another one is a choice, refused only when it does not fit."""
    d = Path(directory)
    if not (d / MANIFEST_NAME).exists():
        return
    why = verify_manifest(d, only=(CONFIG_NAME, WEIGHTS_NAME))
    if why is not None:
        raise ValueError(f"{why}; refusing to load {d}")


def temp_prefix(name: str) -> str:
    """The name prefix of the temporary sibling ``atomic_directory`` builds ``name`` under (to clean leftovers)."""
    return f".{name}.tmp-"


@contextmanager
def atomic_directory(directory: PathLike, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling directory to fill; on success it is renamed to ``directory``.

    A kill mid-write leaves ``directory`` as it was. ``replace=False`` refuses an existing non-empty directory
    (an empty one, e.g. made by a CLI's output check, is taken over).
    """
    out = Path(directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out.name), dir=out.parent))
    try:
        yield tmp
        for f in tmp.iterdir():  # the contents reach the disk before the rename makes them visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        fault_point(out)  # a complete temporary directory, not yet renamed
        if out.exists() and not replace:
            if not out.is_dir() or any(out.iterdir()):
                raise FileExistsError(f"{out} exists and is not an empty directory; choose a new --out")
            out.rmdir()
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
        fsync_dir(out.parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.filename and str(e.filename).startswith(str(tmp)):
            # name the file the user asked for, not its temporary twin
            raise OSError(e.errno, e.strerror, str(out) + str(e.filename)[len(str(tmp)):]) from None
        raise


def write_model_dir(directory: PathLike, cfg: ModelConfig, state: dict[str, torch.Tensor],
                    tokenizer_file: Optional[PathLike] = None,
                    extra_files: Optional[dict[str, bytes]] = None) -> Path:
    """Write config.json, model.safetensors (and tokenizer.json, ``extra_files``, the manifest), atomically."""
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()
             if not (cfg.tie_embeddings and k in TIED)}
    with atomic_directory(directory) as tmp:
        cfg.to_json(tmp / CONFIG_NAME)
        save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt", "library": "difftransformer"})
        if tokenizer_file is not None:
            shutil.copyfile(tokenizer_file, tmp / TOKENIZER_NAME)
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        write_manifest(tmp)
    return Path(directory)


def save_pretrained(model: nn.Module, directory: PathLike, tokenizer_file: Optional[PathLike] = None,
                    extra_files: Optional[dict[str, bytes]] = None) -> Path:
    """``write_model_dir`` for a ``DiffTransformerLM`` (its ``cfg`` and ``state_dict()``)."""
    return write_model_dir(directory, cast(ModelConfig, model.cfg), model.state_dict(), tokenizer_file, extra_files)


def load_state_dict(path: PathLike) -> dict[str, torch.Tensor]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist")
    try:
        with safe_open(str(p), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has keys(), no __iter__)
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise ValueError(f"{p} is not a readable safetensors file: {e}") from None


def is_model_dir(path: PathLike) -> bool:
    """True for one of our model directories: weights plus a config.json of ours (it names an ``attention``)."""
    p = Path(path)
    try:
        cfg = parse_json((p / CONFIG_NAME).read_text(), p / CONFIG_NAME)
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "attention" in cfg and "model_type" not in cfg


def read_model_dir(path: PathLike) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, weights) of one model directory; a training run directory is refused with what to pass."""
    d = Path(path)
    if not d.exists():
        raise FileNotFoundError(f"{d} does not exist")
    if not d.is_dir():
        raise NotADirectoryError(f"{d} is not a directory (expected a model directory)")
    if not (d / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(f"{d} holds no {WEIGHTS_NAME}; for a training run pass its checkpoint "
                                "(difftransformer.rundir.resolve_checkpoint), or load it with "
                                "difftransformer.loading.load_model")
    cfg_path = d / CONFIG_NAME
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} does not exist")
    check_manifest(d)
    raw = parse_json(cfg_path.read_text(), cfg_path)
    if isinstance(raw, dict) and "model_type" in raw:
        raise ValueError(f"{d} is a Hugging Face checkpoint (model_type {raw['model_type']!r}), not our format: load "
                         f"it with difftransformer.loading.load_model, or convert it once with `difftransformer "
                         f"convert --from-hf {d} --out DIR`")
    return ModelConfig.from_json(cfg_path), load_state_dict(d / WEIGHTS_NAME)


def assign_weights(model: M, state: dict[str, torch.Tensor], where: str) -> M:
    """Assign ``state`` to a model built on the meta device: keys and shapes checked, tied weights re-tied.

    No random init and no second copy of the weights. ``where`` names the source in error messages.
    """
    tied = TIED if cast(ModelConfig, model.cfg).tie_embeddings else {}
    expected = {k: v for k, v in model.state_dict().items() if k not in tied}
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{where} does not match the config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for k, v in state.items():
        if v.shape != expected[k].shape:
            raise ValueError(f"{where}: tensor {k} has shape {tuple(v.shape)}, the config needs "
                             f"{tuple(expected[k].shape)}")
    model.load_state_dict(state, strict=False, assign=True)
    for dst, src in tied.items():
        owner, _, attr = dst.rpartition(".")
        setattr(model.get_submodule(owner), attr, model.get_parameter(src))
    return model
