"""Structure of the package: no import circle, layers import downwards only, run file names spelled once (in
``rundir/files.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import difftransformer
from difftransformer import rundir
from difftransformer.model.pretrained import SIDE_FILES

SRC = Path(difftransformer.__file__).parent
# Modules that other work is restructuring; the lead drops each entry when its owner's branch is merged.
PENDING: set[str] = set()  # files allowed to spell a run file name themselves (none)


def module_name(path: Path) -> str:
    parts = ["difftransformer", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every difftransformer module ``path`` imports, at the top or inside a function (a lazy import still ties
    the two modules together)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # "from . import rundir" imports a module, "from .x import f" imports x
                sub = f"{target}.{a.name}"
                if sub in known:
                    out.add(sub)
                elif target in known:
                    out.add(target)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return []

    for n in sorted(g):
        if n not in state and (found := visit(n)):
            return found
    return []


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    g = graph()
    assert "difftransformer.rundir" in g["difftransformer.train.metrics"]  # the resolver sees "from .. import x"
    assert find_cycle(g) == []


# The layer table of ARCHITECTURE.md ("Layers"), whole: each room of the package (a top-level package or module;
# "difftransformer" is the package's face, __init__.py) and the rooms it may import. A room imports its own modules
# freely; anything not listed is refused. Keep ARCHITECTURE.md's picture and this table the same.
BASE = {"fileio", "log", "extras"}
ALLOWED: dict[str, set[str]] = {
    "fileio": set(), "log": set(), "extras": set(),
    "model": BASE,  # imports nothing of the kernels: they register into model/attention/fused.py's table
    "kernels": BASE | {"model"},  # tensors in, tensors out; kernels/hook.py registers its rule in the model's table
    "layer": BASE | {"model"},  # the public DiffAttention: the model's attention modules as its core
    # __version__, the layer and the model (importing it registers the variants), and the kernels (their rule)
    "difftransformer": {"model", "layer", "kernels"},
    "data": BASE | {"model"},
    "jobs": BASE | {"model"},  # only model.variants: workers adopt the parent's registry
    "rundir": BASE | {"model", "data"},
    "interop": BASE | {"difftransformer", "model", "data", "rundir"},  # formats: knows no loader, trainer or eval
    "loading": BASE | {"model", "data", "rundir", "interop"},
    "train": BASE | {"model", "data", "rundir", "interop", "loading"},
    "inference": BASE | {"model", "data", "rundir", "loading"},
    "eval": BASE | {"difftransformer", "model", "data", "rundir", "interop", "loading", "inference"},
    "studies": BASE | {"model", "data", "rundir", "jobs", "train", "eval"},
    "retrieval": BASE | {"model", "data", "rundir", "jobs", "train", "eval", "studies"},
    "lmsweep": BASE | {"model", "data", "rundir", "jobs", "train", "eval", "studies"},
    # the report page, the answer table and make docs: above both studies, whose results it draws
    "report": BASE | {"difftransformer", "model", "data", "rundir", "interop", "loading", "inference", "eval",
                      "studies", "retrieval", "lmsweep"},
    "demo": BASE | {"model", "data", "rundir", "jobs", "interop", "train", "eval", "studies", "retrieval", "lmsweep",
                    "report"},
    "bench": BASE | {"kernels", "model", "layer", "data", "rundir", "jobs", "interop", "loading", "train", "inference", "eval",
                     "retrieval"},
    "cli": BASE | {"difftransformer", "train", "inference", "interop", "eval", "retrieval", "lmsweep", "demo",
                   "bench", "report"},
    "__main__": {"cli"},
    # `make gpu-check` runs the commands (in-process for speed): it stands above the command line it runs
    "gpucheck": BASE | {"kernels", "model", "data", "rundir", "jobs", "train", "inference", "eval", "retrieval",
                        "bench", "cli"},
}
# Imports the table refuses that the code still has, each with the reason it is still there; empty is the goal.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_violations(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs of modules whose rooms the table does not allow, or whose room it does not know."""
    return sorted((n, d) for n, deps in g.items() for d in deps
                  if room(n) != room(d) and room(d) not in ALLOWED.get(room(n), set()))


def test_the_layer_table_finds_an_upward_import():
    g = {"difftransformer.model.x": {"difftransformer.train.trainer", "difftransformer.fileio"},
         "difftransformer.interop.peft": {"difftransformer.train.lora", "difftransformer.model.lora"},
         "difftransformer.retrieval.a": {"difftransformer.lmsweep.b", "difftransformer.retrieval.c"},
         "difftransformer.newroom": {"difftransformer.model"}}
    assert layer_violations(g) == [("difftransformer.interop.peft", "difftransformer.train.lora"),
                                   ("difftransformer.model.x", "difftransformer.train.trainer"),
                                   ("difftransformer.newroom", "difftransformer.model"),
                                   ("difftransformer.retrieval.a", "difftransformer.lmsweep.b")]


def test_the_layer_table_is_a_ladder():
    """The table itself has no loop (so a picture of floors exists), names every room of the package, and every
    known exception is one the table refuses."""
    g = {k: set(v) for k, v in ALLOWED.items()}
    assert find_cycle(g) == []
    assert {room(m) for m in modules()} <= set(ALLOWED)
    assert all(b not in ALLOWED[room(a)] for a, b in KNOWN_EXCEPTIONS)


def test_every_import_follows_the_layer_table():
    bad = [(n, d) for n, d in layer_violations(graph()) if (room(n), room(d)) not in KNOWN_EXCEPTIONS]
    assert not bad, "imports the layer table (tests/test_architecture.py ALLOWED) refuses:\n  " + "\n  ".join(
        f"{n} -> {d}" for n, d in bad)


