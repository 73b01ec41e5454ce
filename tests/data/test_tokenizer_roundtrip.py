"""The byte-level BPE round-trips any text exactly, and its training is deterministic."""

from __future__ import annotations

import pytest

from difftransformer.data.corpus import embedded_corpus
from difftransformer.data.tokenizer import EOS, eos_id, load_tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(embedded_corpus("kjv")[:300], vocab_size=400)


@pytest.mark.parametrize("text", [
    "In the beginning God created the heaven and the earth.",
    "  leading and trailing spaces, \ttabs\nnewlines\r\n and  double  spaces  ",
    "unseen: Größe, naïve café, Ωμέγα, 漢字かな, emoji 🙂👍🏽, math ∑∫√",
    "control \x00\x01\x7f bytes and a lone combining mark \u0301",
    "",
])
def test_round_trip(tok, text):
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.get_vocab_size() for i in ids)


def test_vocabulary_size_bytes_and_eos(tok):
    assert tok.get_vocab_size() == 400
    assert tok.id_to_token(eos_id(tok)) == EOS
    assert tok.encode("the").ids != [ord("t"), ord("h"), ord("e")]  # merges were learned


def test_training_is_deterministic_and_saved_file_reloads(tok, tmp_path):
    again = train_tokenizer(embedded_corpus("kjv")[:300], vocab_size=400)
    assert again.to_str() == tok.to_str()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    text = "And God said, Let there be light: and there was light."
    assert loaded.encode(text).ids == tok.encode(text).ids


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected a tokenizer.json"):
        load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a valid tokenizer.json"):
        load_tokenizer(tmp_path / "bad.json")
