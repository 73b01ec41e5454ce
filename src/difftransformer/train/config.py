"""`TrainConfig`: the whole training run as typed sections that reject unknown keys.

A run is described by a TOML file (a preset in ``configs/`` or the user's own) with the sections ``[model]``
(``ModelConfig`` fields), ``[data]``, ``[train]``, ``[checkpoint]`` and ``[log]``, then command-line overrides
``--section.key value`` (values parsed as TOML, so ``--train.lr 3e-4``, ``--data.sources '["a.txt"]'`` and
``--model.attention diff_v2`` all work). A typo in a key is an error, never a silent default.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Optional, get_args, get_origin

from ..model.config import ModelConfig

# Repo-root `configs/` is a link to this folder, so presets work from a checkout and from an installed package.
PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"

Precision = Literal["auto", "float32", "bfloat16"]
Parallel = Literal["ddp", "fsdp"]


@dataclass
class DataConfig:
    sources: list[str] = field(default_factory=lambda: ["kjv"])  # "kjv" = the embedded corpus, or .txt/.jsonl paths
    vocab_size: int = 8192  # byte-level BPE vocabulary (also the model's vocab_size)
    seq_len: int = 256  # training window; must not exceed model.max_seq_len
    val_fraction: float = 0.02  # share of documents held out, spread evenly through the corpus
    max_chars: int = 0  # >0: use only the first max_chars characters of the corpus (tests, quick demos)
    # Retrieval mixing (issue 5): this fraction of the training text is synthetic multi-needle documents
    # (`data.synthetic.retrieval_documents`) whose filler sentences come from the corpus.
    retrieval_share: float = 0.0
    retrieval_n_needles: int = 4
    retrieval_n_queries: int = 2
    retrieval_n_filler: int = 8
    retrieval_digits: int = 3
    seed: int = 1234  # document shuffle and retrieval documents
    prepared_dir: str = ""  # a folder of already prepared shards to share (hard-linked into RUN_DIR/data)


@dataclass
class OptimConfig:
    steps: int = 1000  # optimizer steps
    batch_size: int = 16  # global batch in sequences (all ranks, all accumulation micro-steps)
    micro_batch_size: int = 16  # sequences per rank per forward; accumulation = batch / (micro * world)
    lr: float = 1e-3
    min_lr: float = 1e-4  # end of the cosine
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0  # model init and batch sampling
    device: str = "auto"  # auto = cuda if available, else cpu
    precision: Precision = "auto"  # auto = bf16 autocast where supported (CUDA), else float32
    compile: bool = False  # torch.compile the model
    parallel: Parallel = "ddp"  # under torchrun: DDP, or FSDP2 (fully_shard)


@dataclass
class CheckpointConfig:
    every: int = 500  # steps between checkpoints (the final step is always saved)
    keep_last: int = 3


@dataclass
class LogConfig:
    every: int = 10  # steps between metric lines
    tensorboard: bool = True
    progress: bool = True  # tqdm bar


SECTIONS: dict[str, type] = {"data": DataConfig, "train": OptimConfig, "checkpoint": CheckpointConfig,
                             "log": LogConfig}


@dataclass
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
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
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
        if self.model.vocab_size != d.vocab_size:
            raise ValueError(f"model.vocab_size={self.model.vocab_size} must equal data.vocab_size={d.vocab_size}")
        if d.vocab_size < 260 or d.vocab_size > 2**32 - 1:
            raise ValueError(f"data.vocab_size={d.vocab_size} must be in [260, 2^32) (256 bytes + special tokens)")
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
                             f"train.micro_batch_size={t.micro_batch_size} (times the number of processes)")
        if t.warmup_steps < 0 or t.lr <= 0 or t.min_lr < 0 or t.min_lr > t.lr or t.grad_clip < 0:
            raise ValueError("train: need warmup_steps >= 0, lr > 0, 0 <= min_lr <= lr and grad_clip >= 0")
        if t.weight_decay < 0 or not (0 <= t.beta1 < 1 and 0 <= t.beta2 < 1):
            raise ValueError("train: need weight_decay >= 0 and beta1, beta2 in [0, 1)")
        _positive("checkpoint.every", c.every)
        _positive("checkpoint.keep_last", c.keep_last)
        _positive("log.every", lg.every)

    def accumulation(self, world_size: int) -> int:
        """Micro-steps per optimizer step on each rank; refuses a global batch the ranks cannot split evenly."""
        per_step = self.train.micro_batch_size * world_size
        if self.train.batch_size % per_step:
            raise ValueError(f"train.batch_size={self.train.batch_size} is not a multiple of train.micro_batch_size"
                             f"={self.train.micro_batch_size} x {world_size} process(es)")
        return self.train.batch_size // per_step


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


def _check_type(name: str, annotation: str, value: Any) -> None:
    """Type check against the (string) annotation: TOML gives int/float/bool/str/list, nothing else."""
    ann = annotation.replace(" ", "")
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
    """A preset name (``tiny``, ``demo``, ...) or a path to a TOML file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
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


def parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["--train.lr", "3e-4", "--data.sources=[\"a.txt\"]"]`` -> ``{"train": {"lr": 0.0003}, ...}``."""
    out: dict[str, dict[str, Any]] = {}
    i = 0
    while i < len(items):
        item = items[i]
        if not item.startswith("--") or "." not in item.split("=", 1)[0]:
            raise ValueError(f"unexpected argument {item!r}; overrides look like --section.key value")
        if "=" in item:
            key, raw = item[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(items):
                raise ValueError(f"override {item} needs a value")
            key, raw = item[2:], items[i + 1]
            i += 2
        section, _, name = key.partition(".")
        out.setdefault(section, {})[name] = parse_value(raw)
    return out


def parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word: a string (e.g. --model.attention diff_v2)


def load_config(name_or_path: str, overrides=None) -> TrainConfig:
    """A preset or TOML file with overrides: ``["--train.lr", "3e-4"]`` or ``{"train": {"lr": 3e-4}}``."""
    path = resolve_config_path(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--config {path}: not valid TOML: {e}") from None
    if not isinstance(overrides, dict):
        overrides = parse_overrides(overrides or [])
    for section, values in overrides.items():
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


# One line per key, for `difftransformer train --help` (every key is also a --section.key flag).
FIELD_HELP: dict[str, str] = {
    "data.sources": 'list of corpora: "kjv" (embedded King James Bible) or .txt/.jsonl files or folders',
    "data.vocab_size": "byte-level BPE vocabulary size, also the model's vocab_size",
    "data.seq_len": "training/evaluation window in tokens (<= model.max_seq_len)",
    "data.val_fraction": "fraction of documents held out for validation, spread evenly",
    "data.max_chars": "use only the first N characters of the corpus (0 = all)",
    "data.retrieval_share": "fraction of the text made of synthetic multi-needle retrieval documents",
    "data.retrieval_n_needles": "needles per retrieval document",
    "data.retrieval_n_queries": "questions per retrieval document",
    "data.retrieval_n_filler": "corpus filler sentences per retrieval document",
    "data.retrieval_digits": "digits of each pass number",
    "data.seed": "seed of the retrieval documents",
    "data.prepared_dir": "folder where shards are prepared once and shared (hard-linked into RUN_DIR/data)",
    "train.steps": "optimizer steps",
    "train.batch_size": "global batch in sequences (all ranks and accumulation micro-steps)",
    "train.micro_batch_size": "sequences per rank per forward pass (accumulation = batch / (micro x ranks))",
    "train.lr": "peak learning rate",
    "train.min_lr": "learning rate at the end of the cosine",
    "train.warmup_steps": "linear warmup steps",
    "train.weight_decay": "AdamW weight decay on matrices (never norms, biases, V1 lambda vectors)",
    "train.beta1": "AdamW beta1",
    "train.beta2": "AdamW beta2",
    "train.eps": "AdamW epsilon",
    "train.grad_clip": "max global gradient norm (0 disables clipping)",
    "train.eval_every": "steps between validation evaluations (the last step is always evaluated)",
    "train.eval_batches": "validation batches (of train.batch_size windows) per evaluation",
    "train.seed": "seed of model init and batch sampling",
    "train.device": '"auto" (cuda if available, else cpu), "cpu", "cuda" or "cuda:N"',
    "train.precision": '"auto" (bf16 autocast on CUDA with bf16, else float32), "float32" or "bfloat16"',
    "train.compile": "torch.compile the model (true/false)",
    "train.parallel": 'under torchrun: "ddp" or "fsdp" (FSDP2 fully_shard)',
    "checkpoint.every": "steps between checkpoints (the last step is always saved)",
    "checkpoint.keep_last": "number of newest checkpoints kept",
    "log.every": "steps between metric records in metrics.jsonl / TensorBoard",
    "log.tensorboard": "also write TensorBoard events to RUN_DIR/tb (true/false)",
    "log.progress": "show the tqdm progress bar (true/false)",
}


def override_keys() -> list[tuple[str, str]]:
    """Every (flag, help) pair: ``model.*`` (ModelConfig fields, vocab_size excepted) and the other sections."""
    out = [(f"model.{f.name}", f"ModelConfig.{f.name} (see difftransformer.model.config)")
           for f in fields(ModelConfig) if f.name != "vocab_size"]
    for section, typ in SECTIONS.items():
        out.extend((f"{section}.{f.name}", FIELD_HELP[f"{section}.{f.name}"]) for f in fields(typ))
    return out
