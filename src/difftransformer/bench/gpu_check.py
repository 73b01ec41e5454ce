"""`make gpu-check` (``python -m difftransformer.bench.gpu_check run``): the whole GPU verification in one command
that fits a short GPU slot, at most 6 minutes on one H100-class GPU.

It runs the GPU tests and the GPU measurements of issue 41 (items 3 and 4) as steps, each a subprocess with its own
time limit (a step that overruns is killed with its process group and recorded as ``timeout``; a failing step is
recorded as ``failed``; the next step runs either way), and the whole run under one budget (a step gets at most
what is left of it). Each step's output is saved as it comes to ``OUT/<step>.txt`` (the command on the first line,
its status on the last); ``OUT/summary.md`` and ``OUT/summary.json`` hold the pass/fail counts, every ratio, the
Triton configs the kernels chose, the small-job throughput and the proposed ``TRITON_AUTO_MEASURED`` entries
(``bench/gpu_summary.py``, the outputs read by ``bench/gpu_readers.py``). Only the repository and the machine's
PyTorch/Triton are needed: no network, no data.

The budget, per step, from the H200 run of 2026-11-26 (commit 5fdef50, torch 2.11.0+cu130, Triton 3.6.0):

======================  ======  ==============================================================================
step                    limit   basis
======================  ======  ==============================================================================
env                     20 s    import torch + CUDA init, a few seconds
candidates              75 s    (new; an estimate, not measured) every Triton candidate the later steps' tuner
                                may try (62 on sm_90, 50 on sm_80), compiled and checked against the float64
                                oracle in up to 16 worker processes: ~10 s per worker to start (torch, CUDA),
                                then ~4 rounds of compiles of a few seconds each (3 kernels per backward job)
tests                   75 s    the GPU test files took 64 s (32 of them failing); run with the default tiles
                                (DIFFTRANSFORMER_TRITON_TUNE=0): the candidates step checked the others
attention-3b            40 s    paper-3b N=4096/16384, 3 rounds: 53 s with memory, most of it the 10 fresh
                                processes of the memory columns (about 5 s each), which this check leaves out
attention               35 s    bench shape N=2048/8192, 5 rounds: about 60 s with memory (3 sizes took 90 s)
decode-sdpa             25 s    cuda-graph, batch 1/8, context 2048/8192: 18 s
decode-triton           30 s    the same: 19 s, plus measuring the kernel's candidate tiles
train                   55 s    bench shape 8 x 1024, 5 cases each in a fresh process: 49 s
train-3b                60 s    paper-3b, 4 layers, seq 4096: 104 s when each of its 5 cases built its 1.07B model
                                on the CPU (~20 s each); now built on the GPU (estimate: ~10 s a case)
small-jobs              35 s    one job at a time per variant, then 8 and 16 processes: 100 steps each
======================  ======  ==============================================================================

The limits add up to 450 s; the budget (``--budget``, 350 s) caps the run and the steps are ordered so that the
ones the goals of item 3 need most come first. On a fresh machine Triton's on-disk cache is empty: without the
candidates step, the first call of each shape in a bench would compile every candidate serially inside the bench
(about a hundred compiles), far past the benches' limits; after it, the benches load them from the cache and only
time them. Its list of candidates left out (wrong or failed on this GPU) is ``OUT/candidates-skip.json``, which
every step's tuner reads (``DIFFTRANSFORMER_TRITON_SKIP``). Attention runs without its memory columns
(``attention-time``: ``bench attention`` with the per-case memory processes left out, the time ratios untouched),
which is what makes the rest fit. ``--dry-run`` runs every step on the CPU at toy size (the same commands, readers
and summary), to check the plumbing without a GPU; ``--steps`` runs a subset (a rerun of one that timed out).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..model.attention.triton_tuning import SKIP_ENV
from . import gpu_readers, gpu_summary

BUDGET_S = 350.0  # the whole run: 6 minutes less 10 s for starting and the summary
MIN_STEP_S = 5.0  # a step with less than this left of the budget is skipped, not started
GPU_TEST_FILES = ("tests/model/test_triton_diff.py", "tests/model/test_triton_fallback.py", "tests/model/test_cuda.py")
MODULE = "difftransformer.bench.gpu_check"  # the step commands below run it as python -m MODULE
CANDIDATES = "difftransformer.bench.gpu_candidates"  # the candidates step
# The GPU tests run the kernels' default tiles (what their tolerances were written for): the candidates step has
# checked every other config the tuner may pick, and tuning inside the tests would compile them all again.
TESTS_ENV = (("DIFFTRANSFORMER_TRITON_TUNE", "0"),)
SKIP_FILE = "candidates-skip.json"  # in the output directory: the candidates step writes it, the tuner reads it
SRC = Path(__file__).resolve().parents[2]  # the directory holding the difftransformer package (PYTHONPATH)


@dataclass(frozen=True)
class Step:
    """One command of the check: ``python -m <args>``; ``kind`` names its reader in ``gpu_readers.READERS``."""

    name: str
    kind: str
    args: tuple[str, ...]
    limit_s: float
    env: tuple[tuple[str, str], ...] = ()  # variables set for this step only (on top of ``child_env``)


def _bench(what: str, *flags: str) -> tuple[str, ...]:
    return ("difftransformer", "bench", what, *flags)


def gpu_plan() -> list[Step]:
    """The steps on a GPU, in the order they run (see the module's table for each limit's basis)."""
    attention = ("--device", "cuda", "--dtype", "bfloat16", "--backends", "sdpa", "triton")
    decode = ("--device", "cuda", "--decode-mode", "cuda-graph", "--batch", "1", "8", "--contexts", "2048", "8192",
              "--new-tokens", "64", "--no-hf", "--backend")
    train = ("--device", "cuda", "--precision", "bfloat16", "--backends", "sdpa", "triton", "--timeout", "100")
    return [
        Step("env", "env", (MODULE, "env"), 20),
        Step("candidates", "candidates", (CANDIDATES,), 75),
        Step("tests", "tests", ("pytest", "-q", "-p", "no:cacheprovider", *GPU_TEST_FILES), 75, TESTS_ENV),
        Step("attention-3b", "attention", (MODULE, "attention-time", "--shape", "paper-3b", *attention,
                                           "--seq-lens", "4096", "16384", "--repeats", "3"), 40),
        Step("attention", "attention", (MODULE, "attention-time", *attention, "--seq-lens", "2048", "8192",
                                        "--repeats", "5"), 35),
        Step("decode-sdpa", "decode", _bench("decode", *decode, "sdpa"), 25),
        Step("decode-triton", "decode", _bench("decode", *decode, "triton"), 30),
        Step("train", "train", _bench("train", *train, "--batch", "8"), 55),
        Step("train-3b", "train", _bench("train", *train, "--shape", "paper-3b", "--layers", "4", "--seq-len", "4096"),
             60),
        Step("small-jobs", "small-jobs", ("difftransformer.bench.small_jobs", "--device", "cuda", "--steps", "100",
                                          "--processes", "8", "16"), 35),
    ]


def dry_plan() -> list[Step]:
    """The same steps on the CPU at toy size: ``blocked`` stands in for ``triton`` (which needs CUDA), a tiny
    model for each shape, pytest on the CUDA-only test file (every case skips there)."""
    toy = ("--d-model", "64", "--vocab-size", "256")
    attention = ("--device", "cpu", "--dtype", "float32", "--backends", "sdpa", "blocked", "--d-model", "64",
                 "--head-dim", "16", "--repeats", "1")
    decode = ("--device", "cpu", "--batch", "1", "--contexts", "8", "--new-tokens", "2", "--rounds", "1", "--layers",
              "1", "--head-dim", "16", *toy, "--no-hf", "--backend", "sdpa")
    train = ("--device", "cpu", "--backends", "sdpa", "blocked", "--seq-len", "16", "--batch", "2", "--layers", "1",
             "--heads", "4", "--steps", "1", "--warmup", "0", "--timeout", "60", *toy)
    return [
        Step("env", "env", (MODULE, "env"), 30),
        Step("candidates", "candidates", (CANDIDATES, "--dry-run"), 60),  # 8 candidates: about 8 s on 2 cores
        Step("tests", "tests", ("pytest", "-q", "-p", "no:cacheprovider", "tests/model/test_cuda.py"), 60, TESTS_ENV),
        Step("attention-3b", "attention", (MODULE, "attention-time", "--shape", "paper-3b", *attention,
                                           "--seq-lens", "32"), 30),
        Step("attention", "attention", (MODULE, "attention-time", *attention, "--seq-lens", "16", "32"), 30),
        Step("decode-sdpa", "decode", _bench("decode", *decode), 30),
        Step("train", "train", _bench("train", *train), 150),  # 5 fresh processes: 50-60 s on 2 loaded cores
        Step("small-jobs", "small-jobs", ("difftransformer.bench.small_jobs", "--device", "cpu", "--steps", "2",
                                          "--warmup", "1", "--processes", "2"), 120),
    ]


# ---------------------------------------------------------------------------------------------- running
def child_env(out_dir: Optional[Path] = None, extra: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    """The environment of every step: this package first on PYTHONPATH (the repository's src/, not an install);
    with ``out_dir``, the tuner's skip list there (``triton_tuning.SKIP_ENV``: the candidates step writes the
    candidates that were wrong or failed on this GPU, and the later steps' tuner leaves them out); then ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"  # the output reaches the file as it is printed, and survives a kill
    if out_dir is not None:
        env[SKIP_ENV] = str(out_dir.resolve() / SKIP_FILE)
    env.update(extra)
    return env


def _stop(proc: subprocess.Popen) -> None:
    """End the step's process group (its own session: the step and the processes it spawned), TERM then KILL."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def step_command(step: Step) -> str:
    """The step's command as a shell line to rerun it by hand from the repository root (its own variables first)."""
    return shlex.join([*(f"{k}={v}" for k, v in step.env), "PYTHONPATH=src", "python3", "-m", *step.args])


def run_step(step: Step, out_dir: Path, limit_s: float, python: str = sys.executable) -> dict[str, Any]:
    """Run one step under ``limit_s`` seconds, its output (stdout and stderr) into ``out_dir/<name>.txt``.
    Returns {name, kind, status ("ok", "failed", "timeout"), rc, seconds, limit_s, command, output, text}."""
    argv = [python, "-m", *step.args]
    path = out_dir / f"{step.name}.txt"
    command = step_command(step)
    t0 = time.monotonic()
    with open(path, "w") as f:
        f.write(f"$ {command}\n")
        f.flush()
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=child_env(out_dir, step.env),
                                cwd=SRC.parent, start_new_session=True)
        try:
            rc: Optional[int] = proc.wait(timeout=limit_s)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc, status = proc.returncode, "timeout"
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C): leave nothing running on the GPU
                _stop(proc)
    seconds = time.monotonic() - t0
    with open(path, "a") as f:
        f.write(f"\n# gpu-check: {step.name} {status} (rc {rc}) after {seconds:.1f} s, limit {limit_s:.0f} s\n")
    return {"name": step.name, "kind": step.kind, "status": status, "rc": rc, "seconds": seconds,
            "limit_s": limit_s, "command": command, "output": path.name, "text": path.read_text()}


