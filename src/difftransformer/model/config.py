"""`ModelConfig`: one typed, JSON-serialisable description of a baseline / DIFF V1 / DIFF V2 language model.

Head counts are always the *baseline's* (``n_heads`` = H, ``n_kv_heads`` = H_kv). Each variant derives its own:

* baseline: H query heads, H_kv key/value heads, all of width ``head_dim`` = d.
* DIFF V1 (paper §2.1, "h = d_model / 2d"): h = H/2 differential heads, each made of two d-wide query/key
  halves and one 2d-wide value; h_kv = H_kv/2 (unilm issue #1663: halve the KV heads too). Parameters of
  the projections then equal the baseline's exactly.
* DIFF V2 (Jan 2026 article): 2H query heads, H_kv key/value heads (the baseline's KV cache), W_o the
  baseline's size, plus W_lambda: d_model -> H.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, Union, get_args

from ..fileio import atomic_write, parse_json
from . import variants

# A registered variant's name (model/variants.py; the built-in ones: baseline, diff_v1, diff_v2)
AttentionKind = str
Backend = Literal["auto", "eager", "sdpa", "blocked", "triton"]
V2Lambda = Literal["sigmoid", "none", "raw", "scalar"]
V2Keys = Literal["shared", "separate"]
V2NormLayers = Literal["all", "after_first"]
HeadGain = Literal["off", "one", "norm_start"]
V2Pairing = Literal["interleaved", "halves"]
V1Layout = Literal["paper", "per_head"]

BACKENDS: tuple[str, ...] = get_args(Backend)
V2_LAMBDA_MODES: tuple[str, ...] = get_args(V2Lambda)
V2_PAIRINGS: tuple[str, ...] = get_args(V2Pairing)
V2_KEYS: tuple[str, ...] = get_args(V2Keys)
V2_NORM_LAYERS: tuple[str, ...] = get_args(V2NormLayers)
HEAD_GAINS: tuple[str, ...] = get_args(HeadGain)
V1_LAYOUTS: tuple[str, ...] = get_args(V1Layout)


def _check_choice(name: str, value: Any, allowed: tuple[str, ...], owner: str = "ModelConfig") -> None:
    if value not in allowed:
        raise ValueError(f"{owner}.{name}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def _check_positive_int(name: str, value: Any, owner: str = "ModelConfig") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


def default_ffn_hidden(d_model: int, multiple_of: int) -> int:
    """SwiGLU hidden width: about 8/3 d_model (keeps the FFN at ~8 d_model^2 parameters), rounded up."""
    m = max(multiple_of, 1)
    return m * math.ceil(8 * d_model / 3 / m)


@dataclass(frozen=True)
class AttentionConfig:
    """What one attention layer of any variant reads: its sizes (the baseline's head counts), the variant, the backend,
    every variant's options (the registry's ``Variant.options``) and the biases and dropout. ``DiffAttention`` is
    built from one, and ``ModelConfig`` is one (its attention part), so both build the variant from the same fields
    with the same checks. Unset (``None``) sizes are resolved in ``__post_init__``."""

    attention: AttentionKind = "diff_v1"
    d_model: int = 512
    n_heads: int = 8  # the baseline's query heads H; DIFF V1 uses H/2, DIFF V2 2H
    # Typed as what they hold once built: None at construction means "derive it", done in __post_init__.
    n_kv_heads: int = None  # type: ignore[assignment]  # the baseline's KV heads H_kv (GQA); default H
    head_dim: int = None  # type: ignore[assignment]  # d; default d_model // n_heads
    backend: Backend = "auto"  # sdpa, or a kernel where measured faster: kernels/hook.py (CPU_AUTO_BLOCKED)
    # --- DIFF V1 options (paper eq. 2-3 and the Table 6 ablations) ---
    lambda_init: Union[Literal["schedule"], float] = "schedule"  # or a constant in (0, 1), e.g. 0.8 / 0.5
    headwise_norm: bool = True  # Table 6: "w/o GroupNorm" ablation when False
    headwise_norm_weight: bool = True  # official code: learnable 2d weight shared by heads; HF DiffLlama: none
    # "paper": h = H/2 heads with 2d-wide values (parameters matched to the baseline); "per_head": each of the
    # baseline's H heads becomes one differential head (queries/keys doubled, d-wide values): the layout that a
    # pretrained Llama converts to with its function kept (model/upcycle.py), with a warmed-up negative branch.
    v1_layout: V1Layout = "paper"
    # --- DIFF V2 options (the article's design ablations) ---
    v2_lambda: V2Lambda = "sigmoid"  # "none": attn1 - attn2; "raw": attn1 - lambda * attn2 without sigmoid;
    # "scalar": DIFF V1's lambda (eq. 2: four vectors per layer and lambda_init's layer schedule), one per layer
    v2_pairing: V2Pairing = "interleaved"  # "halves": first half vs second half (the wrong-grouping ablation)
    # The retrieval diagnostic's one-change arms (docs/retrieval.md): "separate": each pair's two query heads read
    # their own key head (K1, K2, as DIFF V1; W_k twice the baseline's), still one shared value head
    v2_keys: V2Keys = "shared"
    # DIFF V1's head-wise norm on each of V2's heads: RMSNorm over the d channels (learnable weight), then times
    # (1 - lambda_init) with lambda_init on the paper's layer schedule (eq. 3)
    v2_headwise_norm: bool = False
    # with v2_headwise_norm: "all" layers, or "after_first" (every layer but the first: the follow-up arm)
    v2_headwise_norm_layers: V2NormLayers = "all"
    # The head-wise norm's mechanism arms (retrieval/LONGER.md, issue 64 item 3), DIFF V1 or V2 without a head-wise
    # norm: each head's output times a learnable per-head gain g_h, no normalisation (each token keeps its magnitude).
    # "one": g_h starts at 1; "norm_start": at (1 - lambda_init) / r_h, r_h the head's output RMS over its channels,
    # mean over the tokens of the layer's first forward (the first training batch), where the norm would put it.
    # DIFF V1 then drops its fixed (1 - lambda_init) multiplier (the start holds it).
    head_gain: HeadGain = "off"
    # --- every variant: what a layer outside our language model may want (``DiffAttention``'s qkv_bias, proj_bias,
    # attn_drop); our language models use none. Biases on W_q, W_k, W_v (qkv_bias) and on W_o (proj_bias), never on
    # DIFF V2's W_lambda. attn_dropout: dropout on every softmax map while training (each of DIFF's two maps on its
    # own, before the pairs are combined, as timm's layer and SDPA's dropout_p do); off in eval.
    qkv_bias: bool = False
    proj_bias: bool = False
    attn_dropout: float = 0.0

    def __post_init__(self) -> None:
        self._resolve()
        self.validate()

    def _resolve(self) -> None:
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)  # frozen: resolved once, here
        if self.head_dim is None and isinstance(self.n_heads, int) and self.n_heads > 0:
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Every attention field; the first problem raises, naming the field (``ModelConfig.`` or
        ``AttentionConfig.``, the class checked) and what it allows."""
        me = type(self).__name__
        for name in ("d_model", "n_heads", "n_kv_heads", "head_dim"):
            _check_positive_int(name, getattr(self, name), me)
        var = variants.variant(self.attention, f"{me}.attention")
        _check_choice("backend", self.backend, BACKENDS, me)
        _check_choice("v2_lambda", self.v2_lambda, V2_LAMBDA_MODES, me)
        _check_choice("v2_pairing", self.v2_pairing, V2_PAIRINGS, me)
        _check_choice("v2_keys", self.v2_keys, V2_KEYS, me)
        _check_choice("v2_headwise_norm_layers", self.v2_headwise_norm_layers, V2_NORM_LAYERS, me)
        _check_choice("head_gain", self.head_gain, HEAD_GAINS, me)
        _check_choice("v1_layout", self.v1_layout, V1_LAYOUTS, me)
        v = self.attn_dropout
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
            raise ValueError(f"{me}.attn_dropout must be a number in [0, 1), got {v!r}")
        object.__setattr__(self, "attn_dropout", float(v))
        for name in ("headwise_norm", "headwise_norm_weight", "v2_headwise_norm", "qkv_bias", "proj_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{me}.{name} must be true or false, got {getattr(self, name)!r}")
        if self.head_dim % 2:
            raise ValueError(f"{me}.head_dim={self.head_dim} must be even (RoPE rotates pairs of channels)")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{me}.n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.lambda_init != "schedule":
            v = self.lambda_init
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v < 1.0:
                raise ValueError(f"{me}.lambda_init={v!r} is not allowed; use \"schedule\" or a number in (0, 1)")
            object.__setattr__(self, "lambda_init", float(v))
        if self.v2_headwise_norm_layers != "all" and not self.v2_headwise_norm:
            raise ValueError(f"{me}.v2_headwise_norm_layers needs v2_headwise_norm=true")
        if self.v2_keys == "separate" and self.v2_pairing != "interleaved":
            raise ValueError(f"{me}.v2_keys='separate' needs v2_pairing='interleaved' (each pair's own keys sit in "
                             "its GQA group)")
        if self.head_gain != "off":
            if self.attention not in ("diff_v1", "diff_v2") or self.v1_layout != "paper":
                raise ValueError(f"{me}.head_gain applies to attention='diff_v1' (paper layout) or 'diff_v2'")
            if (self.attention == "diff_v1" and self.headwise_norm) or (self.attention == "diff_v2"
                                                                        and self.v2_headwise_norm):
                raise ValueError(f"{me}.head_gain replaces the head-wise norm: it needs headwise_norm=false "
                                 "(DIFF V1, with headwise_norm_weight=false) or v2_headwise_norm=false (DIFF V2)")
        if self.headwise_norm_weight and not self.headwise_norm:
            raise ValueError(f"{me}.headwise_norm_weight=true needs headwise_norm=true")
        if var.check is not None:
            var.check(self)
        self._refuse_foreign_options(var)

    def _refuse_foreign_options(self, var: variants.Variant) -> None:
        # A V1 ablation set on a V2 model (or vice versa) would silently do nothing: refuse it loudly.
        default = {f.name: f.default for f in fields(AttentionConfig)}
        for name in variants.all_options():
            if name not in var.options and getattr(self, name) != default[name]:
                owners = [v.name for v in variants.variants() if name in v.options]
                raise ValueError(f"{type(self).__name__}.{name}={getattr(self, name)!r} only applies to "
                                 f"{' or '.join(owners)}, not attention={self.attention!r}")

    # ------------------------------------------------------------------ derived sizes
    @property
    def n_diff_heads(self) -> int:
        """DIFF V1's h = H/2 (paper: h = d_model / 2d); H under ``v1_layout="per_head"``."""
        return self.n_heads if self.v1_layout == "per_head" else self.n_heads // 2

    @property
    def v1_value_dim(self) -> int:
        """Width of one DIFF V1 head's value: 2d (paper), d (``v1_layout="per_head"``)."""
        return self.head_dim if self.v1_layout == "per_head" else 2 * self.head_dim

    def lambda_init_for(self, layer_idx: int) -> float:
        """Eq. (2) initial lambda: 0.8 - 0.6 exp(-0.3 l) with 0-based l (the paper writes l-1, 1-based)."""
        if self.lambda_init == "schedule":
            return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
        return float(self.lambda_init)

    def replace(self, **changes: Any) -> AttentionConfig:
        """A copy with some fields changed (validated; unknown fields raise)."""
        return type(self)(**self._changed(changes))

    def _changed(self, changes: dict[str, Any]) -> dict[str, Any]:
        """The fields with ``changes`` on top; a size that was the default of the old shape is derived again
        (None) when the shape it depends on changes."""
        d = dataclasses.asdict(self)
        unknown = sorted(set(changes) - set(d))
        if unknown:
            raise ValueError(f"unknown {type(self).__name__} key(s): {', '.join(unknown)}")
        d.update(changes)
        if "head_dim" not in changes and self.head_dim == self.d_model // self.n_heads:
            d["head_dim"] = None
        if "n_kv_heads" not in changes and "n_heads" in changes and self.n_kv_heads == self.n_heads:
            d["n_kv_heads"] = None
        return d


