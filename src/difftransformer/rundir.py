"""The training run directory: the one module that names its files and reads them back.

A run directory holds

* ``run_config.json``: the full ``TrainConfig`` of the run;
* ``tokenizer.json``: the run's tokenizer (also inside every checkpoint);
* ``data/``: the prepared memmap shards (``data.shards``);
* ``metrics.jsonl``: one JSON object per line (``MetricsRecord``), appended as training goes;
* ``tb/``: TensorBoard event files;
* ``checkpoints/step_XXXXXXXX/``: one model directory per checkpoint (``model.pretrained`` format: config,
  weights, tokenizer, manifest) plus the training state to resume (``training_state.*``, ``train.checkpoint``);
* ``run.lock``: the writer's lock (``lock_run``), holding the PID of the process that holds it.

Every file but metrics.jsonl is replaced atomically (``fileio.atomic_write``); metrics.jsonl is only appended to.

It sits above ``model`` and ``data`` (it may import them, never the reverse) and below ``train``, ``eval``,
``inference`` and ``interop``, which all find a run's files through it.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal, Optional, TypedDict, Union

from tokenizers import Tokenizer

from .data.tokenizer import EOS, load_tokenizer
from .fileio import FAULT_ENV, atomic_write, fault_point, parse_json
from .model.attention import ATTENTION_REGISTRY, DiffV1Attention, DiffV2Attention
from .model.pretrained import (CONFIG_NAME, MANIFEST_NAME, TOKENIZER_NAME, WEIGHTS_NAME, is_model_dir,
                               temp_prefix, verify_manifest)

PathLike = Union[str, Path]

RUN_CONFIG_NAME = "run_config.json"
METRICS_NAME = "metrics.jsonl"
DATA_DIR = "data"
TENSORBOARD_DIR = "tb"
CHECKPOINTS_DIR = "checkpoints"
STEP_PREFIX = "step_"
# Beside the model files of each checkpoint: what resuming needs (written and read by ``train.checkpoint``).
STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"
LOCK_NAME = "run.lock"
# A metrics record a resumed run appends first: readers drop the records logged past this step before it (what a
# killed run wrote after its last checkpoint), so the file is never rewritten.
RESUMED_KEY = "resumed_from_step"

__all__ = ["RUN_CONFIG_NAME", "METRICS_NAME", "DATA_DIR", "TENSORBOARD_DIR", "CHECKPOINTS_DIR", "TOKENIZER_NAME",
           "STATE_TENSORS", "STATE_JSON", "LOCK_NAME", "RESUMED_KEY", "RunLocked", "lock_run",
           "CONFIG_NAME", "WEIGHTS_NAME", "MANIFEST_NAME", "LAMBDA_V1", "LAMBDA_V2", "LAMBDA_KEYS",
           "MetricsRecord", "MetricsCurves", "run_config_path", "tokenizer_path", "data_dir", "metrics_path",
           "tensorboard_dir", "checkpoints_dir", "step_dir", "is_run_dir", "dir_kind", "list_checkpoints",
           "leftover_temp_checkpoints", "newest_complete_checkpoint", "resolve_checkpoint", "run_of_checkpoint",
           "read_run_config", "write_run_config", "parse_metrics", "read_metric_records", "append_metrics",
           "truncate_metrics_after", "read_metrics", "find_tokenizer", "check_tokenizer", "read_tokenizer"]


# ---------------------------------------------------------------------------------------------- paths
def run_config_path(run_dir: PathLike) -> Path:
    return Path(run_dir) / RUN_CONFIG_NAME


def tokenizer_path(run_dir: PathLike) -> Path:
    return Path(run_dir) / TOKENIZER_NAME


def data_dir(run_dir: PathLike) -> Path:
    return Path(run_dir) / DATA_DIR


def metrics_path(run_dir: PathLike) -> Path:
    return Path(run_dir) / METRICS_NAME


def tensorboard_dir(run_dir: PathLike) -> Path:
    return Path(run_dir) / TENSORBOARD_DIR


def checkpoints_dir(run_dir: PathLike) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def step_dir(run_dir: PathLike, step: int) -> Path:
    """``RUN_DIR/checkpoints/step_XXXXXXXX``: zero-padded so names sort as steps do."""
    return checkpoints_dir(run_dir) / f"{STEP_PREFIX}{step:08d}"


# ---------------------------------------------------------------------------------------------- kinds
DirKind = Literal["run", "model", "hf"]


def is_run_dir(path: PathLike) -> bool:
    """A training run: it has its run_config.json or a checkpoints/ folder."""
    p = Path(path)
    return run_config_path(p).is_file() or checkpoints_dir(p).is_dir()


def dir_kind(path: PathLike) -> Optional[DirKind]:
    """"run", "model" (ours: config.json naming an ``attention``), "hf" (a config.json naming a
    ``model_type``), or None for anything else (missing, a file, an unrelated folder)."""
    p = Path(path)
    if not p.is_dir():
        return None
    if is_run_dir(p):
        return "run"
    if is_model_dir(p):
        return "model"
    try:
        cfg = parse_json((p / CONFIG_NAME).read_text(), p / CONFIG_NAME)
    except (OSError, ValueError):
        return None
    return "hf" if isinstance(cfg, dict) and "model_type" in cfg else None


# ---------------------------------------------------------------------------------------------- the lock
class RunLocked(FileExistsError):
    """Another live process is writing the run directory."""


@contextmanager
def lock_run(run_dir: PathLike) -> Iterator[Path]:
    """Hold the run directory's writer lock (creating the directory) for the ``with`` block.

    ``flock`` on ``run.lock``: the kernel drops it when the holder exits, however it dies, so a killed run never
    blocks its resume. A second writer is refused at once with the holder's PID. Readers take no lock.
    """
    d = Path(run_dir)
    created = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    path = d / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    failed = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RunLocked(f"{d} is being written by another process (PID {holder}, holding {path}); wait for "
                            "it to finish or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield path
        except BaseException:
            failed = True
            raise
    finally:
        if failed and created and [p.name for p in d.iterdir()] == [LOCK_NAME]:
            path.unlink()  # a run refused before writing anything leaves no directory behind
            d.rmdir()
        os.close(fd)  # releases the lock


# ---------------------------------------------------------------------------------------------- checkpoints
def list_checkpoints(run_dir: PathLike) -> list[Path]:
    """Checkpoint directories of a run, oldest first (by step number in the name)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    n = len(STEP_PREFIX)
    steps = [(int(p.name[n:]), p) for p in root.iterdir()
             if p.is_dir() and p.name.startswith(STEP_PREFIX) and p.name[n:].isdigit()]
    return [p for _, p in sorted(steps)]