def test_no_study_imports_another():
    studies = {"retrieval", "lmsweep"}
    crossings = sorted((n, d) for n, deps in graph().items() for d in deps
                       if room(n) in studies and room(d) in studies and room(n) != room(d)
                       and (room(n), room(d)) not in KNOWN_EXCEPTIONS)
    assert not crossings, crossings


def string_constants(path: Path) -> list[str]:
    """String literals of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def spelled_in(names: list[str]) -> dict[str, list[str]]:
    """The modules whose code spells each name as a path (help and error text may name the files)."""
    where: dict[str, list[str]] = {n: [] for n in names}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in PENDING:
            continue
        for s in string_constants(path):
            for n in names:
                if s == n or s.startswith(n + "/") or s.endswith("/" + n):  # a path, not a message naming it
                    where[n].append(rel)
    return where


def test_run_file_names_are_spelled_once():
    """Every path a run's file is found by comes from one constant, in rundir/files.py; the model directory's
    names (a checkpoint is one, a Hugging Face directory uses the same) in model/pretrained.py; each variant's
    metrics key in its own class."""
    run = [rundir.RUN_CONFIG_NAME, rundir.METRICS_NAME, rundir.CHECKPOINTS_DIR, rundir.TENSORBOARD_DIR,
           rundir.STATE_TENSORS, rundir.STATE_JSON, rundir.LOCK_NAME, rundir.ADAPTER_DIR, rundir.ADAPTER_CONFIG_NAME,
           rundir.ADAPTER_WEIGHTS_NAME, rundir.ADAPTER_BASE_DIR, rundir.MODEL_CARD_NAME, rundir.SWEEP_RESULTS_NAME,
           rundir.RESULTS_NAME, rundir.ROUNDING_NAME, rundir.RETRIEVAL_JOURNAL, rundir.WIDTH_SWEEP_JOURNAL,
           rundir.LM_SWEEP_JOURNAL]
    model = [rundir.CONFIG_NAME, rundir.WEIGHTS_NAME, rundir.TOKENIZER_NAME, rundir.MANIFEST_NAME, *SIDE_FILES]
    where = spelled_in([*run, *model, *rundir.LAMBDA_KEYS])
    assert {n: w for n, w in where.items() if len(w) != 1} == {}
    assert {n: where[n] for n in run} == {n: ["rundir/files.py"] for n in run}
    assert {n: where[n] for n in model} == {n: ["model/pretrained.py"] for n in model}


def test_the_job_runner_imports_no_study():
    """``jobs/`` (journal, resume, code path, executors) runs what a study declares and knows none: it imports only
    itself, the variant registry (handed to workers), and the package's helpers."""
    allowed = ("difftransformer.jobs", "difftransformer.model.variants", "difftransformer.extras",
               "difftransformer.fileio", "difftransformer.log")
    g = graph()
    assert "difftransformer.jobs.runner" in g
    for name, deps in g.items():
        if name.startswith("difftransformer.jobs"):
            bad = sorted(d for d in deps if not d.startswith(allowed))
            assert not bad, f"{name} imports {bad}"


def test_the_kernels_register_into_the_model():
    """The fused kernels (``kernels/``) stand apart from the model: the model imports nothing of them; the one
    kernel module that imports the model is ``kernels/hook.py``, for the table it registers its rule in
    (``model/attention/fused.py``), which the package's ``__init__`` fills by importing the kernels."""
    g = graph()
    into = sorted((n, d) for n, deps in g.items() for d in deps if room(n) == "model" and room(d) == "kernels")
    assert into == []
    out = sorted((n, d) for n, deps in g.items() for d in deps if room(n) == "kernels" and room(d) != "kernels")
    assert out == [("difftransformer.kernels.hook", "difftransformer.model.attention.fused")]
    from difftransformer.kernels.hook import fused_kernel
    from difftransformer.model.attention.fused import _RULES
    assert _RULES == [fused_kernel]


STUDIES = ("difftransformer.retrieval", "difftransformer.lmsweep")  # each owns its protocol and its statistics
REPORT = "difftransformer.report"  # above the studies: it may import them, they may not import it


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def study_report_crossings(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports that break "studies decide, the report draws": anything under ``eval/`` importing a study, or a
    study importing the report (a study may use ``eval.stats``, the library's statistics)."""
    return sorted((n, d) for n, deps in g.items() for d in deps
                  if (_under(n, ("difftransformer.eval",)) and _under(d, STUDIES))
                  or (_under(n, STUDIES) and _under(d, (REPORT,))))


def test_the_crossing_finder_finds_both_directions():
    g = {"difftransformer.eval.x": {"difftransformer.lmsweep.sweep"},
         "difftransformer.retrieval.rounding": {"difftransformer.report.retrieval", "difftransformer.eval.stats"},
         "difftransformer.lmsweep.analysis": {"difftransformer.eval.stats", "difftransformer.retrieval.protocol"},
         "difftransformer.report.answer": {"difftransformer.retrieval.longer"}}
    assert study_report_crossings(g) == [("difftransformer.eval.x", "difftransformer.lmsweep.sweep"),
                                         ("difftransformer.retrieval.rounding", "difftransformer.report.retrieval")]


def test_studies_decide_and_the_report_draws():
    """The report reads what the studies wrote (results.json, sweep.json); no study imports the report (each draws
    its own section from ``studies/page.py``'s pieces, and the report places it)."""
    g = graph()
    assert "difftransformer.retrieval.statistics" in g and "difftransformer.retrieval.page" in g
    assert study_report_crossings(g) == []
