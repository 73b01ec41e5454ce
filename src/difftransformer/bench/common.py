"""What the benchmarks share besides timing: the matched model shape, the backends and cases, the load-average
lines and table rows.

Every benchmark builds its models from a named shape (``model.config.FLAVOURS``; ``bench`` by default: d_model
512, 8 layers, 8 baseline heads of 64, vocab 8192; ``--shape paper-3b`` for the paper's 3B width), with the shape
flags of its command on top, so the commands measure the same models unless told otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any, Optional

from ..model import config as model_config
from ..model import variants
from ..model.config import FLAVOURS, ModelConfig

DEFAULT_SHAPE = "bench"
SHAPE = FLAVOURS[DEFAULT_SHAPE]  # the default shape of every bench command

# A shape flag's dest -> the ModelConfig field it sets (each command has some of them).
SHAPE_FIELDS = {"d_model": "d_model", "head_dim": "head_dim", "heads": "n_heads", "kv_heads": "n_kv_heads",
                "layers": "n_layers", "vocab_size": "vocab_size"}



def baseline_case() -> tuple[str, str, str]:
    """(label, attention, backend) of every ratio's reference: the baseline with SDPA."""
    return (f"{variants.reference().short} sdpa", variants.reference().name, "sdpa")


def hf_diff_variant() -> str:
    """Which of our variants transformers' DiffLlama holds (the HF columns compare with it)."""
    from ..interop.hf import ARCHITECTURES
    return ARCHITECTURES["diffllama"][1]


def diff_backends() -> tuple[str, ...]:
    """The backends a DIFF variant can be timed with: ``model.config.BACKENDS`` except "eager" and "auto" (a
    selector, not a path), read at each call, so a backend added there is offered by every bench's ``--backends``
    and timed as "V1 <b>" and "V2 <b>"."""
    return tuple(b for b in model_config.BACKENDS if b not in ("eager", "auto"))


def bench_cases(backends: Sequence[str]) -> list[tuple[str, str, str]]:
    """(label, attention, backend) of the baseline, then every compared variant (V1, V2, ... in the registry's
    order) with each backend, in the order given (repeats dropped)."""
    allowed = diff_backends()
    chosen = list(dict.fromkeys(backends))
    bad = [b for b in chosen if b not in allowed]
    if bad or not chosen:
        raise ValueError(f"--backends {' '.join(map(str, backends))} is not allowed; choose one or more of "
                         f"{', '.join(allowed)}")
    return [baseline_case(), *((f"{v.short} {b}", v.name, b) for v in variants.compared() for b in chosen)]


def add_shape_flag(p: argparse.ArgumentParser, example: str) -> None:
    """``--shape NAME``: the named model shape the other shape flags default to (``example``: one overriding flag
    of this command, for the help)."""
    shapes = ", ".join(f"{name} (d_model {s['d_model']}, {s['n_layers']} layers, {s['n_heads']} heads)"
                       for name, s in FLAVOURS.items())
    p.add_argument("--shape", default=DEFAULT_SHAPE, metavar="NAME",
                   help=f"named model shape ({shapes}; default {DEFAULT_SHAPE}); it sets every shape flag that is "
                        f"not given, and a given one overrides it (--shape paper-3b {example})")