def leftover_temp_checkpoints(run_dir: PathLike) -> list[Path]:
    """Half-written checkpoint directories a killed run left behind (``model.pretrained.atomic_directory``)."""
    root = checkpoints_dir(run_dir)
    return sorted(root.glob(temp_prefix(f"{STEP_PREFIX}*") + "*")) if root.is_dir() else []


def newest_complete_checkpoint(run_dir: PathLike, check_hashes: bool = True, warn=None) -> Path:
    """The newest checkpoint whose manifest verifies; ``warn(line)`` hears of each newer broken one."""
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise FileNotFoundError(f"{run_dir} holds no checkpoint under {CHECKPOINTS_DIR}/")
    problems = []
    for c in reversed(ckpts):
        why = verify_manifest(c, check_hashes)
        if why is None:
            return c
        problems.append(why)
        if warn is not None:
            warn(f"skipping checkpoint {c.name}: {why}")
    raise FileNotFoundError(f"no complete checkpoint in {checkpoints_dir(run_dir)}: " + "; ".join(problems))


def _stderr(line: str) -> None:
    print(f"difftransformer: warning: {line}", file=sys.stderr, flush=True)


def resolve_checkpoint(path: PathLike, check_hashes: bool = True,
                       warn: Optional[Callable[[str], None]] = _stderr) -> Path:
    """A model directory for ``path``: itself if it holds weights, else the newest complete checkpoint of a run.

    A run's broken newer checkpoints are skipped; ``warn`` (stderr by default) hears one line naming them and
    the checkpoint used instead. A model directory given directly is checked when its weights are read."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist")
    if not p.is_dir():
        raise NotADirectoryError(f"{p} is not a directory (expected a run or model directory)")
    if (p / WEIGHTS_NAME).is_file():
        return p
    if not list_checkpoints(p):
        raise FileNotFoundError(f"{p} holds neither {WEIGHTS_NAME} nor any checkpoint under {CHECKPOINTS_DIR}/")
    skipped: list[str] = []
    found = newest_complete_checkpoint(p, check_hashes, warn=skipped.append)
    if skipped and warn is not None:
        warn(f"{'; '.join(skipped)}; using {found} instead")
    return found


def run_of_checkpoint(checkpoint: PathLike) -> Optional[Path]:
    """The run directory holding ``checkpoint`` (``RUN/checkpoints/step_*``), or None for a bare model directory."""
    c = Path(checkpoint)
    if c.parent.name == CHECKPOINTS_DIR and c.name.startswith(STEP_PREFIX):
        return c.parent.parent
    return None


# ---------------------------------------------------------------------------------------------- run config
def read_run_config(run_dir: Optional[PathLike]) -> dict:
    """The run's configuration as saved (a plain dict), or {} when there is none (a bare model directory)."""
    if run_dir is None:
        return {}
    p = run_config_path(run_dir)
    if not p.is_file():
        return {}
    cfg = parse_json(p.read_text(), p)
    if not isinstance(cfg, dict):
        raise ValueError(f"{p} must hold a JSON object")
    return cfg


