"""A trained baseline turned into DIFF V2 or DIFF V1 that computes exactly the same function (continued training
starts from the source model, not from noise).

DIFF V2
-------

DIFF V2 keeps the baseline's K, V and W_o shapes and doubles the query heads: pair i is query heads (2i, 2i+1),
both reading KV head i // (H / H_kv), combined as ``attn(q_2i) - lambda_i * attn(q_2i+1)`` with
``lambda = sigmoid(x W_lambda)`` per token and head. The construction, for every layer and head i:

    q_2i = q_2i+1 = the baseline's q_i         (both members of the pair copy the original query head)
    W_lambda = 0                                (lambda = sigmoid(0) = 1/2 for every token and head)
    W_o = 2 * the baseline's W_o                (undoes the factor 1/2)

so pair i outputs ``attn_i - 1/2 attn_i = 1/2 attn_i`` and ``(2 W_o)(1/2 attn_i V) = W_o attn_i V``: the
baseline's output, for every input. Under ``v2_lambda="raw"`` (no sigmoid) lambda = 0 and W_o is kept. In
floating point only the order of the sums changes (``x - x/2`` and the factors 2 and 1/2 are exact): the logits
agree to rounding (about 1e-16 in float64 on every backend, tested).

Training then moves off this point by itself: the two queries of a pair receive gradients ``g`` and ``-g/2``
(the pair's map enters with +1 and -lambda), and W_lambda's gradient is ``-attn_2i+1 V`` projected, not zero.
No parameters are added beyond V2's own (the second query of each pair and W_lambda); the command prints them.

``v2_lambda="none"`` (attn1 - attn2) has no such point (an exact copy cancels to zero), and the ``"halves"``
pairing puts a pair's two heads in different GQA groups: both are refused.

DIFF V1
-------
The paper's layout (h = H/2 heads with 2d-wide values, parameters matched to the baseline) cannot hold H
independent softmax heads, so a Llama converts to ``v1_layout="per_head"``: each of its H heads becomes one
differential head with two d-wide query/key maps and the head's own d-wide value (W_v unchanged). For every
layer l (lambda_init_l = 0.8 - 0.6 exp(-0.3 l)) and head i of group g:

    Q1_i = the baseline's q_i,  K1_g = the baseline's k_g     (the positive branch is the original head)
    Q2_i, K2_g ~ N(0, init_std), seeded                        (a fresh negative branch)
    lambda vectors ~ N(0, 0.1) as at initialisation,  neg_weight = 0
    W_o = the baseline's W_o / (1 - lambda_init_l),  no head-wise RMSNorm

The layer applies lambda * neg_weight, so at neg_weight = 0 head i is ``(1 - lambda_init)(A1_i V)`` and the
divided W_o undoes the factor: the baseline's output. Training warms ``neg_weight`` up linearly from 0 to 1 over
``train.v1_negative_warmup`` steps (the axolotl diff-transformer plugin's idea), so the negative map is blended in
rather than switched on. The negative branch starts small and random, not at zero: with Q2 = K2 = 0 both
gradients are products with the other one (dQ2 = dS2 K2, dK2 = dS2^T Q2) and stay exactly zero for ever, a
saddle that training never leaves. With the head-wise RMSNorm kept (``headwise_norm=True``, option of
``baseline_to_diff_v1``) the function is not kept (RMSNorm of a head is not the head): its step-0 gap is measured
by ``convert``, as is the gap without the warm-up (neg_weight = 1 at step 0).

Added parameters per layer: the second query and key maps (d_model x (H + H_kv) d) and lambda's 4d.

One entry point
---------------
``convert(model_or_config, attention)`` is what every command uses (``convert --from-hf --attention``, ``train
--init-from --model.attention``, ``bench pretrained``): a model (or its ``ModelConfig``) of one variant as another,
through the one conversion in ``CONVERSIONS`` between their classes; the model itself when it already is that
variant; a ValueError naming the conversions there are for any other pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional, Union, overload

import torch

from .attention import BaselineAttention, DiffV1Attention, DiffV2Attention
from .config import ModelConfig
from .pretrained import TIED, assign_weights
from .transformer import DiffTransformerLM
from .variants import variant, variants


def _is(cfg: ModelConfig, cls: type) -> bool:
    return variant(cfg.attention).cls is cls


def _name(cls: type) -> str:
    """The registered name of an attention class."""
    for v in variants():
        if v.cls is cls:
            return v.name
    raise LookupError(f"{cls.__name__} is not a registered attention variant")


def diff_v2_config_from_baseline(cfg: ModelConfig, v2_lambda: str = "sigmoid") -> ModelConfig:
    """The DIFF V2 config with ``cfg``'s shapes (the baseline's head counts, as every config of ours names)."""
    if not _is(cfg, BaselineAttention):
        raise ValueError(f"attention={cfg.attention!r}: only a baseline model converts to DIFF V2 (a DIFF V1 model "
                         "has other query/key shapes)")
    if v2_lambda not in ("sigmoid", "raw"):
        raise ValueError(f"v2_lambda={v2_lambda!r}: a function-preserving conversion needs 'sigmoid' or 'raw' "
                         "('none' computes attn1 - attn2, which a copied query cancels to zero)")
    return cfg.replace(attention=_name(DiffV2Attention), v2_lambda=v2_lambda, v2_pairing="interleaved")


@torch.no_grad()
def baseline_to_diff_v2(model: DiffTransformerLM, v2_lambda: str = "sigmoid") -> DiffTransformerLM:
    """A DIFF V2 model (on ``model``'s device and dtype) whose forward equals ``model``'s; ``model`` is unchanged."""
    if not isinstance(model, DiffTransformerLM):
        raise TypeError(f"model must be a DiffTransformerLM, got {type(model).__name__}")
    cfg = diff_v2_config_from_baseline(model.cfg, v2_lambda)
    p = next(model.parameters())
    with torch.device("meta"):
        out = DiffTransformerLM(cfg)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    H, d = cfg.n_heads, cfg.head_dim
    o_scale = 2.0 if v2_lambda == "sigmoid" else 1.0
    for i in range(cfg.n_layers):
        pre = f"layers.{i}.attn."
        wq = state[pre + "wq.weight"].view(H, d, cfg.d_model)
        state[pre + "wq.weight"] = wq.repeat_interleave(2, dim=0).reshape(2 * H * d, cfg.d_model)  # 2i, 2i+1 = i
        state[pre + "wo.weight"] = state[pre + "wo.weight"] * o_scale
        state[pre + "wlambda.weight"] = torch.zeros(H, cfg.d_model, dtype=p.dtype, device=p.device)
    for k in TIED if cfg.tie_embeddings else ():
        state.pop(k, None)
    assign_weights(out, state, "the converted baseline")  # keys and shapes checked, tied weights re-tied
    out.train(model.training)
    return out


def diff_v1_config_from_baseline(cfg: ModelConfig, headwise_norm: bool = False) -> ModelConfig:
    """The per_head DIFF V1 config with ``cfg``'s shapes."""
    if not _is(cfg, BaselineAttention):
        raise ValueError(f"attention={cfg.attention!r}: only a baseline model converts to DIFF V1")
    if not isinstance(headwise_norm, bool):
        raise TypeError(f"headwise_norm must be true or false, got {headwise_norm!r}")
    return cfg.replace(attention=_name(DiffV1Attention), v1_layout="per_head", headwise_norm=headwise_norm,
                       headwise_norm_weight=headwise_norm)


@torch.no_grad()
def baseline_to_diff_v1(model: DiffTransformerLM, headwise_norm: bool = False, seed: int = 0) -> DiffTransformerLM:
    """A per_head DIFF V1 model whose forward equals ``model``'s (negative branch at weight 0); ``model`` unchanged.

    ``seed`` draws the negative branch's queries/keys and the lambda vectors. With ``headwise_norm=True`` the
    head-wise RMSNorm is kept (weights 1) and the function is NOT preserved (see the module docstring).
    """
    if not isinstance(model, DiffTransformerLM):
        raise TypeError(f"model must be a DiffTransformerLM, got {type(model).__name__}")
    cfg = diff_v1_config_from_baseline(model.cfg, headwise_norm)
    p = next(model.parameters())
    with torch.device("meta"):
        out = DiffTransformerLM(cfg)
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std).to(device=p.device, dtype=p.dtype)

    state = {k: v.clone() for k, v in model.state_dict().items()}
    H, Hkv, d, dm = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    for i in range(cfg.n_layers):
        pre = f"layers.{i}.attn."
        for name, heads in (("wq", H), ("wk", Hkv)):
            w = state[pre + name + ".weight"].view(heads, 1, d, dm)
            neg = normal(heads, 1, d, dm, std=cfg.init_std)
            state[pre + name + ".weight"] = torch.cat((w, neg), dim=1).reshape(2 * heads * d, dm)  # 2i: Q1, 2i+1: Q2
        state[pre + "wo.weight"] = state[pre + "wo.weight"] / (1.0 - cfg.lambda_init_for(i))
        for lam in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            state[pre + lam] = normal(d, std=0.1).float()
        state[pre + "neg_weight"] = torch.zeros((), dtype=torch.float32, device=p.device)
        if headwise_norm:
            state[pre + "subln.weight"] = torch.ones(d, dtype=p.dtype, device=p.device)
    for k in TIED if cfg.tie_embeddings else ():
        state.pop(k, None)
    assign_weights(out, state, "the converted baseline")
    out.train(model.training)
    return out


