"""Which tiles the fused DIFF kernels run with on a GPU: candidate configs per architecture, pruned ahead of time,
chosen on the GPU by measurement on first use.

Each kernel (``fwd``, ``bwd_dkdv``, ``bwd_dq``, ``decode``) has a short list of candidate (block_m, block_n,
num_warps, num_stages) per head-width class (``CANDIDATES_16BIT``). ``tests/model/triton_launches.py --candidates
--write`` compiles every candidate of the 16-bit launches for sm_80 (A100, 163 KB per program) and sm_90 (H100/H200,
227 KB) with no GPU (``triton.compile`` for a ``GPUTarget``) and writes which fit -- shared memory within the GPU's
limit, at most ``MAX_SPILL_BYTES`` of spilled registers per thread -- to ``triton_fits.py`` (generated data; the test
``tests/model/test_triton_aot.py`` checks that it matches the candidates and recompiles a sample of it).

On a CUDA GPU, for a 16-bit call whose (arch, variant, head width, kernel) has more than one fitting candidate,
``tuned_launch`` times each fitting candidate on the call's own tensors (``triton.testing.do_bench``; every kernel
here overwrites its outputs and reads only its inputs, so repeated launches are harmless: no atomics, nothing in
place), keeps the fastest per shape key (arch, dtype, d, dv, variant, kernel, sequence-length bucket) for the life
of the process, and launches it. A candidate that fails to compile or launch is skipped. It never measures under
Triton's CPU interpreter (tests pass their own tiles or get ``default_config``), under ``torch.compile`` tracing or
during CUDA-graph capture (then the key's choice if one was made, else the default config). ``chosen_configs()``
reports the choices; ``bench attention|train|decode`` print them as ``# triton config:`` lines. Candidates listed in
the JSON file named by ``$DIFFTRANSFORMER_TRITON_SKIP`` (``skipped``; gpu-check's candidates step writes those that
computed a wrong answer or failed to compile on its GPU) are left out.

Why not ``triton.autotune``: the decode kernel's partial buffers depend on its tile (the split count), the choice
must be skippable under graph capture and tracing, and the ahead-of-time compile test drives the raw kernels.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch

from .launches import is_triton_launch_error

# (block_m, block_n, num_warps, num_stages); decode's block_m is 0 (unused). A forward config may carry a 5th entry,
# block_dv: the value columns per program (the value width split over dv // block_dv programs, scores recomputed).
Config = tuple[int, ...]

KERNELS = ("fwd", "bwd_dkdv", "bwd_dq", "decode")
# The architectures the candidates are compiled for and tuned on; anything else runs ``default_config``.
TUNED_ARCHS = (80, 90)
# Per thread, bytes of stack frame (spilled registers) a candidate may use and still count as fitting.
MAX_SPILL_BYTES = 128

# Candidates for float16/bfloat16 on sm_80/sm_90, per width class ("d64": d 64, dv 64 or 128; "d128": d = dv = 128;
# "d128v256": DIFF V1 at d 128). ``default_config``'s entry (tiles sized for 99 KB) is always a candidate too, so the
# measured choice is never worse than it on the GPU it ran on. The grids follow FlashAttention-2's tiles on those
# GPUs (128 x 64, 3-4 stages, 8 warps) shrunk where the kernels hold two maps of state: the forward keeps two
# accumulators of width dv (2 * 128 * 256 float32 at 128 rows and dv 256 is 256 KB of registers: 16 warps at most),
# so DIFF V1's forward at d 128 also gets candidates that split its 256 value columns into two programs of 128
# (block_dv, the 5th entry): each recomputes both maps' scores (the forward's matmul work grows by a third) and holds
# the accumulators of V1 per_head, whose 64 x 64 and 128 x 64 tiles fit sm_90 (and 64 x 64 x 3 stages sm_80).
# DIFF V1's dK/dV kernel at d 128 holds three float32 accumulators per key row, dk1 and dk2 (d wide) and dv (dv =
# 256 wide): 512 floats, twice d128's. Its first grid (block_n 64 and 128, the d128 sizes) spilled 300-1500 bytes
# per thread on both GPUs, so only the default (64, 16, 8, 2) fitted and the tuner had nothing to measure (gpu-check
# on an H100, 2026-11-26: "measured": 0). These block_n 16-32 tiles at 8 warps fit sm_80 and sm_90 (triton_fits.py).
CANDIDATES_16BIT: dict[str, dict[str, tuple[Config, ...]]] = {
    "d64": {
        "fwd": ((128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 4, 2), (64, 64, 4, 2), (64, 64, 4, 3)),
        "bwd_dkdv": ((32, 128, 8, 2), (64, 128, 8, 2), (64, 64, 4, 2), (32, 64, 4, 2), (64, 64, 8, 3)),
        "bwd_dq": ((64, 64, 8, 2), (128, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 2), (64, 64, 4, 3)),
        "decode": ((0, 32, 4, 2), (0, 64, 4, 4), (0, 128, 4, 3), (0, 64, 8, 3), (0, 128, 8, 2)),
    },
    "d128": {
        "fwd": ((128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 4, 2), (64, 64, 8, 3), (64, 32, 4, 2)),
        "bwd_dkdv": ((32, 128, 8, 2), (64, 64, 8, 2), (32, 64, 4, 2), (64, 64, 8, 3), (16, 64, 4, 2)),
        "bwd_dq": ((64, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 2), (64, 64, 8, 3), (32, 64, 4, 2)),
        "decode": ((0, 32, 4, 2), (0, 64, 4, 4), (0, 128, 4, 3), (0, 64, 8, 3), (0, 128, 8, 2)),
    },
    "d128v256": {
        "fwd": ((128, 32, 16, 2), (64, 64, 8, 2), (64, 32, 8, 2), (64, 32, 8, 3), (32, 64, 4, 2),
                (128, 64, 8, 2, 128), (64, 64, 4, 2, 128), (64, 64, 8, 3, 128)),
        "bwd_dkdv": ((32, 32, 8, 2), (64, 32, 8, 2), (64, 16, 8, 3), (32, 16, 8, 2)),
        "bwd_dq": ((64, 32, 8, 2), (64, 64, 8, 2), (32, 64, 4, 2), (64, 32, 8, 3), (128, 32, 16, 2)),
        "decode": ((0, 32, 4, 2), (0, 64, 4, 4), (0, 128, 4, 3), (0, 64, 8, 3), (0, 128, 8, 2)),
    },
}

# Timing of one candidate (milliseconds of warm-up and of measurement, triton.testing.do_bench): short, so that the
# first call of a shape costs well under a second per kernel once compiled.
BENCH_WARMUP_MS = 5
BENCH_REP_MS = 20

# A JSON file of candidates to leave out (``skipped``), written by gpu-check's candidates step.
SKIP_ENV = "DIFFTRANSFORMER_TRITON_SKIP"
_SKIP_CACHE: dict[str, Any] = {}

_CHOSEN: dict[tuple, Config] = {}  # shape key -> the config its launches use
_MEASURED: set[tuple] = set()  # the keys whose config was measured among several (the others had one option)


def width_class(d: int, dv: int) -> Optional[str]:
    """The candidate class of head width d and value width dv (None: no candidates; ``default_config`` only)."""
    if d == 64:
        return "d64"
    if d == 128:
        return "d128" if dv == 128 else "d128v256"
    return None


def variant_of(d: int, dv: int, shared_k: bool) -> str:
    """The launch's DIFF form, as the fit table names it: v1 (dv = 2d), v2 (one key tensor), v1_per_head (dv = d)."""
    if dv == 2 * d:
        return "v1"
    return "v2" if shared_k else "v1_per_head"


