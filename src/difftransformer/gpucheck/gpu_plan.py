"""`make gpu-check`'s plan: its steps, each one's time limit and the H100 time the limit is planned from.

The plan fits a 5-minute GPU slot: the limits add up to 292 s, within ``BUDGET_S`` (294 s; the run's own start,
Python and torch's import, and the summary make the rest of 300 s), and each limit is at least ``MARGIN`` (1.2)
times its basis, the step's time on an H100 (NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, Triton 3.6.0, 16 CPUs, a
fresh machine: Triton's cache cold; ``make gpu-check`` at commit bdc804a, 2026-11-26), measured where the step ran
as it runs now, else estimated from the measured steps it was made of (the estimate's parts are in the table).
Steps marked ``parts`` run several measurements in one process (``gpu_check parts STEP``): one interpreter start and
CUDA context instead of one per measurement (about 6 s each on the H100: the env step, which only imports torch and
asks CUDA, took 6.1 s); each part's output is read as its own measurement in the summary.

==============  ======  ======  ==========================================================================
step            limit   H100    basis (s on the H100); what the step lost against the run at bdc804a
==============  ======  ======  ==========================================================================
env             8 s     6.1     measured
cuda-smoke      50 s    40      new, estimated: its 17 commands at toy size took 32-51 s of CPU (two runs,
                                --device cpu) on a loaded 2-core AMD EPYC, CPU-bound at that size; on the
                                GPU machine, whose Python lacks the KJV corpus, report and eval icl are
                                skipped (about 12 s of it); plus 6 s of start
candidates      39 s    32      30.2 measured for 62 candidates; 4 more now (DIFF V1's dK/dV at d 128)
tests           48 s    40      estimated: 8 pytest shards at once (was one process: 51 passed, 15 skipped
                                of 178 cases at its 75 s limit with Triton's cache cold; 63 s warm), so
                                about 190 s of cold serial work over 8 CPUs, plus the start of each shard
attention       31 s    25.7    parts attention-3b (18.0 measured), attention-bench (9.8) and kernels-3b
                                (new, about 4) in one process: one start fewer (-6.1); kernels-3b reuses
                                the tiles attention-3b tuned at N=16384
decode          27 s    22.2    parts decode-sdpa (20.3) and decode-triton (20.0) in one process (-6.1),
                                context 8192 only (-12: about 3 s per batch and context): lost context 2048
train           54 s    45      parts train-bench (68 measured) and train-3b (72), every case in this
                                process (``bench train --in-process``) instead of a fresh process per case:
                                about 10 s of each case's 12-14 s was the child's start (interpreter,
                                imports, CUDA context); estimated 8 s of start and 3-4 s per case
small-jobs      35 s    29      50 measured with 8 and 16 processes and 100 timed steps; lost the
                                16-process row (18.3) and half the timed steps (about 3 s)
==============  ======  ======  ==========================================================================

The steps run in this order, so that a check cut short still has the device smoke and the correctness checks
first. ``dry_plan`` is the same steps on the CPU at toy size (``--dry-run``): the plumbing, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

BUDGET_S = 294.0  # every step's limit together; the run's start (Python, torch's import) and summary: the rest of 300 s
MARGIN = 1.2  # each limit >= MARGIN x its basis (the H100 time)
MIN_STEP_S = 5.0  # a step with less than this left of the budget is skipped, not started
GPU_TEST_FILES = ("tests/model/test_triton_diff.py", "tests/model/test_triton_fallback.py", "tests/model/test_cuda.py")
MODULE = "difftransformer.gpucheck.gpu_check"  # the step commands below run it as python -m MODULE
CANDIDATES = "difftransformer.gpucheck.gpu_candidates"  # the candidates step
SMOKE = "difftransformer.gpucheck.cuda_smoke"
TESTS = "difftransformer.gpucheck.gpu_tests"
SMALL_JOBS = "difftransformer.gpucheck.small_jobs"
# The GPU tests run the kernels' default tiles (what their tolerances were written for): the candidates step has
# checked every other config the tuner may pick, and tuning inside the tests would compile them all again.
TESTS_ENV = (("DIFFTRANSFORMER_TRITON_TUNE", "0"),)
TEST_SHARDS = 8  # pytest processes of the tests step at once (16 CPUs on the H100 machine)


@dataclass(frozen=True)
class Step:
    """One command of the check: ``python -m <args>``; ``kind`` names its reader in ``gpu_readers.READERS``.
    A step with ``parts`` runs them in one process (``gpu_check parts STEP``), each read by its own kind."""

    name: str
    kind: str
    args: tuple[str, ...]
    limit_s: float
    env: tuple[tuple[str, str], ...] = ()  # variables set for this step only (on top of ``child_env``)
    parts: tuple[Step, ...] = ()
    basis_s: float = 0.0  # its H100 time, measured or estimated (the module's table)


def _bench(what: str, *flags: str) -> tuple[str, ...]:
    return ("difftransformer", "bench", what, *flags)


def _parts(name: str, limit: float, basis: float, *parts: Step, dry: bool = False,
           env: tuple[tuple[str, str], ...] = ()) -> Step:
    return Step(name, "parts", (MODULE, "parts", *(("--dry-run",) if dry else ()), name), limit, env, parts, basis)


def gpu_plan() -> list[Step]:
    """The steps on a GPU, in the order they run (the module's table gives each limit's basis)."""
    attention = ("--no-memory", "--device", "cuda", "--dtype", "bfloat16", "--backends", "sdpa", "triton")
    decode = ("--device", "cuda", "--decode-mode", "cuda-graph", "--batch", "1", "8", "--contexts", "8192",
              "--new-tokens", "64", "--no-hf", "--backend")
    train = ("--device", "cuda", "--precision", "bfloat16", "--backends", "sdpa", "triton", "--in-process")
    return [
        Step("env", "env", (MODULE, "env"), 8, basis_s=6.1),
        Step("cuda-smoke", "smoke", (SMOKE, "--device", "cuda"), 50, basis_s=40),
        Step("candidates", "candidates", (CANDIDATES,), 39, basis_s=32),
        Step("tests", "tests", (TESTS, "--shards", str(TEST_SHARDS), *GPU_TEST_FILES), 48, TESTS_ENV, basis_s=40),
        _parts("attention", 31, 25.7,
               Step("attention-3b", "attention", _bench("attention", "--shape", "paper-3b", *attention,
                                                        "--seq-lens", "4096", "16384", "--repeats", "3"), 0),
               Step("attention-bench", "attention", _bench("attention", *attention, "--seq-lens", "2048",
                                                           "8192", "--repeats", "5"), 0),
               Step("kernels-3b", "kernels", _bench("kernels", "--shape", "paper-3b", "--seq-lens", "16384",
                                                    "--repeats", "5", "--device", "cuda", "--dtype", "bfloat16"), 0)),
        _parts("decode", 27, 22.2,
               Step("decode-sdpa", "decode", _bench("decode", *decode, "sdpa"), 0),
               Step("decode-triton", "decode", _bench("decode", *decode, "triton"), 0)),
        _parts("train", 54, 45,
               Step("train-bench", "train", _bench("train", *train, "--batch", "8"), 0),
               Step("train-3b", "train", _bench("train", *train, "--shape", "paper-3b", "--layers", "4",
                                                "--seq-len", "4096"), 0)),
        Step("small-jobs", "small-jobs", (SMALL_JOBS, "--device", "cuda", "--steps", "50", "--processes", "8"), 35,
             basis_s=29),
    ]


def dry_plan() -> list[Step]:
    """The same steps on the CPU at toy size: ``blocked`` stands in for ``triton`` in the benches, the kernels
    bench runs Triton's interpreter, a tiny model for each shape, the smoke's commands on the CPU, the tests step's
    shards on the CUDA-only test file (every case skips there). Limits for 2 loaded cores."""
    toy = ("--d-model", "64", "--vocab-size", "256")
    attention = ("--no-memory", "--device", "cpu", "--dtype", "float32", "--backends", "sdpa", "blocked",
                 "--d-model", "64", "--head-dim", "16", "--repeats", "1")
    decode = ("--device", "cpu", "--batch", "1", "--contexts", "8", "--new-tokens", "2", "--rounds", "1", "--layers",
              "1", "--head-dim", "16", *toy, "--no-hf", "--backend", "sdpa")
    train = ("--device", "cpu", "--backends", "sdpa", "blocked", "--seq-len", "16", "--batch", "2", "--layers", "1",
             "--heads", "4", "--steps", "1", "--warmup", "0", "--in-process", *toy)
    return [
        Step("env", "env", (MODULE, "env"), 60),
        Step("cuda-smoke", "smoke", (SMOKE, "--device", "cpu"), 300),
        Step("candidates", "candidates", (CANDIDATES, "--dry-run"), 120),  # 8 candidates: about 10 s on 2 cores
        Step("tests", "tests", (TESTS, "--shards", "2", "tests/model/test_cuda.py"), 120, TESTS_ENV),
        _parts("attention", 180, 0,
               Step("attention-3b", "attention", _bench("attention", "--shape", "paper-3b", *attention,
                                                        "--seq-lens", "32"), 0),
               Step("attention-bench", "attention", _bench("attention", *attention, "--seq-lens", "16", "32"), 0),
               Step("kernels-3b", "kernels", _bench("kernels", "--shape", "tiny", "--seq-lens", "32", "--repeats",
                                                    "1", "--device", "cpu", "--dtype", "float32"), 0),
               dry=True, env=(("TRITON_INTERPRET", "1"),)),
        _parts("decode", 60, 0, Step("decode-sdpa", "decode", _bench("decode", *decode), 0), dry=True),
        _parts("train", 120, 0, Step("train-bench", "train", _bench("train", *train), 0), dry=True),
        Step("small-jobs", "small-jobs", (SMALL_JOBS, "--device", "cpu", "--steps", "2", "--warmup", "1",
                                          "--processes", "2"), 120),
    ]


def find(plan: list[Step], name: str) -> Step:
    """The step of ``plan`` named ``name``: a ValueError naming the choices where there is none."""
    for step in plan:
        if step.name == name:
            return step
    raise ValueError(f"no step {name!r}; choose from {' '.join(s.name for s in plan)}")
