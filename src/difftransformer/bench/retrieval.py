"""`difftransformer bench retrieval`: the retrieval benchmark's jobs per minute, the path before protocol version 3
against the path it runs now, and each DIFF variant's job time over the baseline's.

A job trains one model of the benchmark's size (``RetrievalConfig``'s defaults: d_model 64, 2 layers, batch 32) and
evaluates it, at one torch thread, as a benchmark worker does. The two paths:

* ``v2 path`` (the benchmark until protocol version 3): the sdpa attention backend, PyTorch's default (for-loop)
  AdamW, and every block at every position (``rows_only=False``);
* ``v3 path`` (now): the ``eager`` backend (the explicit softmax maps: at 40-64 tokens faster than the CPU flash
  kernel, and DIFF V1 then needs two maps instead of four value products), the fused CPU AdamW, and the last block
  at the scored positions only (``DiffTransformerLM.forward(logits_at=...)``).

The jobs of the rows are interleaved round by round and the median is reported, with the load average: another
process on the machine skews every timing, so run it idle. Training is timed over ``--steps`` steps and scaled to
the benchmark's 600; evaluation is timed whole.
"""

from __future__ import annotations

import argparse
import statistics
import time

from .common import print_load, table_row

PATHS = ("v2 path", "v3 path")


def _job_time(cfg, variant: str, seed: int, path: str, steps: int) -> tuple[float, float]:
    """(training seconds scaled to cfg.steps, evaluation seconds) of one job on ``path``."""
    from ..retrieval.evaluate import evaluate_model, validation
    from ..retrieval.train import train_model
    run_cfg = cfg.replace(steps=steps, backend="sdpa", fused_adamw=False) if path == "v2 path" else cfg.replace(
        steps=steps)
    r = train_model(run_cfg, variant, seed, 2e-3, rows_only=path != "v2 path")
    t0 = time.process_time()
    validation(r["model"], cfg)
    evaluate_model(r["model"], cfg)
    return r["train_cpu_s"] * cfg.steps / steps, time.process_time() - t0


def run(args: argparse.Namespace) -> int:
    import torch

    for name in ("steps", "rounds"):
        v = getattr(args, name)
        if isinstance(v, bool) or v < 1:
            raise ValueError(f"--{name} must be >= 1, got {v}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a benchmark worker runs a job
    try:
        return _measure(args)
    finally:
        torch.set_num_threads(threads)


def _measure(args: argparse.Namespace) -> int:
    from ..model import variants as registry
    from ..retrieval.config import RetrievalConfig
    cfg = RetrievalConfig()
    names = registry.names()
    base = registry.reference().name
    print_load("before")
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for rnd in range(args.rounds):
        for v in names:
            for path in PATHS:
                times.setdefault((v, path), []).append(_job_time(cfg, v, 9000 + rnd, path, args.steps))
        print(f"# round {rnd + 1} of {args.rounds} done", flush=True)
    med: dict[tuple[str, str], tuple[float, float]] = {
        k: (statistics.median(t for t, _ in xs), statistics.median(e for _, e in xs)) for k, xs in times.items()}
    job = {k: t + e for k, (t, e) in med.items()}
    print(f"retrieval benchmark jobs (d_model {cfg.d_model}, {cfg.n_layers} layers, batch {cfg.batch}, {cfg.steps} "
          f"steps, one thread; training timed over {args.steps} steps and scaled; CPU seconds, median of "
          f"{args.rounds} round(s)):")
    w = (-9, -8, 9, 8, 8, 10)
    print(table_row(["variant", "path", "train s", "eval s", "job s", "vs base"], w))
    for v in names:
        for path in PATHS:
            t, e = med[(v, path)]
            ratio = job[(v, path)] / job[(base, path)]
            print(table_row([v, path, f"{t:.1f}", f"{e:.1f}", f"{t + e:.1f}", f"{ratio:.2f}x"], w))
    per_min = {p: 60 / statistics.fmean(job[(v, p)] for v in names) for p in PATHS}  # equal jobs of each variant
    print(f"jobs per minute per worker (the v3 workload: as many jobs of each variant): v2 path "
          f"{per_min['v2 path']:.2f}, v3 path {per_min['v3 path']:.2f}: {per_min['v3 path'] / per_min['v2 path']:.2f}x")
    print_load("after")
    return 0


def register(sub) -> None:
    p = sub.add_parser("retrieval", help="the retrieval benchmark's jobs per minute: the v2 path vs the v3 path, "
                                         "DIFF's job time over the baseline's",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--steps", type=int, default=150,
                   help="training steps timed per job, scaled to the benchmark's 600 (default 150)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every row, interleaved; median (default 3)")
    p.set_defaults(func=run)
