"""A throwaway third study, registered by this test only, reaches the command line, the report (its flag, its
section, its verdicts in the multiplicity note, results.json) and ``make docs`` with no other file changed.

This is the recipe of ARCHITECTURE.md ("A third study") tried for real: a ``studies.registry.Study`` (what a study's
``study.py`` holds) added to the registry. Anything in the package that still lists the studies by name fails here
(an unknown command, a missing flag, a section not shown, a block refused as unknown)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from typing_extensions import TypedDict

from difftransformer.cli import build_parser, main
from difftransformer.eval.stats import HELD, Verdict, verdict_row
from difftransformer.studies.schema import checker, write_checked
from difftransformer.studies import registry
from difftransformer.studies.page import table

RESULTS = "toy.json"


class ToyResults(TypedDict):
    benchmark: str
    score: float


check = checker(ToyResults)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.score <= 1:  # refused before OUT is made, like every study command
        raise ValueError(f"--score must be in [0, 1], got {args.score}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_checked(out / RESULTS, {"benchmark": "toy", "score": args.score}, check)
    print(f"wrote {out / RESULTS}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("toy-study", help="a toy third study (tests/studies/test_third_study.py)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--score", type=float, default=0.75)
    p.set_defaults(func=run)


def section(res: Any, directory: Path, provenance: Any) -> str:
    return "<h2>The toy study</h2>" + table(["score"], [[res["score"]]])


def verdicts(res: Any) -> list:
    v = Verdict(HELD, res["score"], (res["score"] - 0.1, res["score"] + 0.1), (3, 3), "a toy interval", "a toy")
    return [verdict_row("the toy claim", "Toy 1", "diff_v1", "a toy score", v)]


def score_block(results: Path) -> str:
    return f"score {check(json.loads((results / 'toy' / RESULTS).read_text()), 'toy')['score']:.3f}"


TOY = registry.Study(
    name="toy-study", what="the toy study", results=RESULTS,
    read=registry.result_reader("toy-study", RESULTS, "toy", check), register=register, section=section,
    verdicts=verdicts, docs={"toy-score": score_block})


@pytest.fixture()
def toy():
    import difftransformer.report.studies  # noqa: F401  (the built-in studies registered first)
    with registry.registered(TOY):
        yield TOY
    assert TOY not in registry.STUDIES


def test_the_registry_takes_it_and_refuses_a_second(toy):
    assert [s.name for s in registry.STUDIES] == ["retrieval", "retrieval-v4", "lm-sweep", "toy-study"]
    assert registry.by_name("toy-study") is toy
    with pytest.raises(ValueError, match="a study named 'toy-study' is registered already"):
        registry.add(toy)
    clash = registry.Study(name="other", what="x", results="x.json", read=toy.read, register=register,
                           section=section, docs={"retrieval-v4": toy.docs["toy-score"]})
    with pytest.raises(ValueError, match=r"the make docs block\(s\) \['retrieval-v4'\] belong to another study"):
        registry.add(clash)
    with pytest.raises(ValueError, match="no study named 'nope'"):
        registry.by_name("nope")


def test_its_command_and_its_reader(toy, tmp_path, capsys):
    assert "toy-study" in build_parser().format_help()
    assert main(["toy-study", "--out", str(tmp_path / "t")]) == 0
    assert toy.read(tmp_path / "t", "--toy-study") == {"benchmark": "toy", "score": 0.75}
    assert main(["toy-study", "--out", str(tmp_path / "bad"), "--score", "2"]) == 2
    assert "--score must be in [0, 1]" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    (tmp_path / "t" / RESULTS).write_text(json.dumps({"benchmark": "toy", "score": "high"}))
    with pytest.raises(ValueError, match="--toy-study: .* is not a toy-study result: score is a JSON string"):
        toy.read(tmp_path / "t", "--toy-study")
    with pytest.raises(ValueError, match="holds no toy.json"):
        toy.read(tmp_path / "none", "--toy-study")


def test_the_report_shows_it(toy, tmp_path, capsys):
    """``report --toy-study DIR``: the flag exists, the section is on the page after the other studies' places,
    its verdict is counted in the note and written to results.json; a mistyped file is one line before any model."""
    from difftransformer.train.config import load_config
    from difftransformer.train.trainer import train

    cfg = load_config("tiny", {"train": {"steps": 4, "eval_every": 4}, "checkpoint": {"every": 4},
                               "data": {"prepared_dir": str(tmp_path / "data")},
                               "log": {"progress": False, "tensorboard": False}})
    train(cfg, tmp_path / "run", progress=False)
    assert main(["toy-study", "--out", str(tmp_path / "t"), "--score", "0.5"]) == 0
    assert main(["report", str(tmp_path / "run"), "--toy-study", str(tmp_path / "t"), "--out",
                 str(tmp_path / "rep"), "--no-progress"]) == 0
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<h2>The toy study</h2>" in page and ">0.500</td>" in page
    assert page.index("The toy study") < page.index("Models</h")  # before the language models
    assert "makes 1 verdict" in page  # the multiplicity note counts its row (the models' are smoke rows)
    results = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert [r["claim"] for r in results["toy-study_verdicts"]] == ["the toy claim"]
    assert results["retrieval_verdicts"] == []  # a registered study not shown: its rows are empty
    (tmp_path / "t" / RESULTS).write_text(json.dumps({"benchmark": "other"}))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "run"), "--toy-study", str(tmp_path / "t"), "--out",
                 str(tmp_path / "rep2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a toy-study result: its \"benchmark\" is 'other'" in err[0]
    assert not (tmp_path / "rep2").exists()


def test_make_docs_fills_its_block(toy, tmp_path, monkeypatch):
    from difftransformer.report import docs

    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / RESULTS).write_text(json.dumps({"benchmark": "toy", "score": 0.25}))
    monkeypatch.setattr(docs, "RESULTS", tmp_path)
    text = "a\n<!-- generated: toy-score (make docs) -->\nstale\n<!-- end generated: toy-score -->\n"
    assert docs.render(text, "T.md", {}) == ("a\n<!-- generated: toy-score (make docs) -->\nscore 0.250\n"
                                             "<!-- end generated: toy-score -->\n")
    assert "toy-score" in docs.blocks()
    registry.STUDIES.remove(toy)
    try:
        with pytest.raises(ValueError, match="unknown generated block 'toy-score'"):
            docs.render(text, "T.md", {})
    finally:
        registry.STUDIES.append(toy)
