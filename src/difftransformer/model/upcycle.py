"""A trained baseline turned into DIFF V2 that computes exactly the same function (continued training starts
from the source model, not from noise).

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
"""

from __future__ import annotations

import torch

from .config import ModelConfig
from .pretrained import TIED, assign_weights
from .transformer import DiffTransformerLM


def diff_v2_config_from_baseline(cfg: ModelConfig, v2_lambda: str = "sigmoid") -> ModelConfig:
    """The DIFF V2 config with ``cfg``'s shapes (the baseline's head counts, as every config of ours names)."""
    if cfg.attention != "baseline":
        raise ValueError(f"attention={cfg.attention!r}: only a baseline model converts to DIFF V2 (a DIFF V1 model "
                         "has other query/key shapes)")
    if v2_lambda not in ("sigmoid", "raw"):
        raise ValueError(f"v2_lambda={v2_lambda!r}: a function-preserving conversion needs 'sigmoid' or 'raw' "
                         "('none' computes attn1 - attn2, which a copied query cancels to zero)")
    return cfg.replace(attention="diff_v2", v2_lambda=v2_lambda, v2_pairing="interleaved")


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


def added_parameters(source: DiffTransformerLM, converted: DiffTransformerLM) -> int:
    return converted.num_parameters() - source.num_parameters()