def add_model_flags(p: argparse.ArgumentParser, example: str, *, verb: str, default_backends: Sequence[str]) -> None:
    """The model-shape flags of a training-step bench (``bench train``, ``bench ops``): --shape (``example`` in its
    help), --d-model, --layers, --heads, --kv-heads, --vocab-size, and --backends (the DIFF backends to ``verb``)."""
    add_shape_flag(p, example)
    p.add_argument("--d-model", type=int, default=None, help=shape_default_help("d_model", "model width"))
    p.add_argument("--layers", type=int, default=None, help=shape_default_help("layers", "number of layers"))
    p.add_argument("--heads", type=int, default=None,
                   help=shape_default_help("heads", "the baseline's query heads; head_dim is the shape's, or d_model / "
                                                    "heads where --d-model or --heads is given"))
    p.add_argument("--kv-heads", type=int, default=None,
                   help="the baseline's KV heads (default: the --shape's; as many as heads where it sets none)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help=shape_default_help("vocab_size", "vocabulary size; bench's is the data default"))
    p.add_argument("--backends", nargs="+", choices=diff_backends(), default=list(default_backends), metavar="B",
                   help=f"DIFF backends to {verb}, each as V1 and V2 (choices: {', '.join(diff_backends())}; default: "
                        f"{' '.join(default_backends)}); the baseline always uses sdpa")


def shape_default_help(dest: str, what: str) -> str:
    """Help text of a shape flag: ``what (default: the shape's, N for bench)``."""
    value = getattr(ModelConfig.from_flavour(DEFAULT_SHAPE), SHAPE_FIELDS[dest])
    return f"{what} (default: the --shape's, {value} for {DEFAULT_SHAPE})"


def shape_config(name: Any) -> ModelConfig:
    """The named shape as a (resolved) ModelConfig; a bad name is a ValueError naming ``--shape``."""
    if not isinstance(name, str) or name not in FLAVOURS:
        raise ValueError(f"--shape {name!r} is not a model shape; choose one of {', '.join(FLAVOURS)}")
    return ModelConfig.from_flavour(name)


def resolve_shape(args: argparse.Namespace, dests: Sequence[str]) -> str:
    """Fill each shape flag in ``dests`` left unset (None) from ``args.shape``; returns the header's description,
    e.g. ``shape paper-3b`` or ``shape paper-3b with --layers 4``.

    The KV heads of a shape that sets none stay None ("as many as heads"), so that ``--heads`` alone keeps the
    full multi-head layout, as without ``--shape``.
    """
    flavour = shape_config(args.shape)
    given = [d for d in dests if getattr(args, d) is not None]
    for dest in dests:
        if getattr(args, dest) is None:
            field = SHAPE_FIELDS[dest]
            value = FLAVOURS[args.shape].get(field) if field == "n_kv_heads" else getattr(flavour, field)
            setattr(args, dest, value)
    flags = ", ".join(f"--{d.replace('_', '-')} {getattr(args, d)}" for d in given)
    return f"shape {args.shape}" + (f" with {flags}" if flags else "")


def bench_config(attention: str, backend: str = "sdpa", *, d_model: int, head_dim: int, n_layers: int,
                 vocab_size: int, max_seq_len: int, n_kv_heads: Optional[int] = None, n_heads: Optional[int] = None,
                 shape: str = DEFAULT_SHAPE) -> ModelConfig:
    """The matched config of one variant in the named shape; the baseline's heads are ``n_heads`` (default
    d_model / head_dim). The FFN is the shape's where d_model is the shape's, else the default for d_model."""
    flavour = shape_config(shape)
    ffn = {} if d_model == flavour.d_model else {"ffn_hidden": None}
    return ModelConfig.from_flavour(shape, attention=attention, backend=backend, d_model=d_model,
                                    n_heads=n_heads if n_heads is not None else d_model // head_dim,
                                    head_dim=head_dim, n_kv_heads=n_kv_heads, n_layers=n_layers,
                                    vocab_size=vocab_size, max_seq_len=max_seq_len, **ffn)


def load_average() -> str:
    """The 1-minute load average ("n/a" where the OS has none): other load on the machine skews every timing."""
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


def print_load(when: str, note: str = "") -> None:
    """``# load average (1 min) before: 1.23 on 2 CPUs`` (the CPU count only where ``when`` is "before"), then
    ``; note`` when given."""
    cpus = f" on {os.cpu_count()} CPUs" if when == "before" else ""
    print(f"# load average (1 min) {when}: {load_average()}{cpus}" + (f"; {note}" if note else ""), flush=True)


def table_row(cells: Sequence[Any], widths: Sequence[int]) -> str:
    """Cells one space apart, right-aligned to ``widths`` (a negative width: left-aligned to its size); cells
    are used as they are, so format numbers first."""
    if len(cells) != len(widths):
        raise ValueError(f"table_row: {len(cells)} cells for {len(widths)} widths")
    return " ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, w in zip(cells, widths))


def data_line(what: str, kind: str, record: dict[str, Any]) -> str:
    """A benchmark's setup or one of its rows as data, printed beside its table: ``# WHAT setup|row: {json}``, the
    numbers as the table rounds them (what ``gpucheck/gpu_readers.py`` reads; nothing parses the table)."""
    return f"# {what} {kind}: " + json.dumps(record)


def shape_fields(description: str) -> dict[str, Optional[str]]:
    """``resolve_shape``'s description as data: {"shape": NAME, "overrides": "--flag V, ..." or None}."""
    name, _, flags = description.removeprefix("shape ").partition(" with ")
    return {"shape": name, "overrides": flags or None}
