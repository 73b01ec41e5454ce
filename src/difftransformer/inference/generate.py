"""Autoregressive generation with the model's static KV cache (the gpt-fast design).

One ``prefill`` forward writes the prompt's keys and values into the cache, then a tiny ``decode_step`` feeds one
token per sequence at a time at ``input_pos``. Sampling (greedy, temperature, top-k, top-p) stays on the device:
the categorical draw uses the exponential race ``argmax(p / E)``, E ~ Exp(1), which needs no ``.item()``.

Batches of prompts of different lengths are LEFT-padded to the longest one and a padding mask hides the pad keys.
Every row then shares the same positions: a row's real tokens start at position ``P - len`` instead of 0, which
RoPE cannot tell apart (attention scores depend only on position differences), so a padded row gets the logits it
would get alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..model.transformer import DiffTransformerLM

DecodeFn = Callable[[DiffTransformerLM, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# Below this a temperature is not "nearly greedy" but broken: logits / 1e-45 overflow float32 to inf, the softmax
# turns them into NaN and no token comes out. 0 asks for greedy explicitly.
MIN_TEMPERATURE = 1e-4


@dataclass
class SamplingConfig:
    """How the next token is chosen. ``temperature=0`` is greedy (top-k/top-p then change nothing)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_k: Optional[int] = None  # keep the k most likely tokens
    top_p: Optional[float] = None  # nucleus: keep the smallest set whose probability is >= top_p
    seed: Optional[int] = None  # None: torch's global RNG
    stop_tokens: tuple[int, ...] = ()  # a row ends at the first of these (it is not returned)

    def __post_init__(self) -> None:
        self.stop_tokens = tuple(int(t) for t in self.stop_tokens)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature={self.temperature!r} is too small to sample with (the logits divided by "
                             f"it overflow); use 0 for greedy or at least {MIN_TEMPERATURE:g}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 1):
            raise ValueError(f"top_k must be a positive integer or unset, got {self.top_k!r}")
        if self.top_p is not None and (isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float))
                                       or not 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] or unset, got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class GenerationOutput:
    tokens: list[list[int]]  # new tokens per prompt, stop token excluded
    stopped: list[bool]  # True where the row ended on a stop token (else it hit max_new_tokens)
    prompt_lengths: list[int] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- sampling
def filter_logits(logits: torch.Tensor, top_k: Optional[int], top_p: Optional[float]) -> torch.Tensor:
    """Set logits outside the top-k / top-p (nucleus, Holtzman et al. 2020) sets to -inf. logits (B, V)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens before it already hold top_p of the mass; the first is always kept.
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def sample_next(logits: torch.Tensor, cfg: SamplingConfig, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Next token ids (B,) from last-position logits (B, V), without a host sync."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits.float() / cfg.temperature, cfg.top_k, cfg.top_p)
    probs = torch.softmax(logits, dim=-1)
    # argmax(p_i / E_i), E_i ~ Exp(1), is a draw from Categorical(p) (the exponential race); no multinomial sync.
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax(dim=-1)


# ---------------------------------------------------------------------------------------------- batching
def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0,
             device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, P) left-padded with ``pad_id`` and a bool mask (B, P), True on real tokens."""
    if len(prompts) == 0:
        raise ValueError("no prompt given")
    lengths = [len(p) for p in prompts]
    for i, n in enumerate(lengths):
        if n == 0:
            raise ValueError(f"prompt {i} is empty: give at least one token")
    P = max(lengths)
    # built on the host, row by row, then one copy each to ``device`` (not one small copy per prompt)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros(len(prompts), P, dtype=torch.bool, device="cpu")
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.as_tensor(list(p), dtype=torch.long, device="cpu")
        mask[i, P - len(p):] = True
    return ids.to(device), mask.to(device)


def check_vocab(ids: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> None:
    real = ids[mask]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab_size):
        raise ValueError(f"prompt token ids must lie in [0, {vocab_size}), got {int(real.min())}..{int(real.max())}")


# ---------------------------------------------------------------------------------------------- model steps
def prefill(model: DiffTransformerLM, ids: torch.Tensor, cache_mask: torch.Tensor) -> torch.Tensor:
    """Run the whole (padded) prompt through the model, filling the cache; last-position logits (B, V)."""
    input_pos = torch.arange(ids.shape[1], device=ids.device)
    return model(ids, input_pos=input_pos, attention_mask=cache_mask, logits_to_keep=1).logits[:, -1]


def decode_step(model: DiffTransformerLM, token: torch.Tensor, input_pos: torch.Tensor,
                cache_mask: torch.Tensor) -> torch.Tensor:
    """One token per row: token (B, 1) at input_pos (1,); logits (B, V). The part worth ``torch.compile``."""
    return model(token, input_pos=input_pos, attention_mask=cache_mask).logits[:, -1]


def compiled_decode_step(mode: Optional[str] = None) -> DecodeFn:
    """``decode_step`` under ``torch.compile`` (static shapes: the cache and the mask never change size)."""
    return torch.compile(decode_step, mode=mode, dynamic=False)


class CUDAGraphDecode:
    """``decode_step`` captured once as a CUDA graph and replayed: no per-kernel launch cost (gpt-fast's
    "reduce-overhead" without a compiler). Valid for one cache set-up: build a new one per generation.

    The warm-up and capture run the real first step (same token, same position), so the cache writes they make
    are the ones that step makes anyway.
    """

    def __init__(self) -> None:
        self.graph: Optional[torch.cuda.CUDAGraph] = None

    def __call__(self, model: DiffTransformerLM, token: torch.Tensor, input_pos: torch.Tensor,
                 cache_mask: torch.Tensor) -> torch.Tensor:
        if self.graph is None:
            if token.device.type != "cuda":
                raise ValueError(f"decode mode 'cuda-graph' needs a CUDA model, this one is on {token.device.type}")
            self.token, self.pos, self.mask = token.clone(), input_pos.clone(), cache_mask
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    decode_step(model, self.token, self.pos, self.mask)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = decode_step(model, self.token, self.pos, self.mask)
        elif cache_mask is not self.mask:
            raise ValueError("a CUDAGraphDecode serves one generation; build a new one")
        self.token.copy_(token)
        self.pos.copy_(input_pos)
        self.graph.replay()
        return self.logits


