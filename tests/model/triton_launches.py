"""Compile the Triton launches that the wrappers make, ahead of time, for a GPU that is not here.

``python tests/model/triton_launches.py`` (run it with the repository's Python; it must NOT run under
``TRITON_INTERPRET=1``) prints, per launch and target architecture, the shared memory the launch asks for and the
registers and stack frame (where ptxas puts spilled registers) of one thread. ``--json`` prints the same as one JSON
object (``tests/model/test_triton_aot.py`` reads that). Nothing needs a GPU: Triton's bundled ptxas compiles for a
``GPUTarget`` and its bundled ``cuobjdump`` reads the resource use of the cubin.

How a launch is found: the real wrappers (``triton_diff_attention`` forward and backward, ``triton_diff_decode``) run
on CPU tensors with every kernel replaced by a recorder and the GPU's compute capability faked, so the tiles,
warps, stages and constexprs are the ones the wrappers choose for that GPU. Each recorded call is then specialised
exactly as ``JITFunction.run`` would specialise it (Triton's own binder: dtypes, 16-byte alignment, integers equal
to 1 or divisible by 16) and compiled with ``triton.compile``. The kernels never run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("triton_launches.py compiles real kernels: run it without TRITON_INTERPRET=1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated (silences its warning)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from difftransformer.kernels import triton_decode as tdd  # noqa: E402
from difftransformer.kernels import triton_diff as td  # noqa: E402
from difftransformer.kernels import triton_tuning as tuning  # noqa: E402

FITS_PATH = os.path.join(os.path.dirname(tuning.__file__), "triton_fits.py")
# The default launches' resources, compiled once (``--defaults --write``) and read by test_triton_aot.py, which
# recompiles a sample of them: a fresh machine's Triton cache is empty, and compiling all of them took 298 s of the
# test suite's CPU (2026-12-02).
DEFAULTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_default_launches.json")
KERNEL_SOURCES = (td.__file__, tdd.__file__)  # what the table was compiled from (its sha256 is in the table)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (label, value width as a multiple of d, one key tensor for both maps, lambda per row): the three DIFF forms
VARIANTS = {"v1": (2, False, False), "v1_per_head": (1, False, False), "v2": (1, True, True)}
# What `make test` compiles (see test_triton_aot.py): both arch the issue names, and a consumer GPU's 99 KB limit
# for the 16-bit dtypes.
DEFAULT_ARCHS = (80, 90)
# (variant, d) compiled per arch and dtype: V1 and V2 at both widths; per_head (V2's value width with V1's two key
# maps) at the wider one (its d 64 launches lie between V1's and V2's). About two minutes on two cores.
REPRESENTATIVE = (("v1", 64), ("v1", 128), ("v1_per_head", 128), ("v2", 64), ("v2", 128))
CONSUMER_ARCH = 86
QUICK = (("v1", 128), ("v2", 64))  # --quick: the widest launch and the most common one
KERNELS = {  # module attribute -> short name
    (td, "_diff_fwd_kernel"): "fwd",
    (td, "_diff_bwd_preprocess_kernel"): "bwd_pre",
    (td, "_diff_bwd_dkdv_kernel"): "bwd_dkdv",
    (td, "_diff_bwd_dq_kernel"): "bwd_dq",
    (tdd, "_diff_decode_split_kernel"): "decode",
    (tdd, "_diff_decode_merge_kernel"): "merge",
}


@dataclass
class Launch:
    kernel: str  # short name
    case: str  # variant/dtype/d
    arch: int
    where: tuple[str, str] = field(repr=False)  # (module, attribute) of the kernel
    args: tuple = field(repr=False)
    kwargs: dict = field(repr=False)

    @property
    def fn(self):
        return getattr(sys.modules[self.where[0]], self.where[1])

    def packed(self) -> tuple:
        """(signature, constexprs, attrs, options) as ``JITFunction.run`` makes them for this call on ``arch``."""
        backend = make_backend(GPUTarget("cuda", self.arch, 32))
        fn = self.fn
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, spec, opts = binder(*self.args, **self.kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, self.kwargs, bound, spec, opts)
        return signature, constexprs, attrs, options.__dict__

    def config(self) -> dict:
        keys = ("BLOCK_M", "BLOCK_N", "BLOCK_DV", "BLOCK_R", "BLOCK_S", "num_warps", "num_stages", "PRECISION")
        return {k: self.kwargs[k] for k in keys if k in self.kwargs}


@contextmanager
def recording(arch: int):
    """Within: every kernel launch of the two wrappers is recorded instead of run, on CPU tensors, as if on a GPU
    of compute capability ``arch`` (major * 10 + minor)."""
    calls: list[tuple[str, Any, tuple, dict]] = []
    saved = {key: getattr(*key) for key in KERNELS}
    saved_arch, saved_env = (td._device_arch, tdd._device_arch), os.environ.get("TRITON_INTERPRET")

    class Recorder:
        def __init__(self, name, where):
            self.name, self.where = name, where

        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((self.name, self.where, a, k))

    try:
        for (mod, attr), name in KERNELS.items():
            setattr(mod, attr, Recorder(name, (mod.__name__, attr)))
        td._device_arch = tdd._device_arch = lambda device: arch
        os.environ["TRITON_INTERPRET"] = "1"  # only read by the wrappers' device check: the kernels are compiled
        yield calls
    finally:
        for (mod, attr), fn in saved.items():
            setattr(mod, attr, fn)
        td._device_arch, tdd._device_arch = saved_arch
        if saved_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved_env


def record(variant: str, dtype: str, d: int, arch: int, *, b: int = 2, hq: int = 4, hk: int = 2, t: int = 1024,
           n_cache: int = 4096, mask: bool = True, override: Any = None) -> list[Launch]:
    """The launches of one training step (forward and backward, with a padding mask) and one decode step;
    ``override``: a (block_m, block_n, num_warps, num_stages) both wrappers are called with (candidates)."""
    tiles: dict = {}
    if override is not None:
        tiles = dict(block_n=override[1], num_warps=override[2], num_stages=override[3])
    dv_mult, shared_k, lam_row = VARIANTS[variant]
    dt = DTYPES[dtype]
    case = f"{variant}/{dtype}/d{d}"

    def leaf(*shape):
        return torch.zeros(*shape, dtype=dt).requires_grad_(True)

    q1, q2 = leaf(b, hq, t, d), leaf(b, hq, t, d)
    k1 = leaf(b, hk, t, d)
    k2 = k1 if shared_k else leaf(b, hk, t, d)
    v = leaf(b, hk, t, dv_mult * d)
    lam = torch.zeros(b, hq, t, 1, requires_grad=True) if lam_row else torch.zeros((), requires_grad=True)
    key_mask = torch.ones(b, t, dtype=torch.bool) if mask else None
    key_mask is not None and key_mask[0, :3].fill_(False)
    with recording(arch) as calls:
        out = td.triton_diff_attention(q1, q2, k1, k2, v, lam, d ** -0.5, key_mask,
                                       **(dict(tiles, block_m=max(16, override[0])) if tiles else {}))
        out.backward(torch.zeros_like(out))
        with torch.no_grad():
            kc1, kc2 = torch.zeros(b, hk, n_cache, d, dtype=dt), torch.zeros(b, hk, n_cache, d, dtype=dt)
            kc2 = kc1 if shared_k else kc2
            vc = torch.zeros(b, hk, n_cache, dv_mult * d, dtype=dt)
            dlam = torch.zeros(b, hq, 1, 1) if lam_row else torch.zeros(())
            td_mask = torch.ones(b, n_cache, dtype=torch.bool)
            tdd.triton_diff_decode(torch.zeros(b, hq, 1, d, dtype=dt), torch.zeros(b, hq, 1, d, dtype=dt), kc1, kc2,
                                   vc, dlam, d ** -0.5, td_mask, **tiles)
    return [Launch(name, case, arch, where, a, k) for name, where, a, k in calls]


_CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def compile_launch(job: tuple) -> dict:
    """Compile one launch (``_job``) for its arch as JITFunction.run would; its resource use."""
    (kernel, case, arch, config), where, (signature, constexprs, attrs, options) = job
    fn = getattr(sys.modules[where[0]], where[1])
    t0 = time.time()
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                              options=options)
    seconds = time.time() - t0
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(compiled.asm["cubin"])
        fh.flush()
        usage = subprocess.run([_CUOBJDUMP, "--dump-resource-usage", fh.name], capture_output=True, text=True,
                               check=True).stdout
    fields = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage.split("Function", 1)[1]))
    return dict(kernel=kernel, case=case, arch=arch, config=config,
                shared=int(compiled.metadata.shared), regs=int(fields["REG"]), stack=int(fields["STACK"]),
                local=int(fields["LOCAL"]), seconds=round(seconds, 2))


def _job(launch: Launch) -> tuple:
    """What a worker process needs to compile a launch (picklable: the kernel by module and name)."""
    return (launch.kernel, launch.case, launch.arch, launch.config()), launch.where, launch.packed()


def representative(archs=DEFAULT_ARCHS, consumer: bool = True, full: bool = False, pairs=None) -> list[tuple]:
    """The set `make test` compiles: ``REPRESENTATIVE`` in bf16 and fp32, every kernel, for each arch; for the
    consumer arch, the largest bf16 cases. ``full``: every variant at d 64 and 128, and every bf16 one on the
    consumer arch."""
    if pairs is None:
        pairs = [(v, d) for v in VARIANTS for d in (64, 128)] if full else list(REPRESENTATIVE)
    launches = []
    for arch in archs:
        for variant, d in pairs:
            for dtype in ("bf16", "fp32"):
                launches += record(variant, dtype, d, arch)
    if consumer:  # the 16-bit launches nearest 99 KB (before: V1's decode at 141 KB, per_head's at 109 KB)
        for variant, d in (pairs if full else (("v1", 128), ("v1_per_head", 128))):
            launches += record(variant, "bf16", d, CONSUMER_ARCH)
    unique, seen = [], set()
    for launch in launches:  # one compilation per distinct kernel, arch, signature, constexprs and options
        job = _job(launch)
        key = (launch.where, launch.arch, repr(job[2]))
        if key not in seen:
            seen.add(key)
            unique.append(job)
    return unique


def candidate_jobs(archs=DEFAULT_ARCHS) -> list[tuple]:
    """Every autotune candidate (``triton_tuning.CANDIDATES_16BIT`` plus the default) of the 16-bit launches of
    ``REPRESENTATIVE`` for each arch, as the wrappers launch it (bf16; float16 compiles to the same resources)."""
    jobs, seen = [], set()
    for arch in archs:
        for variant, d in REPRESENTATIVE:
            dv = VARIANTS[variant][0] * d
            grid = tuning.CANDIDATES_16BIT[tuning.width_class(d, dv)]
            default = td.default_config(d, dv, torch.bfloat16, arch)
            for kernel in tuning.KERNELS:
                for cfg in dict.fromkeys((default[kernel], *grid[kernel])):
                    launch = next(x for x in record(variant, "bf16", d, arch, override=cfg[:4]) if x.kernel == kernel)
                    if len(cfg) > 4:  # the forward's value split (block_dv): the wrapper's fwd launch makes it so
                        launch.kwargs["BLOCK_DV"] = cfg[4]
                    key = (tuning.fit_key(arch, variant, d, kernel), cfg)
                    if key not in seen:
                        seen.add(key)
                        jobs.append((key, _job(launch)))
    return jobs


def fit_rows(jobs: list[tuple], workers: int, pool: ProcessPoolExecutor | None = None) -> dict[str, list[dict]]:
    """Compile ``candidate_jobs`` (in ``pool``, else a pool of ``workers``); per fit key, each candidate's resources and
    whether it fits (shared memory within the arch's limit, at most ``MAX_SPILL_BYTES`` of spills per thread), in
    candidate order."""
    if pool is None:
        with ProcessPoolExecutor(workers) as own:
            return fit_rows(jobs, workers, own)
    rows = list(pool.map(compile_launch, [job for _, job in jobs]))
    table: dict[str, list[dict]] = {}
    for ((key, cfg), _), r in zip(jobs, rows):
        fits = r["shared"] <= smem_limit(r["arch"]) and r["stack"] <= tuning.MAX_SPILL_BYTES
        table.setdefault(key, []).append(dict(config=tuple(cfg), shared=r["shared"], regs=r["regs"],
                                              stack=r["stack"], fits=fits))
    return table


def sample_jobs(jobs: list[tuple]) -> list[tuple]:
    """A sample of ``candidate_jobs`` that ``make test`` recompiles: per arch and kernel one candidate of one case,
    rotating through the cases and the candidate positions, so that each case and each position is drawn."""
    by_group: dict[tuple, list[tuple]] = {}
    for job in jobs:
        key = job[0][0]  # "sm_90/v1/d128/fwd"
        arch, variant, d, kernel = key.split("/")
        by_group.setdefault((arch, kernel), []).append(job)
    sample = []
    for i, (_, group) in enumerate(sorted(by_group.items())):
        keys = list(dict.fromkeys(job[0][0] for job in group))
        key = keys[i % len(keys)]
        rows = [job for job in group if job[0][0] == key]
        sample.append(rows[(i * 2 + 1) % len(rows)])
    return sample


def launch_id(job: tuple) -> list:
    """A default launch as the table lists it: kernel, case, arch and the wrapper's config."""
    kernel, case, arch, config = job[0]
    return [kernel, case, arch, json.loads(json.dumps(config))]


def sources_sha256() -> str:
    import hashlib
    h = hashlib.sha256()
    for path in KERNEL_SOURCES:
        with open(path, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def default_sample(jobs: list[tuple]) -> list[tuple]:
    """A sample of the default launches ``make test`` recompiles: per arch one launch of each of four kernels,
    rotating through the cases (and the consumer arch's first), so that every variant and dtype is drawn."""
    sample, by_arch = [], {}
    for job in jobs:
        by_arch.setdefault(job[0][2], []).append(job)
    for arch, group in sorted(by_arch.items()):
        kernels = ("fwd", "bwd_dkdv", "bwd_dq", "decode") if arch != CONSUMER_ARCH else ("decode",)
        for i, kernel in enumerate(kernels):
            rows = [j for j in group if j[0][0] == kernel]
            sample.append(rows[(i * 3 + arch) % len(rows)])
    return sample


def fits_module(table: dict[str, list[dict]]) -> str:
    """The source of ``triton_fits.py`` for ``table``."""
    lines = [
        '"""Which autotune candidates of the fused DIFF kernels fit each GPU (generated data: do not edit).',
        "",
        "Written by ``python tests/model/triton_launches.py --candidates --write`` with Triton "
        f"{triton.__version__} (its ptxas),",
        "no GPU: each candidate of ``triton_tuning.CANDIDATES_16BIT`` (and the default) compiled for sm_80 and sm_90",
        "as the wrappers launch it (bfloat16). ``fits``: shared memory within the GPU's per-program limit and at most",
        "``triton_tuning.MAX_SPILL_BYTES`` of spilled registers per thread. shared: bytes; stack: bytes per thread.",
        '"""',
        "",
        f"TRITON_VERSION = {triton.__version__!r}",
        "FITS: dict[str, list[dict]] = {",
    ]
    for key, rows in table.items():
        lines.append(f"    {key!r}: [")
        for r in rows:
            lines.append(f"        {{'config': {r['config']!r}, 'shared': {r['shared']}, 'regs': {r['regs']}, "
                         f"'stack': {r['stack']}, 'fits': {r['fits']}}},")
        lines.append("    ],")
    lines.append("}")
    return "\n".join(lines) + "\n"


def smem_limit(arch: int) -> int:
    return td.smem_limit(arch)


def _defaults_check(a, pool, t0: float) -> dict:
    """The default launches the wrappers make (recorded, not compiled) and a recompiled sample of them."""
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    jobs = representative(tuple(a.arch))
    rows = list(pool.map(compile_launch, default_sample(jobs)))
    return {"triton": triton.__version__, "sources": sources_sha256(), "launches": [launch_id(j) for j in jobs],
            "sample": rows, "seconds": round(time.time() - t0, 1)}


def _table_check(a, pool, t0: float) -> dict:
    """The candidate set (every fit key and config) and the fit rows of a recompiled sample of it."""
    jobs = candidate_jobs(tuple(a.arch))
    table = fit_rows(sample_jobs(jobs), a.jobs, pool)
    return {"triton": triton.__version__, "candidates": [[k, list(c)] for (k, c), _ in jobs],
            "sample": [[k, r] for k, rows in table.items() for r in rows], "seconds": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, nargs="+", default=list(DEFAULT_ARCHS), help="compute capabilities (80 90)")
    p.add_argument("--no-consumer", action="store_true", help=f"skip sm_{CONSUMER_ARCH} (bf16, 99 KB limit)")
    p.add_argument("--full", action="store_true", help="every variant at d 64 and 128 (V1 per_head d 64 too)")
    p.add_argument("--tf32", action="store_true", help="record with torch.backends.cuda.matmul.allow_tf32 = True "
                   "(fp32 dots on TF32 tensor cores)")
    p.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    p.add_argument("--json", action="store_true")
    p.add_argument("--candidates", action="store_true", help="compile every autotune candidate (bf16, sm_80 and "
                   "sm_90) and print the fit table (triton_fits.py's source)")
    p.add_argument("--write", action="store_true", help=f"with --candidates: write it to {FITS_PATH}")
    p.add_argument("--check-table", action="store_true", help="print as JSON the candidate set (every fit key and "
                   "config) and the fit rows of a recompiled sample of it (what test_triton_aot.py compares with "
                   "triton_fits.py)")
    p.add_argument("--defaults", action="store_true", help="with --write: compile the default launches (the set "
                   f"`make test` checks) and write their resources to {DEFAULTS_PATH}; with --check-table: print "
                   "the default launches (recorded, not compiled) and the rows of a recompiled sample of them")
    p.add_argument("--quick", action="store_true", help="the default launches of V1 at d 128 and V2 at d 64 only "
                   "(sm_80 and sm_90, bf16 and fp32; the lowest supported Triton's check)")
    p.add_argument("--check-both", action="store_true", help="--defaults --check-table and --check-table in one "
                   "process and one pool of compilers, as {\"defaults\": ..., \"table\": ...} (what test_triton_aot.py "
                   "reads)")
    a = p.parse_args(argv)
    t0 = time.time()
    if a.check_both:
        with ProcessPoolExecutor(a.jobs) as pool:
            print(json.dumps({"defaults": _defaults_check(a, pool, t0), "table": _table_check(a, pool, t0)}))
        return 0
    if a.defaults:
        if a.check_table:
            with ProcessPoolExecutor(a.jobs) as pool:
                print(json.dumps(_defaults_check(a, pool, t0)))
            return 0
        if not a.write:
            p.error("--defaults goes with --write or --check-table")
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        jobs = representative(tuple(a.arch))
        with ProcessPoolExecutor(a.jobs) as pool:
            rows = list(pool.map(compile_launch, jobs))
        for r in rows:
            r.pop("seconds")
        head = {"note": "generated by python tests/model/triton_launches.py --defaults --write: do not edit",
                "triton": triton.__version__, "sources": sources_sha256()}
        with open(DEFAULTS_PATH, "w") as fh:  # one launch a line
            fh.write(json.dumps(head)[:-1] + ', "rows": [\n' + ",\n".join(json.dumps(r) for r in rows) + "\n]}\n")
        print(f"# {len(rows)} default launches compiled in {time.time() - t0:.1f} s, written to {DEFAULTS_PATH}",
              file=sys.stderr)
        return 0
    if a.check_table:
        with ProcessPoolExecutor(a.jobs) as pool:
            print(json.dumps(_table_check(a, pool, t0)))
        return 0
    if a.candidates:
        text = fits_module(fit_rows(candidate_jobs(tuple(a.arch)), a.jobs))
        if a.write:
            with open(FITS_PATH, "w") as fh:
                fh.write(text)
        else:
            print(text, end="")
        print(f"# candidates compiled in {time.time() - t0:.1f} s", file=sys.stderr)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = a.tf32  # the wrappers' fp32 dot precision follows it
    jobs = representative(tuple(a.arch), consumer=not a.no_consumer and not a.quick, full=a.full,
                          pairs=QUICK if a.quick else None)
    with ProcessPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(compile_launch, jobs))
    total = time.time() - t0
    for r in rows:
        r["limit"] = smem_limit(r["arch"])
    if a.json:
        print(json.dumps({"rows": rows, "seconds": round(total, 1), "triton": triton.__version__}))
        return 0
    print(f"{'arch':>4} {'case':<20} {'kernel':<9} {'shared':>8} {'limit':>8} {'regs':>4} {'stack':>5}  config")
    for r in rows:
        print(f"{r['arch']:>4} {r['case']:<20} {r['kernel']:<9} {r['shared']:>8} {r['limit']:>8} {r['regs']:>4} "
              f"{r['stack']:>5}  {r['config']}")
    print(f"{len(rows)} launches compiled in {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
