"""Device bugs caught on the CPU (issue 48): the paths that run on ``--device cuda`` make and feed their tensors on
the model's device, checked without a GPU in two ways.

1. Dynamic (``tests/device_scenarios*.py`` in a child process, on the fake GPU of ``tests/fakegpu.py``): each of
   the seven analyses, the report's measuring loop, the retrieval benchmark's and the lm-sweep's job functions,
   ``train``, loading onto the device, generation and the lm-eval adapter run to their end with the model on a
   second device, whose operators fail where CUDA's would on a CPU tensor, and give the CPU's numbers.
2. Static (below): in the code that meets a model's outputs, every tensor factory (``torch.zeros``, ``arange``,
   ``tensor``, ``randn``, ``Generator``, ...) names its ``device``, or is in ``ALLOWED`` with the reason. It reaches
   the branches the scenarios do not take.

Both are shown to fail on bdc804a's ``TopAbs`` (``device_scenarios.OLD_TOPABS``): the scenario ``old-topabs`` and
``test_the_rule_finds_the_old_topabs``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import device_scenarios
import pytest

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "difftransformer"
device_scenarios.load()
NAMES = [(group, name) for group, named in device_scenarios.SCENARIOS.items() for name in named]


# ---------------------------------------------------------------------------------------------- dynamic
@pytest.fixture(scope="module")
def scenarios() -> dict[str, dict]:
    """Every scenario, run once in one child process (the fake GPU cannot be registered in this one)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(TESTS / "device_scenarios.py")], capture_output=True, text=True,
                          timeout=900, env=env, cwd=TESTS.parent)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[r["scenario"]] = r
    assert proc.returncode == 0 and out, f"the scenarios did not run (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return out


@pytest.mark.parametrize(("group", "name"), NAMES, ids=[n for _, n in NAMES])
def test_runs_on_a_gpu_device(scenarios, group, name):
    r = scenarios.get(name)
    assert r is not None, f"scenario {name} did not report"
    assert r["ok"], f"{group}/{name} failed on the fake GPU:\n{r['error']}"


def test_every_analysis_has_a_scenario():
    from difftransformer.eval.analyses import ANALYSES

    assert {s.name for s in ANALYSES} <= set(device_scenarios.SCENARIOS["analyses"])


# ---------------------------------------------------------------------------------------------- static
# The code that meets a model's outputs (what runs on --device cuda), relative to src/difftransformer.
SCOPE = ("eval", "train", "retrieval/evaluate.py", "retrieval/train.py", "retrieval/task.py", "lmsweep/job.py",
         "inference/generate.py")
FACTORIES = {"zeros", "ones", "empty", "full", "arange", "range", "tensor", "as_tensor", "asarray", "randn", "rand",
             "randint", "randperm", "linspace", "logspace", "eye", "empty_strided", "scalar_tensor", "tril_indices",
             "triu_indices", "from_numpy", "Generator"}
DEFAULT_DEVICE = ("made under the job's default device: retrieval/benchmark.py runs a job inside "
                  "`with torch.device(device)`, where these are made on the GPU (the retrieval-job scenario)")
# (file, function, call) -> why it names no device
ALLOWED = {
    ("retrieval/task.py", "make_batch", "torch.as_tensor(seq[:, :-1].astype(np.int64))"): DEFAULT_DEVICE,
    ("retrieval/task.py", "make_batch", "torch.as_tensor(layout.value(q_vals).astype(np.int64))"): DEFAULT_DEVICE,
    ("retrieval/task.py", "make_batch", "torch.as_tensor(query_pos)"): DEFAULT_DEVICE,
    ("retrieval/task.py", "make_batch", "torch.as_tensor(np.take_along_axis(where, asked, axis=1))"): DEFAULT_DEVICE,
    ("retrieval/task.py", "make_batch", "torch.as_tensor(P)"): DEFAULT_DEVICE,
}


def factory_calls(source: str, path: str) -> list[tuple[str, str, str]]:
    """(path, enclosing function, call) of every ``torch.<factory>(...)`` in ``source`` without ``device=``."""
    found: list[tuple[str, str, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}.{child.name}" if where else child.name
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and isinstance(child.func.value, ast.Name) and child.func.value.id == "torch"
                    and child.func.attr in FACTORIES and not any(k.arg == "device" for k in child.keywords)):
                found.append((path, where or "<module>", ast.unparse(child)))
            visit(child, inner)

    visit(ast.parse(source), "")
    return found


def scope_files() -> list[Path]:
    out = []
    for part in SCOPE:
        p = SRC / part
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def test_every_tensor_factory_names_its_device():
    files = scope_files()
    assert len(files) > 20 and all(f.is_file() for f in files), "the rule's scope moved: update SCOPE"
    found = [c for f in files for c in factory_calls(f.read_text(), f.relative_to(SRC).as_posix())]
    unexplained = [c for c in found if c not in ALLOWED]
    assert not unexplained, ("a tensor made without device= where a model's outputs are met (give it the device "
                             "of what it meets, device=\"cpu\" where it is host data on purpose, or an ALLOWED "
                             f"entry with the reason): {unexplained}")
    stale = [k for k in ALLOWED if k not in found]
    assert not stale, f"ALLOWED entries that match nothing (remove them): {stale}"


def test_the_rule_finds_the_old_topabs():
    """The known answer: bdc804a's TopAbs made its running top without a device (``TopAbs.__init__``); today's
    outliers.py has no such call."""
    old = factory_calls("import torch\n" + device_scenarios.OLD_TOPABS, "eval/outliers.py")
    assert old == [("eval/outliers.py", "TopAbs.__init__", "torch.empty(0, dtype=torch.float64)")]
    assert factory_calls((SRC / "eval" / "outliers.py").read_text(), "eval/outliers.py") == []


def test_the_rule_reads_calls_as_meant():
    src = ("import torch\n"
           "def f(x, n):\n"
           "    a = torch.arange(n, device=x.device)\n"
           "    b = torch.zeros_like(x)\n"
           "    c = x.new_zeros(3)\n"
           "    class G:\n"
           "        def g(self):\n"
           "            return torch.Generator(), torch.tensor([1], dtype=torch.long)\n")
    assert factory_calls(src, "m.py") == [("m.py", "f.G.g", "torch.Generator()"),
                                          ("m.py", "f.G.g", "torch.tensor([1], dtype=torch.long)")]
