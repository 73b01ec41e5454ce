"""`TrainConfig`: the whole training run as typed sections that reject unknown keys.

A run is described by a TOML file (a preset in ``configs/`` or the user's own) with the sections ``[model]``
(``ModelConfig`` fields), ``[data]``, ``[train]``, ``[checkpoint]`` and ``[log]``, then command-line overrides
``--section.key value`` (values parsed as TOML, so ``--train.lr 3e-4``, ``--data.sources '["a.txt"]'`` and
``--model.attention diff_v2`` all work). A typo in a key is an error, never a silent default.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Optional, get_args

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package (a dependency there only)
    import tomli as tomllib

from ..data.synthetic import CITIES
from ..fileio import check_text, read_text
from ..loading import DEVICE_RE
from ..model.config import ModelConfig
from ..model.lora import DEFAULT_TARGETS, LORA_TARGETS

# Repo-root `configs/` is a link to this folder, so presets work from a checkout and from an installed package.
PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"

Precision = Literal["auto", "float32", "bfloat16"]
Parallel = Literal["ddp", "fsdp"]
# Far above any real BPE vocabulary; the tokenizer trainer aborts the whole process (no exception) on sizes
# near 2^32, so the bound is checked here first.
MAX_VOCAB = 2**20


def _field(default: Any, help: str) -> Any:
    """A config field with its one line of help (``--help`` prints it; the field needs no separate comment)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class DataConfig:
    sources: list[str] = _field(["kjv"], 'list of corpora: "kjv" (embedded King James Bible) or .txt/.jsonl '
                                         "files or folders")
    vocab_size: int = _field(8192, "byte-level BPE vocabulary size, also the model's vocab_size")
    seq_len: int = _field(256, "training/evaluation window in tokens (<= model.max_seq_len)")
    val_fraction: float = _field(0.02, "fraction of documents held out for validation, spread evenly")
    max_chars: int = _field(0, "use only the first N characters of the corpus (0 = all; tests, quick demos)")
    # Retrieval mixing (issue 5): synthetic multi-needle documents (`data.synthetic.retrieval_documents`) whose
    # filler sentences come from the corpus.
    retrieval_share: float = _field(0.0, "fraction of the text made of synthetic multi-needle retrieval documents")
    retrieval_n_needles: int = _field(4, "needles per retrieval document")
    retrieval_n_queries: int = _field(2, "questions per retrieval document")
    retrieval_n_filler: int = _field(8, "corpus filler sentences per retrieval document")
    retrieval_digits: int = _field(3, "digits of each pass number")
    seed: int = _field(1234, "seed of the document shuffle and the retrieval documents")
    tokenizer: str = _field("", "a tokenizer.json to encode with instead of training a BPE (train --init-from sets "
                                "it to the source model's)")
    prepared_dir: str = _field("", "folder where shards are prepared once and shared (hard-linked into the run's "
                                   "data folder)")


