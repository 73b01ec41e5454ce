"""What the benchmarks share besides timing: the matched model shape, the load-average lines and table rows.

Every benchmark builds its models from the ``bench`` flavour (``model.config.FLAVOURS``: d_model 512, 8 layers,
8 baseline heads of 64, vocab 8192), with the shape flags of its command on top, so the three commands measure
the same models unless told otherwise.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from ..model.config import FLAVOURS, ModelConfig

SHAPE = FLAVOURS["bench"]  # the flag defaults of every bench command


def bench_config(attention: str, backend: str = "sdpa", *, d_model: int, head_dim: int, n_layers: int,
                 vocab_size: int, max_seq_len: int, n_kv_heads: Optional[int] = None) -> ModelConfig:
    """The matched config of one variant; the baseline's heads are d_model / head_dim."""
    return ModelConfig.from_flavour("bench", attention=attention, backend=backend, d_model=d_model,
                                    n_heads=d_model // head_dim, head_dim=head_dim, n_kv_heads=n_kv_heads,
                                    n_layers=n_layers, vocab_size=vocab_size, max_seq_len=max_seq_len)


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
