"""gpu-check's ``candidates`` step (``python -m difftransformer.gpucheck.gpu_candidates``): compile and run every Triton
candidate config the tuner may try for the launches of gpu-check's later steps, each against the float64 oracle.

On a fresh GPU machine Triton's on-disk cache is empty, and the first call of each shape in a bench would compile
every fitting candidate of every kernel serially inside the bench process (``triton_tuning.tuned_launch``): on the
order of a hundred compiles of seconds each. This step compiles them all first, in parallel worker processes (up
to the machine's CPU count, at most ``MAX_WORKERS``), so the benches later load them from the cache; and, since a
tuner may pick any of them, it checks that each computes the right answer on the GPU.

What it covers (``plan(arch)``): for the bench shape (head_dim 64: ``bench attention``, ``bench train``, ``bench
decode``) and the paper-3b shape (head_dim 128: ``bench attention --shape paper-3b``, ``bench train --shape
paper-3b``), for each compared DIFF variant (V1: two key maps, dv = 2d, a scalar lambda; V2: one shared key map, dv
= d, a per-token lambda) as its layer calls the kernels (the heads, KV heads and value width of the layer the
benches build), for each kernel those steps run (fwd, bwd_dkdv, bwd_dq; decode at the bench shape only, the one
``bench decode`` runs at), every config ``triton_tuning.candidates`` returns for the GPU's arch in bfloat16 -- the
same list the tuner measures. Archs outside ``TUNED_ARCHS`` have no candidates (the plan is empty).

Each candidate runs on a small real input (batch 2, T = 256 for the training kernels, a cache of 256 for decode,
two rows of different lengths) through the kernels' own launch code (``triton_diff``'s autograd Function with the
candidate as that kernel's tiles and the defaults for the others; ``triton_diff_decode`` with the tiles passed),
and its output (fwd, decode) or its gradients (bwd_dkdv: dk1, dk2, dv; bwd_dq: dq1, dq2) are compared with a float64
oracle with the GPU tests' bfloat16 tolerance (``BF16_RTOL``). One line per candidate: ``# candidate: ok|wrong|failed
KEY CONFIG ...`` (wrong: the largest error and the tolerance; failed: the first line of the error), then a
``# candidates:`` count. The exit status is 1 where a candidate is wrong.

Why the benches then hit the cache entries compiled here: Triton (3.6 to 3.9) keys a compiled kernel by its source,
the target, the launch options (num_warps, num_stages, ...), the constexpr arguments (the tiles, D, DV, SHARED_K,
LAM_PER_ROW, HAS_MASK, PRECISION; the same here, as the same launch code passes them), the dtypes of the tensor
arguments, and a specialisation of the others: a pointer by whether its address is a multiple of 16 bytes, an int
by whether it equals 1 (then a constant) and whether it is a multiple of 16 (and by its width, i32 or i64). Here
every pointer is a fresh allocation or a view at a multiple of d elements (16-byte aligned, as the benches' views of
their projections are); T and the cache length are multiples of 16 (256 here; 1024-16384 and the cache of context +
64 new tokens in the benches); every stride is a product of d (64 or 128) and other sizes, so a multiple of 16 in
both; and the head counts (Hq, Hk, the GQA group Hq / Hk) are the benches' own, read from the layer built for the
shape, so the ones that equal 1 equal 1 in both. With the same TRITON_CACHE_DIR (the default, ~/.triton/cache, as
no step sets it) the bench's compile is then a cache hit. (Decode's merge kernel, one fixed config and not a
candidate, takes the split count as an argument, which may specialise differently here: at most one quick compile
per form in the bench.)

``--skip-file PATH`` (gpu-check passes its ``DIFFTRANSFORMER_TRITON_SKIP``) receives the wrong and failed candidates
as JSON; the later steps' tuner leaves them out (``triton_tuning.skipped``). ``--dry-run``: the same on the CPU
under Triton's interpreter (float32), at a tiny size, for one candidate per kernel and form of the sm_90 plan.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from ..bench.common import bench_config, data_line, shape_config
from ..kernels import triton_tuning as tuning
from ..model import variants
from ..model.attention import build_attention
from ..model.config import FLAVOURS

# The kernels each shape's later gpu-check steps run: attention and train run the training kernels at both shapes;
# bench decode runs at the bench shape only.
TRAIN_KERNELS = ("fwd", "bwd_dkdv", "bwd_dq")
SHAPE_KERNELS = {"bench": (*TRAIN_KERNELS, "decode"), "paper-3b": TRAIN_KERNELS}
DTYPE = torch.bfloat16  # the benches' dtype on a GPU (attention --dtype bfloat16, train and decode bf16)
# The GPU tests' tolerance for bfloat16 kernels (tests/model/test_triton_diff.py KERNEL_RTOL, justified there):
# max |kernel - float64 oracle| <= BF16_RTOL * max(1, max |oracle|), per tensor.
BF16_RTOL = 3e-2
MAX_WORKERS = 16
LINE = "# candidate: "
COUNT_LINE = "# candidates: "
SKIP_VERSION = 1


@dataclass(frozen=True)
class Job:
    """One candidate: ``config`` as ``kernel``'s tiles for one DIFF form at one shape's heads."""

    shape: str
    attention: str
    form: str  # triton_tuning.variant_of: v1, v2, v1_per_head
    kernel: str
    config: tuple[int, ...]
    d: int
    dv: int
    hq: int
    hk: int
    shared_k: bool

    def label(self, arch: int) -> str:
        return f"{tuning.fit_key(arch, self.form, self.d, self.kernel)} {','.join(map(str, self.config))} " \
               f"({self.where()})"

    def where(self) -> str:
        return f"{self.shape} {self.attention} hq {self.hq} hk {self.hk} dv {self.dv}"

    def data(self, arch: int) -> dict[str, str]:
        """What the candidate's data line names: its fit key, its tiles and where the benches launch it."""
        return {"key": tuning.fit_key(arch, self.form, self.d, self.kernel),
                "config": ",".join(map(str, self.config)), "where": self.where()}


