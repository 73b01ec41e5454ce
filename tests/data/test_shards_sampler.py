"""Shards are identical across runs; windows and the checkpointable sampler."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from difftransformer.data.shards import WindowSampler, eval_starts, prepare_data, read_prepared, windows
from difftransformer.data.tokenizer import load_tokenizer
from difftransformer.train.config import DataConfig

FILES = ("tokenizer.json", "train.bin", "val.bin", "meta.json")


def _cfg(**kw) -> DataConfig:
    base = dict(vocab_size=400, seq_len=32, max_chars=60_000, val_fraction=0.05, retrieval_share=0.2)
    base.update(kw)
    return DataConfig(**base)


def test_shards_are_identical_across_runs(tmp_path):
    a = prepare_data(_cfg(), tmp_path / "a", progress=False)
    b = prepare_data(_cfg(), tmp_path / "b", progress=False)
    for name in FILES:
        assert (a.directory / name).read_bytes() == (b.directory / name).read_bytes(), name
    assert a.dtype == "uint16" and a.num_tokens["train"] > 10 * a.num_tokens["val"] > 0
    # Another seed changes the mixed-in retrieval documents, hence the tokens.
    c = prepare_data(_cfg(seed=7), tmp_path / "c", progress=False)
    assert (c.directory / "train.bin").read_bytes() != (a.directory / "train.bin").read_bytes()


def test_shards_decode_to_the_corpus_and_are_reused(tmp_path):
    cfg = _cfg(retrieval_share=0.0)
    data = prepare_data(cfg, tmp_path, progress=False)
    tok = load_tokenizer(data.tokenizer_file)
    ids = data.tokens("train")
    assert ids.dtype == np.uint16 and len(ids) == data.num_tokens["train"]
    text = tok.decode(ids[:200].tolist(), skip_special_tokens=False)
    assert text.startswith("In the beginning God created the heaven and the earth.")
    stamp = (tmp_path / "train.bin").stat().st_mtime_ns
    assert prepare_data(cfg, tmp_path, progress=False).num_tokens == data.num_tokens
    assert (tmp_path / "train.bin").stat().st_mtime_ns == stamp  # same fingerprint: not rebuilt
    assert read_prepared(tmp_path, _cfg(retrieval_share=0.0, vocab_size=500)) is None
    assert json.loads((tmp_path / "meta.json").read_text())["documents"]["val"] > 0


def test_windows_are_shifted_targets():
    tokens = np.arange(100, dtype=np.uint16)
    x, y = windows(tokens, torch.tensor([0, 10, 67]), 32)
    assert x.shape == y.shape == (3, 32) and x.dtype == torch.int64
    assert torch.equal(y, x + 1) and x[2, -1] == 98


def test_sampler_state_restores_the_position():
    s = WindowSampler(1000, 32, seed=3)
    for _ in range(5):
        s.next_starts(8)
    state = s.state_dict()
    expected = [s.next_starts(8) for _ in range(3)]
    t = WindowSampler(1000, 32, seed=99)
    t.load_state_dict(state)
    assert all(torch.equal(a, t.next_starts(8)) for a in expected)
    assert t.batches_drawn == 8
    starts = torch.cat([WindowSampler(40, 32, seed=i).next_starts(64) for i in range(5)])
    assert starts.min() >= 0 and starts.max() == 40 - 32 - 1  # every window and its target fit
    with pytest.raises(ValueError, match="longer than"):
        WindowSampler(32, 32, seed=0)


def test_eval_starts_are_fixed_and_in_range():
    s = eval_starts(1000, 32, 8)
    assert s[0] == 0 and s[-1] == 1000 - 33 and torch.equal(s, eval_starts(1000, 32, 8))


class _Records(logging.Handler):
    """The package's log records, whatever handlers the CLI or pytest installed elsewhere."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))

    def said(self, text: str) -> bool:
        return any(level == "WARNING" and text in msg for level, msg in self.lines)


@pytest.fixture
def records():
    h = _Records()
    logging.getLogger("difftransformer").addHandler(h)
    yield h
    logging.getLogger("difftransformer").removeHandler(h)


def test_retrieval_document_length_is_recorded_and_long_ones_get_a_note(tmp_path, records):
    from difftransformer.data.shards import retrieval_doc_tokens
    from difftransformer.data.synthetic import RETRIEVAL_MARKER

    short = prepare_data(_cfg(retrieval_n_filler=1, seq_len=4096), tmp_path / "short", progress=False)
    n_short = json.loads((short.directory / "meta.json").read_text())["retrieval_doc_tokens"]
    tok = load_tokenizer(short.tokenizer_file)
    doc = f"{RETRIEVAL_MARKER} Paris 12. And it was so."
    assert retrieval_doc_tokens(tok, [doc, "prose without the marker"]) == len(tok.encode(doc).ids)
    assert retrieval_doc_tokens(tok, ["prose only"]) == 0
    assert n_short > 0 and not records.said("retrieval documents are")
    # More filler per document: longer documents, and a warning (stderr under the CLI) once they outgrow seq_len.
    long = prepare_data(_cfg(retrieval_n_filler=8), tmp_path / "long", progress=False)
    n_long = json.loads((long.directory / "meta.json").read_text())["retrieval_doc_tokens"]
    assert n_long > max(n_short, 32)  # 32 = data.seq_len of _cfg
    assert records.said("retrieval documents are")