def write_run_config(run_dir: PathLike, config_json: str) -> None:
    """Save the run's configuration (``TrainConfig.to_json()``), atomically."""
    atomic_write(run_config_path(run_dir), config_json.rstrip("\n") + "\n")


# ---------------------------------------------------------------------------------------------- metrics
# The per-layer lambda of each DIFF variant, logged with each evaluation: V1's learned scalar of eq. (2), V2's
# mean sigmoid(lambda) over batch, heads and tokens. Each variant names its key (``lambda_summary_name``); the
# trainer writes under it and every reader takes it from here.
LAMBDA_V1: str = DiffV1Attention.lambda_summary_name
LAMBDA_V2: str = DiffV2Attention.lambda_summary_name
LAMBDA_KEYS = tuple(c.lambda_summary_name for c in ATTENTION_REGISTRY.values() if c.lambda_summary_name)


# One line of metrics.jsonl: a training record (step, loss, lr, grad_norm, tokens, tokens_per_s, skipped_steps: the
# steps so far in this process whose loss or gradient was not finite and made no update) or an evaluation
# record (step, val_loss and the variant's lambda per layer). Functional form: the lambda keys are computed.
MetricsRecord = TypedDict("MetricsRecord", {
    "step": int, "loss": float, "lr": float, "grad_norm": float, "tokens": int, "tokens_per_s": float,
    "skipped_steps": int,
    "val_loss": float, **{k: list for k in LAMBDA_KEYS}}, total=False)


def parse_metrics(lines: Iterable[str]) -> list[MetricsRecord]:
    """Records of metrics.jsonl lines as one run: a line cut by a kill (or blank) is skipped, and a resume marker
    drops the records logged before it past its step (the killed run's tail, logged again after the resume)."""
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(rec, dict):
            continue
        if RESUMED_KEY in rec:
            at = rec[RESUMED_KEY]
            out = [r for r in out if not isinstance(r.get("step"), (int, float)) or r["step"] <= at]
        else:
            out.append(rec)
    return out


def read_metric_records(run_dir: Optional[PathLike]) -> list[MetricsRecord]:
    """Every readable record of the run's metrics.jsonl, in order ([] without one)."""
    p = metrics_path(run_dir) if run_dir is not None else None
    if p is None or not p.is_file():
        return []
    return parse_metrics(p.read_text().splitlines())