@dataclass(frozen=True)
class OptimConfig:
    steps: int = _field(1000, "optimizer steps")
    batch_size: int = _field(16, "global batch in sequences (all ranks and accumulation micro-steps)")
    micro_batch_size: int = _field(16, "at most this many sequences per rank per forward pass; on N processes "
                                       "each rank takes batch / N per step in the largest micro-batches up to this "
                                       "that divide it, accumulating the rest (the global batch is unchanged)")
    lr: float = _field(1e-3, "peak learning rate")
    min_lr: float = _field(1e-4, "learning rate at the end of the cosine")
    warmup_steps: int = _field(100, "linear warmup steps")
    v1_negative_warmup: int = _field(0, "DIFF V1 per_head layout (a converted Llama): steps over which the negative "
                                        "branch's weight rises linearly from 0 to 1 (0: at 1 from the start)")
    weight_decay: float = _field(0.1, "AdamW weight decay on matrices (never norms, biases, lambda parameters)")
    beta1: float = _field(0.9, "AdamW beta1")
    beta2: float = _field(0.95, "AdamW beta2")
    eps: float = _field(1e-8, "AdamW epsilon")
    grad_clip: float = _field(1.0, "max global gradient norm (0 disables clipping)")
    eval_every: int = _field(100, "steps between validation evaluations (the last step is always evaluated)")
    eval_batches: int = _field(8, "validation batches (of train.batch_size windows) per evaluation")
    seed: int = _field(0, "seed of model init and batch sampling")
    device: str = _field("auto", '"auto" (cuda if available, else cpu), "cpu", "cuda" or "cuda:N"')
    precision: Precision = _field("auto", '"auto" (bf16 autocast on CUDA with bf16, else float32), "float32" or '
                                          '"bfloat16"')
    compile: bool = _field(False, "torch.compile the model (true/false)")
    parallel: Parallel = _field("ddp", 'under torchrun: "ddp" or "fsdp" (FSDP2 fully_shard)')
    init_from: str = _field("", "start from this model's weights (set by train --init-from: one of our model or run "
                                "directories, or a Hugging Face Llama/DiffLlama directory)")
    lora_rank: int = _field(0, "LoRA (with --init-from): rank of the low-rank adapters trained on the frozen source "
                               "model; only the adapters train, the checkpoints hold the merged model and RUN/adapter "
                               "the adapters in PEFT's format (0 = off: every weight trains)")
    lora_alpha: float = _field(8.0, "LoRA: the adapters' update is scaled by lora_alpha / lora_rank")
    lora_targets: list[str] = _field(list(DEFAULT_TARGETS), "LoRA: the linear layers adapted, a list of names from "
                                     f"{', '.join(LORA_TARGETS)} (wq..wo attention, wlambda DIFF V2's lambda, "
                                     "w1..w3 the SwiGLU, output the head), e.g. '[\"wq\", \"wv\"]'; default "
                                     "the attention projections")
    lora_dropout: float = _field(0.0, "LoRA: dropout on the adapters' input, in [0, 1)")
    lora_base: str = _field("", "LoRA: the base model RUN/adapter's adapter_config.json names, for peft's "
                                "AutoPeftModelForCausalLM: a model hub name or a directory holding the source as "
                                "transformers remote code; empty: the run writes that export itself, once, as "
                                "RUN/adapter_base, and names it")


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = _field(500, "steps between checkpoints (the last step is always saved)")
    keep_last: int = _field(3, "number of newest checkpoints kept")


@dataclass(frozen=True)
class LogConfig:
    every: int = _field(10, "steps between metric records (the run's metrics file and TensorBoard)")
    tensorboard: bool = _field(True, "also write TensorBoard events into the run directory (true/false)")
    progress: bool = _field(True, "show the tqdm progress bar (true/false)")