def step0_gap(source: DiffTransformerLM, converted: DiffTransformerLM, tokens: torch.Tensor) -> float:
    """max |logits(converted) - logits(source)| on ``tokens`` (B, T): how far a conversion is from the source."""
    with torch.no_grad():
        a = source(tokens).logits.double()
        b = converted(tokens).logits.double()
    return float((a - b).abs().max())


# ---------------------------------------------------------------------------------------------- the entry point
@dataclass(frozen=True)
class Conversion:
    """One function-preserving conversion between two attention classes. ``config(cfg, **options)`` and
    ``model(model, **options)`` build the target (options: ``v2_lambda``, ``headwise_norm``, ``seed``; each takes
    the ones it reads); ``added`` says in words what it adds; ``warmed_up``: a branch starts at weight 0 and is
    blended in by training (``train.v1_negative_warmup``), so the step-0 gap without it is worth printing."""

    source: type
    target: type
    config: Callable[..., ModelConfig]
    model: Callable[..., DiffTransformerLM]
    added: str
    warmed_up: bool = False


CONVERSIONS: tuple[Conversion, ...] = (
    Conversion(BaselineAttention, DiffV1Attention,
               lambda cfg, headwise_norm=False, **_: diff_v1_config_from_baseline(cfg, headwise_norm),
               lambda m, headwise_norm=False, seed=0, **_: baseline_to_diff_v1(m, headwise_norm, seed=seed),
               "a second query and key map per head and the lambda vectors", warmed_up=True),
    Conversion(BaselineAttention, DiffV2Attention,
               lambda cfg, v2_lambda="sigmoid", **_: diff_v2_config_from_baseline(cfg, v2_lambda),
               lambda m, v2_lambda="sigmoid", **_: baseline_to_diff_v2(m, v2_lambda),
               "the second query of each pair and W_lambda, set so that the function is unchanged"),
)


