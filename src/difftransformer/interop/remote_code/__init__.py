"""The Hugging Face remote-code model (``trust_remote_code=True``): its three source files and its layout.

``configuration_difftransformer.py`` and ``modeling_difftransformer.py`` are what `difftransformer convert --to-hf`
copies into an exported directory. Both import only torch and transformers (never ``difftransformer``), so that the
directory runs wherever transformers does; they are modules of this package too, and tested as such.

This file says how our model maps onto them, with neither transformers nor the interop readers (``interop/hf.py``
and ``interop/remote.py`` both use it):

* ``config.json``: ``model_type`` "difftransformer", ``auto_map`` naming the configuration and modeling files,
  transformers' names for the shared sizes (hidden_size, num_attention_heads, ...) and ours for the rest
  (attention, v1_layout, ...);
* the weights: our state dict renamed, nothing else: ``model.`` + our name, ``output.weight`` as
  ``lm_head.weight`` (left out when tied). Import and export are therefore bitwise.

Not carried: ``backend`` (transformers runs its own attention) and ``ffn_multiple_of`` (the FFN width is explicit);
an import has their defaults.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from ...model.config import ModelConfig

CODE_DIR = Path(__file__).resolve().parent
CODE_FILES = ("configuration_difftransformer.py", "layers_difftransformer.py", "modeling_difftransformer.py")

REMOTE_MODEL_TYPE = "difftransformer"
REMOTE_ARCHITECTURE = "DiffTransformerForCausalLM"
AUTO_MAP = {"AutoConfig": "configuration_difftransformer.DiffTransformerConfig",
            "AutoModelForCausalLM": "modeling_difftransformer.DiffTransformerForCausalLM"}
# The attention variants modeling_difftransformer.py implements (its configuration file's ATTENTION_KINDS; a test
# checks the two agree). A variant registered elsewhere has no remote code: its export is refused.
REMOTE_ATTENTION = ("baseline", "diff_v1", "diff_v2")
PREFIX = "model."
HEAD = ("output.weight", "lm_head.weight")  # (ours, the remote model's)

# Our ModelConfig field -> the config.json key (transformers' name where it has one, else ours).
CONFIG_KEYS = {
    "vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
    "attention": "attention", "ffn_hidden": "intermediate_size", "rope_theta": "rope_theta",
    "rope_type": "rope_type", "rope_factor": "rope_factor", "rope_low_freq_factor": "rope_low_freq_factor",
    "rope_high_freq_factor": "rope_high_freq_factor", "rope_original_max_len": "rope_original_max_len",
    "max_seq_len": "max_position_embeddings", "norm_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings",
    "init_std": "initializer_range", "lambda_init": "lambda_init", "headwise_norm": "headwise_norm",
    "headwise_norm_weight": "headwise_norm_weight", "v1_layout": "v1_layout", "v2_lambda": "v2_lambda",
    "v2_pairing": "v2_pairing",
}
# DiffTransformerConfig's defaults (configuration_difftransformer.py; a test keeps the two equal): a config.json
# written by transformers may leave out keys at their default. None: derived (num_key_value_heads =
# num_attention_heads, head_dim = hidden_size // num_attention_heads).
REMOTE_DEFAULTS: dict[str, Any] = {
    "vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
    "num_attention_heads": 8, "num_key_value_heads": None, "head_dim": None, "attention": "diff_v1",
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_type": "default",
    "rope_factor": 1.0, "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0, "rope_original_max_len": 8192,
    "initializer_range": 0.02, "tie_word_embeddings": False, "lambda_init": "schedule", "headwise_norm": True,
    "headwise_norm_weight": True, "v1_layout": "paper", "v2_lambda": "sigmoid", "v2_pairing": "interleaved",
}
V1_OPTIONS = ("lambda_init", "headwise_norm", "headwise_norm_weight", "v1_layout")
V2_OPTIONS = ("v2_lambda", "v2_pairing")
# DIFF V2's diagnostic switches (retrieval/DIAGNOSTIC.md): the modeling file does not implement them
V2_DIAGNOSTIC_OPTIONS = ("v2_keys", "v2_headwise_norm", "v2_headwise_norm_layers", "head_gain")
# The layer's options (DiffAttention's biases and attention dropout): the modeling file has neither
LAYER_OPTIONS = ("qkv_bias", "proj_bias", "attn_dropout")
LLAMA3_OPTIONS = ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_len")


def is_remote_config(hf: dict[str, Any]) -> bool:
    """True for a config.json of the remote-code model (its model_type, or an auto_map naming its class)."""
    if hf.get("model_type") == REMOTE_MODEL_TYPE:
        return True
    auto = hf.get("auto_map")
    target = auto.get("AutoModelForCausalLM") if isinstance(auto, dict) else None
    return isinstance(target, str) and target.endswith("." + REMOTE_ARCHITECTURE)


def config_to_remote(cfg: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """The remote-code config.json for ``cfg`` (weights stored in ``dtype``); a ValueError for a variant the
    modeling file does not implement."""
    if cfg.attention not in REMOTE_ATTENTION:
        raise ValueError(f"attention={cfg.attention!r} has no Hugging Face remote code (the modeling file implements "
                         f"{', '.join(REMOTE_ATTENTION)}); keep it in our format")
    # The diagnostic arms' switches (ModelConfig fields the modeling file does not read) would be dropped: refuse.
    default = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    unread = [f"{n}={getattr(cfg, n)!r}" for n in V2_DIAGNOSTIC_OPTIONS if getattr(cfg, n) != default[n]]
    if cfg.v2_lambda == "scalar":
        unread.append("v2_lambda='scalar'")
    layer = [f"{n}={getattr(cfg, n)!r}" for n in LAYER_OPTIONS if getattr(cfg, n) != default[n]]
    if layer:
        raise ValueError(f"{', '.join(layer)} has no Hugging Face remote code (the modeling file has no attention "
                         "biases or dropout); keep the model in our format")
    if unread:
        raise ValueError(f"{', '.join(unread)} has no Hugging Face remote code (a diagnostic arm of DIFF V2); keep the "
                         "model in our format")
    out: dict[str, Any] = {"architectures": [REMOTE_ARCHITECTURE], "model_type": REMOTE_MODEL_TYPE,
                           "auto_map": dict(AUTO_MAP)}
    out.update({key: getattr(cfg, ours) for ours, key in CONFIG_KEYS.items()})
    out.update({"dtype": str(dtype).removeprefix("torch."), "use_cache": True})
    return out


def config_from_remote(hf: dict[str, Any]) -> ModelConfig:
    """Our ``ModelConfig`` from a remote-code config.json (absent keys: DiffTransformerConfig's defaults;
    transformers' bookkeeping keys are ignored). Bad values raise ModelConfig's ValueError naming the field."""
    if not is_remote_config(hf):
        raise ValueError(f"model_type={hf.get('model_type')!r} is not the remote-code model "
                         f"(model_type {REMOTE_MODEL_TYPE!r})")
    get = {key: hf.get(key, default) for key, default in REMOTE_DEFAULTS.items()}
    if get["num_key_value_heads"] is None:
        get["num_key_value_heads"] = get["num_attention_heads"]
    heads, width = get["num_attention_heads"], get["hidden_size"]
    if get["head_dim"] is None and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                       for v in (heads, width)):
        get["head_dim"] = width // heads
    kw = {ours: get[key] for ours, key in CONFIG_KEYS.items()}
    # The remote config carries every option; the remote model ignores those of the other variant (and the llama3
    # numbers under plain RoPE), which ModelConfig would refuse away from their defaults: drop them likewise.
    ignored = {"diff_v1": V2_OPTIONS, "diff_v2": V1_OPTIONS}.get(kw["attention"], V1_OPTIONS + V2_OPTIONS)
    if kw["rope_type"] == "default":
        ignored += LLAMA3_OPTIONS
    return ModelConfig(**{k: v for k, v in kw.items() if k not in ignored})


def state_to_remote(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict under the remote model's names (a rename; the tied head is left out)."""
    out = {}
    for k, v in state.items():
        if k == HEAD[0]:
            if not cfg.tie_embeddings:
                out[HEAD[1]] = v
        else:
            out[PREFIX + k] = v
    return out


def state_from_remote(cfg: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict from the remote model's (a rename; a tied head, when saved, must equal the embedding)."""
    out: dict[str, torch.Tensor] = {}
    foreign = []
    for k, v in hf.items():
        if k == HEAD[1]:
            out[HEAD[0]] = v
        elif k.startswith(PREFIX):
            out[k[len(PREFIX):]] = v
        else:
            foreign.append(k)
    if foreign:
        raise ValueError(f"the checkpoint holds tensors the remote-code model has no place for: "
                         f"{', '.join(sorted(foreign)[:5])} (expected model.* and lm_head.weight)")
    if cfg.tie_embeddings and HEAD[0] in out:
        head = out.pop(HEAD[0])
        emb = out.get("tok_embeddings.weight")
        if emb is not None and not torch.equal(head, emb):
            raise ValueError("tie_word_embeddings=true but lm_head.weight differs from model.tok_embeddings.weight")
    return out


__all__ = ["CODE_DIR", "CODE_FILES", "REMOTE_MODEL_TYPE", "AUTO_MAP", "CONFIG_KEYS", "REMOTE_DEFAULTS",
           "is_remote_config", "config_to_remote", "config_from_remote", "state_to_remote", "state_from_remote"]