def layer_heads(shape: str, attention: str) -> tuple[int, int, int, int, bool]:
    """(Hq, Hk, d, dv, shared_k) of the kernel calls of ``attention``'s layer at the named shape, as the benches
    build it (``bench_config`` with the shape's own width, heads and KV heads), read from the layer itself (built on
    the meta device: no memory, no time)."""
    flavour = shape_config(shape)
    cfg = bench_config(attention, "triton", d_model=flavour.d_model, head_dim=flavour.head_dim, n_layers=1,
                       vocab_size=256, max_seq_len=256, n_kv_heads=FLAVOURS[shape].get("n_kv_heads"), shape=shape)
    with torch.device("meta"):
        layer = build_attention(cfg, 0)
    k_heads, d, v_heads, dv = layer.cache_layout()  # paired keys (V1): 2 Hk key heads, split into k1 and k2
    hq: Any = layer.n_heads  # V1: its differential heads (2 Hq softmax heads); V2: H
    return int(hq), v_heads, d, dv, k_heads == v_heads


def plan(arch: int, dtype: torch.dtype = DTYPE) -> list[Job]:
    """Every (shape, variant, kernel, config) the tuner may try for gpu-check's later steps on a GPU of ``arch``:
    ``triton_tuning.candidates`` for each, the default config first (empty off ``TUNED_ARCHS``)."""
    from ..kernels.triton_diff import default_config

    jobs = []
    for shape, kernels in SHAPE_KERNELS.items():
        for v in variants.compared():
            hq, hk, d, dv, shared_k = layer_heads(shape, v.name)
            if arch not in tuning.TUNED_ARCHS:
                continue
            defaults = default_config(d, dv, dtype, arch)
            for kernel in kernels:
                for cfg in tuning.candidates(arch, dtype, d, dv, shared_k, kernel, defaults[kernel]):
                    jobs.append(Job(shape, v.name, tuning.variant_of(d, dv, shared_k), kernel, tuple(cfg), d, dv,
                                    hq, hk, shared_k))
    return jobs


