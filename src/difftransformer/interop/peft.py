"""LoRA adapters in PEFT's format: a LoRA run's ``RUN/adapter`` and its base, reading and writing them.

What a LoRA run (``model/lora.py``) writes beside its checkpoints (``train.checkpoint`` calls
``write_run_adapter``):

* ``RUN/adapter/`` (``adapter_config.json`` + ``adapter_model.safetensors`` + a model card, ``README.md``),
  rewritten atomically with every checkpoint (just before it): the newest checkpoint's adapters in PEFT's format
  (after a kill between the two, those of the next step, which the exact resume writes again bit for bit), under
  the module names of the remote-code model that ``convert --to-hf SOURCE --remote-code`` writes (``model.`` + our
  name, ``output`` as ``lm_head``);
* ``RUN/adapter_base/``, written once (atomically, with the first checkpoint): the remote-code export of the
  frozen source as the run holds it, which ``adapter_config.json``'s ``base_model_name_or_path`` names by its
  absolute path, so ``AutoPeftModelForCausalLM.from_pretrained(RUN/adapter, trust_remote_code=True)`` is the
  fine-tuned model. ``train.lora_base NAME`` names another base instead (a model hub name, or a directory) and
  the export is not written.

``load_adapter`` puts such an adapter back onto our own model, without peft; ``export_adapter`` writes any
checkpoint's. peft is not needed here: this module is torch, JSON and safetensors only.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ..fileio import read_json
from ..model.config import ModelConfig
from ..model.lora import LORA_A, LORA_B, STATE_PREFIX, adapters_of, apply_lora, lora_layers
from ..model.pretrained import atomic_directory, load_state_dict, temp_prefix
from ..model.transformer import DiffTransformerLM
from ..rundir import read_run_config, resolve_checkpoint
from ..rundir.files import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_WEIGHTS_NAME,
    CONFIG_NAME,
    MODEL_CARD_NAME,
    STATE_TENSORS,
    PathLike,
    adapter_base_dir,
    adapter_dir,
)
from . import model_card
from .remote_code import HEAD, PREFIX

PEFT_PREFIX = "base_model.model."  # PEFT's key prefix in adapter_model.safetensors
_HEAD = (HEAD[0].removesuffix(".weight"), HEAD[1].removesuffix(".weight"))  # ("output", "lm_head")


def remote_module(name: str) -> str:
    """Our module name -> the remote-code model's (``layers.0.attn.wq`` -> ``model.layers.0.attn.wq``,
    ``output`` -> ``lm_head``)."""
    return _HEAD[1] if name == _HEAD[0] else PREFIX + name


def our_module(name: str) -> str:
    """The inverse of ``remote_module``."""
    if name == _HEAD[1]:
        return _HEAD[0]
    if not name.startswith(PREFIX):
        raise ValueError(f"{name!r} is not a module of the remote-code model (model.* or lm_head)")
    return name[len(PREFIX):]


def adapter_config(rank: int, alpha: float, dropout: float, modules: Iterable[str], base: str = "") -> dict:
    """PEFT's ``adapter_config.json`` for adapters on ``modules`` (our names), plain LoRA (no rsLoRA/DoRA/bias)."""
    targets = sorted({remote_module(m).rpartition(".")[2] for m in modules})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base or None,
            "revision": None, "r": int(rank), "lora_alpha": float(alpha), "lora_dropout": float(dropout),
            "target_modules": targets,
            "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
            "use_rslora": False, "use_dora": False, "modules_to_save": None, "layers_to_transform": None,
            "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}}


def write_adapter(directory: PathLike, adapters: dict[str, torch.Tensor], rank: int, alpha: float,
                  dropout: float = 0.0, base: str = "", card: Optional[str] = None) -> Path:
    """Write ``adapters`` ({``<our module>.lora_A.weight``: A, ``...lora_B.weight``: B}) as a PEFT adapter
    directory, atomically (a kill leaves the previous one), with ``card`` as its README.md when given."""
    modules = sorted({k.rpartition(".lora_")[0] for k in adapters})
    tensors = {PEFT_PREFIX + remote_module(m) + "." + k: adapters[f"{m}.{k}"].detach().contiguous().cpu()
               for m in modules for k in (LORA_A, LORA_B)}
    config = adapter_config(rank, alpha, dropout, modules, base)
    out = Path(directory)
    for old in out.parent.glob(temp_prefix(out.name) + "*"):  # a killed earlier write's temporary directory
        shutil.rmtree(old, ignore_errors=True)
    with atomic_directory(out) as tmp:
        (tmp / ADAPTER_CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS_NAME), metadata={"format": "pt"})
        if card is not None:
            (tmp / MODEL_CARD_NAME).write_text(card, encoding="utf-8")
    return out


