"""Every command README.md shows is checked here (issue 30, item 5): "every README command is run by a test".

The commands are the lines of README.md's fenced shell blocks (```bash, sh, shell, console; a trailing `# ...`
comment is not part of the command, a trailing backslash continues the line). ``COMMANDS`` maps each one to how it
is checked, and the test fails when the README and the table disagree, both ways: a README command the table does
not cover, or a table row the README no longer shows. How each kind is checked:

* every command, first: its flags parse with the real argparse parser (``difftransformer.cli.build_parser``;
  torchrun's own parser for the launcher's flags), a ``--config`` names an existing preset or file, and ``train``'s
  config overrides give a valid config (``load_config``); ``retrieval``'s values give a valid benchmark config;
* ``RUN``: then run as written, in README order, in one temporary directory (each later command reads what the
  earlier ones wrote), with the table's appended arguments, which argparse lets override the README's (a later
  flag wins): a training run shrinks to 2 steps of a 32-wide one-layer model, the retrieval benchmark to its
  ``--quick`` smoke run with fewer steps. ``difftransformer`` commands run in this process through
  ``difftransformer.cli.main`` (one interpreter start for all of them); torchrun runs as a subprocess, the
  repository's venv's ``torchrun`` launching 2 processes with gloo on CPU;
* ``MAKE``: a target of the Makefile, checked by ``make -n`` (nothing runs); for ``make demo`` the
  ``difftransformer demo`` line the dry run prints is parsed too (``QUICK=1`` must give ``--quick``);
* ``PIP``: ``pip install`` of this project (a path or ``difftransformer``) with extras that pyproject.toml
  defines, or of torch at the version the Makefile pins.

The README's ```python blocks run as written (in a temporary directory). The commands of docs/*.md are parsed the
same way (flags, presets, make targets), not run. Measured: about 30 s on 2 CPU cores.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch

from difftransformer.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

RUN, MAKE, PIP = "run", "make", "pip"

# A training run of the `demo` preset made small: 2 steps of a 32-wide, one-layer model on 300k characters, with
# one tokenisation shared by every run (data.prepared_dir); the global batch 4 splits over torchrun's 2 processes.
SMALL_TRAIN = ("--train.steps", "2", "--train.batch_size", "4", "--train.micro_batch_size", "4",
               "--model.d_model", "32", "--model.n_layers", "1", "--data.vocab_size", "512",
               "--data.max_chars", "300000", "--data.prepared_dir", "prepared", "--log.tensorboard", "false",
               "--no-progress")
# The retrieval benchmark's smoke run, smaller still, in this process (--workers 1).
SMALL_RETRIEVAL = ("--quick", "--steps", "10", "--seeds", "2", "--eval-contexts", "8", "--workers", "1",
                   "--no-progress")
# The language-model sweep's smoke run, smaller still (2 widths x 3 variants x 2 lrs x 2 seeds of 4 steps), on the
# `tiny` preset's tokens (vocabulary 512, 200k characters): evaluating the `demo` preset's validation split at its
# 4,096-token vocabulary was two thirds of the sweep's time, and what is checked here (the command runs, writes
# sweep.json, the report reads it) does not depend on the data.
SMALL_LM_SWEEP = ("--quick", "--preset", "tiny", "--steps", "4", "--warmup-steps", "1", "--eval-every", "2",
                  "--seq-len", "32", "--workers", "1", "--no-progress")

# README command (without its comment) -> (how it is checked, arguments appended when run, files it must write).
COMMANDS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "make demo": (MAKE, (), ()),
    "make test": (MAKE, (), ()),
    "make test-fast": (MAKE, (), ()),
    "pip install -e '.[dev]'": (PIP, (), ()),
    "difftransformer train --config demo --model.attention baseline --out runs/base":
        (RUN, SMALL_TRAIN, ("runs/base/checkpoints/step_00000002/model.safetensors",)),
    "difftransformer train --config demo --model.attention diff_v2 --out runs/v2":
        (RUN, SMALL_TRAIN, ("runs/v2/checkpoints/step_00000002/model.safetensors",)),
    "difftransformer train --out runs/v2 --resume --train.steps 800":
        (RUN, ("--train.steps", "3", "--no-progress"), ("runs/v2/checkpoints/step_00000003/model.safetensors",)),
    "torchrun --standalone --nproc_per_node=2 -m difftransformer train --config demo --out runs/ddp":
        (RUN, SMALL_TRAIN, ("runs/ddp/checkpoints/step_00000002/model.safetensors",)),
    "difftransformer eval needles --run runs/v2 --out needles.json": (RUN, (), ("needles.json",)),
    "difftransformer retrieval --out runs/kv": (RUN, SMALL_RETRIEVAL, ("runs/kv/results.json",)),
    "difftransformer lm-sweep --out runs/lm-sweep": (RUN, SMALL_LM_SWEEP, ("runs/lm-sweep/sweep.json",)),
    "difftransformer report runs/base runs/v2 --retrieval runs/kv --lm-sweep runs/lm-sweep --out report":
        (RUN, ("--no-progress",), ("report/report.html", "report/results.json")),
    'difftransformer generate --run runs/v2 --prompt "In the beginning" --max-new-tokens 64': (RUN, (), ()),
}


# ---------------------------------------------------------------------------------------------- extraction
def shell_commands(path: Path) -> list[str]:
    """The commands of ``path``'s fenced shell blocks, each without its trailing comment."""
    out, block, pending = [], None, ""
    for line in path.read_text().splitlines():
        fence = re.match(r"\s*```(\w*)", line)
        if fence:
            block = fence.group(1) if block is None else None
            continue
        if block not in ("bash", "sh", "shell", "console"):
            continue
        line = pending + line.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        line = re.sub(r"^\$\s+", "", line)
        if not line or line.startswith("#"):
            continue
        command = re.sub(r"\s+#\s.*$", "", line).strip()
        assert shlex.split(command) == shlex.split(line, comments=True), f"{path.name}: cannot read {line!r}"
        out.append(command)
    return out


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)