# ---------------------------------------------------------------------------------------------- one candidate
def _oracle(q1, q2, k1, k2, v, lam, scale: float, key_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """float64 (softmax(q1 k1^T s + M) - lam softmax(q2 k2^T s + M)) v, kv heads repeated (GQA). Without key_mask
    causal (T queries); with it (decode: one query row), key j visible where key_mask[b, j]."""
    r = q1.shape[1] // k1.shape[1]
    k1, k2, v = (x.repeat_interleave(r, dim=1) for x in (k1, k2, v))
    if key_mask is None:
        t = q1.shape[2]
        vis = torch.ones(t, t, dtype=torch.bool, device=q1.device).tril()[None, None]
    else:
        vis = key_mask[:, None, None, :]

    def probs(q, k):
        return (q @ k.transpose(-1, -2) * scale).masked_fill(~vis, float("-inf")).softmax(-1)

    return (probs(q1, k1) - lam * probs(q2, k2)) @ v


def _inputs(job: Job, t: int, device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """In ``dtype`` (bf16 on the GPU): q1, q2 (B, Hq, T or 1, d), k1, k2 (B, Hk, T, d; one tensor for shared keys),
    v (B, Hk, T, dv), dout; lam in float32 (0-dim for V1, per row for V2, in (0, 1)); drawn in float64 on the CPU
    (the same values on any device)."""
    g = torch.Generator().manual_seed(seed)
    b, tq = 2, (1 if job.kernel == "decode" else t)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)

    x = {"q1": randn(b, job.hq, tq, job.d), "q2": randn(b, job.hq, tq, job.d), "k1": randn(b, job.hk, t, job.d)}
    x["k2"] = x["k1"] if job.shared_k else randn(b, job.hk, t, job.d)
    x["v"] = randn(b, job.hk, t, job.dv)
    x["lam"] = ((torch.rand(b, job.hq, tq, 1, generator=g, dtype=torch.float64) if job.shared_k else
                 torch.tensor(0.8, dtype=torch.float64)) * 0.9 + 0.05).to(device, torch.float32)
    x["dout"] = randn(b, job.hq, tq, job.dv)
    return x


def _errors(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, tuple[float, float]]:
    """Per tensor: (max |got - ref|, tolerance); NaN or inf in ``got`` is an infinite error."""
    out = {}
    for name, r in ref.items():
        g = got[name].double()
        err = (g - r).abs().max().item() if torch.isfinite(g).all() else float("inf")
        out[name] = (err, BF16_RTOL * max(1.0, r.abs().max().item()))
    return out


def run_candidate(job: Job, x: dict[str, torch.Tensor], arch: int) -> dict[str, torch.Tensor]:
    """The kernels' result for ``job``: its output (fwd, decode) or its gradients (bwd_dkdv: k1, k2, v; bwd_dq: q1,
    q2), with ``job.config`` as the kernel's tiles (the defaults of this arch for the others). The training kernels
    run through triton_diff's own autograd Function and launch closures (private: the public call takes one tile
    size for all kernels and no value split), decode through ``triton_diff_decode`` with the tiles passed."""
    from ..kernels import triton_diff as td

    scale, dtype = job.d ** -0.5, x["q1"].dtype
    if job.kernel == "decode":
        from ..kernels.triton_decode import triton_diff_decode

        _, bn, nw, ns = job.config
        with torch.no_grad():
            out = triton_diff_decode(x["q1"], x["q2"], x["k1"], x["k2"], x["v"], x["lam"], scale, x["key_mask"],
                                     block_n=bn, num_warps=nw, num_stages=ns)
        return {"out": out}
    kernels: dict[str, Any] = dict(td.default_config(job.d, job.dv, dtype, arch))
    kernels[job.kernel] = job.config
    cfg = td._Cfg(kernels, td.dot_precision(dtype, None))  # no tune key: exactly these tiles
    want = {"fwd": (), "bwd_dkdv": ("k1", "k2", "v"), "bwd_dq": ("q1", "q2")}[job.kernel]
    if job.shared_k:
        want = tuple(n for n in want if n != "k2")  # one key tensor: its gradient holds both maps'
    leaves = {n: t.detach().requires_grad_(n in want) for n, t in x.items() if n in ("q1", "q2", "k1", "k2", "v")}
    if job.shared_k:
        leaves["k2"] = leaves["k1"]
    args = (leaves["q1"], leaves["q2"], leaves["k1"], leaves["k2"], leaves["v"], x["lam"], scale, None,
            job.shared_k, cfg)
    if not want:
        with torch.no_grad():
            return {"out": td._TritonDiffAttention.apply(*args)}
    out = td._TritonDiffAttention.apply(*args)
    grads = torch.autograd.grad(out, [leaves[n] for n in want], x["dout"])
    return dict(zip(want, grads))


def oracle_of(job: Job, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The float64 oracle's value of what ``run_candidate`` returns, on the same (bf16-rounded) inputs."""
    names = ("q1", "q2", "k1", "k2", "v")
    leaves = {n: x[n].double().requires_grad_(True) for n in names if not (job.shared_k and n == "k2")}
    if job.shared_k:
        leaves["k2"] = leaves["k1"]
    out = _oracle(leaves["q1"], leaves["q2"], leaves["k1"], leaves["k2"], leaves["v"], x["lam"].double(),
                  job.d ** -0.5, x.get("key_mask"))
    if job.kernel in ("fwd", "decode"):
        return {"out": out.detach()}
    want = ("k1", "v") if job.shared_k else ("k1", "k2", "v")
    if job.kernel == "bwd_dq":
        want = ("q1", "q2")
    grads = torch.autograd.grad(out, [leaves[n] for n in want], x["dout"].double())
    return dict(zip(want, grads))


def check_job(job: Job, arch: int, device: str, t: int, dtype: torch.dtype = DTYPE,
              launch: Callable[[Job, dict[str, torch.Tensor], int], dict[str, torch.Tensor]] = run_candidate
              ) -> dict[str, Any]:
    """Run one candidate and compare it with the oracle: {status: ok | wrong | failed, reason, error, tolerance,
    seconds}. ``dtype``: bfloat16 on the GPU (the benches'); the dry run's interpreter runs float32 (it has no
    bfloat16 arithmetic of its own), with the same tolerance. ``launch`` is ``run_candidate`` (a test passes a broken
    one)."""
    t0 = time.monotonic()
    dev = torch.device(device)
    x = _inputs(job, t, dev, dtype)
    if job.kernel == "decode":  # two rows: the whole cache, and a shorter one (187 of 256: a multiple of no tile)
        lens = torch.tensor([t, t - t // 4 - 5], device=dev)
        x["key_mask"] = torch.arange(t, device=dev)[None, :] < lens[:, None]
    res: dict[str, Any] = {"job": asdict(job), "label": job.label(arch), **job.data(arch)}
    try:
        got = launch(job, x, arch)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    except Exception as exc:  # a compile or launch failure of this candidate (or a bug: the reason says which)
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        res.update(status="failed", reason=f"{type(exc).__name__}: {(lines or [''])[0][:200]}")
        res["traceback"] = traceback.format_exc(limit=4)[-2000:]
    else:
        errs = _errors(got, oracle_of(job, x))
        name, (err, tol) = max(errs.items(), key=lambda kv: kv[1][0] / kv[1][1])
        res.update(status="ok" if all(e <= tl for e, tl in errs.values()) else "wrong", error=err, tolerance=tol,
                   tensor=name, reason=f"max |err| {err:.2e} (d{name}) tol {tol:.2e}"
                   if job.kernel.startswith("bwd") else f"max |err| {err:.2e} tol {tol:.2e}")
    res["seconds"] = time.monotonic() - t0
    return res


# ---------------------------------------------------------------------------------------------- the step
def _worker_init(interpret: bool) -> None:
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton_diff is imported in this (spawned) process


def _work(job: Job, arch: int, device: str, t: int, dtype: torch.dtype) -> dict[str, Any]:
    return check_job(job, arch, device, t, dtype)


def format_line(r: dict[str, Any]) -> str:
    """The candidate's line, then its data line (``# candidates row: {json}``, what gpu-check reads)."""
    row = {"status": r["status"], "key": r["key"], "config": r["config"], "where": r["where"],
           "reason": r.get("reason", ""), "seconds": float(f"{r['seconds']:.1f}")}
    return f"{LINE}{r['status']} {r['label']}: {r.get('reason', '')} ({r['seconds']:.1f} s)\n" \
           + data_line("candidates", "row", row)


def skip_entries(results: Sequence[dict[str, Any]], arch: int) -> list[dict[str, Any]]:
    """The wrong and failed candidates as ``triton_tuning.skipped`` reads them: fit key, config, why."""
    return [{"key": tuning.fit_key(arch, r["job"]["form"], r["job"]["d"], r["job"]["kernel"]),
             "config": list(r["job"]["config"]), "status": r["status"], "reason": r.get("reason", "")}
            for r in results if r["status"] != "ok"]


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if args.skip_file:  # a stale list must not hide candidates from this check
        Path(args.skip_file).unlink(missing_ok=True)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
        arch, device, t, dtype = 90, "cpu", 32, torch.float32
    else:
        if not torch.cuda.is_available():
            print("gpu_candidates: error: no CUDA device (use --dry-run on the CPU)", file=sys.stderr)
            return 2
        major, minor = torch.cuda.get_device_capability(0)
        arch, device, t, dtype = major * 10 + minor, "cuda", 256, DTYPE
    jobs = plan(arch)
    if args.dry_run:  # a few: one per kernel and form, the interpreter is slow
        by_kernel: dict[tuple[str, str], Job] = {}
        for j in jobs:  # the last of each: a tuned candidate, not the default (V1's forward: a value split)
            by_kernel[(j.kernel, j.form)] = j
        jobs = list(by_kernel.values())
    if args.limit is not None:
        jobs = jobs[:args.limit]
    # the forward candidates first: every backward job runs its form's default forward, compiled by then
    jobs.sort(key=lambda j: (j.kernel != "fwd", j.kernel == "decode"))
    workers = max(1, min(args.workers or os.cpu_count() or 1, MAX_WORKERS, len(jobs) or 1))
    print(f"# candidates: sm_{arch}, {len(jobs)} candidates of {len(SHAPE_KERNELS)} shapes "
          f"({', '.join(SHAPE_KERNELS)}), {str(dtype).replace('torch.', '')}, T {t}, {workers} worker processes"
          + (" (dry run: interpreter on the CPU)" if args.dry_run else ""), flush=True)
    print(data_line("candidates", "setup", {"arch": f"sm_{arch}", "dtype": str(dtype).replace("torch.", ""),
                                            "planned": len(jobs)}), flush=True)
    results = []
    if jobs:
        ctx = mp.get_context("spawn")  # CUDA in the workers: no fork after CUDA init
        with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init,
                                    initargs=(args.dry_run,)) as pool:
            futures = {pool.submit(_work, j, arch, device, t, dtype): j for j in jobs}
            for fut in cf.as_completed(futures):
                try:
                    r = fut.result()
                except Exception as exc:  # the worker died (a crash in the compiler): this and its pool's rest
                    job = futures[fut]
                    r = {"job": asdict(job), "label": job.label(arch), **job.data(arch), "status": "failed",
                         "seconds": 0.0,
                         "reason": f"worker process: {type(exc).__name__}: {exc}"[:200], "traceback": ""}
                results.append(r)
                print(format_line(r), flush=True)
                if r["status"] == "failed" and args.verbose:
                    print(r["traceback"], flush=True)
    counts = {s: sum(r["status"] == s for r in results) for s in ("ok", "wrong", "failed")}
    print(f"{COUNT_LINE}{counts['ok']} ok, {counts['wrong']} wrong, {counts['failed']} failed of {len(jobs)} "
          f"(sm_{arch}; {time.monotonic() - t0:.1f} s)", flush=True)
    print(data_line("candidates", "end", {**counts, "of": len(jobs)}), flush=True)
    if args.skip_file:
        skips = skip_entries(results, arch)
        Path(args.skip_file).write_text(json.dumps({"version": SKIP_VERSION, "skip": skips}, indent=1) + "\n")
        print(f"# candidates: {len(skips)} left out of the later steps' tuning ({args.skip_file})", flush=True)
    return 1 if counts["wrong"] else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m difftransformer.gpucheck.gpu_candidates", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--workers", type=int, default=0,
                   help=f"worker processes (default: the CPU count, at most {MAX_WORKERS})")
    p.add_argument("--limit", type=int, default=None, help="only the first N candidates of the plan")
    p.add_argument("--skip-file", default=os.environ.get(tuning.SKIP_ENV) or None,
                   help=f"write the wrong and failed candidates here (default: ${tuning.SKIP_ENV}, which the later "
                        "steps' tuner reads)")
    p.add_argument("--dry-run", action="store_true",
                   help="one candidate per kernel and form of the sm_90 plan in Triton's interpreter on the CPU, "
                        "float32, T 32")
    p.add_argument("--verbose", action="store_true", help="print the traceback of each failed candidate")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    for flag, value, low in (("--workers", args.workers, 0), ("--limit", args.limit, 1)):
        if value is not None and value < low:
            print(f"gpu_candidates: error: {flag} must be >= {low}, got {value}", file=sys.stderr)
            return 2
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
