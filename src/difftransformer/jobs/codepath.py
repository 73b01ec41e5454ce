"""Where a job's numbers come from: the CPU code path it runs, its one torch thread, the device it trains on.

**The CPU code path** (``CODE_PATHS``): "machine" leaves every library to pick its kernels for this CPU; "avx2" /
"avx512" pin PyTorch's kernels (``ATEN_CPU_CAPABILITY``), MKL's (``MKL_CBWR``, conditional numerical
reproducibility) and oneDNN's (``ONEDNN_MAX_CPU_ISA``) to one instruction set. They are read when a process loads
torch, so they are the environment a job's process STARTS with (``code_path_env``: the local pool's spawned workers
get it as their own environment, a Ray task as its runtime environment); nothing edits the parent's ``os.environ``.
Each job checks that torch runs the kernels asked for and refuses otherwise (a CPU without that instruction set).

**One thread** (``one_thread``): every job runs at one torch thread, so its reduction order, and with it its
numbers, do not depend on the process layout or the machine's thread count.

**The device** (``DEVICES``): "cpu" (the default) or "cuda" (the GPU the job's process was given). GPU results
differ from CPU ones, so a study puts ``device_key(device)`` into the job's key when it is not "cpu".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, Optional, get_args

CodePath = Literal["machine", "avx2", "avx512"]  # a study config's ``cpu_code_path``
CODE_PATHS: tuple[CodePath, ...] = get_args(CodePath)
Device = Literal["cpu", "cuda"]  # where a study's jobs train
DEVICES: tuple[Device, ...] = get_args(Device)
_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
        "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}
_TORCH_NAME = {"avx2": "AVX2", "avx512": "AVX512"}  # torch.backends.cpu.get_cpu_capability() under each
PINNING_VARIABLES = tuple(sorted({k for e in _ENV.values() for k in e}))


def code_path_env(path: str) -> dict[str, str]:
    """The environment variables that pin ``path`` (none for "machine")."""
    if path not in CODE_PATHS:
        raise ValueError(f"CPU code path {path!r} is not allowed; choose one of {', '.join(CODE_PATHS)}")
    return dict(_ENV.get(path, {}))


def kernels_of(path: str) -> Optional[str]:
    """The kernel family torch reports under a pinned ``path`` (``get_cpu_capability``: "AVX2", "AVX512"); None for
    "machine" (whatever the CPU has)."""
    code_path_env(path)  # an unknown path refused
    return _TORCH_NAME.get(path)


def in_code_path(path: str, environ: Optional[dict[str, str]] = None) -> bool:
    """Whether THIS process runs ``path``: its torch kernels and the MKL setting it loaded with."""
    env = os.environ if environ is None else environ
    if path == "machine":
        return not any(k in env for k in PINNING_VARIABLES)
    import torch
    return (torch.backends.cpu.get_cpu_capability() == _TORCH_NAME[path]
            and all(env.get(k) == v for k, v in _ENV[path].items()))


def process_env(path: str, base: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The whole environment a worker process of ``path`` starts with: ``base`` (default this process's) without
    any pinning variable, then ``path``'s."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in PINNING_VARIABLES}
    env.update(code_path_env(path))
    return env


def check_code_path(path: str) -> str:
    """In a job's process: the kernels torch runs; refuses when they are not the pinned ones."""
    import torch
    cap = torch.backends.cpu.get_cpu_capability()
    if path != "machine" and cap != _TORCH_NAME[path]:
        raise ValueError(f"the CPU code path {path!r} was asked for, but torch runs {cap} kernels on this CPU (it "
                         "lacks that instruction set, or the variables were set too late); use --cpu-code-path machine")
    return cap


def cpu_model() -> str:
    """The CPU's model (Linux: /proc/cpuinfo's first "model name", with its family, model and stepping numbers; else
    ``platform.processor()``): two CPUs with the same instruction set can round differently, so a job records which
    one it ran on."""
    import platform
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block only
                k, _, v = line.partition(":")
                fields.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown"
    numbers = [f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields]
    return f"{name} ({', '.join(numbers)})" if numbers else name


_RANK = {"DEFAULT": 0, "AVX2": 1, "AVX512": 2}  # x86 kernel sets, each a superset of the one before


def refuse_unsupported_code_path(path: str, environ: Optional[dict[str, str]] = None) -> None:
    """In the driver, before any job: refuse a pinned ``path`` this machine's CPU cannot run (torch picks the best
    kernels the CPU has when nothing pins them; a pin above that would fail every job). Silent when this process was
    itself started pinned (its capability is then the pin's, not the CPU's) or for "machine"."""
    env = os.environ if environ is None else environ
    if path == "machine" or "ATEN_CPU_CAPABILITY" in env:
        return
    import torch
    cap = torch.backends.cpu.get_cpu_capability()
    if _RANK.get(cap, 0) < _RANK[_TORCH_NAME[path]]:
        raise ValueError(f"--cpu-code-path {path}: this CPU runs at most {cap} kernels, so no job could run "
                         "pinned to it; use --cpu-code-path machine or a machine whose CPU has that instruction set")


@contextmanager
def one_thread() -> Iterator[None]:
    """One torch thread for the job (restored after): the same reduction order whatever the process layout."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_device(device: str) -> None:
    """Refuses a device that is not one of ``DEVICES``, and "cuda" in a process that sees no CUDA GPU."""
    if device not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: this process sees no CUDA GPU (torch "
                             f"{torch.__version__}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")


def device_key(device: str) -> dict[str, Any]:
    """What a job's key records about where it ran: the device and its precision (float32, full-precision matmuls:
    no TF32). Empty for "cpu", so the CPU keys (and journals) of before the device existed stay valid."""
    if device == "cpu":
        return {}
    return {"device": {"type": device, "precision": "float32", "matmul": "highest"}}