SECTIONS: dict[str, type] = {"data": DataConfig, "train": OptimConfig, "checkpoint": CheckpointConfig,
                             "log": LogConfig}


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        self.validate()

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), **{s: dataclasses.asdict(getattr(self, s)) for s in SECTIONS}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        unknown = sorted(set(data) - {"model", *SECTIONS})
        if unknown:
            raise ValueError(f"unknown config section(s) [{'], ['.join(unknown)}]; allowed: model, "
                             f"{', '.join(SECTIONS)}")
        model = dict(data.get("model", {}))
        data_sec = data.get("data", {})
        vocab = data_sec.get("vocab_size", DataConfig.vocab_size) if isinstance(data_sec, dict) else None
        if "vocab_size" in model and model["vocab_size"] != vocab:
            raise ValueError(f"model.vocab_size={model['vocab_size']} differs from data.vocab_size={vocab}; "
                             "set only data.vocab_size (the tokenizer's size is the model's)")
        model["vocab_size"] = vocab
        sections = {s: _section(s, typ, data.get(s, {})) for s, typ in SECTIONS.items()}
        return cls(model=ModelConfig.from_dict(model), **sections)

    def validate(self) -> None:
        d, t, c, lg = self.data, self.train, self.checkpoint, self.log
        # inf and nan pass every comparison below the wrong way (nan < 0 is False): refuse them first, by name
        for section in SECTIONS:
            for f in fields(SECTIONS[section]):
                v = getattr(self, section).__dict__[f.name]
                if isinstance(v, float) and not math.isfinite(v):
                    raise ValueError(f"{section}.{f.name}={v} must be a finite number")
        if self.model.vocab_size != d.vocab_size:
            raise ValueError(f"model.vocab_size={self.model.vocab_size} must equal data.vocab_size={d.vocab_size}")
        if not 260 <= d.vocab_size <= MAX_VOCAB:
            raise ValueError(f"data.vocab_size={d.vocab_size} must be in [260, {MAX_VOCAB}] (256 bytes + special "
                             "tokens at least)")
        if d.seq_len < 2 or d.seq_len > self.model.max_seq_len:
            raise ValueError(f"data.seq_len={d.seq_len} must be in [2, model.max_seq_len={self.model.max_seq_len}]")
        if not d.sources:
            raise ValueError("data.sources is empty; give \"kjv\" or paths to .txt/.jsonl files or folders")
        if not 0.0 < d.val_fraction < 0.5:
            raise ValueError(f"data.val_fraction={d.val_fraction} must be in (0, 0.5)")
        if not 0.0 <= d.retrieval_share < 1.0:
            raise ValueError(f"data.retrieval_share={d.retrieval_share} must be in [0, 1)")
        for name in ("steps", "batch_size", "micro_batch_size", "eval_every", "eval_batches"):
            _positive(f"train.{name}", getattr(t, name))
        if t.batch_size % t.micro_batch_size:
            raise ValueError(f"train.batch_size={t.batch_size} must be a multiple of "
                             f"train.micro_batch_size={t.micro_batch_size} (the one-process run)")
        checks = [("warmup_steps", t.warmup_steps >= 0, ">= 0"),
                  ("v1_negative_warmup", not isinstance(t.v1_negative_warmup, bool) and t.v1_negative_warmup >= 0,
                   ">= 0"), ("lr", t.lr > 0, "> 0"),
                  ("min_lr", 0 <= t.min_lr <= t.lr, "in [0, train.lr]"), ("grad_clip", t.grad_clip >= 0, ">= 0"),
                  ("weight_decay", t.weight_decay >= 0, ">= 0"), ("beta1", 0 <= t.beta1 < 1, "in [0, 1)"),
                  ("beta2", 0 <= t.beta2 < 1, "in [0, 1)"), ("eps", t.eps > 0, "> 0"),
                  ("seed", t.seed >= 0, ">= 0"),
                  ("lora_rank", not isinstance(t.lora_rank, bool) and t.lora_rank >= 0, ">= 0 (0 = off)"),
                  ("lora_alpha", t.lora_alpha > 0, "> 0"), ("lora_dropout", 0 <= t.lora_dropout < 1, "in [0, 1)")]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"train.{name}={getattr(t, name)!r} must be {allowed}")
        _check_lora_targets(t.lora_targets)
        _check_lora_base(t.lora_base)
        if d.seed < 0 or d.max_chars < 0:
            raise ValueError(f"data.seed={d.seed} and data.max_chars={d.max_chars} must be >= 0")
        # checked even when retrieval_share is 0: a value that only fails once the option is switched on is a trap
        for name in ("retrieval_n_needles", "retrieval_n_queries", "retrieval_digits"):
            _positive(f"data.{name}", getattr(d, name))
        if d.retrieval_n_needles > len(CITIES):
            raise ValueError(f"data.retrieval_n_needles={d.retrieval_n_needles} must be <= {len(CITIES)} (the cities "
                             "available)")
        if d.retrieval_n_filler < 0:
            raise ValueError(f"data.retrieval_n_filler={d.retrieval_n_filler} must be >= 0")
        if not DEVICE_RE.fullmatch(t.device):
            raise ValueError(f"train.device={t.device!r} is not a device; use auto, cpu, cuda or cuda:N")
        _positive("checkpoint.every", c.every)
        _positive("checkpoint.keep_last", c.keep_last)
        _positive("log.every", lg.every)

    def batch_plan(self, world_size: int) -> tuple[int, int]:
        """(micro-batch per rank, accumulation micro-steps) for ``world_size`` processes. The global batch stays
        ``train.batch_size``, as one process defines it: each rank takes batch / world_size sequences per step, in
        micro-batches of the largest size that divides that share and is at most ``train.micro_batch_size``, so a
        preset runs unchanged on any number of processes that divides its batch (and trains as one process does, up
        to the order of float sums). Refuses only a batch the processes cannot share evenly."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        B, cap = self.train.batch_size, self.train.micro_batch_size
        if B % world_size:
            raise ValueError(f"train.batch_size={B} cannot be shared by {world_size} processes: give a global batch "
                             f"that {world_size} divides (--train.batch_size), or run on a number of processes that "
                             f"divides {B}")
        share = B // world_size
        micro = max(m for m in range(1, min(cap, share) + 1) if share % m == 0)
        return micro, share // micro

    def accumulation(self, world_size: int) -> int:
        """Micro-steps per optimizer step on each rank (``batch_plan``)."""
        return self.batch_plan(world_size)[1]


def _check_lora_targets(targets: list[str]) -> None:
    """Checked even with LoRA off (a value that fails only once the option is on is a trap); whether this model
    has each layer is ``lora.check_lora``'s to say, once the model is known."""
    bad = [x for x in targets if x not in LORA_TARGETS]
    if bad or not targets or len(set(targets)) != len(targets):
        why = (f"{bad[0]!r} is not a linear layer's name" if bad else
               "it is empty" if not targets else "it repeats a name")
        raise ValueError(f"train.lora_targets={targets!r}: {why}; choose from {', '.join(LORA_TARGETS)}")


