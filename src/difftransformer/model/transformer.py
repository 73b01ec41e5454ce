"""The decoder-only language model around the attention (paper section 2.2).

  Y = X + MultiHead(RMSNorm(X)),   X' = Y + SwiGLU(RMSNorm(Y)),   then a final RMSNorm and the LM head.

Baseline, DIFF V1 and DIFF V2 differ only in the attention module (``ModelConfig.attention``). The model holds no
training machinery: parallelism, compile, quantisation and checkpoint I/O are applied from outside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, cast

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention, AttentionMaps, build_attention
from .attention.base import normal_init_, prefill_from_start
from .attention.masks import build_mask
from .config import ModelConfig
from .kv_cache import KVCache
from .norm import RMSNorm
from .pretrained import WEIGHTS_NAME, assign_weights, read_model_dir, save_pretrained
from .rope import rotary


class SwiGLU(nn.Module):
    """FFN(x) = W2 (silu(W1 x) * W3 x) (Shazeer, 2020), hidden width about 8/3 d_model."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)  # gate
        self.w3 = nn.Linear(d_model, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, d_model, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = build_attention(cfg, layer_idx)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = SwiGLU(cfg.d_model, cfg.ffn_hidden)

    def forward(self, x, rope, mask, input_pos=None, return_maps=False, rows=None):
        """rows: None, or (positions (B, K), their RoPE, their (B, 1, K, T) mask): the block's output only at those
        positions (B, K, d_model), the keys and values still from every position (``DiffTransformerLM.forward``)."""
        h = self.attn_norm(x)
        if rows is None:
            a, maps = self.attn(h, rope, mask, input_pos, return_maps)
            y = x + a
        else:
            pos, qrope, qmask = rows
            a, maps = self.attn(h, rope, mask, input_pos, return_maps, query=(_gather_rows(h, pos), qrope, qmask))
            y = _gather_rows(x, pos) + a
        return y + self.ffn(self.ffn_norm(y)), maps


def _gather_rows(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x (B, T, d) at positions pos (B, K) -> (B, K, d)."""
    return x.gather(1, pos[..., None].expand(-1, -1, x.shape[-1]))


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, vocab)
    loss: Optional[torch.Tensor] = None
    maps: Optional[list[AttentionMaps]] = None  # one per layer, with return_maps=True
    hidden_states: Optional[list[torch.Tensor]] = None  # embeddings, then the residual stream after each block


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean next-token cross-entropy in float32; targets already shifted, ``ignore_index`` skipped."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index)


class DiffTransformerLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"DiffTransformerLM expects a ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        # on the meta device (a model built to be filled: from_state_dict, parameter counts) nothing is drawn: see
        # normal_init_ (nn.Embedding draws its own N(0, 1) unless given its weight; init_weights redraws it anyway)
        on_meta = torch.get_default_device().type == "meta"
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model, _weight=torch.empty(
            cfg.vocab_size, cfg.d_model) if on_meta else None)
        # A ModuleList, typed by what it holds (a type checker sees its items as plain Modules).
        self.layers = cast("Sequence[Block]", nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers)))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.output = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # forward(logits_at=...) runs the last block at those positions only (same math, less work); False runs every
        # block at every position (the benchmarks time the two)
        self.rows_only_last_block = True
        self.init_weights()

    # ------------------------------------------------------------------ init and bookkeeping
    @torch.no_grad()
    def init_weights(self) -> None:
        """Linear and embedding weights N(0, init_std), biases 0; norm weights 1; DIFF V1 lambda vectors N(0, 0.1)."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                normal_init_(m.weight, self.cfg.init_std)
            if isinstance(m, nn.Linear) and m.bias is not None and not m.bias.is_meta:
                nn.init.zeros_(m.bias)  # qkv_bias / proj_bias (off in our language models)
            elif isinstance(m, RMSNorm) and m.weight is not None:
                nn.init.ones_(m.weight)
            if isinstance(m, Attention):
                m.reset_lambda()

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        seen, n = set(), 0
        for p in self.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        if exclude_embeddings:
            n -= self.tok_embeddings.weight.numel()
        return n

    def set_negative_weight(self, w: float) -> None:
        """Set the negative branch's warm-up weight of every layer (DIFF V1 ``v1_layout="per_head"``; else a no-op)."""
        if not 0.0 <= w <= 1.0:
            raise ValueError(f"negative-branch weight must be in [0, 1], got {w!r}")
        for layer in self.layers:
            layer.attn.set_negative_weight(w)

    def set_backend(self, backend: str) -> None:
        """Switch every layer's attention backend (``eager``, ``sdpa`` or ``blocked``) in place."""
        self.cfg = self.cfg.replace(backend=backend)  # validates
        for layer in self.layers:
            layer.attn.backend = backend

    # ------------------------------------------------------------------ KV cache
    def setup_caches(self, batch_size: int, max_seq_len: int, dtype: Optional[torch.dtype] = None,
                     device: Optional[torch.device] = None) -> None:
        """Preallocate a static KV cache per layer; later forwards must pass ``input_pos``."""
        if max_seq_len > self.cfg.max_seq_len:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds ModelConfig.max_seq_len={self.cfg.max_seq_len}")
        p = self.output.weight
        for layer in self.layers:
            kh, kd, vh, vd = layer.attn.cache_layout()
            layer.attn.kv_cache = KVCache(batch_size, max_seq_len, kh, kd, vh, vd, dtype or p.dtype, device or p.device)

    def clear_caches(self) -> None:
        for layer in self.layers:
            layer.attn.kv_cache = None

    def cache_nbytes(self) -> int:
        return sum(layer.attn.kv_cache.nbytes() for layer in self.layers if layer.attn.kv_cache is not None)

    # ------------------------------------------------------------------ forward
    def build_mask(self, B: int, T: int, input_pos: Optional[torch.Tensor], attention_mask: Optional[torch.Tensor],
                   device: torch.device) -> Optional[torch.Tensor]:
        """Boolean (B or 1, 1, T, Tk) mask, or None for plain causal attention over the input.

        Key j is visible to the query at position p when j <= p and (with a padding mask) key j is real. A query
        that sees no key at all (a left-pad position) may see itself, so its row stays finite; it is ignored.

        A prefill from position 0 under a KV cache (``prefill_from_start``) attends only over its own T keys (the
        layers read the new keys, not the cache): the mask is then (.., T, T), or None when no key is padding.
        """
        cache = self.layers[0].attn.kv_cache
        if cache is None and attention_mask is None:
            return None
        tk = cache.max_seq_len if cache is not None else T
        if cache is not None and prefill_from_start(T, input_pos):
            if attention_mask is not None and attention_mask.shape != (B, tk):
                raise ValueError(f"attention_mask must have shape (batch, {tk}) = ({B}, {tk}), "
                                 f"got {tuple(attention_mask.shape)}")
            attention_mask = None if attention_mask is None else attention_mask[:, :T]
            if attention_mask is None or bool(attention_mask.all()):
                return None  # plain causal over the prompt: the fast is_causal kernels
            tk = T
        if attention_mask is not None and attention_mask.shape != (B, tk):
            raise ValueError(f"attention_mask must have shape (batch, {tk}) = ({B}, {tk}), "
                             f"got {tuple(attention_mask.shape)}")
        return build_mask(T, tk, causal=True, device=device, query_pos=input_pos,
                          key_valid=None if attention_mask is None else attention_mask.to(torch.bool))

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None, *,
                attention_mask: Optional[torch.Tensor] = None, input_pos: Optional[torch.Tensor] = None,
                return_maps: bool = False, return_hidden: bool = False,
                logits_to_keep: Optional[int] = None, logits_at: Optional[torch.Tensor] = None) -> LMOutput:
        """idx (B, T) token ids; targets (B, T) next-token ids (-100 = ignore) for the loss.

        logits_at: (B, K) positions; the output layer only there (logits (B, K, vocab)), for tasks scored at a few
        known positions (the retrieval benchmark's answers: the full head and its softmax were a third of a step).

        logits_to_keep: compute the output layer for the last k positions only (logits (B, k, vocab)); a prompt's
        prefill needs one, and the full (B, T, vocab) tensor is the largest of the forward at long prompts.

        attention_mask: (B, Tk) bool/int, 1 for real tokens, over all key positions (Tk = T, or the cache length
        when a KV cache is set up). input_pos: (T,) positions of idx, required with a KV cache (default 0..T-1).
        """
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"idx must be a torch.Tensor of token ids, got {type(idx).__name__}")
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (batch, seq_len), got {tuple(idx.shape)}")
        if idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
            raise TypeError(f"idx must hold integer token ids, got {idx.dtype}")
        # the ids' range, read on the host where that costs nothing (the CPU) or once per call of many tokens; not per
        # decode step on an accelerator, nor under compile (an embedding lookup out of range is a device assert)
        if idx.numel() and not idx.is_meta and not torch.compiler.is_compiling() and (
                idx.device.type == "cpu" or idx.shape[1] > 1):
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= self.cfg.vocab_size:
                raise ValueError(f"idx holds token ids outside [0, {self.cfg.vocab_size}): {lo} .. {hi}")
        if logits_to_keep is not None:
            if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 1:
                raise ValueError(f"logits_to_keep must be a positive integer or None, got {logits_to_keep!r}")
            if targets is not None:
                raise ValueError("logits_to_keep cannot be combined with targets (the loss needs every position)")
        if logits_at is not None:
            if logits_to_keep is not None or targets is not None:
                raise ValueError("logits_at cannot be combined with logits_to_keep or targets")
            if logits_at.dim() != 2 or logits_at.shape[0] != idx.shape[0] or logits_at.dtype != torch.long:
                raise ValueError(f"logits_at must be a (batch, K) int64 tensor of positions, got "
                                 f"{tuple(logits_at.shape)} {logits_at.dtype}")
        B, T = idx.shape
        limit = self.cfg.max_seq_len
        if input_pos is None and self.layers[0].attn.kv_cache is not None:
            raise ValueError("input_pos is required when a KV cache is set up (call clear_caches() to drop it)")
        if input_pos is None:
            last = T
        elif self.layers[0].attn.kv_cache is None or (input_pos.device.type == "cpu"
                                                       and not torch.compiler.is_compiling()):
            last = int(input_pos[-1]) + 1
        else:  # decoding on an accelerator or under compile: no host sync (and no recompile) per token; the
            last = 0  # cache bounds the positions
        if last > limit:
            raise ValueError(f"sequence length {last} exceeds ModelConfig.max_seq_len={limit}")
        pos = input_pos if input_pos is not None else torch.arange(T, device=idx.device)
        c = self.cfg
        scaling = (c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor, c.rope_original_max_len)
        rope = rotary(pos, c.head_dim, c.rope_theta, scaling if c.rope_type == "llama3" else None)  # (T, 1, d/2) each
        mask = self.build_mask(B, T, input_pos, attention_mask, idx.device)

        x = self.tok_embeddings(idx)  # (B, T, d_model)
        hidden: Optional[list[torch.Tensor]] = [x] if return_hidden else None
        maps: Optional[list[AttentionMaps]] = [] if return_maps else None
        # With logits_at, nothing after the last block's attention is read anywhere but at those positions: the last
        # block's queries, output projection, residual and FFN run there only (the keys and values of every
        # position still feed its attention). The same math, a fraction of the last block's work.
        rows_only = logits_at is not None and self._rows_path(idx, attention_mask, input_pos, return_maps,
                                                               return_hidden)
        for i, layer in enumerate(self.layers):
            if rows_only and i == len(self.layers) - 1:
                assert logits_at is not None
                qrope = (rope[0][logits_at], rope[1][logits_at])  # (B, K, 1, d/2) each
                qmask = build_mask(logits_at.shape[1], T, causal=True, device=idx.device, query_pos=logits_at)
                x, m = layer(x, rope, mask, input_pos, return_maps, rows=(logits_at, qrope, qmask))  # (B, K, d)
            else:
                x, m = layer(x, rope, mask, input_pos, return_maps)
            if maps is not None:
                maps.append(m)
            if hidden is not None:
                hidden.append(x)
        if logits_to_keep is not None:
            x = x[:, -logits_to_keep:]  # the output layer (B, T, vocab) only where it is read
        elif logits_at is not None and not rows_only:
            x = _gather_rows(x, logits_at)  # (B, K, d_model)
        logits = self.output(self.norm(x))  # (B, T or logits_to_keep, vocab)
        loss = lm_loss(logits, targets) if targets is not None else None
        return LMOutput(logits=logits, loss=loss, maps=maps, hidden_states=hidden)

    def _rows_path(self, idx: torch.Tensor, attention_mask: Optional[torch.Tensor], input_pos: Optional[torch.Tensor],
                   return_maps: bool, return_hidden: bool) -> bool:
        """Whether a ``logits_at`` forward runs its last block at those positions only: plain causal self-attention
        (no padding mask, no KV cache), nothing per position asked back, a PyTorch attention path (eager or sdpa;
        ``auto`` is sdpa on the CPU), and a last layer that takes a row subset of queries."""
        backend = self.cfg.backend
        pytorch_path = backend in ("eager", "sdpa") or (backend == "auto" and idx.device.type == "cpu")
        last = self.layers[-1].attn
        return (self.rows_only_last_block and pytorch_path and attention_mask is None and input_pos is None
                and last.kv_cache is None and not return_maps and not return_hidden and last.takes_query_rows)

    # ------------------------------------------------------------------ our own format (see pretrained.py)
    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, state: dict, where: str = "weights") -> DiffTransformerLM:
        """The model of ``cfg`` holding ``state``: built on the meta device, the tensors assigned (no init)."""
        with torch.device("meta"):
            model = cls(cfg)
        return assign_weights(model, state, where).eval()

    @classmethod
    def from_pretrained(cls, path, device="cpu", dtype=None, backend=None) -> DiffTransformerLM:
        """Load config.json + model.safetensors from one model directory (a run's: ``rundir.resolve_checkpoint``)."""
        cfg, state = read_model_dir(path)
        if backend is not None:
            cfg = cfg.replace(backend=backend)
        model = cls.from_state_dict(cfg, state, where=str(Path(path) / WEIGHTS_NAME)).to(device=device)
        return model.to(dtype=dtype) if dtype is not None else model

    def save_pretrained(self, directory, tokenizer_file=None):
        """Write config.json + model.safetensors (+ tokenizer.json) atomically to ``directory``."""
        return save_pretrained(self, directory, tokenizer_file=tokenizer_file)

    def lambdas(self) -> list[float]:
        """DIFF V1's current lambda per layer (eq. 2); empty for other variants."""
        with torch.no_grad():
            lams = (layer.attn.static_lambda() for layer in self.layers)
            return [float(x) for x in lams if x is not None]
