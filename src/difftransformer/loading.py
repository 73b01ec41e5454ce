"""The one model loader: a training run (its newest complete checkpoint), one of our model directories, or a
Hugging Face Llama/DiffLlama directory, as a ``DiffTransformerLM`` with its tokenizer.

    from difftransformer.loading import load_model
    loaded = load_model("runs/v2", device="cuda", dtype=torch.bfloat16)
    loaded.model, loaded.tokenizer(), loaded.model_dir, loaded.run_dir

``locate(path)`` says what a path is and which directory's weights it stands for without reading them (``train
--init-from`` takes the config and tokenizer first; ``generate`` checks its ``--device`` in between);
``ModelSource.load`` then reads them. Every command that takes a model directory goes through here: ``eval``
(``eval.loading.load_for_eval``), ``lm-eval``, ``generate``, ``train --init-from`` and ``bench pretrained``. A
caller may accept fewer kinds (``generate`` and ``eval`` refuse a Hugging Face directory with the command that
converts it). A path that is none of the kinds accepted is one ValueError naming it and them.

It sits above ``rundir`` and ``interop.hf`` (it reads both kinds of directory) and below the commands.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from tokenizers import Tokenizer

from .interop.hf import config_from_hf, load_hf, read_hf_config
from .model.config import ModelConfig
from .model.pretrained import CONFIG_NAME, WEIGHTS_NAME
from .model.transformer import DiffTransformerLM
from .rundir import (
    CHECKPOINTS_DIR,
    DIR_KINDS,
    DirKind,
    dir_kind,
    find_tokenizer,
    read_tokenizer,
    resolve_checkpoint,
    run_of_checkpoint,
)

PathLike = Union[str, Path]

KINDS: tuple[DirKind, ...] = DIR_KINDS
WORDS: dict[str, str] = {"run": "a run", "model": "a model directory of ours", "hf": "a Hugging Face directory"}

__all__ = ["KINDS", "ModelSource", "LoadedModel", "locate", "load_model", "DEVICE_RE", "pick_device", "device_arg"]

# The device names every command that runs a model takes (train.device; eval, report and lm-eval's --device)
DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?")
DEVICE_WORDS = "auto, cpu, cuda or cuda:N"


def pick_device(name: str, local_rank: int = 0, who: str = "--device") -> torch.device:
    """The one place a device name becomes a ``torch.device`` (``train``'s ``pick_device`` and the studies' jobs come
    here): "auto" is cuda when a GPU is seen, else cpu; "cuda" is GPU ``local_rank``; "cuda:N" must exist. A CUDA
    device this process does not see is a ValueError naming ``who`` (the flag or field) and the name."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"{who}={name!r} but CUDA is not available here (torch {torch.__version__}); use "
                             "\"cpu\" or \"auto\"")
        index = torch.device(name).index
        if index is not None and index >= torch.cuda.device_count():
            raise ValueError(f"{who}={name!r} but there are only {torch.cuda.device_count()} CUDA devices")
        return torch.device("cuda", local_rank if name == "cuda" else torch.device(name).index)
    return torch.device(name)


def device_arg(name: str, flag: str = "--device") -> torch.device:
    """A command's ``--device`` (``eval``, ``report``, ``lm-eval``), checked as ``train.device`` is: one of
    ``DEVICE_RE``'s names, and a device this process has; else a ValueError (one line, exit code 2) naming ``flag``.
    Called before any model is read."""
    if not isinstance(name, str) or not DEVICE_RE.fullmatch(name):
        raise ValueError(f"{flag}={name!r} is not a device; use {DEVICE_WORDS}")
    return pick_device(name, 0, flag)


