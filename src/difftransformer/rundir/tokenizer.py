"""A model's tokenizer: where it is (the model directory's, else its run's) and whether it fits the model."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from tokenizers import Tokenizer

from ..data.tokenizer import EOS, load_tokenizer
from .files import TOKENIZER_NAME, PathLike, tokenizer_path

__all__ = ["find_tokenizer", "check_tokenizer", "read_tokenizer"]


def find_tokenizer(model_dir: PathLike, run_dir: Optional[PathLike] = None) -> Path:
    """tokenizer.json of the model directory, else of the run; FileNotFoundError naming where it looked."""
    candidates = [Path(model_dir) / TOKENIZER_NAME] + ([tokenizer_path(run_dir)] if run_dir is not None else [])
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError(f"no {TOKENIZER_NAME} in {' or '.join(str(c.parent) for c in candidates)}")


def check_tokenizer(tok: Tokenizer, vocab_size: int, where: PathLike, require_eos: bool = True) -> None:
    """Refuse a tokenizer whose ids the model cannot embed, or (``require_eos``) that lacks the document
    separator; generation can do without it (it then never stops early), the analyses cannot."""
    n = tok.get_vocab_size()
    if n > vocab_size:
        raise ValueError(f"{where}: {TOKENIZER_NAME} has {n} tokens but the model's vocab_size is {vocab_size}; "
                         "the tokenizer does not belong to this model")
    eos = tok.token_to_id(EOS)
    if require_eos and (eos is None or eos >= vocab_size):
        raise ValueError(f"{where}: {TOKENIZER_NAME} has no {EOS} token inside the model's vocabulary; "
                         "the tokenizer does not belong to this model")


def read_tokenizer(path: PathLike, vocab_size: int, where: Optional[PathLike] = None,
                   require_eos: bool = True) -> Tokenizer:
    """Load ``path`` and check it fits a model of ``vocab_size`` (``where`` names the source in errors)."""
    tok = load_tokenizer(path, None if where is None else str(where))
    check_tokenizer(tok, vocab_size, where if where is not None else path, require_eos)
    return tok
