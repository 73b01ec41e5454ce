"""Our own checkpoint format, and finding the checkpoint inside a run directory.

A model directory holds ``config.json`` (the ``ModelConfig``), ``model.safetensors`` (the weights) and usually
``tokenizer.json``. Training writes one such directory per checkpoint, ``RUN_DIR/checkpoints/step_XXXXXXXX``,
completed by a ``manifest.json`` (file names, sizes, sha256) written last; the directory is built under a
temporary name and renamed, so a directory with a matching manifest is complete.

Only JSON and safetensors are ever read from a user path (no pickle).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import ModelConfig
from .transformer import DiffTransformerLM

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_NAME = "tokenizer.json"
MANIFEST_NAME = "manifest.json"
CHECKPOINTS_DIR = "checkpoints"

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


def verify_manifest(directory: PathLike, check_hashes: bool = True) -> Optional[str]:
    """None when the directory matches its manifest, else a sentence saying what is wrong."""
    d = Path(directory)
    mf = d / MANIFEST_NAME
    if not mf.is_file():
        return f"{d} has no {MANIFEST_NAME} (an incomplete checkpoint)"
    try:
        files = json.loads(mf.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return f"{mf} is not a valid manifest"
    for name, info in files.items():
        p = d / name
        if not p.is_file():
            return f"{p} is missing"
        if p.stat().st_size != info["bytes"]:
            return f"{p} is truncated ({p.stat().st_size} bytes, manifest says {info['bytes']})"
        if check_hashes and _sha256(p) != info["sha256"]:
            return f"{p} is corrupted (sha256 differs from the manifest)"
    return None


def list_checkpoints(run_dir: PathLike) -> list[Path]:
    """Checkpoint directories of a run, oldest first (by step number in the name)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    steps = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit():
            steps.append((int(p.name[5:]), p))
    return [p for _, p in sorted(steps)]


def resolve_checkpoint(path: PathLike, check_hashes: bool = True) -> Path:
    """A model directory for ``path``: itself if it holds weights, else the newest complete checkpoint of a run."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist")
    if not p.is_dir():
        raise NotADirectoryError(f"{p} is not a directory (expected a run or model directory)")
    if (p / WEIGHTS_NAME).is_file():
        return p
    ckpts = list_checkpoints(p)
    if not ckpts:
        raise FileNotFoundError(f"{p} holds neither {WEIGHTS_NAME} nor any checkpoint under {CHECKPOINTS_DIR}/")
    problems = []
    for c in reversed(ckpts):
        why = verify_manifest(c, check_hashes)
        if why is None:
            return c
        problems.append(why)
    raise FileNotFoundError(f"no complete checkpoint in {p}: " + "; ".join(problems))


def save_pretrained(model: DiffTransformerLM, directory: PathLike, tokenizer_file: Optional[PathLike] = None,
                    extra_files: Optional[dict[str, bytes]] = None) -> Path:
    """Write config.json, model.safetensors (and tokenizer.json) to ``directory``, atomically.

    Everything is written to a temporary sibling directory and renamed over ``directory`` when complete.
    """
    out = Path(directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.cfg.to_json(tmp / CONFIG_NAME)
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        if model.cfg.tie_embeddings:
            state.pop("output.weight", None)  # safetensors refuses shared storage; re-tied on load
        save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt", "library": "difftransformer"})
        if tokenizer_file is not None:
            shutil.copyfile(tokenizer_file, tmp / TOKENIZER_NAME)
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        write_manifest(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_state_dict(path: PathLike) -> dict[str, torch.Tensor]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist")
    try:
        with safe_open(str(p), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise ValueError(f"{p} is not a readable safetensors file: {e}") from None


def load_pretrained(path: PathLike, device: Union[str, torch.device] = "cpu",
                    dtype: Optional[torch.dtype] = None, backend: Optional[str] = None) -> DiffTransformerLM:
    """Load a model directory (or a run directory's newest complete checkpoint).

    The model is built on the meta device and the weights are assigned (no random init, no double memory).
    """
    d = resolve_checkpoint(path)
    cfg_path = d / CONFIG_NAME
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} does not exist")
    cfg = ModelConfig.from_json(cfg_path)
    if backend is not None:
        cfg = cfg.replace(backend=backend)
    state = load_state_dict(d / WEIGHTS_NAME)
    with torch.device("meta"):
        model = DiffTransformerLM(cfg)
    expected = set(model.state_dict())
    if cfg.tie_embeddings:
        expected.discard("output.weight")
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{d / WEIGHTS_NAME} does not match {cfg_path}: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for k, v in state.items():
        want = model.state_dict()[k].shape
        if v.shape != want:
            raise ValueError(f"{d / WEIGHTS_NAME}: tensor {k} has shape {tuple(v.shape)}, config needs {tuple(want)}")
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    model = model.to(device=device)
    if dtype is not None:
        model = model.to(dtype=dtype)
    return model.eval()
