"""``make docs`` checks what it reads before it writes anything (issue 70 item 8): a results file missing, of another
shape, or holding ``[]`` is one error line naming the block, exit 2, and no file changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from difftransformer.report import docs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def tree(tmp_path, monkeypatch):
    """A copy of the README, docs/ and docs/results/ that ``make docs`` reads and writes instead of the checkout."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    monkeypatch.setattr(docs, "RESULTS", tmp_path / "docs" / "results")
    return tmp_path


def texts(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in [root / "README.md", *(root / "docs").glob("*.md")]}


@pytest.mark.parametrize("damage", ["missing", "empty list", "other shape", "lm-longer empty list"])
def test_bad_results_are_one_line_and_change_nothing(tree, damage, capsys):
    before = texts(tree)
    target = tree / "docs" / "results" / "v2-diagnostic" / "diagnostic.json"
    if damage == "missing":
        target.unlink()
    elif damage == "empty list":
        target.write_text("[]")
    elif damage == "other shape":
        target.write_text(json.dumps({"benchmark": "something else"}))
    else:
        (tree / "docs" / "results" / "lm-longer" / "lm-longer.json").write_text("[]")
    # a stale block so that a write would happen if nothing refused
    readme = tree / "README.md"
    readme.write_text(readme.read_text().replace("+0.063 [+0.032, +0.093]", "+9.999 [+9.999, +9.999]"))
    before = texts(tree)
    assert docs.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("make docs: error: ") and "block" in err[0], err
    assert texts(tree) == before
