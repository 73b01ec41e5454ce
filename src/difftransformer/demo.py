"""`difftransformer demo`: the main job on the embedded default data.

Until the training loop lands this builds the three variants at the demo size, prints their parameter counts and
runs one forward/backward pass on random tokens.
"""

from __future__ import annotations

import argparse

import torch

from .model import DiffTransformerLM, ModelConfig


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    base = ModelConfig(vocab_size=8192, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, max_seq_len=256)
    idx = torch.randint(0, base.vocab_size, (2, 128))
    print(f"{'attention':<10} {'parameters':>12} {'vs baseline':>12} {'loss':>8}")
    ref = None
    for kind in ("baseline", "diff_v1", "diff_v2"):
        model = DiffTransformerLM(base.replace(attention=kind))
        out = model(idx[:, :-1], idx[:, 1:])
        out.loss.backward()
        n = model.num_parameters()
        ref = ref or n
        print(f"{kind:<10} {n:>12,} {n / ref:>11.3f}x {out.loss.item():>8.4f}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the main job on the embedded default data",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a shorter run (make demo QUICK=1)")
    p.set_defaults(func=run)
