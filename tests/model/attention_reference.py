"""Naive references written straight from the equations, head by head, with no code shared with the package.

Used as the test oracle in float64. Each takes the attention module (only to read its parameters, so autograd
reaches the same leaves), the input x (B, T, d_model) and a key-padding mask (B, T) of real tokens (or None).
"""

from __future__ import annotations

import math

import torch


def rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Interleaved RoPE on x (T, d): pair (2i, 2i+1) at position t rotated by t * theta^(-2i/d)."""
    T, d = x.shape
    out = torch.empty_like(x)
    for i in range(d // 2):
        ang = torch.arange(T, dtype=x.dtype) * theta ** (-2 * i / d)
        c, s = torch.cos(ang), torch.sin(ang)
        a, b = x[:, 2 * i], x[:, 2 * i + 1]
        out[:, 2 * i] = a * c - b * s
        out[:, 2 * i + 1] = a * s + b * c
    return out


def visible(T: int, pad_row: torch.Tensor | None) -> torch.Tensor:
    """(T, T) bool: key s visible to query t when s <= t and s is a real token (a row with none sees itself)."""
    m = torch.ones(T, T, dtype=torch.bool).tril()
    if pad_row is not None:
        m = m & pad_row[None, :]
        empty = ~m.any(-1)
        m[empty, empty.nonzero().flatten()] = True
    return m


def softmax_attn(q, k, vis):
    s = q @ k.T / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~vis, float("-inf")), dim=-1)


def rms(x, eps=1e-5):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rows(w: torch.Tensor, j: int, width: int) -> torch.Tensor:
    """Rows j*width .. (j+1)*width-1 of a projection weight: the j-th head's slice."""
    return w[j * width:(j + 1) * width]


def baseline(mod, x, pad=None):
    B, T, _ = x.shape
    H, Hkv, d = mod.n_heads, mod.n_kv_heads, mod.head_dim
    outs = []
    for b in range(B):
        vis, heads = visible(T, None if pad is None else pad[b]), []
        for i in range(H):
            g = i // (H // Hkv)
            q = rope(x[b] @ rows(mod.wq.weight, i, d).T)
            k = rope(x[b] @ rows(mod.wk.weight, g, d).T)
            v = x[b] @ rows(mod.wv.weight, g, d).T
            heads.append(softmax_attn(q, k, vis) @ v)
        outs.append(torch.cat(heads, -1) @ mod.wo.weight.T)
    return torch.stack(outs)


def diff_v1(mod, x, layer_idx: int, pad=None, lambda_init=None):
    """Eq. (1)-(3), half-heads 2i/2i+1 = Q1/Q2 of head i, key half-heads 2g/2g+1 = K1/K2 of group g."""
    B, T, _ = x.shape
    h, hkv, d = mod.n_heads, mod.n_kv_heads, mod.head_dim
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * layer_idx) if lambda_init is None else lambda_init
    lam = (torch.exp((mod.lambda_q1 * mod.lambda_k1).sum()) - torch.exp((mod.lambda_q2 * mod.lambda_k2).sum())
           + lam_init)
    if getattr(mod, "neg_weight", None) is not None:  # per_head layout: the negative branch's warm-up weight
        lam = lam * mod.neg_weight
    dv = mod.wv.weight.shape[0] // hkv  # 2d (paper layout) or d (per_head layout)
    outs = []
    for b in range(B):
        vis, heads = visible(T, None if pad is None else pad[b]), []
        for i in range(h):
            g = i // (h // hkv)
            q1 = rope(x[b] @ rows(mod.wq.weight, 2 * i, d).T)
            q2 = rope(x[b] @ rows(mod.wq.weight, 2 * i + 1, d).T)
            k1 = rope(x[b] @ rows(mod.wk.weight, 2 * g, d).T)
            k2 = rope(x[b] @ rows(mod.wk.weight, 2 * g + 1, d).T)
            v = x[b] @ rows(mod.wv.weight, g, dv).T  # (T, dv)
            head = (softmax_attn(q1, k1, vis) - lam * softmax_attn(q2, k2, vis)) @ v
            if mod.subln is not None:
                head = rms(head)
                if mod.subln.weight is not None:
                    head = head * mod.subln.weight
            heads.append((1 - lam_init) * head)
        outs.append(torch.cat(heads, -1) @ mod.wo.weight.T)
    return torch.stack(outs)