def adapter_modules(adapters: dict[str, torch.Tensor]) -> list[str]:
    """The module names (ours) that ``adapters`` ({``<module>.lora_A.weight``: ...}) adapt."""
    return sorted({k.rpartition(".lora_")[0] for k in adapters})


def base_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LoRA model's full (unmerged) state dict without its adapters: the frozen base's state dict (``LoRALinear``
    keeps W under the wrapped layer's own name)."""
    return {k: v for k, v in state.items() if not k.endswith((LORA_A, LORA_B))}


def base_for_adapter(run_dir: PathLike, lora_base: str = "") -> tuple[str, bool]:
    """(what adapter_config.json names as the base, whether it is the run's own ``RUN/adapter_base`` export):
    ``train.lora_base`` when set, else that export's absolute path (peft resolves a relative one against the
    working directory, not the adapter's)."""
    if lora_base:
        return lora_base, False
    return str(adapter_base_dir(run_dir).resolve()), True


def write_adapter_base(run_dir: PathLike, base: DiffTransformerLM, tokenizer_file: Optional[PathLike],
                       init_from: str = "") -> Optional[Path]:
    """``RUN/adapter_base``: the remote-code export of ``base`` (the frozen source as the run holds it), with the
    source's side files (end tokens, chat template) when the source is still there. Written once: an existing
    export is kept (the base never changes); a killed earlier write's temporary directory is removed."""
    from .hf import side_files_of
    from .remote import save_remote

    out = adapter_base_dir(run_dir)
    if out.is_dir() and any(out.iterdir()):
        return None
    for old in out.parent.glob(temp_prefix(out.name) + "*"):
        shutil.rmtree(old, ignore_errors=True)
    side = {}
    if init_from:  # a Hugging Face or model directory holds its side files itself; a run, its newest checkpoint
        source = Path(init_from)
        try:
            side = side_files_of(source if (source / CONFIG_NAME).is_file()
                                 else resolve_checkpoint(source, check_hashes=False, warn=None))
        except (OSError, ValueError):
            side = {}
    hub, license_ = model_card.source_of(init_from) if init_from else (None, None)
    name = Path(init_from).name if init_from else "the source"
    prov = model_card.Provenance((f"The frozen base of the LoRA run `{Path(run_dir).name}`: the weights of `{name}` "
                                  "(`--init-from`) as the run loaded them, exported as remote code so that peft "
                                  "loads the run's `adapter/` onto it.",), hub, license_)
    return save_remote(base, out, tokenizer_file=tokenizer_file, side_files=side or None, provenance=prov)


def write_run_adapter(run_dir: PathLike, cfg: ModelConfig, weights: dict[str, torch.Tensor],
                      adapters: dict[str, torch.Tensor], rank: int, alpha: float, dropout: float,
                      tokenizer_file: Optional[PathLike], init_from: str, step: int, tokens: int) -> Path:
    """A LoRA run's ``RUN/adapter`` at ``step``: ``adapters`` in PEFT's format, its base (``train.lora_base``, read
    from the run's config, else ``RUN/adapter_base``, exported from ``weights``, the full unmerged state dict, the
    first time) and its model card."""
    train = read_run_config(run_dir).get("train")
    lora_base = train.get("lora_base", "") if isinstance(train, dict) else ""
    state = base_state(weights)
    if cfg.tie_embeddings:  # the head is the embedding matrix: the model holds it once
        state.pop(_HEAD[0] + ".weight", None)
    base_model = DiffTransformerLM.from_state_dict(cfg, state, where="the LoRA run's frozen base")
    base, beside = base_for_adapter(run_dir, lora_base)
    if beside:
        write_adapter_base(run_dir, base_model, tokenizer_file, init_from)
    lines, _ = model_card.run_lines(Path(run_dir), step, tokens)
    src_hub, src_license = model_card.source_of(init_from) if init_from else (None, None)
    hub = lora_base if lora_base and model_card.is_hub_name(lora_base) else src_hub
    card = model_card.adapter_card(base_model, rank, alpha, dropout,
                                   [m.rpartition(".")[2] for m in adapter_modules(adapters)], base,
                                   load_path=str(adapter_dir(run_dir)),
                                   provenance=model_card.Provenance(tuple(lines), hub, src_license),
                                   base_beside=beside)
    return write_adapter(adapter_dir(run_dir), adapters, rank, alpha, dropout, base, card)


def export_adapter(checkpoint: PathLike, directory: PathLike, train_cfg: Any) -> Path:
    """A checkpoint's adapters (its training state's ``lora.*.lora_A/B``) as a PEFT adapter directory, with the
    run's ``[train]`` LoRA settings."""
    path = Path(checkpoint) / STATE_TENSORS
    with safe_open(str(path), framework="pt") as f:
        names = [k for k in f.keys() if k.startswith(STATE_PREFIX) and k.endswith((LORA_A, LORA_B))]  # noqa: SIM118
        adapters = adapters_of({k: f.get_tensor(k) for k in names})
    if not adapters:
        raise ValueError(f"{path} holds no LoRA adapters (not a LoRA run's checkpoint)")
    t = train_cfg
    run = Path(checkpoint).parent.parent
    base, _ = base_for_adapter(run, getattr(t, "lora_base", ""))
    return write_adapter(directory, adapters, t.lora_rank, t.lora_alpha, t.lora_dropout, base)


def load_adapter(model: nn.Module, directory: PathLike) -> nn.Module:
    """Put a PEFT LoRA adapter directory (ours, or PEFT's for the remote-code model) onto our ``model``, in place:
    the layers it adapts become ``LoRALinear`` holding its A and B. Plain LoRA only (no DoRA, rsLoRA, bias or
    per-module ranks)."""
    d = Path(directory)
    cfg = read_json(d / ADAPTER_CONFIG_NAME)
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        raise ValueError(f"{d / ADAPTER_CONFIG_NAME} is not a LoRA adapter config (peft_type 'LORA')")
    unsupported = [k for k in ("use_dora", "use_rslora", "fan_in_fan_out", "rank_pattern", "alpha_pattern",
                               "modules_to_save") if cfg.get(k)]
    if cfg.get("bias", "none") != "none":
        unsupported.append("bias")
    if unsupported:
        raise ValueError(f"{d / ADAPTER_CONFIG_NAME}: {', '.join(unsupported)} not supported (plain LoRA only)")
    raw = load_state_dict(d / ADAPTER_WEIGHTS_NAME)
    adapters: dict[str, torch.Tensor] = {}
    for key, v in raw.items():
        module, sep, kind = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
        if not key.startswith(PEFT_PREFIX) or not sep or "lora_" + kind not in (LORA_A, LORA_B):
            raise ValueError(f"{d / ADAPTER_WEIGHTS_NAME}: unexpected tensor {key!r}")
        adapters[f"{our_module(module)}.lora_{kind}"] = v
    modules = sorted({k.rpartition(".lora_")[0] for k in adapters})
    targets = sorted({m.rpartition(".")[2] for m in modules})
    dropout = float(cfg.get("lora_dropout") or 0.0)
    wrapped = apply_lora(model, int(cfg["r"]), float(cfg["lora_alpha"]), targets, dropout)
    if sorted(wrapped) != modules:
        raise ValueError(f"{d}: adapters for {len(modules)} modules, but its targets name {len(wrapped)} of this "
                         f"model's (missing: {sorted(set(wrapped) - set(modules))[:3]})")
    with torch.no_grad():
        for name, m in lora_layers(model).items():
            for k in (LORA_A, LORA_B):
                src, dst = adapters[f"{name}.{k}"], getattr(m, k.split(".")[0]).weight
                if src.shape != dst.shape:
                    raise ValueError(f"{d}: {name}.{k} has shape {tuple(src.shape)}, this model needs "
                                     f"{tuple(dst.shape)}")
                dst.copy_(src)
    return model


__all__ = ["PEFT_PREFIX", "remote_module", "our_module", "adapter_config", "write_adapter", "adapter_modules",
           "base_state", "base_for_adapter", "write_adapter_base", "write_run_adapter", "export_adapter",
           "load_adapter"]