def fit_key(arch: int, variant: str, d: int, kernel: str) -> str:
    return f"sm_{arch}/{variant}/d{d}/{kernel}"


def candidates(arch: int, dtype: torch.dtype, d: int, dv: int, shared_k: bool, kernel: str,
               default: Config) -> list[Config]:
    """The configs the tuner may try for this launch, the default first: ``default`` plus every candidate that the
    committed fit table (``triton_fits.FITS``) lists as fitting ``arch``; just ``[default]`` where there is no entry
    (other GPUs, float32/float64, head widths 16 and 32, a variant or width not compiled)."""
    cls = width_class(d, dv)
    if dtype not in (torch.float16, torch.bfloat16) or arch not in TUNED_ARCHS or cls is None:
        return [default]
    from .triton_fits import FITS  # generated data (tests/model/triton_launches.py --candidates --write)

    key = fit_key(arch, variant_of(d, dv, shared_k), d, kernel)
    rows = FITS.get(key)
    if rows is None:
        return [default]
    fitting = [tuple(r["config"]) for r in rows if r["fits"]]
    options = [default, *(c for c in fitting if c != default)]
    skip = skipped()
    kept = [c for c in options if (key, c) not in skip]
    return kept or [default]  # everything left out: the default, as without a tuner


def skipped() -> frozenset[tuple[str, Config]]:
    """The (fit key, config) pairs the tuner leaves out: those listed in the JSON file named by ``$SKIP_ENV``
    (``{"skip": [{"key": "sm_90/v1/d128/fwd", "config": [128, 64, 8, 2], ...}]}``), which gpu-check's candidates
    step writes for the candidates that computed a wrong answer or failed to compile on the GPU it ran on
    (``gpucheck/gpu_candidates.py``). Empty where the variable is unset or the file is absent; read again when the
    file changes."""
    path = os.environ.get(SKIP_ENV)
    if not path or not os.path.isfile(path):
        return frozenset()
    stamp = (path, os.stat(path).st_mtime_ns)
    if _SKIP_CACHE.get("stamp") != stamp:
        import json

        with open(path) as f:
            entries = json.load(f).get("skip", [])
        _SKIP_CACHE.update(stamp=stamp, skip=frozenset((str(e["key"]), tuple(int(c) for c in e["config"]))
                                                       for e in entries))
    return _SKIP_CACHE["skip"]


