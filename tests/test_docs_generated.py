"""``make docs``: every generated block of the README and docs/ (``report/docs.py``) is what the committed results
give now; a stale block, or one of an unknown name, is found."""

from __future__ import annotations

import shutil

import pytest

from difftransformer.report import docs


def test_every_generated_block_is_fresh():
    stale = docs.stale()
    assert not stale, f"stale generated blocks in {', '.join(stale)}: run `make docs` and commit"


def test_every_block_name_is_used_and_every_file_has_one():
    used = {name for rel in docs.files() for name, _ in docs.PATTERN.findall((docs.ROOT / rel).read_text())}
    assert used == set(docs.blocks())
    assert {"README.md", "docs/retrieval.md", "docs/lm-sweep.md"} <= set(docs.files())


def test_a_stale_block_is_found(tmp_path):
    for rel in docs.files():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(docs.ROOT / rel, tmp_path / rel)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("| DIFF V1 (as published) | with | +0.063", "| DIFF V1 (as published) "
                                                                                          "| with | +0.064", 1))
    assert set(docs.stale(tmp_path)) == {"README.md"}


def test_an_unknown_block_is_one_error(tmp_path):
    with pytest.raises(ValueError, match="unknown generated block 'nope'"):
        docs.render("<!-- generated: nope (make docs) -->\nx\n<!-- end generated: nope -->\n", "X.md", {})
