"""Hugging Face checkpoints in and out: ``DiffLlamaForCausalLM`` <-> our DIFF V1, ``LlamaForCausalLM`` <-> our
baseline. DIFF V2 has no Hugging Face class: it lives in our own format only (``save_pretrained``).

Only ``config.json`` and safetensors files are read (``model.safetensors`` or a sharded
``model.safetensors.index.json``); a directory holding only ``pytorch_model.bin`` (pickle) is refused. Writing
needs no ``transformers``: the config is plain JSON that transformers 4.46+ and 5.x read.

The layouts differ in three ways, all fixed by permuting rows (exact, bitwise reversible):

1. RoPE. Hugging Face rotates channel i with channel i + d/2 of a head (NeoX ``rotate_half``); we rotate channels
   (2i, 2i+1) (the official DIFF code, GPT-J style). Both use frequency theta^(-2i/d) for pair i, so our channel 2i
   is their channel i and our channel 2i+1 is their channel i + d/2, in every query and key head. Scores
   q.k are unchanged by permuting q and k alike.
2. DIFF V1 half-head pairing (paper eq. 1). DiffLlama's head j (j < H/2) is Q1 of differential head j and head
   j + H/2 is its Q2; keys: KV head g is K1 and g + H_kv/2 is K2 of group g; the 2d-wide value of group g is
   [v_g, v_(g + H_kv/2)]. Ours (official layout): half-heads 2i and 2i+1 are Q1 and Q2 of head i, key half-heads
   2g and 2g+1 are K1 and K2 of group g, and value group g is rows [g*2d, (g+1)*2d). ``o_proj`` is the same.
3. DIFF V1 head-wise norm (eq. 3). DiffLlama's RMSNorm over each head's 2d channels has no weight and uses
   ``rms_norm_eps``; ours may carry a learnable 2d weight (``headwise_norm_weight``) and uses eps 1e-5. Exporting
   folds the weight into the columns of ``W_o`` (exact in real arithmetic; float rounding only); a checkpoint
   whose ``rms_norm_eps`` is not 1e-5 cannot be represented and is refused.

lambda (eq. 2) needs nothing: both compute exp(lq1.lk1) - exp(lq2.lk2) + 0.8 - 0.6 exp(-0.3 l) in fp32 with the
same 0-based layer index, and both scale scores by d^-0.5.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors.torch import save_file

from ..fileio import parse_json
from ..model.config import ModelConfig
from ..model.pretrained import (CONFIG_NAME, GENERATION_CONFIG_NAME, SIDE_FILES, TOKENIZER_CONFIG_NAME,
                                TOKENIZER_NAME, WEIGHTS_NAME, atomic_directory, load_state_dict)
from ..model.transformer import DiffTransformerLM
from ..rundir import dir_kind
from .remote_code import config_from_remote, is_remote_config, state_from_remote

PathLike = Union[str, os.PathLike]

HF_CONFIG, HF_WEIGHTS = CONFIG_NAME, WEIGHTS_NAME  # the same names as our model directories
# Carried both ways by `convert`, byte for byte; for our own runs `side_files_for` writes the first and the third.
HF_SIDE_FILES = SIDE_FILES
HF_INDEX = WEIGHTS_NAME + ".index.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.bin")
HEADWISE_EPS = 1e-5  # our DIFF V1 head-wise RMSNorm eps (the official code's)

# model_type -> (architecture, our attention kind, the class defaults transformers applies to absent keys)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "diffllama": ("DiffLlamaForCausalLM", "diff_v1", {"rms_norm_eps": 1e-5}),
    "llama": ("LlamaForCausalLM", "baseline", {"rms_norm_eps": 1e-6}),
}


# ---------------------------------------------------------------------------------------------- permutations
def neox_to_interleaved(d: int) -> torch.Tensor:
    """Row order of one head: ours[c] = hf[perm[c]], perm = [0, d/2, 1, d/2+1, ...]."""
    return torch.arange(d).view(2, d // 2).t().reshape(-1)


def interleaved_to_neox(d: int) -> torch.Tensor:
    """Inverse of ``neox_to_interleaved``: hf[c] = ours[perm[c]], perm = [0, 2, 4, ..., 1, 3, 5, ...]."""
    return torch.arange(d).view(d // 2, 2).t().reshape(-1)


def _permute_heads(w: torch.Tensor, heads: int, d: int, perm: torch.Tensor) -> torch.Tensor:
    """Apply a within-head row permutation to a (heads*d, in) projection."""
    return w.view(heads, d, -1)[:, perm].reshape(heads * d, -1)


def _halves_to_pairs(w: torch.Tensor, heads: int, d: int) -> torch.Tensor:
    """Rows of heads [0..heads/2) and [heads/2..heads) (HF) -> pairs (j, j + heads/2) side by side (ours)."""
    return w.view(2, heads // 2, d, -1).transpose(0, 1).reshape(heads * d, -1)


def _pairs_to_halves(w: torch.Tensor, heads: int, d: int) -> torch.Tensor:
    return w.view(heads // 2, 2, d, -1).transpose(0, 1).reshape(heads * d, -1)


# ---------------------------------------------------------------------------------------------- configs
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
    cfg = parse_json(p.read_text(), p)
    if not isinstance(cfg, dict):
        raise ValueError(f"{p} must hold a JSON object")
    return cfg


LLAMA3_KEYS = {"factor": "rope_factor", "low_freq_factor": "rope_low_freq_factor",
               "high_freq_factor": "rope_high_freq_factor",
               "original_max_position_embeddings": "rope_original_max_len"}


def _rope(hf: dict[str, Any]) -> dict[str, Any]:
    """Our RoPE fields (rope_theta, and Llama 3.1's scaling when the file names it) from a config.json."""
    # transformers 4.x writes rope_scaling, 5.x rope_parameters, some files both: each is checked on its own, so
    # a scaled RoPE in one is never hidden by "default" in the other (it would convert to wrong logits).
    out: dict[str, Any] = {}
    for key in ("rope_parameters", "rope_scaling"):
        v = hf.get(key)
        if v is None:
            continue
        if not isinstance(v, dict):
            raise ValueError(f"{key}={v!r} must be a mapping (e.g. {{\"rope_type\": \"default\"}}) or null")
        kind = v.get("rope_type", v.get("type", "default"))
        if kind == "llama3":
            missing = [k for k in LLAMA3_KEYS if k not in v]
            if missing:
                raise ValueError(f"{key}: rope_type 'llama3' needs {', '.join(missing)}")
            out.update({"rope_type": "llama3", **{ours: _number(hf, f"{key}.{k}", v[k])
                                                  for k, ours in LLAMA3_KEYS.items()}})
            out["rope_original_max_len"] = int(out["rope_original_max_len"])
        elif kind != "default":
            raise ValueError(f"{key}.rope_type={kind!r} is not implemented here; only plain RoPE (rope_type "
                             "'default') and Llama 3.1's 'llama3' convert")
    rp = hf.get("rope_parameters") or {}
    out["rope_theta"] = _number(hf, "rope_theta", rp.get("rope_theta") or hf.get("rope_theta") or 10000.0)
    return out


def _number(hf: dict[str, Any], key: str, v: Any) -> float:
    """A positive finite float of the HF config (``key`` names it in the error)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise ValueError(f"config.json: {key}={v!r} must be a positive finite number")
    return float(v)


def _count(hf: dict[str, Any], key: str, default: Any = None) -> int:
    """A positive integer of the HF config (a 0 head count would divide by zero further on)."""
    v = hf.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"config.json: {key}={v!r} must be a positive integer")
    return v


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Our ``ModelConfig`` for a DiffLlama / Llama ``config.json`` (or our remote-code model's: ``remote_code``);
    unsupported options raise ValueError."""
    if is_remote_config(hf):
        return config_from_remote(hf)
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"model_type={model_type!r} is not supported; convert one of "
                         f"{', '.join(a for a, _, _ in ARCHITECTURES.values())} (model_type "
                         f"{' or '.join(repr(k) for k in ARCHITECTURES)})")
    arch, attention, defaults = ARCHITECTURES[model_type]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if key not in hf:
            raise ValueError(f"config.json of this {arch} lacks {key!r}")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf['hidden_act']!r} is not supported; only 'silu' (SwiGLU) converts")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key, False):
            raise ValueError(f"{key}=true is not supported: our projections have no bias")
    if hf.get("pretraining_tp", 1) not in (1, None):
        raise ValueError(f"pretraining_tp={hf['pretraining_tp']} is not supported; only 1 converts")
    if float(hf.get("attention_dropout") or 0.0) != 0.0:
        raise ValueError("attention_dropout must be 0 to convert")
    H, d_model = _count(hf, "num_attention_heads"), _count(hf, "hidden_size")
    eps = _number(hf, "rms_norm_eps", hf.get("rms_norm_eps", defaults["rms_norm_eps"]))
    kw: dict[str, Any] = dict(
        vocab_size=_count(hf, "vocab_size"), d_model=d_model, n_layers=_count(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=_count(hf, "num_key_value_heads", hf.get("num_key_value_heads") or H),
        head_dim=_count(hf, "head_dim", hf.get("head_dim") or d_model // H), attention=attention,
        ffn_hidden=_count(hf, "intermediate_size"), **_rope(hf),
        max_seq_len=_count(hf, "max_position_embeddings", 2048), norm_eps=eps,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=_number(hf, "initializer_range", hf.get("initializer_range", 0.02)))
    if attention == "diff_v1":
        if eps != HEADWISE_EPS:
            raise ValueError(f"rms_norm_eps={eps:g}: DiffLlama's head-wise norm uses it, ours uses {HEADWISE_EPS:g} "
                             "(the official code's), so this checkpoint's logits cannot be reproduced")
        kw.update(headwise_norm=True, headwise_norm_weight=False)
    return ModelConfig(**kw)


def _architecture_of(cfg: ModelConfig) -> str:
    """The native transformers model_type that holds ``cfg``'s variant (``ARCHITECTURES``), or a ValueError."""
    for model_type, (_, ours, _) in ARCHITECTURES.items():
        if ours == cfg.attention:
            return model_type
    raise ValueError(f"attention={cfg.attention!r} has no Hugging Face class; keep our own format "
                     "(config.json + model.safetensors), which DiffTransformerLM.from_pretrained reloads")


def _rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
    if cfg.rope_type == "llama3":
        out.update({k: getattr(cfg, ours) for k, ours in LLAMA3_KEYS.items()})
    return out


def config_to_hf(cfg: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """A ``config.json`` for DiffLlamaForCausalLM (DIFF V1) or LlamaForCausalLM (baseline)."""
    model_type = _architecture_of(cfg)
    if cfg.attention == "diff_v1":
        if cfg.v1_layout != "paper":
            raise ValueError(f"v1_layout={cfg.v1_layout!r} cannot be exported: DiffLlama holds the paper's layout "
                             "(n_heads/2 heads with 2d-wide values); keep the model in our format")
        if not cfg.headwise_norm:
            raise ValueError("headwise_norm=false cannot be exported: DiffLlama always applies its head-wise norm")
        if cfg.lambda_init != "schedule":
            raise ValueError(f"lambda_init={cfg.lambda_init} cannot be exported: DiffLlama always uses the "
                             "0.8 - 0.6 exp(-0.3 l) schedule")
        if cfg.norm_eps != HEADWISE_EPS:
            raise ValueError(f"norm_eps={cfg.norm_eps:g} cannot be exported: DiffLlama's head-wise norm would use it "
                             f"instead of our {HEADWISE_EPS:g}")
    return {
        "architectures": [ARCHITECTURES[model_type][0]], "model_type": model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
        "rope_parameters": _rope_parameters(cfg),
        "rope_theta": cfg.rope_theta,  # transformers 4.x reads this key; 5.x reads rope_parameters
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "initializer_range": cfg.init_std,
        "dtype": str(dtype).removeprefix("torch."), "use_cache": True,
    }


# ---------------------------------------------------------------------------------------------- weights
def _per_layer_names(l: int) -> dict[str, str]:
    """Our parameter name -> the Hugging Face name, for layer l (attention projections handled apart)."""
    o, h = f"layers.{l}.", f"model.layers.{l}."
    return {o + "attn_norm.weight": h + "input_layernorm.weight",
            o + "ffn_norm.weight": h + "post_attention_layernorm.weight",
            o + "ffn.w1.weight": h + "mlp.gate_proj.weight",
            o + "ffn.w3.weight": h + "mlp.up_proj.weight",
            o + "ffn.w2.weight": h + "mlp.down_proj.weight",
            o + "attn.wo.weight": h + "self_attn.o_proj.weight"}


LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def state_from_hf(cfg: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict from a Hugging Face one (pure row permutations: bitwise reversible)."""
    hf = dict(hf)
    out: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"the checkpoint lacks tensor {name!r}")
        return hf.pop(name)

    out["tok_embeddings.weight"] = take("model.embed_tokens.weight")
    out["norm.weight"] = take("model.norm.weight")
    if cfg.tie_embeddings:
        hf.pop("lm_head.weight", None)  # tied: the embedding is the head
    else:
        out["output.weight"] = take("lm_head.weight")
    H, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    rope = neox_to_interleaved(d)
    for l in range(cfg.n_layers):
        for ours, theirs in _per_layer_names(l).items():
            out[ours] = take(theirs)
        a, h = f"layers.{l}.attn.", f"model.layers.{l}.self_attn."
        q, k, v = (_checked(take(h + f"{n}_proj.weight"), rows, cfg.d_model, h + f"{n}_proj.weight")
                   for n, rows in (("q", H * d), ("k", Hkv * d), ("v", Hkv * d)))
        q, k = _permute_heads(q, H, d, rope), _permute_heads(k, Hkv, d, rope)
        if cfg.attention == "diff_v1":
            q, k, v = _halves_to_pairs(q, H, d), _halves_to_pairs(k, Hkv, d), _halves_to_pairs(v, Hkv, d)
            for n in LAMBDAS:
                out[a + n] = take(h + n)
        out[a + "wq.weight"], out[a + "wk.weight"], out[a + "wv.weight"] = q, k, v
    if hf:
        raise ValueError(f"the checkpoint holds tensors this {cfg.attention} config has no place for: "
                         f"{', '.join(sorted(hf)[:5])}")
    return out


def _checked(w: torch.Tensor, rows: int, cols: int, name: str) -> torch.Tensor:
    if tuple(w.shape) != (rows, cols):
        raise ValueError(f"tensor {name} has shape {tuple(w.shape)}, config.json needs {(rows, cols)}")
    return w


def state_to_hf(model: DiffTransformerLM) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict of our model (DIFF V1's head-wise norm weight folded into W_o)."""
    cfg = model.cfg
    _architecture_of(cfg)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "model.norm.weight": sd["norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["output.weight"]
    H, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    rope = interleaved_to_neox(d)
    for l in range(cfg.n_layers):
        for ours, theirs in _per_layer_names(l).items():
            out[theirs] = sd[ours]
        a, h = f"layers.{l}.attn.", f"model.layers.{l}.self_attn."
        q, k, v = sd[a + "wq.weight"], sd[a + "wk.weight"], sd[a + "wv.weight"]
        if cfg.attention == "diff_v1":
            q, k, v = _pairs_to_halves(q, H, d), _pairs_to_halves(k, Hkv, d), _pairs_to_halves(v, Hkv, d)
            for n in LAMBDAS:
                out[h + n] = sd[a + n]
            if cfg.headwise_norm_weight:  # Eq. (3): W_o (g * RMSNorm(x)) = (W_o diag(g)) RMSNorm(x), per head
                wo = sd[a + "wo.weight"]
                g = sd[a + "subln.weight"].repeat(cfg.n_diff_heads)  # (h*2d,)
                out[h + "o_proj.weight"] = (wo.float() * g.float()).to(wo.dtype)
        out[h + "q_proj.weight"] = _permute_heads(q, H, d, rope)
        out[h + "k_proj.weight"] = _permute_heads(k, Hkv, d, rope)
        out[h + "v_proj.weight"] = v
    return {k: v.contiguous() for k, v in out.items()}


# ---------------------------------------------------------------------------------------------- file I/O
def read_hf_weights(hf_dir: PathLike) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards listed in ``model.safetensors.index.json``."""
    d = _require_dir(hf_dir)
    if (d / HF_WEIGHTS).is_file():
        return load_state_dict(d / HF_WEIGHTS)
    if (d / HF_INDEX).is_file():
        try:
            weight_map = parse_json((d / HF_INDEX).read_text(), d / HF_INDEX)["weight_map"]
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
    gen = parse_json(side[GENERATION_CONFIG_NAME].decode(), GENERATION_CONFIG_NAME)
    return {k: gen[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if isinstance(gen, dict) and k in gen}


def save_hf(model: DiffTransformerLM, out_dir: PathLike, tokenizer_file: Optional[PathLike] = None,
            side_files: Optional[dict[str, bytes]] = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json`` and ``side_files``, e.g. carried from
    an import by ``side_files_of``; without them, ones made for our tokenizer) for transformers, atomically."""
    if not isinstance(model, DiffTransformerLM):
        raise TypeError(f"save_hf expects a DiffTransformerLM, got {type(model).__name__}")
    dtype = model.output.weight.dtype
    hf_cfg = config_to_hf(model.cfg, dtype)  # validates first: nothing is written for an unsupported model
    if not side_files and tokenizer_file is not None:
        side_files = side_files_for(tokenizer_file, model.cfg.max_seq_len)
    side_files = side_files or {}
    hf_cfg.update(_token_ids(side_files))
    state = {k: v.cpu() for k, v in state_to_hf(model).items()}
    with atomic_directory(out_dir, replace=False) as tmp:
        (tmp / HF_CONFIG).write_text(json.dumps(hf_cfg, indent=2) + "\n")
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
           "read_hf_config", "read_hf_weights", "is_hf_dir", "neox_to_interleaved", "interleaved_to_neox"]
