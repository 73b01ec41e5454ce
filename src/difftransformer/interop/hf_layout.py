"""The Hugging Face layouts of our models: ``config.json`` and the weights of ``DiffLlamaForCausalLM`` (our DIFF
V1, paper layout) and ``LlamaForCausalLM`` (our baseline), mapped both ways. Pure functions over dicts and tensors;
``interop/hf.py`` reads and writes the directories. Other variants have no native class: ``interop/remote.py``
writes them as transformers remote code.

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

from typing import Any

import torch

from ..model.config import ModelConfig
from ..model.transformer import DiffTransformerLM
from .remote_code import config_from_remote, is_remote_config

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


def native_model_type(cfg: ModelConfig) -> str:
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
    model_type = native_model_type(cfg)
    if cfg.qkv_bias or cfg.proj_bias:
        raise ValueError(f"qkv_bias={cfg.qkv_bias}, proj_bias={cfg.proj_bias} cannot be exported: the Hugging Face "
                         "classes take biases on all four projections or none (attention_bias), and our models have "
                         "none; keep the model in our format")
    if cfg.attn_dropout:
        raise ValueError(f"attn_dropout={cfg.attn_dropout} cannot be exported (a training setting; an import refuses "
                         "attention_dropout): set it to 0 first")
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
def _per_layer_names(layer: int) -> dict[str, str]:
    """Our parameter name -> the Hugging Face name, for layer ``layer`` (attention projections handled apart)."""
    o, h = f"layers.{layer}.", f"model.layers.{layer}."
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
    for layer in range(cfg.n_layers):
        for ours, theirs in _per_layer_names(layer).items():
            out[ours] = take(theirs)
        a, h = f"layers.{layer}.attn.", f"model.layers.{layer}.self_attn."
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
    native_model_type(cfg)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "model.norm.weight": sd["norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["output.weight"]
    H, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    rope = interleaved_to_neox(d)
    for layer in range(cfg.n_layers):
        for ours, theirs in _per_layer_names(layer).items():
            out[theirs] = sd[ours]
        a, h = f"layers.{layer}.attn.", f"model.layers.{layer}.self_attn."
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
