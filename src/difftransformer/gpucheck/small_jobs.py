"""`python -m difftransformer.gpucheck.small_jobs`: how many of the retrieval benchmark's jobs one GPU trains per
minute, one job at a time and as P processes sharing the device -- the number that decides how a sweep uses a GPU.

A job here is the benchmark's training (``RetrievalConfig``'s defaults: d_model 64, 2 layers, batch 32, 600 steps,
float32, the last block at the scored rows only), built as the benchmark builds it (``retrieval.train``:
``build_paired``, its AdamW, its lr schedule, ``answer_loss``, its training stream, batches made inline as a worker
makes them) on ``--device``; the evaluation is not timed. Each process trains ``--warmup`` untimed steps (kernels,
allocator), then times ``--steps`` steps and scales them to the job's 600: on a GPU a step this small is bound by
kernel launches, so its time per step is flat and a few hundred steps give the job's rate.

* one at a time: each registered variant's job in this process, one after the other;
* P processes: the reference variant's job in P fresh processes (``spawn``), all timed from one start (a barrier
  after their warm-up), so jobs/min = P * 60 / the slowest process's scaled job time; the wall time including the
  processes' start (import, CUDA context, build) is printed beside it.

Every measured row is printed as it is done, with a ``# small-jobs row: {json}`` line that ``gpucheck/gpu_readers.py``
reads (a run stopped by a time limit keeps its finished rows). One torch thread per process, as a benchmark worker.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import queue as queue_module
import sys
import threading
import time
from typing import Any, Optional

ROW_PREFIX = "# small-jobs row: "
LR = 2e-3  # the middle of the protocol's grid; the speed of a step does not depend on it


def _sync(device: str) -> None:
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def job_seconds(variant: str, seed: int, steps: int, warmup: int, device: str,
                start: Optional[Any] = None) -> tuple[float, float]:
    """(seconds of ``steps`` timed training steps, the last loss) of one retrieval job on ``device``, after
    ``warmup`` untimed steps; ``start``: a barrier waited on between the two (the P-process rows)."""
    import torch

    from ..retrieval.config import RetrievalConfig
    from ..retrieval.task import train_stream
    from ..retrieval.train import answer_loss, build_paired, lr_at, optimizer

    torch.set_num_threads(1)  # as a benchmark worker runs a job
    cfg = RetrievalConfig()
    model, _ = build_paired(cfg, variant, seed)
    model.rows_only_last_block = True  # the benchmark's path (train_model's rows_only=True)
    model.to(device).train()
    opt = optimizer(cfg, model.parameters(), LR)
    stream = train_stream(cfg, seed)

    def step(i: int) -> torch.Tensor:
        for g in opt.param_groups:
            g["lr"] = lr_at(i, cfg, LR)
        b = next(stream)
        b = dataclasses.replace(b, tokens=b.tokens.to(device), query_pos=b.query_pos.to(device),
                                answers=b.answers.to(device))
        loss = answer_loss(model, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for i in range(warmup):
        step(i)
    _sync(device)
    if start is not None:
        start.wait()
    t0 = time.perf_counter()
    loss = None
    for i in range(warmup, warmup + steps):
        loss = step(i)
    _sync(device)
    seconds = time.perf_counter() - t0
    return seconds, float(loss.detach()) if loss is not None else float("nan")


def _child(variant: str, seed: int, steps: int, warmup: int, device: str, start, results) -> None:
    """One of the P processes: its timed seconds (or its error) onto ``results``."""
    try:
        results.put(("ok", job_seconds(variant, seed, steps, warmup, device, start)))
    except BaseException as e:  # the parent reads one message either way instead of waiting for its timeout
        start.abort()  # the others (and the parent) stop waiting at the barrier
        results.put(("error", f"{type(e).__name__}: {e}"))
        raise


def processes_row(variant: str, n: int, steps: int, warmup: int, device: str, timeout: float) -> dict[str, Any]:
    """``n`` processes training ``variant``'s job together: per-process seconds, from a common start."""
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(n + 1), ctx.Queue()
    t_wall = time.perf_counter()
    procs = [ctx.Process(target=_child, args=(variant, 5000 + i, steps, warmup, device, start, results))
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        start.wait(timeout=timeout)  # every process built and warmed up
    except threading.BrokenBarrierError:
        try:  # a process that failed before the start said why
            why = ": " + str(results.get(timeout=5)[1])
        except queue_module.Empty:
            why = " (one failed or hung)"
        for p in procs:
            p.kill()
        raise RuntimeError(f"{n} processes: not all reached the start within {timeout:g} s{why}") from None
    seconds: list[float] = []
    deadline = time.monotonic() + timeout
    try:
        while len(seconds) < n:
            try:
                status, value = results.get(timeout=1.0)
            except queue_module.Empty:
                if time.monotonic() > deadline or not any(p.is_alive() for p in procs):
                    raise RuntimeError(f"{n} processes: {n - len(seconds)} gave no result") from None
                continue
            if status != "ok":
                raise RuntimeError(f"{n} processes: one failed: {value}")
            seconds.append(value[0])
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return {"seconds": seconds, "wall_s": time.perf_counter() - t_wall}


def job_row(mode: str, variant: str, processes: int, seconds: list[float], steps: int, job_steps: int,
            wall_s: Optional[float] = None) -> dict[str, Any]:
    """A printed row: the slowest process's job time scaled to ``job_steps``, ms/step and jobs/min."""
    slowest = max(seconds)
    job_s = slowest * job_steps / steps
    return {"mode": mode, "variant": variant, "processes": processes, "job_s": job_s,
            "ms_per_step": 1e3 * slowest / steps, "jobs_per_min": processes * 60.0 / job_s,
            "wall_s": wall_s, "steps_timed": steps, "job_steps": job_steps}


def print_row(row: dict[str, Any]) -> None:
    wall = "-" if row["wall_s"] is None else f"{row['wall_s']:.1f}"
    print(f"{row['mode']:<16} {row['variant']:<10} {row['job_s']:7.2f} {row['ms_per_step']:8.2f} "
          f"{row['jobs_per_min']:9.1f} {wall:>8}", flush=True)
    print(ROW_PREFIX + json.dumps(row, sort_keys=True), flush=True)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..model import variants
    from ..retrieval.config import RetrievalConfig

    for name in ("steps", "timeout"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if any(p < 2 for p in args.processes):
        raise ValueError(f"--processes takes counts >= 2 (one at a time is always measured), got {args.processes}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    cfg = RetrievalConfig()
    where = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"# retrieval benchmark jobs on {args.device} ({where}): d_model {cfg.d_model}, {cfg.n_layers} layers, "
          f"batch {cfg.batch}, float32; a job is {cfg.steps} training steps (evaluation not timed); each process "
          f"times {args.steps} steps after {args.warmup} warm-up steps and scales them to {cfg.steps}", flush=True)
    print(f"{'mode':<16} {'variant':<10} {'job s':>7} {'ms/step':>8} {'jobs/min':>9} {'wall s':>8}", flush=True)
    for i, v in enumerate(variants.variants()):
        seconds, _ = job_seconds(v.name, 4000 + i, args.steps, args.warmup, args.device)
        print_row(job_row("one at a time", v.name, 1, [seconds], args.steps, cfg.steps))
    ref = variants.reference().name
    for n in args.processes:
        r = processes_row(ref, n, args.steps, args.warmup, args.device, args.timeout)
        print_row(job_row(f"{n} processes", ref, n, r["seconds"], args.steps, cfg.steps, r["wall_s"]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m difftransformer.gpucheck.small_jobs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda", help="device (default cuda)")
    p.add_argument("--steps", type=int, default=200,
                   help="timed steps per process, scaled to the job's 600 (default 200)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per process first (default 10)")
    p.add_argument("--processes", type=int, nargs="*", default=[8, 16], metavar="P",
                   help="process counts sharing the device, each >= 2 (default: 8 16; none: one at a time only)")
    p.add_argument("--timeout", type=int, default=120,
                   help="seconds a group of processes may take to start, and then to finish (default 120)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ValueError as e:
        print(f"small_jobs: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