def _check_lora_base(base: str) -> None:
    """A name peft can pass to ``from_pretrained``: one line of UTF-8 text, no surrounding blanks (checked even with
    LoRA off, as the targets are)."""
    check_text(base, "train.lora_base")
    if base != base.strip() or any(c in base for c in "\n\r\t\0"):
        raise ValueError(f"train.lora_base={base!r} must be a model hub name or a directory path, without blanks "
                         "around it or control characters")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _section(name: str, typ: type, values: Any):
    if not isinstance(values, dict):
        raise ValueError(f"[{name}] must be a table of key = value, got {values!r}")
    known = {f.name: f for f in fields(typ)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) in [{name}]: {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    for key, v in values.items():
        _check_type(f"{name}.{key}", known[key].type, v)
    return typ(**values)


def _check_type(name: str, annotation: object, value: Any) -> None:
    """Type check against the (string: postponed evaluation) annotation: TOML gives int/float/bool/str/list."""
    ann = str(annotation).replace(" ", "")
    ok = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "bool": lambda v: isinstance(v, bool),
          "str": lambda v: isinstance(v, str),
          "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)}
    literal = {"Precision": get_args(Precision), "Parallel": get_args(Parallel)}
    if ann in literal:
        if value not in literal[ann]:
            raise ValueError(f"{name}={value!r} is not allowed; choose one of {', '.join(literal[ann])}")
    elif ann in ok and not ok[ann](value):
        raise ValueError(f"{name} must be {ann}, got {value!r}")


# ---------------------------------------------------------------------------------------------- loading
def resolve_config_path(name_or_path: str) -> Path:
    """A preset name (``tiny``, ``demo``, ...) or a path to a TOML file. A bare name (no path separator, no
    ``.toml`` suffix) is always a preset, even when a file or folder of that name sits in the working directory
    (``demo --out demo`` used to make ``--config demo`` fail)."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or "/" in name_or_path or (os.sep in name_or_path):
        if not p.is_file():
            raise FileNotFoundError(f"--config {name_or_path}: no such file")
        return p
    preset = PRESETS_DIR / f"{name_or_path}.toml"
    if not preset.is_file():
        raise FileNotFoundError(f"--config {name_or_path}: neither a file nor a preset; presets: "
                                f"{', '.join(list_presets())}")
    return preset


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word: a string (e.g. --model.attention diff_v2)


def load_config(name_or_path: str, overrides: Optional[dict[str, dict[str, Any]]] = None) -> TrainConfig:
    """A preset or TOML file with overrides ``{"train": {"lr": 3e-4}}``."""
    path = resolve_config_path(name_or_path)
    try:
        data = tomllib.loads(read_text(path, "--config"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--config {path}: not valid TOML: {e}") from None
    if overrides is not None and not isinstance(overrides, dict):
        raise TypeError(f"load_config: overrides must be a dict {{section: {{key: value}}}}, got "
                        f"{type(overrides).__name__}")
    for section, values in (overrides or {}).items():
        if section not in ("model", *SECTIONS):
            raise ValueError(f"unknown config section in override --{section}.*; allowed: model, "
                             f"{', '.join(SECTIONS)}")
        data.setdefault(section, {}).update(values)
    return TrainConfig.from_dict(data)


def merge(cfg: TrainConfig, changes: dict[str, dict[str, Any]]) -> TrainConfig:
    """A copy of ``cfg`` with ``{section: {key: value}}`` changes applied (validated)."""
    d = cfg.to_dict()
    for section, values in changes.items():
        d.setdefault(section, {}).update(values)
    d["model"].pop("vocab_size", None)
    return TrainConfig.from_dict(d)


def override_keys() -> list[tuple[str, str]]:
    """Every (flag, help) pair: ``model.*`` (ModelConfig fields, vocab_size excepted) and the other sections."""
    out = [(f"model.{f.name}", f"ModelConfig.{f.name} (see difftransformer.model.config)")
           for f in fields(ModelConfig) if f.name != "vocab_size"]
    for section, typ in SECTIONS.items():
        out.extend((f"{section}.{f.name}", f.metadata["help"]) for f in fields(typ))
    return out
