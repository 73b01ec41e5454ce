"""``difftransformer retrieval``: the token-level key-value retrieval benchmark (paper Fig. 1, Table 2/3, Fig. 5/8).

Writes DIR/results.json and DIR/*.png and prints, per variant: parameters, chosen lr, accuracy at each condition
(mean +- seed sd, with the number of seeds) and the layer-mean attention shares at the primary endpoint.
"""

from __future__ import annotations

import argparse
from typing import Any

from .config import VARIANTS, RetrievalConfig, quick_config

HELP = "token-level key-value retrieval benchmark: baseline vs DIFF V1/V2, seeds, lr grid, attention noise, plots"


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated numbers, got {text!r}") from None
    if not vals:
        raise ValueError(f"{flag} must list at least one number")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory for results.json and the plots")
    p.add_argument("--quick", action="store_true",
                   help="smoke run (about a minute): 200 steps, one lr, 2 seeds, 16 contexts per condition; "
                        "its numbers are not a measurement")
    p.add_argument("--seeds", type=int, help="seeds per variant (default 3; quick 2)")
    p.add_argument("--steps", type=int, help="training steps per model")
    p.add_argument("--batch", type=int, help="contexts per training step")
    p.add_argument("--lr-grid", help="comma-separated learning rates tried on the lr-search seed")
    p.add_argument("--pairs", type=int, help="key-value facts per training context")
    p.add_argument("--filler", type=int, help="filler tokens per training context")
    p.add_argument("--distractors", help="training distractor kind: random | near")
    p.add_argument("--d-model", type=int, help="model width (all variants; parameters matched by the library)")
    p.add_argument("--n-layers", type=int, help="transformer layers")
    p.add_argument("--variants", help=f"comma-separated subset of {', '.join(VARIANTS)}")
    p.add_argument("--eval-contexts", type=int, help="test contexts per condition (every key asked once in each)")
    p.add_argument("--primary", help="primary endpoint condition name (default p2f4); fix it before running")
    p.add_argument("--workers", type=int, default=2, help="worker processes, one torch thread each (default 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args) -> RetrievalConfig:
    cfg = quick_config() if args.quick else RetrievalConfig()
    ch: dict[str, Any] = {}
    for flag, key in (("seeds", "seeds"), ("steps", "steps"), ("batch", "batch"), ("pairs", "n_pairs"),
                      ("filler", "filler"), ("distractors", "distractors"), ("d_model", "d_model"),
                      ("n_layers", "n_layers"), ("eval_contexts", "eval_contexts"), ("primary", "primary")):
        if getattr(args, flag) is not None:
            ch[key] = getattr(args, flag)
    if args.lr_grid is not None:
        ch["lr_grid"] = _floats(args.lr_grid, "--lr-grid")
    if args.variants is not None:
        ch["variants"] = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    return cfg.replace(**ch) if ch else cfg


def format_table(results: dict[str, Any]) -> str:
    from .benchmark import layer_mean, mean_spread, retrieval_layer_value, seed_values
    conds = [c["name"] for c in results["conditions"]]
    prim = results["primary_endpoint"]["condition"]
    lines = []
    if results.get("quick"):
        lines.append("QUICK SMOKE RUN: too few steps and contexts to measure anything; run without --quick.")
    lines.append(f"key-value retrieval, accuracy mean +- seed sd (chance {results['chance']:.3f}); "
                 f"primary endpoint: {prim} (marked *)")
    lines.append(f"{'variant':<9} {'params':>8} {'lr':>7} {'seeds':>5}  " +
                 " ".join(f"{(c + '*' if c == prim else c):>12}" for c in conds))
    for v, d in results["variants"].items():
        cells = []
        for c in conds:
            m, s = mean_spread(seed_values(results, v, c))
            cells.append(f"{m:.3f}+-{s:.3f}".rjust(12))
        lines.append(f"{v:<9} {d['params']:>8,} {d['chosen_lr']:>7.2g} {len(d['runs']):>5}  " + " ".join(cells))
    lines.append(f"attention of the answering query at {prim} (head mean; scale-free shares, signed raw beside); "
                 "'retrieval layer' = each run's layer with the highest answer share, 'layer mean' over all layers:")
    keys = ("answer_share", "noise_share", "answer_raw", "rest_raw")
    lines.append(f"{'variant':<9} {'':<16}" + "".join(f"{k:>16}" for k in keys))
    for v, d in results["variants"].items():
        for label, fn in (("retrieval layer", retrieval_layer_value), ("layer mean", layer_mean)):
            row = [mean_spread([fn(r, prim, k) for r in d["runs"]]) for k in keys]
            lines.append(f"{v:<9} {label:<16}" + "".join(f"{m:.3f}+-{s:.3f}".rjust(16) for m, s in row))
    lines.append(f"lr grid (seed {results['config']['lr_search_seed']}; validation split, training condition: "
                 "answer loss / accuracy; chosen on the loss):")
    for v, d in results["variants"].items():
        lines.append(f"  {v:<9} " + ", ".join(f"{g['lr']:g}: {g['val_loss']:.4f} / {g['val_accuracy']:.3f}"
                                              for g in d["lr_grid"]) + f"  -> {d['chosen_lr']:g}")
    t = results["timings"]
    lines.append(f"wall {t['wall_s']:.0f} s on {t['workers']} workers; load average before {t['loadavg_before']}, "
                 f"after {t['loadavg_after']}")
    return "\n".join(lines)


def run_cli(args) -> int:
    if isinstance(args.workers, bool) or args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    cfg = config_from_args(args)
    from .benchmark import run_benchmark
    results = run_benchmark(cfg, args.out, workers=args.workers, progress=not args.no_progress, quick=args.quick)
    print(format_table(results))
    print(f"wrote {args.out}/results.json and plots")
    return 0


def register(sub) -> None:
    p = sub.add_parser("retrieval", help=HELP, description=HELP, allow_abbrev=False)
    add_arguments(p)
    p.set_defaults(func=run_cli)