@dataclass(frozen=True)
class ModelConfig(AttentionConfig):
    """Configuration of a decoder-only LM whose only variable part is the attention module: its attention fields
    (``AttentionConfig``, which every layer is built from) and the rest of the model.

    Unset (``None``) sizes are resolved in ``__post_init__`` so that a config written to JSON reads back equal.
    """

    vocab_size: int = 8192
    n_layers: int = 8
    ffn_hidden: int = None  # type: ignore[assignment]  # SwiGLU width; default ~8/3 d_model, a multiple of ffn_multiple_of
    ffn_multiple_of: int = 64
    rope_theta: float = 10000.0
    # RoPE frequency scaling: "default" (none) or "llama3" (Llama 3.1/3.2's; the four numbers below are its own)
    rope_type: Literal["default", "llama3"] = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    max_seq_len: int = 1024
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02

    def _resolve(self) -> None:
        super()._resolve()
        if self.ffn_hidden is None and isinstance(self.d_model, int) and isinstance(self.ffn_multiple_of, int):
            object.__setattr__(self, "ffn_hidden", default_ffn_hidden(self.d_model, self.ffn_multiple_of))

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden",
                     "ffn_multiple_of", "max_seq_len"):  # the sizes first, in this order (the attention's among them)
            _check_positive_int(name, getattr(self, name))
        super().validate()
        for name in ("rope_theta", "norm_eps", "init_std"):
            v = getattr(self, name)
            # inf passes "> 0" but makes every weight (init_std) or rotation (rope_theta) NaN
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise ValueError(f"ModelConfig.{name} must be a positive finite number, got {v!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"ModelConfig.tie_embeddings must be true or false, got {self.tie_embeddings!r}")
        _check_choice("rope_type", self.rope_type, ("default", "llama3"))
        for name in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise ValueError(f"ModelConfig.{name} must be a positive finite number, got {v!r}")
        _check_positive_int("rope_original_max_len", self.rope_original_max_len)
        if self.rope_type == "llama3" and not (self.rope_factor >= 1
                                               and self.rope_low_freq_factor < self.rope_high_freq_factor):
            raise ValueError(f"ModelConfig: rope_type='llama3' needs rope_factor >= 1 (got {self.rope_factor}) and "
                             f"rope_low_freq_factor < rope_high_freq_factor (got {self.rope_low_freq_factor}, "
                             f"{self.rope_high_freq_factor})")
        if self.rope_type == "default":
            default = {f.name: f.default for f in fields(ModelConfig)}
            for name in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_len"):
                if getattr(self, name) != default[name]:
                    raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} only applies to rope_type='llama3'")

    def attention_config(self) -> AttentionConfig:
        """The attention part alone (what ``DiffAttention`` takes)."""
        names = {f.name for f in fields(AttentionConfig)}
        return AttentionConfig(**{k: v for k, v in dataclasses.asdict(self).items() if k in names})

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        if not isinstance(data, dict):
            # a user's config.json holding a list or a number: bad input, not a programming error
            raise ValueError(f"ModelConfig.from_dict expects a dict (a JSON object), got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig key(s): {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        return cls(**data)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            atomic_write(path, text + "\n")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> ModelConfig:
        p = Path(text_or_path) if not str(text_or_path).lstrip().startswith("{") else None
        text = p.read_text() if p is not None else str(text_or_path)
        data = parse_json(text, f"model config {p or 'text'}")
        return cls.from_dict(data)

    @classmethod
    def from_flavour(cls, name: str, **changes: Any) -> ModelConfig:
        """The named shape of ``FLAVOURS`` with ``changes`` on top (e.g. ``attention="diff_v2"``)."""
        if name not in FLAVOURS:
            raise ValueError(f"ModelConfig flavour {name!r} is not defined; choose one of {', '.join(FLAVOURS)}")
        unknown = sorted(set(changes) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown ModelConfig key(s): {', '.join(unknown)}")
        return cls(**{**FLAVOURS[name], **changes})

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated; unknown fields raise)."""
        d = self._changed(changes)
        if "ffn_hidden" not in changes and self.ffn_hidden == default_ffn_hidden(self.d_model, self.ffn_multiple_of):
            d["ffn_hidden"] = None
        return ModelConfig(**d)


# Named model shapes (the attention kind and backend are chosen per use). Head counts are the baseline's.
FLAVOURS: dict[str, dict[str, Any]] = {
    # the tests' model: 4 heads of 16 (V1: 2 differential heads), GQA with 2 KV heads, a few thousand weights
    "tiny": dict(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, max_seq_len=64),
    # the matched benchmark shape: d_model 512, 8 layers, 8 heads of 64
    "bench": dict(vocab_size=8192, d_model=512, n_layers=8, n_heads=8, head_dim=64, max_seq_len=1024),
    # the paper's 3B shape (Section 3.1 / Appendix B): 28 layers, d_model 3072, 24 heads of 128
    "paper-3b": dict(vocab_size=100288, d_model=3072, n_layers=28, n_heads=24, head_dim=128, ffn_hidden=8192,
                     max_seq_len=4096),
}
