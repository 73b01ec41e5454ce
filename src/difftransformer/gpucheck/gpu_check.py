"""`make gpu-check` (``python -m difftransformer.gpucheck.gpu_check run``): the whole GPU verification in one command
that fits a short GPU slot: at most 5 minutes (300 s) on one H100.

It runs the GPU tests and the GPU measurements of issue 41 (items 3 and 4) as steps, each a subprocess with its own
time limit (a step that overruns is killed with its process group and recorded as ``timeout``; a failing step is
recorded as ``failed``; the next step runs either way), and the whole run under one budget (a step gets at most
what is left of it). Each step's output is saved as it comes to ``OUT/<step>.txt`` (the command on the first line,
its status on the last); ``OUT/summary.md`` and ``OUT/summary.json`` hold the pass/fail counts, every ratio, the
Triton configs the kernels chose, the small-job throughput and the proposed ``TRITON_AUTO_MEASURED`` entries
(``gpucheck/gpu_summary.py``, the outputs read by ``gpucheck/gpu_readers.py``). Only the repository and the machine's
PyTorch/Triton are needed: no network, no data.

The steps, their limits and the H100 times the limits are planned from are ``gpu_plan.py``'s (its table): a device
smoke of every command (``cuda_smoke.py``), the Triton candidates (``gpu_candidates.py``), the GPU tests in parallel
shards (``gpu_tests.py``), attention fwd+bwd at both shapes and the fused kernel's
breakdown (``bench kernels``), decode and training (every case in one process), the small retrieval jobs. A step
with parts runs several measurements in one process (``gpu_check parts STEP``, each between ``# gpu-check part:``
lines; ``gpu_readers.split_parts`` reads each as its own measurement); the rest are one command each.

On a fresh machine Triton's on-disk cache is empty: without the candidates step, the first call of each shape in a
bench would compile every candidate serially inside the bench (about a hundred compiles), far past the benches'
limits; after it, the benches load them from the cache and only time them. Its list of candidates left out (wrong or
failed on this GPU) is ``OUT/candidates-skip.json``, which every step's tuner reads (``DIFFTRANSFORMER_TRITON_SKIP``).
Attention runs without its memory columns (``bench attention --no-memory``: the per-case memory processes left out,
the time ratios untouched). ``--dry-run`` runs every step on the CPU at toy size (the same commands, readers
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
from pathlib import Path
from typing import Any, Optional

from . import gpu_readers, gpu_summary
from .gpu_plan import (  # noqa: F401  (re-exported: the plan is read through this module too)
    BUDGET_S,
    CANDIDATES,
    GPU_TEST_FILES,
    MIN_STEP_S,
    MODULE,
    TESTS_ENV,
    Step,
    dry_plan,
    find,
    gpu_plan,
)

# triton_tuning.SKIP_ENV, spelled here so that the check itself never imports torch (tests compare the two)
SKIP_ENV = "DIFFTRANSFORMER_TRITON_SKIP"
SKIP_FILE = "candidates-skip.json"  # in the output directory: the candidates step writes it, the tuner reads it
SRC = Path(__file__).resolve().parents[2]  # the directory holding the difftransformer package (PYTHONPATH)


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
            "limit_s": limit_s, "command": command, "output": path.name, "text": path.read_text(),
            "parts": [[p.name, p.kind] for p in step.parts]}


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
                            "limit_s": 0.0, "command": step_command(step), "output": "", "text": "",
                            "parts": [[p.name, p.kind] for p in step.parts]})
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
        plan = [plan[0], *(s for s in plan[1:] if s.name in args.steps)]
    if args.budget is None:  # the dry run measures nothing: every step gets its whole limit however slow the CPU
        args.budget = sum(s.limit_s for s in plan) if args.dry_run else BUDGET_S
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
    results = [probe, *run_steps(plan[1:], out, args.budget - (time.monotonic() - t0), python)]
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


def call_module(args: Sequence[str]) -> int:
    """``python -m MODULE ARGV`` (``args`` = MODULE, *ARGV) in this process: ``ENTRIES[MODULE](argv)``'s status;
    an exception (a bug, not a refusal) is printed and is status 1. A part runs the command line or this module."""
    import traceback

    from ..cli import main as cli_main

    entries: dict[str, Callable[[list[str]], Any]] = {"difftransformer": cli_main, MODULE: main}
    module, *argv = args
    if module not in entries:
        print(f"gpu-check: error: a part runs one of {', '.join(entries)}, not {module!r}", file=sys.stderr)
        return 1
    try:
        return int(entries[module](argv) or 0)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except Exception:
        traceback.print_exc()
        return 1


def run_parts(step: Step) -> int:
    """``parts``: each of the step's parts in this process, one after the other, between ``# gpu-check part:``
    lines (``gpu_readers.split_parts``); a part that fails does not stop the next. 1 where one failed."""
    failed = 0
    for part in step.parts:
        print(f"{gpu_readers.PART_PREFIX}{part.name} {part.kind} start: {step_command(part)}", flush=True)
        t0 = time.monotonic()
        rc = call_module(part.args)
        sys.stdout.flush()
        status = "ok" if rc == 0 else "failed"
        failed += rc != 0
        print(f"\n{gpu_readers.PART_PREFIX}{part.name} {status} (rc {rc}) after {time.monotonic() - t0:.1f} s",
              flush=True)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m difftransformer.gpucheck.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    r = sub.add_parser("run", help="the whole check (what `make gpu-check` runs)", allow_abbrev=False)
    r.add_argument("--out", default=None, help="output directory (default runs/gpu; runs/gpu-dry with --dry-run)")
    r.add_argument("--budget", type=float, default=None,
                   help=f"seconds for the whole run; each step gets at most what is left (default {BUDGET_S:g}; with "
                        "--dry-run the dry steps' limits together)")
    r.add_argument("--steps", nargs="+", metavar="STEP", default=None,
                   help="run only these steps (the env probe always runs): "
                        + " ".join(s.name for s in gpu_plan()[1:]))
    r.add_argument("--dry-run", action="store_true",
                   help="every step on the CPU at toy size (no GPU needed): checks the plumbing, measures nothing")
    r.add_argument("--commit", default=None, help="the commit to name in the summary (default: git rev-parse HEAD)")
    sub.add_parser("env", help="print the machine's versions and card as one JSON line (a step of run)")
    pp = sub.add_parser("parts", help="run a step's parts in this process (what run starts for a step with parts)",
                        allow_abbrev=False)
    pp.add_argument("step", help="the step: " + " ".join(s.name for s in gpu_plan() if s.parts))
    pp.add_argument("--dry-run", action="store_true", help="the step of the dry plan")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command == "env":
        return env_probe()
    if args.command == "parts":
        try:
            step = find(dry_plan() if args.dry_run else gpu_plan(), args.step)
            if not step.parts:
                raise ValueError(f"step {step.name!r} has no parts")
        except ValueError as e:
            print(f"gpu-check: error: parts: {e}", file=sys.stderr)
            return 2
        return run_parts(step)
    if args.out is None:
        args.out = "runs/gpu-dry" if args.dry_run else "runs/gpu"
    try:
        return check(args)
    except ValueError as e:
        print(f"gpu-check: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