def seq_bucket(n: int) -> int:
    """The sequence-length bucket of a shape key: n rounded up to a power of two, at least 256."""
    return max(256, 1 << max(0, (n - 1).bit_length()))


def tuning_enabled(device: torch.device) -> bool:
    """Whether calls on ``device`` may measure candidates now: on CUDA, not in the interpreter, not while
    torch.compile traces or a CUDA graph captures (those use the key's earlier choice, else the default)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if os.environ.get("DIFFTRANSFORMER_TRITON_TUNE", "1") == "0":
        return False
    return not (torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing())


def tuned_launch(key: tuple, options: Sequence[Config], launch: Callable[[Config], None], device: torch.device) -> None:
    """Run ``launch(config)`` once with the config chosen for ``key``: measured among ``options`` (the default first)
    on first use where ``tuning_enabled``, remembered for the process. With one option, or where measuring is off,
    the key's earlier choice if any, else ``options[0]``. A candidate whose launch fails (``is_triton_launch_error``)
    is skipped; if all fail, the last error is raised (the caller's fallback takes it)."""
    chosen = _CHOSEN.get(key)
    if chosen is not None or len(options) == 1 or not tuning_enabled(device):
        cfg = chosen if chosen is not None else options[0]
        if chosen is None and len(options) == 1 and device.type == "cuda":
            _CHOSEN[key] = cfg  # reported too: the only config this GPU has for the key
        launch(cfg)
        return
    from triton.testing import do_bench

    times: dict[Config, float] = {}
    error: Optional[BaseException] = None
    for cfg in options:
        try:  # one launch first (it compiles): an error raised here is judged by where it came from, not inside
            launch(cfg)  # do_bench, whose frames are Triton's and would make any error look like Triton's own
        except Exception as exc:
            if not is_triton_launch_error(exc):
                raise
            error = exc
            continue
        times[cfg] = float(do_bench(lambda cfg=cfg: launch(cfg), warmup=BENCH_WARMUP_MS, rep=BENCH_REP_MS))
    if not times:
        assert error is not None
        raise error
    best = min(times, key=times.__getitem__)
    _CHOSEN[key] = best
    _MEASURED.add(key)
    launch(best)


def chosen_configs() -> dict[str, dict[str, int]]:
    """The configs the kernels ran with on CUDA in this process, per shape key:
    "sm_90/bfloat16/d128/dv256/v1/fwd/T4096" -> {"block_m", "block_n", "num_warps", "num_stages", "measured"}
    (JSON-able; block_m is 0 for decode, whose rows are the query heads; measured: chosen by timing among several
    candidates, else the only one, or the default under graph capture / tracing)."""
    out: dict[str, dict[str, int]] = {}
    for key, cfg in sorted(_CHOSEN.items(), key=str):
        arch, dtype, d, dv, variant, kernel, bucket = key
        name = f"sm_{arch}/{str(dtype).replace('torch.', '')}/d{d}/dv{dv}/{variant}/{kernel}/T{bucket}"
        bm, bn, nw, ns = cfg[:4]
        out[name] = {"block_m": bm, "block_n": bn, "num_warps": nw, "num_stages": ns, "measured": int(key in _MEASURED)}
        if len(cfg) > 4:
            out[name]["block_dv"] = cfg[4]
    return out


def config_lines(configs: Optional[dict[str, dict[str, int]]] = None) -> list[str]:
    """One ``# triton config: KEY {json}`` line per chosen config (``chosen_configs()`` of this process unless
    ``configs`` is given, e.g. a benchmark child's): what ``bench attention|train|decode`` print after their tables."""
    import json

    configs = chosen_configs() if configs is None else configs
    return [f"# triton config: {k} {json.dumps(v, sort_keys=True)}" for k, v in sorted(configs.items())]