def append_metrics(run_dir: PathLike, record: dict) -> None:
    line = json.dumps(record) + "\n"
    with open(metrics_path(run_dir), "a") as f:
        if os.environ.get(FAULT_ENV):  # the tests' kill lands inside the line: cut it in two
            f.write(line[:len(line) // 2])
            f.flush()
            fault_point(metrics_path(run_dir))
            f.write(line[len(line) // 2:])
        else:
            f.write(line)


def truncate_metrics_after(run_dir: PathLike, step: int) -> None:
    """Make a resumed run's metrics read as one run without rewriting the file: cut away only a last line a
    kill left unfinished (no newline), then append a resume marker (``RESUMED_KEY``) telling readers to drop
    the records past ``step`` logged before it."""
    p = metrics_path(run_dir)
    if not p.is_file():
        return
    with open(p, "rb+") as f:
        end = pos = f.seek(0, os.SEEK_END)
        while pos > 0:  # back from the end to the last newline: the file may be long, a line is short
            pos = max(0, pos - 4096)
            f.seek(pos)
            nl = f.read(end - pos).rfind(b"\n")
            if nl >= 0:
                pos += nl + 1
                break
        if pos < end:
            f.truncate(pos)  # the cut line only; 0 when it was the only line
    append_metrics(run_dir, {RESUMED_KEY: step})


# The training curves of one run, as the report and the demo table read them ("lambda" is a keyword, hence the
# functional form). grad_norm is nan where a record has none; "lambda" is the last evaluation's
# {"name": LAMBDA_V1 or LAMBDA_V2, "step": int, "values": [per layer]}, or {} for the baseline.
MetricsCurves = TypedDict("MetricsCurves", {
    "step": list, "loss": list, "grad_norm": list, "tokens_per_s": list, "val_step": list, "val_loss": list,
    "lambda": dict})


def read_metrics(run_dir: Optional[PathLike]) -> MetricsCurves:
    """The run's curves (``MetricsCurves`` keys, with the lambda under "lambda"); empty lists when the run has
    no metrics.jsonl or ``run_dir`` is None (a bare model directory)."""
    out: MetricsCurves = {"step": [], "loss": [], "grad_norm": [], "tokens_per_s": [], "val_step": [], "val_loss": [],
                 "lambda": {}}
    for rec in read_metric_records(run_dir):
        if "loss" in rec:
            out["step"].append(rec["step"])
            out["loss"].append(rec["loss"])
            out["grad_norm"].append(rec.get("grad_norm", math.nan))
        if "tokens_per_s" in rec:
            out["tokens_per_s"].append(rec["tokens_per_s"])
        if "val_loss" in rec:
            out["val_step"].append(rec["step"])
            out["val_loss"].append(rec["val_loss"])
            for k in LAMBDA_KEYS:
                if k in rec:
                    out["lambda"] = {"name": k, "step": rec["step"], "values": rec[k]}
    return out


# ---------------------------------------------------------------------------------------------- tokenizer
def find_tokenizer(model_dir: PathLike, run_dir: Optional[PathLike] = None) -> Path:
    """tokenizer.json of the model directory, else of the run; FileNotFoundError naming where it looked."""
    candidates = [Path(model_dir) / TOKENIZER_NAME] + ([tokenizer_path(run_dir)] if run_dir is not None else [])
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError(f"no {TOKENIZER_NAME} in {' or '.join(str(c.parent) for c in candidates)}")


def check_tokenizer(tok: Tokenizer, vocab_size: int, where: PathLike, require_eos: bool = True) -> None:
    """Refuse a tokenizer whose ids the model cannot embed, or (``require_eos``) that lacks the document
    separator; generation can do without it (it then never stops early), the analyses cannot."""
    n = tok.get_vocab_size()
    if n > vocab_size:
        raise ValueError(f"{where}: {TOKENIZER_NAME} has {n} tokens but the model's vocab_size is {vocab_size}; "
                         "the tokenizer does not belong to this model")
    eos = tok.token_to_id(EOS)
    if require_eos and (eos is None or eos >= vocab_size):
        raise ValueError(f"{where}: {TOKENIZER_NAME} has no {EOS} token inside the model's vocabulary; "
                         "the tokenizer does not belong to this model")


def read_tokenizer(path: PathLike, vocab_size: int, where: Optional[PathLike] = None,
                   require_eos: bool = True) -> Tokenizer:
    """Load ``path`` and check it fits a model of ``vocab_size`` (``where`` names the source in errors)."""
    tok = load_tokenizer(path)
    check_tokenizer(tok, vocab_size, where if where is not None else path, require_eos)
    return tok
