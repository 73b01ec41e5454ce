"""Corpus reading (.txt paragraphs, .jsonl records, folders, the embedded KJV) and the deterministic split."""

from __future__ import annotations

import json

import pytest

from difftransformer.data import corpus


def test_embedded_corpus_is_the_kjv():
    docs = corpus.load_corpus(["kjv"])
    assert len(docs) > 1000 and docs[0].startswith("In the beginning God created")
    assert sum(map(len, docs)) > 4_000_000


def test_txt_jsonl_and_folders(tmp_path):
    (tmp_path / "a.txt").write_text("first para\nstill first\n\n\nsecond para\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "b.jsonl").write_text(json.dumps({"text": "record one"}) + "\n\n" + json.dumps({"text": "two"}) + "\n")
    (sub / "ignored.csv").write_text("x,y\n")
    assert corpus.load_corpus([str(tmp_path / "a.txt")]) == ["first para\nstill first", "second para"]
    assert corpus.load_corpus([str(tmp_path)]) == ["first para\nstill first", "second para", "record one", "two"]


@pytest.mark.parametrize("content, expected", [
    (b"", "is empty"),
    (b"ab\x00cd", "looks binary"),
    (b"\xff\xfe bad", "is not UTF-8"),
])
def test_bad_files(tmp_path, content, expected):
    p = tmp_path / "x.txt"
    p.write_bytes(content)
    with pytest.raises(ValueError, match=expected):
        corpus.load_corpus([str(p)])


def test_bad_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        corpus.load_corpus([str(tmp_path / "missing.txt")])
    (tmp_path / "x.md").write_text("hello")
    with pytest.raises(ValueError, match="neither .txt nor .jsonl"):
        corpus.load_corpus([str(tmp_path / "x.md")])
    (tmp_path / "x.jsonl").write_text("{bad json\n")
    with pytest.raises(ValueError, match=r"x.jsonl:1 is not valid JSON"):
        corpus.load_corpus([str(tmp_path / "x.jsonl")])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ValueError, match="holds no .txt or .jsonl files"):
        corpus.load_corpus([str(tmp_path / "empty_dir")])


def test_split_is_deterministic_disjoint_and_spread():
    docs = [f"doc {i}" for i in range(1000)]
    train, val = corpus.split_documents(docs, 0.02)
    assert len(val) == 20 and len(train) == 980
    assert set(train).isdisjoint(val) and sorted(train + val) == sorted(docs)
    assert corpus.split_documents(docs, 0.02) == (train, val)
    held = [int(d.split()[1]) for d in val]
    assert held[0] < 100 and held[-1] > 900  # spread through the corpus, not one end of it
    with pytest.raises(ValueError, match="cannot be split"):
        corpus.split_documents(["only one"], 0.1)


def test_truncate():
    assert corpus.truncate(["abcd", "efgh", "ij"], 6) == ["abcd", "ef"]
    assert corpus.truncate(["abcd"], 0) == ["abcd"]