def run_steps(steps: Sequence[Step], out_dir: Path, budget_s: float, python: str = sys.executable,
              clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every step in order, each under min(its limit, what is left of ``budget_s``); a step with less than
    ``MIN_STEP_S`` left is recorded as ``skipped`` without being started."""
    end = clock() + budget_s
    results = []
    for step in steps:
        left = end - clock()
        if left < MIN_STEP_S:
            results.append({"name": step.name, "kind": step.kind, "status": "skipped", "rc": None, "seconds": 0.0,
                            "limit_s": 0.0, "command": step_command(step), "output": "",
                            "text": ""})
            log(f"gpu-check: {step.name}: skipped ({left:.0f} s of the budget left)")
            continue
        limit = min(step.limit_s, left)
        log(f"gpu-check: {step.name} (limit {limit:.0f} s) ...")
        r = run_step(step, out_dir, limit, python)
        log(f"gpu-check: {step.name}: {r['status']} in {r['seconds']:.1f} s")
        results.append(r)
    return results


def source_digest() -> str:
    """The first 12 hex digits of a SHA-256 over the package's Python files (path and content, sorted): names the
    code that ran where the GPU machine's copy of the checkout has no ``.git`` (compute it beside a commit to match)."""
    h = hashlib.sha256()
    for path in sorted((SRC / "difftransformer").rglob("*.py")):
        h.update(path.relative_to(SRC).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def commit() -> str:
    """The checkout's commit (short hash, "+dirty" with uncommitted changes), or "unknown" without git."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=SRC.parent, capture_output=True, text=True, timeout=10).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        return (head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")) if head else \
            "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def check(args: argparse.Namespace, python: str = sys.executable) -> int:
    """``run``: probe the machine, run the steps, write the summary; 2 (one line) where CUDA is missing."""
    out = Path(args.out).resolve()
    plan = dry_plan() if args.dry_run else gpu_plan()
    if args.steps:
        unknown = sorted(set(args.steps) - {s.name for s in plan})
        if unknown:
            raise ValueError(f"--steps {' '.join(unknown)}: no such step; choose from {' '.join(s.name for s in plan)}")
    if args.budget <= 0:
        raise ValueError(f"--budget must be > 0 seconds, got {args.budget}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    probe = run_step(plan[0], out, plan[0].limit_s, python)
    env = gpu_readers.read_env(probe["text"])
    if not args.dry_run and not env.get("cuda_available"):
        why = (f"torch {env['torch']}: torch.cuda.is_available() is False" if env else
               f"the probe failed ({probe['status']}; see {out / probe['output']})")
        print(f"gpu-check needs a CUDA device: {why}", file=sys.stderr)
        return 2
    steps = [s for s in plan[1:] if not args.steps or s.name in args.steps]
    results = [probe, *run_steps(steps, out, args.budget - (time.monotonic() - t0), python)]
    meta = {"commit": args.commit or commit(), "source_digest": source_digest(),
            "date": datetime.date.today().isoformat(),
            "mode": "dry (CPU, toy sizes)" if args.dry_run else "gpu", "budget_s": args.budget,
            "wall_s": time.monotonic() - t0}
    summary = gpu_summary.summarize(results, meta)
    js, md = gpu_summary.write(summary, out)
    bad = [f"{r['name']} {r['status']}" for r in results if r["status"] != "ok"]
    print(f"gpu-check: {len(results) - len(bad)} of {len(results)} steps ok"
          + (f" ({', '.join(bad)})" if bad else "") + f"; {md} and {js.name}")
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------- the step commands
def env_probe() -> int:
    """``env``: one ``# gpu-check env: {json}`` line (versions, the card, its capability)."""
    info: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        import torch
    except ImportError as e:
        info["error"] = f"torch is not importable: {e}"
    else:
        info.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
        if info["cuda_available"]:
            props = torch.cuda.get_device_properties(0)
            info.update(device=props.name, capability=list(torch.cuda.get_device_capability(0)),
                        memory_gib=round(props.total_memory / 2**30, 1))
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    print(gpu_readers.ENV_PREFIX + json.dumps(info, sort_keys=True), flush=True)
    return 0


def _no_memory(*_args: Any, **_kwargs: Any) -> float:
    return float("nan")


def attention_time(argv: Sequence[str]) -> int:
    """``attention-time``: ``difftransformer bench attention ARGV`` with the memory columns left out (each costs a
    fresh process per case and size; they read ``nan``). The time ratios are the bench's own."""
    from ..cli import main as cli_main
    from . import attention

    if not callable(getattr(attention, "peak_memory", None)):
        raise RuntimeError("bench attention no longer has peak_memory(): update gpu_check.attention_time")
    attention.peak_memory = _no_memory
    print("# gpu-check: memory not measured (the MB and xM columns read nan): time ratios only", flush=True)
    return cli_main(["bench", "attention", *argv])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m difftransformer.bench.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    r = sub.add_parser("run", help="the whole check (what `make gpu-check` runs)", allow_abbrev=False)
    r.add_argument("--out", default=None, help="output directory (default runs/gpu; runs/gpu-dry with --dry-run)")
    r.add_argument("--budget", type=float, default=BUDGET_S,
                   help=f"seconds for the whole run; each step gets at most what is left (default {BUDGET_S:g})")
    r.add_argument("--steps", nargs="+", metavar="STEP", default=None,
                   help="run only these steps (the env probe always runs): "
                        + " ".join(s.name for s in gpu_plan()[1:]))
    r.add_argument("--dry-run", action="store_true",
                   help="every step on the CPU at toy size (no GPU needed): checks the plumbing, measures nothing")
    r.add_argument("--commit", default=None, help="the commit to name in the summary (default: git rev-parse HEAD)")
    sub.add_parser("env", help="print the machine's versions and card as one JSON line (a step of run)")
    sub.add_parser("attention-time", add_help=False,
                   help="bench attention without its memory columns (a step of run); every flag after it is bench "
                        "attention's")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["attention-time"]:  # the rest is bench attention's, parsed (and refused) by it
        return attention_time(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "env":
        return env_probe()
    if args.out is None:
        args.out = "runs/gpu-dry" if args.dry_run else "runs/gpu"
    try:
        return check(args)
    except ValueError as e:
        print(f"gpu-check: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
