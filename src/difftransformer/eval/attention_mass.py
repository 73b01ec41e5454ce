"""Scale-free attention mass on the answer vs the rest of the context (paper section 3.4, Table 3; Fig. 1).

Why scale-free: the baseline's softmax row sums to 1, but DIFF's differential row ``A1 - lambda*A2`` sums to
``1 - lambda`` (V1 eq. 1; V2 per query head), and the head-wise norm (V1 eq. 3) then rescales the output. Raw
masses of DIFF and baseline are therefore on different scales: a DIFF row with lambda = 0.8 has at most 0.2 of
signed mass to give anywhere, and comparing 0.2 to the baseline's 1.0 says nothing about noise. We divide by the
row's absolute mass over the context instead:

    answer_share = sum(row[answer]) / sum(|row[context]|)          (signed: a negative answer weight counts against)
    noise_share  = sum(|row[context \\ answer]|) / sum(|row[context]|)   (magnitude that reaches the values from
                                                                    distractors, of either sign)

Both are unchanged when a row is multiplied by any c > 0. The signed raw numbers are returned beside them
(``answer_raw``, ``rest_raw``, ``row_sum``), and ``context_fraction`` = sum(|row[context]|) / sum(|row|) says how
much of the row lies on the context at all (the rest is on BOS / earlier questions). A row with no mass on the
context has undefined shares: NaN, not a silent 0.
"""

from __future__ import annotations

import torch


def attention_shares(rows: torch.Tensor, answer: torch.Tensor, context: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row masses. rows (..., Tk) attention rows (any sign); answer, context (..., Tk) boolean key masks,
    broadcastable to rows, with answer a subset of context. Returns a dict of (...) float64 tensors:
    answer_share, noise_share, answer_raw, rest_raw, row_sum, context_fraction."""
    if rows.shape[-1] != answer.shape[-1] or rows.shape[-1] != context.shape[-1]:
        raise ValueError(f"key masks {tuple(answer.shape)}, {tuple(context.shape)} do not match rows "
                         f"{tuple(rows.shape)} in the key dimension")
    answer, context = answer.to(torch.bool), context.to(torch.bool)
    if bool((answer & ~context).any()):
        raise ValueError("the answer mask must lie inside the context mask")
    r = rows.to(torch.float64)
    rest = context & ~answer
    a = r.abs()
    ctx_abs = (a * context).sum(-1)
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=r.device)
    denom = torch.where(ctx_abs > 0, ctx_abs, nan)  # undefined on a row with nothing on the context
    total_abs = a.sum(-1)
    return {
        "answer_share": (r * answer).sum(-1) / denom,
        "noise_share": (a * rest).sum(-1) / denom,
        "answer_raw": (r * answer).sum(-1),
        "rest_raw": (r * rest).sum(-1),
        "row_sum": r.sum(-1),
        "context_fraction": ctx_abs / torch.where(total_abs > 0, total_abs, nan),
    }