def _one_of(kinds: Sequence[str]) -> str:
    words = [WORDS[k] for k in kinds]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _stderr(line: str) -> None:
    print(f"difftransformer: warning: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ModelSource:
    """Where a model is: ``path`` as given, its ``kind`` ("run", "model" or "hf") and ``model_dir``, the directory
    whose weights are read (``path`` itself, or a run's newest complete checkpoint)."""

    path: Path
    kind: DirKind
    model_dir: Path

    @property
    def run_dir(self) -> Optional[Path]:
        """The run given (kind "run"); None for a model or Hugging Face directory given directly."""
        return self.path if self.kind == "run" else None

    def config(self) -> ModelConfig:
        """The model's config, without reading its weights."""
        if self.kind == "hf":
            return config_from_hf(read_hf_config(self.model_dir))
        return ModelConfig.from_json(self.model_dir / CONFIG_NAME)

    def tokenizer_file(self) -> Path:
        """tokenizer.json of the model directory, else of its run (the run given, or the one a checkpoint given
        directly sits in); FileNotFoundError naming where it looked."""
        return find_tokenizer(self.model_dir, self.run_dir or run_of_checkpoint(self.model_dir))

    def tokenizer(self, require_eos: bool = True, where: Optional[PathLike] = None,
                  vocab_size: Optional[int] = None) -> Tokenizer:
        """The tokenizer, refused when the model (``vocab_size``, else the config's) cannot embed its ids or
        (``require_eos``) it lacks the document separator; ``where`` names the source in errors (``path``)."""
        n = vocab_size if vocab_size is not None else self.config().vocab_size
        return read_tokenizer(self.tokenizer_file(), n, where=where if where is not None else self.path,
                              require_eos=require_eos)

    def load(self, device: Union[str, torch.device] = "cpu", dtype: Optional[torch.dtype] = None,
             backend: Optional[str] = None) -> LoadedModel:
        """The model on ``device`` (in ``dtype``, else as stored; with ``backend``, else the config's), in eval
        mode, with where it came from."""
        if self.kind == "hf":
            model = load_hf(self.model_dir)
            if backend is not None:
                model.set_backend(backend)
            model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device=device)
        else:
            model = DiffTransformerLM.from_pretrained(self.model_dir, device=device, dtype=dtype, backend=backend)
        return LoadedModel(self.path, self.kind, self.model_dir, model.eval())


@dataclass(frozen=True)
class LoadedModel(ModelSource):
    """A loaded model with where it came from (``ModelSource``'s fields); ``tokenizer()`` checks against it."""

    model: DiffTransformerLM

    def tokenizer(self, require_eos: bool = True, where: Optional[PathLike] = None,
                  vocab_size: Optional[int] = None) -> Tokenizer:
        n = vocab_size if vocab_size is not None else self.model.cfg.vocab_size
        return super().tokenizer(require_eos, where, n)


def locate(path: PathLike, kinds: Sequence[DirKind] = KINDS,
           warn: Optional[Callable[[str], None]] = _stderr) -> ModelSource:
    """What ``path`` is (one of ``kinds``) and the directory whose weights it stands for.

    A run's broken newer checkpoints are skipped (``warn`` hears one line). A directory holding weights beside a
    config.json that is neither ours nor a Hugging Face one is taken as ours, so that reading it says what is
    wrong with its config. Anything else, or a kind not in ``kinds``, is one ValueError naming the path and the
    kinds accepted (a Hugging Face directory where only ours are read: with the command that converts it)."""
    bad = [k for k in kinds if k not in WORDS]
    if bad or not kinds:
        raise ValueError(f"kinds={tuple(kinds)!r}: choose among {', '.join(KINDS)}")
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{p} does not exist, so it is not {_one_of(kinds)}")
    if not p.is_dir():
        raise ValueError(f"{p} is not a directory, so it is not {_one_of(kinds)}")
    kind = dir_kind(p) or ("model" if (p / WEIGHTS_NAME).is_file() else None)
    if kind is None:
        raise ValueError(f"{p} holds neither {WEIGHTS_NAME} beside a {CONFIG_NAME} nor any checkpoint under "
                         f"{CHECKPOINTS_DIR}/, so it is not {_one_of(kinds)}")
    if kind not in kinds:
        if kind == "hf":
            raise ValueError(f"{p} is a Hugging Face checkpoint; convert it first: difftransformer convert "
                             f"--from-hf {p} --out DIR")
        raise ValueError(f"{p} is {WORDS[kind]}, not {_one_of(kinds)}")
    return ModelSource(p, kind, p if kind == "hf" else resolve_checkpoint(p, warn=warn))


def load_model(path: PathLike, device: Union[str, torch.device] = "cpu", dtype: Optional[torch.dtype] = None,
               backend: Optional[str] = None, kinds: Sequence[DirKind] = KINDS) -> LoadedModel:
    """The model of a run (its newest complete checkpoint), one of our model directories or a Hugging Face
    directory (``kinds`` narrows these), on ``device`` in ``dtype`` with ``backend``: ``locate(path).load(...)``."""
    return locate(path, kinds).load(device, dtype, backend)
