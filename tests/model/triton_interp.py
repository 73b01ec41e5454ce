"""Triton's CPU interpreter for the kernel tests, in one place.

Importing this module sets TRITON_INTERPRET=1 when there is no CUDA, then imports triton (the test file is skipped
without it). Triton decides interpreter-or-not when its @jit functions (its own standard library included) are
defined, i.e. at the first `import triton` of the process. If something imported it earlier in this pytest process
(torch.compile does, even on CPU), setting the variable now cannot help: ``NEEDS_FRESH_PROCESS`` is then True, the
file's tests skip (``skip_unless_interpreting``) and its ``test_in_fresh_interpreter_process`` re-runs the whole
file in a fresh process (``run_in_fresh_process``). Import it before anything that imports triton.

The three interpreted files (``INTERPRETED_FILES``) share that fresh process where they run together: under
pytest-xdist (``make test``; whether a worker imported triton first depends on what it ran before, so no worker can
tell whether another needs a fresh process), or in one process that cannot interpret, the first file's
``test_in_fresh_interpreter_process`` runs every one of them that the session collected in ONE fresh process (one
start of Python, torch and triton instead of three) and the others' tests skip, naming it
(``interpreted_elsewhere``). Run alone, or together in a process that can interpret, each runs in this process.
"""

from __future__ import annotations