def diff_v2(mod, x, pad=None):
    """Query heads 2i, 2i+1 share KV head (2i) // (2H / H_kv); out_i = attn_2i - sigmoid(x W_lambda_i) attn_2i+1.
    Under ``v2_pairing="halves"`` (the ablation) head i pairs with head H + i, each reading its own KV head j //
    (2H / H_kv) for its keys and its values."""
    B, T, _ = x.shape
    H, Hkv, d = mod.n_heads, mod.n_kv_heads, mod.head_dim
    outs = []
    for b in range(B):
        vis, heads = visible(T, None if pad is None else pad[b]), []
        for i in range(H):
            pair = []
            for j in ((2 * i, 2 * i + 1) if mod.pairing == "interleaved" else (i, H + i)):
                g = j // (2 * H // Hkv)
                q = rope(x[b] @ rows(mod.wq.weight, j, d).T)
                k = rope(x[b] @ rows(mod.wk.weight, g, d).T)
                v = x[b] @ rows(mod.wv.weight, g, d).T
                pair.append(softmax_attn(q, k, vis) @ v)
            lam = torch.sigmoid(x[b] @ mod.wlambda.weight[i])  # (T,)
            heads.append(pair[0] - lam[:, None] * pair[1])
        outs.append(torch.cat(heads, -1) @ mod.wo.weight.T)
    return torch.stack(outs)


def diff_v2_arm(mod, x, layer_idx: int, pad=None):
    """DIFF V2 with the retrieval diagnostic's switches, from the equations (interleaved pairs only):
    ``v2_keys="separate"``: query head 2i reads key head 2g and 2i+1 reads 2g+1 of its group g (K1, K2), the one value
    head g; ``v2_lambda="scalar"``: DIFF V1's eq. (2) lambda, one per layer; ``v2_headwise_norm``: each head
    (1 - lambda_init) * RMSNorm(head) * weight (eq. 3), lambda_init = 0.8 - 0.6 exp(-0.3 l)."""
    cfg = mod.cfg
    B, T, _ = x.shape
    H, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
    if cfg.v2_lambda == "scalar":
        q1, k1, q2, k2 = mod.lambda_vectors
        scalar = torch.exp((q1 * k1).sum()) - torch.exp((q2 * k2).sum()) + lam_init
    outs = []
    for b in range(B):
        vis, heads = visible(T, None if pad is None else pad[b]), []
        for i in range(H):
            pair = []
            for j in (2 * i, 2 * i + 1):
                g = j // (2 * H // Hkv)
                key_head = 2 * g + j % 2 if cfg.v2_keys == "separate" else g
                q = rope(x[b] @ rows(mod.wq.weight, j, d).T)
                k = rope(x[b] @ rows(mod.wk.weight, key_head, d).T)
                v = x[b] @ rows(mod.wv.weight, g, d).T
                pair.append(softmax_attn(q, k, vis) @ v)
            lam = scalar if cfg.v2_lambda == "scalar" else torch.sigmoid(x[b] @ mod.wlambda.weight[i])[:, None]
            head = pair[0] - lam * pair[1]
            if cfg.v2_headwise_norm and (cfg.v2_headwise_norm_layers == "all" or layer_idx > 0):
                head = (1 - lam_init) * rms(head) * mod.subln.weight
            heads.append(head)
        outs.append(torch.cat(heads, -1) @ mod.wo.weight.T)
    return torch.stack(outs)
