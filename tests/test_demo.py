"""`difftransformer demo` end to end on the tiny preset: three runs on shared tokens, the table, reuse on a rerun."""

from __future__ import annotations

import json

from difftransformer.cli import main


def test_demo_trains_three_variants_then_reuses_them(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "--config", "tiny", "--steps", "4", "--out", str(out), "--no-report", "--no-progress",
            "--no-retrieval"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    for kind in ("baseline", "diff_v1", "diff_v2"):
        cfg = json.loads((out / kind / "run_config.json").read_text())
        assert cfg["model"]["attention"] == kind and cfg["train"]["steps"] == 4
        assert (out / kind / "data" / "train.bin").is_file()
    # One tokenisation shared by the three runs: their shards are the same file (hard links).
    inodes = {(out / k / "data" / "train.bin").stat().st_ino for k in ("baseline", "diff_v1", "diff_v2")}
    assert len(inodes) == 1
    rows = [line.split() for line in first.splitlines() if line.split()[:1] in (["baseline"], ["diff_v1"], ["diff_v2"])]
    assert [r[0] for r in rows] == ["baseline", "diff_v1", "diff_v2"] and rows[0][2] == "1.000x"
    assert main(argv) == 0  # complete runs are reused, not retrained or refused
    again = capsys.readouterr().out
    assert again.count("reused") == 3
    # A complete run from other options (here another preset) is refused, not silently reported as this one.
    assert main(["demo", "--config", "demo", "--steps", "4", "--out", str(out), "--no-report", "--no-progress",
                 "--no-retrieval"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other model or data options" in err[0]


def test_demo_bad_input_is_one_line(tmp_path, capsys):
    assert main(["demo", "--seeds", "0", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seeds" in err[0]


def test_demo_from_a_pretrained_model_continues_it_three_ways(tmp_path, capsys):
    """`demo --init-from SRC`: the baseline continues SRC, DIFF V1 (per_head) and V2 continue its conversions, all with
    SRC's tokenizer and on the same tokens; each run's first loss is SRC's on that batch (the functions are kept)."""
    from difftransformer import rundir
    from difftransformer.model.transformer import DiffTransformerLM

    src = tmp_path / "src"
    assert main(["train", "--config", "tiny", "--model.attention", "baseline", "--train.steps", "3", "--out", str(src),
                 "--no-progress", "--log.tensorboard", "false"]) == 0
    from difftransformer.train.config import PRESETS_DIR

    preset = tmp_path / "tiny_log1.toml"  # the tiny preset, logging every step, V1's negative branch warmed up
    text = (PRESETS_DIR / "tiny.toml").read_text().replace("[log]\nevery = 5", "[log]\nevery = 1")
    preset.write_text(text.replace("[train]\n", "[train]\nv1_negative_warmup = 4\n"))
    out = tmp_path / "demo"
    assert main(["demo", "--init-from", str(src), "--config", str(preset), "--steps", "2", "--out", str(out),
                 "--no-report", "--no-progress"]) == 0
    assert "retrieval" not in capsys.readouterr().out and not (out / "retrieval").exists()
    first = {}
    for kind in ("baseline", "diff_v1", "diff_v2"):
        cfg = json.loads((out / kind / "run_config.json").read_text())
        assert cfg["model"]["attention"] == kind and cfg["train"]["init_from"] == str(src.resolve())
        assert rundir.tokenizer_path(out / kind).read_bytes() == rundir.tokenizer_path(src).read_bytes()
        first[kind] = next(r["loss"] for r in rundir.read_metric_records(out / kind) if r.get("step") == 1)
    assert json.loads((out / "diff_v1" / "run_config.json").read_text())["model"]["v1_layout"] == "per_head"
    assert abs(first["diff_v1"] - first["baseline"]) < 1e-4 and abs(first["diff_v2"] - first["baseline"]) < 1e-4
    assert DiffTransformerLM.from_pretrained(rundir.resolve_checkpoint(out / "baseline")).cfg.attention == "baseline"
    assert main(["demo", "--init-from", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_the_page_opens_with_what_ran_in_its_order():
    """The demo's preface: the studies in the order the page shows them (nothing "above" that comes below), the
    committed sweep marked as not measured, a user's own sweep named, the language models' steps."""
    from argparse import Namespace
    from pathlib import Path

    from difftransformer.demo import LM_STEPS, QUICK_STEPS, preface

    args = Namespace(quick=False, seeds=1, init_from=None)
    text = preface(args, "demo", LM_STEPS, Path("r/retrieval"), Path("r/lm-sweep-v2"), {"commit": "x"})
    assert "above" not in text
    order = [text.index(s) for s in ("retrieval benchmark, measured in this run", "not measured in this run",
                                     f"{LM_STEPS} steps each")]
    assert order == sorted(order) and "`difftransformer demo`" in text
    own = preface(Namespace(quick=True, seeds=2, init_from=None), "demo", None, None, Path("runs/mine"), None)
    assert "the one in runs/mine, run beforehand" in own and f"{QUICK_STEPS} steps each" in own
    assert "--quick" in own and "retrieval" not in own and own.count("The language models") == 0


def test_smoke_verdicts_print_one_line(tmp_path, capsys):
    from difftransformer.demo import print_verdicts
    from difftransformer.report import HELD, SMOKE

    row = {"variant": "diff_v1", "claim": "a claim", "why": "because"}
    (tmp_path / "results.json").write_text(json.dumps({
        "retrieval_verdicts": [{**row, "verdict": HELD}], "verdicts": [{**row, "verdict": SMOKE}] * 28}))
    print_verdicts(tmp_path / "results.json")
    out = capsys.readouterr().out
    assert "held" in out and out.count(SMOKE) == 1 and "verdicts, language models: none (a smoke run" in out


def test_make_demo_installs_what_the_demo_imports():
    """`make demo` installs torch and the `demo` extra only (the Makefile's `.demo-installed` step; `make test` adds
    `dev`): every extra the from-scratch demo requires (``demo._extras_needed``, what it checks before its first job)
    is inside it, and the demo target waits for that step alone. A lean venv with the `demo` extra ran
    `demo --quick` end to end (2026-12-06)."""
    import re
    from pathlib import Path

    import tomllib

    from difftransformer import demo
    from difftransformer.cli import build_parser
    from difftransformer.train.config import load_config

    root = Path(__file__).resolve().parent.parent
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def closure(name: str) -> set[str]:
        out = {name}
        for req in extras[name]:
            m = re.fullmatch(r"difftransformer\[([\w,]+)\]", req)
            for sub in (m.group(1).split(",") if m else ()):
                out |= closure(sub)
        return out

    args = build_parser().parse_args(["demo"])
    _, needed, _ = demo._extras_needed(load_config(args.config or "demo"), args)
    assert needed and set(needed) <= closure("demo"), (needed, closure("demo"))
    assert not {"dev", "all", "triton", "ray", "lmeval"} & closure("demo")
    make = (root / "Makefile").read_text()
    assert re.search(r"^demo: \$\(VENV\)/\.demo-installed$", make, re.MULTILINE)
    step = make.split("$(VENV)/.demo-installed: pyproject.toml\n", 1)[1].split("\n\n", 1)[0]
    assert "-e '.[demo]'" in step and "dev" not in step