import ast
import builtins
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton` / kernel definition

triton = pytest.importorskip("triton")

NEEDS_FRESH_PROCESS = (not torch.cuda.is_available()
                       and type(triton.language.standard.sigmoid).__name__ != "InterpretedFunction")
FRESH_TEST = "test_in_fresh_interpreter_process"


def _patch_the_language_once_per_launch() -> None:
    """Make Triton's interpreter patch ``triton.language`` once per module per launch, not at every call.

    The interpreter swaps the language's builtins (``tl.dot``, ``tl.exp``, ...) for NumPy ones with
    ``_patch_lang(fn)`` when a launch starts (and restores them when it ends), and again, in full, at every call of
    a ``@triton.jit`` helper inside the kernel (``InterpretedFunction.__call__``: ``tl.max``, ``tl.sum`` and the
    kernels' own helpers, some 120 calls per launch). Each re-patch walks every member of ``triton.language``
    (``inspect.getmembers``) and changes nothing (the builtins are patched already; the rest is reassigned to the
    same functions): a third of the CPU time of these tests (test_triton_diff.py alone: 26.5 -> 17.5 s). Here a
    patch is skipped when the same module's functions were patched already in this launch; the first call per
    module still patches (the standard library's module names ``triton.language.core``, not ``triton.language``,
    and is patched then), and nothing else changes: the kernels run the same NumPy code. Outside a launch, and where
    Triton's interpreter has another layout, nothing is changed."""
    from triton.runtime import interpreter

    if not all(hasattr(interpreter, n) for n in ("_patch_lang", "_LangPatchScope", "GridExecutor")):
        return
    real_patch, real_launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    if getattr(real_patch, "once_per_launch", False):
        return
    patched: set[int] | None = None  # ids of the module namespaces patched in the running launch

    def patch_lang(fn):
        if patched is None:
            return real_patch(fn)
        if id(fn.__globals__) in patched:
            return interpreter._LangPatchScope()  # nothing to restore: InterpretedFunction.__call__ drops it
        scope = real_patch(fn)
        patched.add(id(fn.__globals__))
        return scope

    def launch(self, *args, **kwargs):
        nonlocal patched
        patched = set()
        try:
            return real_launch(self, *args, **kwargs)
        finally:
            patched = None

    patch_lang.once_per_launch = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = launch


if os.environ.get("TRITON_INTERPRET") == "1" and not NEEDS_FRESH_PROCESS:
    _patch_the_language_once_per_launch()


INTERPRETED_FILES = ("test_triton_diff.py", "test_triton_tuning.py", "test_triton_fallback.py")  # beside this file
CHILD = "DIFFTRANSFORMER_TRITON_CHILD"  # set in the fresh process: it runs its files itself


def _shared_files(session) -> list[Path]:
    """The interpreted files whose fresh-process tests this session collected, in INTERPRETED_FILES order, when
    they share one fresh process (see the module's docstring); else []."""
    if torch.cuda.is_available() or os.environ.get(CHILD) == "1":
        return []
    if not (os.environ.get("PYTEST_XDIST_WORKER") or NEEDS_FRESH_PROCESS):
        return []
    found = {item.path for item in session.items
             if getattr(item, "originalname", None) == FRESH_TEST and item.path.name in INTERPRETED_FILES}
    files = sorted(found, key=lambda p: INTERPRETED_FILES.index(p.name))
    return files if len(files) > 1 else []


def interpreted_elsewhere(request) -> str | None:
    """Why this test does not run in this process (the reason to skip it), or None: it runs here."""
    shared, here = _shared_files(request.session), request.node.path
    if here in shared:
        if request.node.originalname == FRESH_TEST and here == shared[0]:
            return None
        return f"runs in the one fresh process of {shared[0].name}::{FRESH_TEST}"
    if request.node.originalname == FRESH_TEST:
        return None if NEEDS_FRESH_PROCESS else "this process already runs the kernels directly"
    if NEEDS_FRESH_PROCESS:
        return f"triton was imported before TRITON_INTERPRET=1 was set; covered by {FRESH_TEST}"
    return None


def skip_unless_interpreting(request) -> None:
    """In an autouse fixture: skip the tests that run in a fresh process instead (``interpreted_elsewhere``)."""
    reason = interpreted_elsewhere(request)
    if reason is not None:
        pytest.skip(reason)


def run_in_fresh_process(request) -> None:
    """The body of ``test_in_fresh_interpreter_process``: run its file (or every file that shares the fresh process)
    under pytest in a new process with TRITON_INTERPRET=1; fail with its output if it fails."""
    files = _shared_files(request.session) or [request.node.path]
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, files)],
                         cwd=root, env={**os.environ, "TRITON_INTERPRET": "1", CHILD: "1"}, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0 and " passed" in res.stdout, res.stdout[-6000:] + res.stderr[-3000:]


# Triton cannot compile float64 dots on CUDA (an H200, sm_90, Triton 3.6: "Currently fp64 don't support largeK MMA"),
# so float64 kernel checks run in the interpreter (`make test`) and on CUDA the same checks run float32 (TF32 off)
# and bfloat16 against the float64 oracle.
ON_CUDA = torch.cuda.is_available()
NO_FP64_ON_CUDA = ("float64 kernel checks run in the interpreter (`make test`): Triton cannot compile float64 dots on "
                   "CUDA (sm_90: 'Currently fp64 don't support largeK MMA')")
CUDA_ONLY = ("a CUDA check (float32 with TF32 off, bfloat16, against the float64 oracle); without a GPU the same case "
             "runs in float64 in the interpreter")
# The dtype the LM-level kernel tests (the whole model, the KV cache, the fallbacks) run the model in.
MODEL_DTYPE = torch.float32 if ON_CUDA else torch.float64


def kernel_test_model(attention: str, opts: dict, device: str, dtype: torch.dtype = torch.float64):
    """The LM both Triton test files run the kernels in: 4 heads of 16 over 2 KV heads, 2 layers, the `triton`
    backend, matrices drawn N(0, 0.2) after seed 0 (sharp enough maps that a kernel error shows). Built in float64
    on the CPU, then moved to ``device`` and ``dtype``: two calls with different dtypes give the same weights
    (rounded), so a float64 model is the oracle of a float32 one."""
    from difftransformer.model import DiffTransformerLM, ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, max_seq_len=64,
                      attention=attention, backend="triton", **opts)
    model = DiffTransformerLM(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return model.to(device=device, dtype=dtype)


def model_error(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(max |got - want|, the tolerance) for a logit or gradient tensor of the LM run in ``dtype`` against the same
    LM in float64 (``want``). float64: 1e-10 absolute. float32 (TF32 off): 1e-4 * max |want| + 1e-9, the bound
    test_cuda.py holds the sdpa and eager paths to on an H200: unit roundoff 6e-8 accumulated over the model's
    longest sums (d_model 64 projections, softmax over 21 keys, two layers) gives errors of a few 1e-6 of max |want|
    (measured in the interpreter: at most 6e-6 for the triton backend), 1e-4 leaves room for the GPU's approximate
    exp2/log2 and another summation order."""
    err = (got.double() - want.double()).abs().max().item()
    if dtype == torch.float64:
        return err, 1e-10
    if dtype != torch.float32:
        raise ValueError(f"dtype={dtype} is not allowed; use float64 or float32")
    return err, 1e-4 * want.double().abs().max().item() + 1e-9


def fail_inside_triton(monkeypatch, module, name: str, message: str = "PassManager::run failed") -> list[str]:
    """Make Triton itself fail with ``RuntimeError(message)`` (what an H200 raised from Triton's LLVM lowering of
    float64 dots) when it compiles the kernel ``module.<name>``; returns the list of failed attempts (one entry each).

    The error is raised inside Triton's own compile/launch machinery, below the frames of ``kernel[grid](...)``,
    not by a stand-in for the kernel object: in the interpreter, Triton "compiles" a kernel at its launch (its
    ``FunctionRewriter`` rewrites the kernel's AST and calls ``compile`` on it; the rewrite cache is emptied so it
    happens again), and that ``compile`` raises for this kernel (the traceback runs through ``triton/runtime/jit.py``
    and ``triton/runtime/interpreter.py`` as the GPU's ran through ``jit.py`` and Triton's compiler). On CUDA the
    kernel's ``run`` method (Triton's bind-compile-launch step, which Triton's launch proxy ``kernel[grid]`` calls)
    is replaced by one that raises, so the traceback runs through ``jit.py`` too (compiled kernels are cached per
    process, so the compile step itself is not reliably reached there).
    """
    attempts: list[str] = []
    kernel = getattr(module, name)
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime import interpreter

        real_compile = builtins.compile

        def compile_(source, filename, mode, *args, **kwargs):
            if isinstance(source, ast.Module) and any(isinstance(node, ast.FunctionDef) and node.name == name
                                                      for node in source.body):
                attempts.append(name)
                raise RuntimeError(message)
            return real_compile(source, filename, mode, *args, **kwargs)

        monkeypatch.setattr(interpreter.InterpretedFunction, "rewritten_fn", {})
        monkeypatch.setattr(interpreter, "compile", compile_, raising=False)
    else:
        def run(*args, **kwargs):
            attempts.append(name)
            raise RuntimeError(message)

        monkeypatch.setattr(kernel, "run", run)
    return attempts