# ---------------------------------------------------------------------------------------------- parsing
def _difftransformer_argv(tokens: list[str]) -> list[str] | None:
    """The argv after the program name when ``tokens`` runs difftransformer (directly, as a module, under
    torchrun), else None."""
    if tokens[0] == "difftransformer":
        return tokens[1:]
    for i in range(len(tokens) - 1):
        if tokens[i] == "-m" and tokens[i + 1] == "difftransformer":
            return tokens[i + 2:]
    return None


def parse_difftransformer(argv: list[str]):
    """argparse with difftransformer's real parser, then the values argparse cannot judge: presets and config."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            args, extra = build_parser().parse_known_args(argv)
        except SystemExit as e:
            raise AssertionError(f"`difftransformer {shlex.join(argv)}` does not parse: {err.getvalue().strip()}"
                                 ) from e
    assert not extra, f"`difftransformer {shlex.join(argv)}`: unrecognized arguments {extra}"
    if args.command in ("train", "demo") and args.config is not None:
        from difftransformer.train.config import resolve_config_path
        resolve_config_path(args.config)  # a bare name must be a preset
    if args.command == "train" and args.config is not None and args.init_from is None:
        from difftransformer.train.cli import OVERRIDE_PREFIX
        from difftransformer.train.config import load_config, parse_value
        overrides: dict[str, dict] = {}
        for dest, raw in vars(args).items():
            if dest.startswith(OVERRIDE_PREFIX) and raw is not None:
                section, key = dest[len(OVERRIDE_PREFIX):].split(".", 1)
                overrides.setdefault(section, {})[key] = parse_value(raw)
        load_config(args.config, overrides)
    if args.command == "retrieval":
        from difftransformer.retrieval.cli import config_from_args
        config_from_args(args)
    return args


def check_make(tokens: list[str]) -> None:
    targets = [t for t in tokens[1:] if "=" not in t and not t.startswith("-")]
    assert targets, f"{shlex.join(tokens)}: no target"
    rules = set(re.findall(r"^([\w.-]+)\s*:(?!=)", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    assert set(targets) <= rules, f"`{shlex.join(tokens)}`: no rule {sorted(set(targets) - rules)} in the Makefile"
    res = subprocess.run(["make", "-n", "-C", str(ROOT), *tokens[1:]], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, f"`{shlex.join(tokens)}` is not a target of the Makefile: {res.stderr.strip()}"
    if "demo" in targets:
        demo = [ln for ln in res.stdout.splitlines() if "-m difftransformer demo" in ln]
        assert len(demo) == 1, res.stdout
        argv = _difftransformer_argv(shlex.split(demo[0]))
        args = parse_difftransformer(argv)
        assert args.quick == ("QUICK=1" in tokens), demo[0]
    if "test" in targets:
        assert "-m pytest" in res.stdout, res.stdout


def check_pip(tokens: list[str]) -> None:
    assert tokens[:2] == ["pip", "install"], shlex.join(tokens)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras_defined = set(project.get("optional-dependencies", {}))
    torch_pin = re.search(r"^TORCH\s*:?=\s*(\S+)", (ROOT / "Makefile").read_text(), flags=re.MULTILINE).group(1)
    reqs = [t for t in tokens[2:] if not t.startswith("-")]
    assert reqs, shlex.join(tokens)
    for req in reqs:
        m = re.fullmatch(r"([^\[\]]+?)(?:\[([\w,\s-]*)\])?", req)
        assert m, f"{req!r}: not a requirement"
        name, extras = m.group(1), [e.strip() for e in (m.group(2) or "").split(",") if e.strip()]
        if name.startswith("torch"):
            assert req == torch_pin, f"{req!r}: the Makefile pins {torch_pin}"
            continue
        assert name in (".", project["name"]) or (ROOT / name / "pyproject.toml").is_file(), \
            f"{req!r}: not this project"
        unknown = set(extras) - extras_defined
        assert not unknown, f"{req!r}: no extra(s) {sorted(unknown)} in pyproject.toml ({sorted(extras_defined)})"


def check_parses(command: str) -> None:
    tokens = shlex.split(command)
    if tokens[0] == "make":
        return check_make(tokens)
    if tokens[0] == "pip":
        return check_pip(tokens)
    argv = _difftransformer_argv(tokens)
    assert argv is not None, f"{command!r}: no check for this kind of command"
    if tokens[0] == "torchrun":
        from torch.distributed.run import get_args_parser
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                launcher = get_args_parser().parse_args(tokens[1:])
            except SystemExit as e:
                raise AssertionError(f"torchrun's flags in {command!r} do not parse: {err.getvalue()}") from e
        assert launcher.module and launcher.training_script == "difftransformer", command
    else:
        assert tokens[0] == "difftransformer" or tokens[:3] in (["python", "-m", "difftransformer"],
                                                                  [".venv/bin/python", "-m", "difftransformer"]), \
            f"{command!r}: no check for this kind of command"
    parse_difftransformer(argv)


# ---------------------------------------------------------------------------------------------- tests
def test_the_table_covers_every_readme_command():
    readme = shell_commands(README)
    assert len(readme) == len(set(readme)), "a README command is shown twice"
    missing = [c for c in readme if c not in COMMANDS]
    stale = [c for c in COMMANDS if c not in readme]
    assert not missing, ("README commands without a row in COMMANDS (tests/test_readme_commands.py): say how each "
                         "is checked\n  " + "\n  ".join(missing))
    assert not stale, "rows of COMMANDS that README.md no longer shows:\n  " + "\n  ".join(stale)


@pytest.mark.parametrize("command", shell_commands(README))
def test_readme_command_parses(command):
    check_parses(command)


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_docs_commands_parse(page):
    commands = shell_commands(page)
    for command in commands:
        if shlex.split(command)[0] != "pip":  # the docs name extras the lead's install text owns; README's are checked
            check_parses(command)


def test_readme_commands_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    ran = []
    try:
        for command in shell_commands(README):
            kind, extra, writes = COMMANDS[command]
            if kind != RUN:
                continue
            tokens = shlex.split(command) + list(extra)
            if tokens[0] == "torchrun":
                env = {**os.environ, "OMP_NUM_THREADS": "1"}
                env.pop("DIFFTRANSFORMER_DEBUG", None)
                res = subprocess.run([str(Path(sys.executable).with_name("torchrun")), *tokens[1:]],
                                     capture_output=True, text=True, env=env, timeout=300, check=False)
                assert res.returncode == 0, f"{command}\n{res.stderr[-3000:]}"
                assert "global batch 4 = 2 processes x 2 sequences" in res.stderr, res.stderr[-3000:]
            else:
                rc = main(_difftransformer_argv(tokens))
                assert rc == 0, f"`{shlex.join(tokens)}` exited with {rc}"
            for f in writes:
                assert (tmp_path / f).is_file(), f"`{command}` did not write {f}"
            ran.append(command)
    finally:
        torch.set_num_threads(threads)
    assert ran, "no README command ran"


def _tiny_remote_code_dir(path: Path) -> None:
    """What the transformers block loads: a tiny DIFF V2 exported as the README's command writes it."""
    from difftransformer.cli import main
    from difftransformer.model import DiffTransformerLM, ModelConfig

    from difftransformer.data.tokenizer import train_tokenizer

    torch.manual_seed(0)
    ours = path.parent / "ours-v2"
    DiffTransformerLM(ModelConfig.from_flavour("tiny", attention="diff_v2", vocab_size=512)).save_pretrained(ours)
    train_tokenizer(["In the beginning God created the heaven and the earth."] * 4, 300).save(str(ours / "tokenizer.json"))
    assert main(["convert", "--to-hf", str(ours), "--out", str(path)]) == 0


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(README)
    assert blocks, "README.md shows no Python"
    for code in blocks:
        if "trust_remote_code" in code:  # the directory `convert --to-hf runs/v2 --out hf-v2` writes
            pytest.importorskip("transformers")
            _tiny_remote_code_dir(tmp_path / "hf-v2")
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102 (the README's own code)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page (lower case, punctuation dropped, spaces to hyphens)."""
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.*)$", page.read_text(), flags=re.MULTILINE):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_links_resolve(page):
    """Every relative link of the front page and the docs names a file of the repository (and a heading of it when
    it has an anchor); none reaches outside the repository."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert dest.exists(), f"{page.name}: {target} does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"


def test_the_front_page_is_short_and_says_what_diff_v2_costs():
    """The README front page stays at most 1,100 words (as ``wc -w`` counts them: issue 71 item 4), and says where a
    user reads it what DIFF V2 costs per attention layer (+25%), not only in our model's whole."""
    text = README.read_text(encoding="utf-8")
    words = len(text.split())
    assert words <= 1100, f"README.md has {words} words; the front page keeps to 1,100 (move detail to docs/)"
    assert re.search(r"DIFF V2 adds 25% to each", " ".join(text.split())), "README.md no longer gives V2's +25%"
