"""Training checkpoints: a model directory (``model.pretrained`` format) plus the state to resume exactly.

``RUN_DIR/checkpoints/step_XXXXXXXX/`` holds ``config.json``, ``model.safetensors``, ``tokenizer.json`` and

* ``training_state.safetensors``: optimizer moments and step counts (keyed ``optim.<param name>.<key>``), the
  batch sampler's generator state and the torch RNG states;
* ``training_state.json``: the step, tokens seen, optimizer hyper-parameter groups, the sampler's draw count,
  Python's RNG state;

then ``manifest.json`` last. A LoRA run (``train.lora``) saves the merged weights as ``model.safetensors`` (the
checkpoint is the fine-tuned model for every reader) and its adapters, with the frozen weights of the layers they
adapt, in ``training_state.safetensors`` under ``lora.``, from which resuming rebuilds the unmerged model.

The directory is built under a temporary name and renamed (``write_model_dir``), so a SIGKILL mid-write leaves the
previous checkpoints intact. Where checkpoints live and which one is complete is
``rundir``'s to say. No pickle anywhere.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, cast

import torch
from safetensors.torch import save as save_tensors
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..interop.peft import write_run_adapter  # RUN/adapter in PEFT's format: the one import of interop here
from ..model.config import ModelConfig
from ..model.lora import adapters_of, lora_layers, settings, split_state, unmerged_state
from ..model.pretrained import CONFIG_NAME, WEIGHTS_NAME, load_state_dict, write_model_dir
from ..rundir import (
    STATE_JSON,
    STATE_TENSORS,
    leftover_temp_checkpoints,
    list_checkpoints,
    newest_complete_checkpoint,
    step_dir,
)

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class TrainingState:
    step: int
    tokens_seen: int
    sampler: dict  # WindowSampler.state_dict()


# ---------------------------------------------------------------------------------------------- writing
def _flatten_optimizer(osd: dict) -> tuple[dict[str, torch.Tensor], list[dict]]:
    tensors = {f"optim.{name}.{key}": v.detach().contiguous().cpu()
               for name, st in osd["state"].items() for key, v in st.items()}
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in osd["param_groups"]]
    return tensors, groups


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out.update({f"rng.cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return out


def save_checkpoint(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: ModelConfig,
                    state: TrainingState, tokenizer_file: Path, is_main: bool,
                    adapter_base: str = "") -> Optional[Path]:
    """Gather full weights and optimizer state (a collective under FSDP) and let rank 0 write them.

    A LoRA model's adapters also go to ``RUN/adapter`` (PEFT's format, with a model card;
    ``interop.peft.write_run_adapter``), just before the checkpoint: a kill between the two leaves the adapter of a
    step that the resumed run, exact, writes again bit for bit, never an adapter older than the newest checkpoint.
    ``adapter_base`` is the run's source (``train.init_from``); the first time, the frozen source is exported beside
    the adapter as its base (``RUN/adapter_base``) unless ``train.lora_base`` names one."""
    weights = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=FULL))  # full: plain tensors
    osd = get_optimizer_state_dict(model, optimizer, options=FULL)
    if not is_main:
        return None
    tensors, groups = _flatten_optimizer(osd)
    scalings = {name: m.scaling for name, m in lora_layers(model).items()}
    if scalings:  # LoRA: the merged model is the checkpoint's; adapters and the frozen weights go to the state
        full = weights
        weights, unmerged = split_state(weights, scalings)
        tensors.update(unmerged)
        write_run_adapter(run_dir, cfg, full, adapters_of(unmerged), *settings(model),
                          tokenizer_file=tokenizer_file, init_from=adapter_base, step=state.step,
                          tokens=state.tokens_seen)
    tensors.update(_rng_tensors())
    tensors["sampler.generator"] = state.sampler["generator"]
    meta = {"step": state.step, "tokens_seen": state.tokens_seen, "param_groups": groups,
            "sampler_batches_drawn": state.sampler["batches_drawn"], "python_rng": _python_rng_state()}
    extra = {STATE_TENSORS: save_tensors(tensors), STATE_JSON: (json.dumps(meta, indent=1) + "\n").encode()}
    return write_model_dir(step_dir(run_dir, state.step), cfg, weights, tokenizer_file=tokenizer_file,
                           extra_files=extra)


def _with_tied(weights: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    if cfg.tie_embeddings and "output.weight" not in weights:
        weights = {**weights, "output.weight": weights["tok_embeddings.weight"]}
    return weights


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` checkpoints, and temp dirs a killed run left behind."""
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    for tmp in leftover_temp_checkpoints(run_dir):
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- reading
def find_resumable(run_dir: Path, warn=print, check_hashes: bool = True) -> Path:
    """The newest checkpoint whose manifest verifies; each newer broken one is reported in one line."""
    try:
        return newest_complete_checkpoint(run_dir, check_hashes, warn=warn)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"--resume: {e}") from None


def check_same_model(ckpt: Path, cfg: ModelConfig) -> None:
    """Refuse to resume a run with a different model shape (the backend may differ: it is a runtime choice)."""
    saved = ModelConfig.from_json(ckpt / CONFIG_NAME).to_dict()
    want = cfg.to_dict()
    diff = sorted(k for k in want if k != "backend" and saved.get(k) != want[k])
    if diff:
        shown = ", ".join(f"{k}: {saved.get(k)!r} in the run vs {want[k]!r} now" for k in diff[:4])
        raise ValueError(f"--resume: the model config differs from the run's ({shown}); resume with the run's "
                         "config or choose another --out")


def checkpoint_step(ckpt: Path) -> int:
    return int(json.loads((ckpt / STATE_JSON).read_text())["step"])


def load_checkpoint(ckpt: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    cfg: ModelConfig) -> TrainingState:
    """Restore weights, optimizer, RNG states; return the step and sampler state to continue from."""
    # Any: torch's state-dict functions take the union of every value kind (DTensor, ...), and a dict is invariant
    weights: dict[str, Any] = _with_tied(load_state_dict(ckpt / WEIGHTS_NAME), cfg)
    tensors = load_state_dict(ckpt / STATE_TENSORS)
    weights.update(unmerged_state(tensors))  # LoRA: the frozen weights and the adapters, in place of the merged
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=True))
    meta = json.loads((ckpt / STATE_JSON).read_text())
    state: dict[str, Any] = {}
    for key, v in tensors.items():
        if key.startswith("optim."):
            name, _, field = key[len("optim."):].rpartition(".")
            state.setdefault(name, {})[field] = v
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups},
                             options=StateDictOptions(full_state_dict=True))
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    _set_python_rng_state(meta["python_rng"])
    return TrainingState(step=int(meta["step"]), tokens_seen=int(meta["tokens_seen"]),
                         sampler={"generator": tensors["sampler.generator"],
                                  "batches_drawn": meta["sampler_batches_drawn"]})


def _python_rng_state() -> list:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _set_python_rng_state(state: list) -> None:
    random.setstate((state[0], tuple(state[1]), state[2]))