DECODE_MODES = ("eager", "compile", "cuda-graph")


def decode_function(mode: str) -> DecodeFn:
    """A fresh decode step for one generation: ``eager``, ``compile`` (torch.compile) or ``cuda-graph``."""
    if mode == "eager":
        return decode_step
    if mode == "compile":
        return compiled_decode_step()
    if mode == "cuda-graph":
        return CUDAGraphDecode()
    raise ValueError(f"decode mode {mode!r} is not allowed; choose one of {', '.join(DECODE_MODES)}")


def check_decode_device(model: DiffTransformerLM, mode: str) -> None:
    """Refuse 'cuda-graph' for a model off CUDA up front (it would fail only after the first decoded token)."""
    device = model.output.weight.device.type
    if mode == "cuda-graph" and device != "cuda":
        raise ValueError(f"decode mode 'cuda-graph' needs a CUDA model, this one is on {device}")


def check_context(model: DiffTransformerLM, prompt_len: int, max_new_tokens: int) -> int:
    """``prompt_len + max_new_tokens`` when it fits the model's context, else a ValueError saying what to change."""
    limit = model.cfg.max_seq_len
    if prompt_len >= limit:
        raise ValueError(f"the prompt has {prompt_len} tokens but the model's context (max_seq_len) is {limit}: "
                         f"shorten it to at most {limit - 1} tokens")
    if prompt_len + max_new_tokens > limit:
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                         f"context (max_seq_len={limit}): use max_new_tokens <= {limit - prompt_len}")
    return prompt_len + max_new_tokens


# ---------------------------------------------------------------------------------------------- generation
@torch.inference_mode()
def stream(model: DiffTransformerLM, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, *,
           pad_id: int = 0, decode_fn: Optional[DecodeFn] = None,
           stop_check_every: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(tokens, done)`` per step: the new token of every row (B,) and which rows have ended (B,) bool.

    Both stay on the model's device (no host sync here, except the early-exit test every ``stop_check_every``
    steps when stop tokens are set). A row that has ended yields ``pad_id``. The KV cache is set up for exactly
    ``P + max_new_tokens`` positions and dropped afterwards.
    """
    device = model.output.weight.device
    ids, mask = left_pad(prompts, pad_id, device)
    check_vocab(ids, mask, model.cfg.vocab_size)
    B, P = ids.shape
    total = check_context(model, P, sampling.max_new_tokens)
    decode_fn = decode_fn or decode_step
    gen = None
    if sampling.seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(sampling.seed)
    stop = torch.tensor(sampling.stop_tokens, dtype=torch.long, device=device) if sampling.stop_tokens else None
    # Padding mask over every cache position: pad slots hidden, future slots real (causality hides them).
    cache_mask = torch.ones(B, total, dtype=torch.bool, device=device)
    cache_mask[:, :P] = mask

    was_training = model.training
    model.eval()
    model.setup_caches(B, total, dtype=model.output.weight.dtype, device=device)
    try:
        done = torch.zeros(B, dtype=torch.bool, device=device)
        logits = prefill(model, ids, cache_mask)
        input_pos = torch.full((1,), P, dtype=torch.long, device=device)
        for step in range(sampling.max_new_tokens):
            token = sample_next(logits, sampling, gen)
            token = torch.where(done, torch.full_like(token, pad_id), token)
            if stop is not None:
                done = done | torch.isin(token, stop)
            yield token, done
            if stop is not None and (step + 1) % stop_check_every == 0 and bool(done.all()):
                return
            if step + 1 < sampling.max_new_tokens:  # the next step's logits, from this step's token
                logits = decode_fn(model, token[:, None], input_pos, cache_mask)
                input_pos += 1
    finally:
        model.clear_caches()
        model.train(was_training)


def generate(model: DiffTransformerLM, prompts: Sequence[Sequence[int]], sampling: Optional[SamplingConfig] = None,
             *, pad_id: int = 0, decode: str = "eager",
             on_token: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None) -> GenerationOutput:
    """Generate for a batch of token-id prompts (lists of ints, lengths may differ).

    ``on_token(tokens, done)`` is called with each step's (B,) device tensors (streaming). ``decode`` picks how
    the per-token step runs: ``eager``, ``compile`` (``torch.compile``; the first call pays the compilation) or
    ``cuda-graph`` (captured once per generation, CUDA only).
    """
    sampling = sampling or SamplingConfig()
    decode_fn = decode_function(decode)
    check_decode_device(model, decode)
    steps, dones = [], []
    for token, done in stream(model, prompts, sampling, pad_id=pad_id, decode_fn=decode_fn, stop_check_every=8):
        steps.append(token)
        dones.append(done)
        if on_token is not None:
            on_token(token, done)
    new = torch.stack(steps, dim=1).tolist()  # (B, steps): one host transfer at the end
    stop_set = set(sampling.stop_tokens)
    tokens, stopped = [], []
    for row in new:
        cut = next((i for i, t in enumerate(row) if t in stop_set), None)
        tokens.append(row if cut is None else row[:cut])
        stopped.append(cut is not None)
    return GenerationOutput(tokens=tokens, stopped=stopped, prompt_lengths=[len(p) for p in prompts])