def _conversions_in_words() -> str:
    """"baseline -> diff_v1 or diff_v2", from the table."""
    by_source: dict[str, list[str]] = {}
    for c in CONVERSIONS:
        by_source.setdefault(_name(c.source), []).append(_name(c.target))
    return "; ".join(f"{s} -> {' or '.join(t)}" for s, t in by_source.items())


def conversion(source: str, attention: str) -> Optional[Conversion]:
    """How a ``source`` model becomes ``attention`` with the same function: None when it already is one, a
    ValueError naming the conversions there are when none exists (or naming the variants for an unknown name)."""
    src, dst = variant(source), variant(attention)
    if src is dst:
        return None
    for c in CONVERSIONS:
        if c.source is src.cls and c.target is dst.cls:
            return c
    raise ValueError(f"attention={attention!r} is not a conversion of a {source} model that keeps its function "
                     f"(only {_conversions_in_words()}, or a variant to itself)")


def targets(cfg: ModelConfig) -> tuple[str, ...]:
    """The variants a model of ``cfg`` converts to (itself included), in the registry's order."""
    src = variant(cfg.attention)
    reach = {src.cls} | {c.target for c in CONVERSIONS if c.source is src.cls}
    return tuple(v.name for v in variants() if v.cls in reach)


@overload
def convert(model_or_config: DiffTransformerLM, attention: str, *, v2_lambda: str = ..., headwise_norm: bool = ...,
            seed: int = ...) -> DiffTransformerLM: ...
@overload
def convert(model_or_config: ModelConfig, attention: str, *, v2_lambda: str = ..., headwise_norm: bool = ...,
            seed: int = ...) -> ModelConfig: ...
def convert(model_or_config: Union[DiffTransformerLM, ModelConfig], attention: str, *, v2_lambda: str = "sigmoid",
            headwise_norm: bool = False, seed: int = 0) -> Union[DiffTransformerLM, ModelConfig]:
    """``model_or_config`` (a ``DiffTransformerLM``, left unchanged, or a ``ModelConfig``) as ``attention`` with the
    same function: itself when it already is that variant, else the one conversion between the two (``v2_lambda``
    for DIFF V2; ``headwise_norm`` and ``seed`` for DIFF V1); a ValueError naming the allowed conversions else."""
    if isinstance(model_or_config, DiffTransformerLM):
        cfg = model_or_config.cfg
    elif isinstance(model_or_config, ModelConfig):
        cfg = model_or_config
    else:
        raise TypeError(f"convert expects a DiffTransformerLM or a ModelConfig, got {type(model_or_config).__name__}")
    c = conversion(cfg.attention, attention)
    if c is None:
        return model_or_config
    options = dict(v2_lambda=v2_lambda, headwise_norm=headwise_norm, seed=seed)
    if isinstance(model_or_config, DiffTransformerLM):
        return c.model(model_or_config, **options)
    return c.config(cfg, **options)
