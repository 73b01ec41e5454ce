"""Byte-level BPE (GPT-2 style) trained with Hugging Face ``tokenizers`` on the training split, saved as
``tokenizer.json`` beside the run. Byte-level means every string round-trips exactly: no unknown tokens."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..fileio import read_text

EOS = "<|endoftext|>"  # separates documents in the token stream


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE with ``vocab_size`` entries at most (fewer when the text has fewer merges to offer)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(path: str | os.PathLike, where: str | None = None) -> Tokenizer:
    """``path``'s tokenizer; errors name ``where`` (the flag or field that named the file), when given, and the
    file: a missing file, one that is not UTF-8 text, one that is not a tokenizer."""
    p = Path(path)
    prefix = f"{where}: " if where else ""
    if not p.is_file():
        raise FileNotFoundError(f"{prefix}{p} does not exist (expected a tokenizer.json)")
    text = read_text(p, where)
    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises its own exception type for malformed files
        raise ValueError(f"{prefix}{p} is not a valid tokenizer.json: {e}") from None


def eos_id(tok: Tokenizer) -> int:
    i = tok.token_to_id(EOS)
    if i is None:
        raise ValueError(f"tokenizer has no {EOS} token")
    return i
