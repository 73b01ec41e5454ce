"""The one mask builder: which keys each query may attend, for the model, the public layer and (tested against it,
``tests/model/test_masks.py``) the remote code's ``build_mask``.

A mask is what every attention path takes (``dispatch.py``): ``None`` for plain causal self-attention over the
whole input (the fused ``is_causal`` kernels), else a tensor broadcastable to (B, heads, Tq, Tk) in SDPA's
convention: bool True where a query may attend a key, or a float added to the logits (-inf: never).

``MaskKind`` says which of two forms a tensor has, decided once by whoever builds it, so that no path guesses:

* ``"causal"``: None, or bool (B or 1, 1, Tq, Tk) = the causal rule & real keys, a row that sees no key seeing its own
  slot. The fused DIFF kernels take these (they read the real keys off the last row: ``kernels/hook.key_padding``).
* ``"general"``: anything else (bidirectional, cross-attention, a caller's ``attn_mask``, a float bias, one mask per
  head). Only the PyTorch paths (eager, sdpa, decode) take these.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch

MaskKind = Literal["causal", "general"]
MASK_KINDS: tuple[MaskKind, ...] = ("causal", "general")


def build_mask(T: int, S: int, *, causal: bool, device: torch.device, query_pos: Optional[torch.Tensor] = None,
               key_valid: Optional[torch.Tensor] = None, attn_mask: Optional[torch.Tensor] = None,
               own_slot: bool = True) -> Optional[torch.Tensor]:
    """The mask of T queries over S keys; None where it is plain causal attention over the input (T == S, queries at
    slots 0..T-1, nothing else masked).

    causal: query at slot p sees keys 0..p. query_pos: the queries' key slots, (T,) or (B, T) (default 0..T-1; under
    a KV cache, the cache positions they are written to). key_valid: (B, S) bool, True for a real key. attn_mask: a
    caller's mask in SDPA's convention, broadcastable to (B, heads, T, S), combined with the rest (bool: and; float:
    added, -inf where the rest masks). own_slot: the keys are the queries' own (self-attention), so a query row that
    sees no key attends its own slot alone and stays finite (its output is padding's and means nothing); False
    (cross-attention): no such slot, the caller refuses empty rows (``empty_rows``).
    """
    if causal and query_pos is None and key_valid is None and attn_mask is None and T == S:
        return None
    qpos = torch.arange(T, device=device) if query_pos is None else query_pos
    kpos = torch.arange(S, device=device)
    allowed: Optional[torch.Tensor] = None
    if causal:
        allowed = (kpos <= qpos[..., None]).unsqueeze(-3)  # (1 or B, 1, T, S) once batched below
        if allowed.dim() == 3:
            allowed = allowed[None]
    if key_valid is not None:
        kv = key_valid.to(torch.bool)[:, None, None, :]  # (B, 1, 1, S)
        allowed = kv if allowed is None else allowed & kv
    floating = attn_mask is not None and attn_mask.is_floating_point()
    if attn_mask is not None and not floating:
        allowed = attn_mask if allowed is None else allowed & attn_mask
    if allowed is None and not floating:  # bidirectional, nothing masked: every key
        return torch.ones(1, 1, 1, S, dtype=torch.bool, device=device)
    can_empty = key_valid is not None or attn_mask is not None
    if floating:
        assert attn_mask is not None
        out = attn_mask if allowed is None else attn_mask.masked_fill(~allowed, float("-inf"))
        if own_slot and can_empty:
            own = (kpos == qpos[..., None]).unsqueeze(-3)
            dead = ~(out > float("-inf")).any(dim=-1, keepdim=True)
            out = torch.where(own & dead, torch.zeros((), dtype=out.dtype, device=device), out)
        return out
    assert allowed is not None
    if own_slot and can_empty:
        own = (kpos == qpos[..., None]).unsqueeze(-3)
        if own.dim() == 3:
            own = own[None]
        allowed = allowed | (own & ~allowed.any(dim=-1, keepdim=True))
    return allowed


def empty_rows(mask: torch.Tensor) -> bool:
    """Whether some query row of a mask sees no key (one host read)."""
    seen = mask if mask.dtype == torch.bool else mask > float("-inf")
    return bool((~seen.any(dim=-1)).any())


def expand_heads(mask: Optional[torch.Tensor], pairing: str) -> Optional[torch.Tensor]:
    """A mask with one entry per differential head (B, h, Tq, Tk) -> one per softmax head (B, 2h, Tq, Tk), laid out
    as the pairs are ("interleaved": heads 2i and 2i+1 are pair i; "halves": i and h+i). A mask shared by the heads
    (head axis 1) or None is returned as it is."""
    if mask is None or mask.dim() < 4 or mask.shape[-3] == 1:
        return mask
    if pairing == "interleaved":
        return mask.repeat_interleave(2, dim=-3)
    return torch.cat((mask, mask), dim=-3)
