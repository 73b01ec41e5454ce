"""Triton's CPU interpreter for the kernel tests, in one place.

Importing this module sets TRITON_INTERPRET=1 when there is no CUDA, then imports triton (the test file is skipped
without it). Triton decides interpreter-or-not when its @jit functions (its own standard library included) are
defined, i.e. at the first `import triton` of the process. If something imported it earlier in this pytest process
(torch.compile does, even on CPU), setting the variable now cannot help: ``NEEDS_FRESH_PROCESS`` is then True, the
file's tests skip (``skip_unless_interpreting``) and its ``test_in_fresh_interpreter_process`` re-runs the whole
file in a fresh process (``run_in_fresh_process``). Import it before anything that imports triton.
"""

from __future__ import annotations

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


def skip_unless_interpreting(request) -> None:
    """In an autouse fixture: skip every test but the fresh-process one when this process cannot interpret."""
    if NEEDS_FRESH_PROCESS and request.node.originalname != FRESH_TEST:
        pytest.skip(f"triton was imported before TRITON_INTERPRET=1 was set; covered by {FRESH_TEST}")


def run_in_fresh_process(test_file: str) -> None:
    """Run ``test_file`` under pytest in a new process with TRITON_INTERPRET=1; fail with its output if it fails."""
    root = Path(test_file).resolve().parents[2]
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(test_file))],
                         cwd=root, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]


def kernel_test_model(attention: str, opts: dict, device: str):
    """The LM both Triton test files run the kernels in: float64, 4 heads of 16 over 2 KV heads, 2 layers, the
    `triton` backend, matrices drawn N(0, 0.2) after seed 0 (sharp enough maps that a kernel error shows)."""
    from difftransformer.model import DiffTransformerLM, ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, max_seq_len=64,
                      attention=attention, backend="triton", **opts)
    model = DiffTransformerLM(cfg).double().to(device)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return model
