"""Tokenise once into memmap shards, then draw random windows from them.

``prepare_data`` turns a ``DataConfig`` into a folder::

    tokenizer.json   byte-level BPE trained on the training split
    train.bin        training tokens, uint16 when the vocabulary fits (else uint32), documents separated by EOS
    val.bin          validation tokens, same layout
    meta.json        dtype, token counts and the fingerprint of the data options (written last)

A folder whose ``meta.json`` carries the same fingerprint is reused as is, so the three demo models (and every
rank of a torchrun job) share one tokenisation. ``WindowSampler`` draws window starts from a seeded
``torch.Generator`` whose state is checkpointed, so a resumed run reads exactly the batches it would have read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..fileio import atomic_copy, atomic_json, fault_point, read_json
from ..log import progress_bar
from ..model.pretrained import TOKENIZER_NAME  # the one spelling of the file name; shards sit in a run
from . import corpus
from .synthetic import FILLER_MAX_CHARS, RETRIEVAL_MARKER, retrieval_documents, short_sentences
from .tokenizer import eos_id, load_tokenizer, train_tokenizer

logger = logging.getLogger(__name__)

META_NAME = "meta.json"
SPLITS = ("train", "val")
ENCODE_CHUNK = 256  # documents per encode_batch call (one progress-bar tick)


def fingerprint(data_cfg) -> str:
    """Hash of every option that changes the tokens (not where prepared shards are shared from)."""
    from .corpus import contents_digest
    d = dataclasses.asdict(data_cfg)
    for k in ("prepared_dir", "seq_len"):
        d.pop(k, None)
    digest = contents_digest(list(d.get("sources") or []))
    if digest is not None:  # your own files: their contents too (the embedded corpus's fingerprints are unchanged)
        d["contents"] = digest
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class PreparedData:
    directory: Path
    dtype: str
    vocab_size: int
    num_tokens: dict[str, int]

    @property
    def tokenizer_file(self) -> Path:
        return self.directory / TOKENIZER_NAME

    def tokens(self, split: str) -> np.ndarray:
        """The split's tokens as a read-only memmap (no copy into memory)."""
        return np.memmap(self.directory / f"{split}.bin", dtype=self.dtype, mode="r")


def read_prepared(directory: Path, data_cfg=None) -> PreparedData | None:
    """The prepared data in ``directory``, or None when absent or made from other data options."""
    meta_path = Path(directory) / META_NAME
    if not meta_path.is_file():
        return None
    try:
        meta = read_json(meta_path)
        int(meta["num_tokens"]["train"]), int(meta["num_tokens"]["val"]), str(meta["dtype"])
    except (ValueError, KeyError, TypeError):
        return None  # unreadable (e.g. left empty by an older version killed mid-write): prepared again
    if data_cfg is not None and meta.get("fingerprint") != fingerprint(data_cfg):
        return None
    return PreparedData(Path(directory), meta["dtype"], meta["vocab_size"], meta["num_tokens"])


def mix_retrieval(docs: list[str], data_cfg, seed: int) -> list[str]:
    """``docs`` with synthetic retrieval documents making up ``retrieval_share`` of the characters.

    Filler sentences come from ``docs`` themselves; the retrieval documents are spread evenly between them.
    """
    share = data_cfg.retrieval_share
    if share <= 0:
        return docs
    filler = short_sentences(corpus.sentences(docs))  # the evaluation's filler too
    if not filler:
        raise ValueError(f"data.retrieval_share > 0 needs corpus sentences of at most {FILLER_MAX_CHARS} characters "
                         "for the filler")
    kw = dict(n_needles=data_cfg.retrieval_n_needles, n_queries=data_cfg.retrieval_n_queries,
              n_filler=data_cfg.retrieval_n_filler, digits=data_cfg.retrieval_digits)
    sample = retrieval_documents(16, filler, seed=seed, **kw)
    avg = sum(map(len, sample)) / len(sample)
    want_chars = sum(map(len, docs)) * share / (1.0 - share)  # r / (c + r) = share
    extra = retrieval_documents(max(1, round(want_chars / avg)), filler, seed=seed, **kw)
    out, step = [], len(docs) / len(extra)
    j = 0
    for i, d in enumerate(docs):
        out.append(d)
        while j < len(extra) and j * step <= i:
            out.append(extra[j])
            j += 1
    return out + extra[j:]


def retrieval_doc_tokens(tok, docs: list[str], sample: int = 256) -> int:
    """Median token length of the retrieval documents among ``docs`` (0 when there are none)."""
    found = [d for d in docs if RETRIEVAL_MARKER in d][:sample]
    if not found:
        return 0
    return int(np.median([len(e.ids) for e in tok.encode_batch(found)]))


def _encode(tok, docs: list[str], split: str, progress: bool) -> np.ndarray:
    eos = eos_id(tok)
    parts = []
    bar = progress_bar(total=len(docs), desc=f"tokenising {split}", unit="doc", disable=not progress, leave=False)
    for i in range(0, len(docs), ENCODE_CHUNK):
        for enc in tok.encode_batch(docs[i:i + ENCODE_CHUNK]):
            parts.append(np.asarray([*enc.ids, eos], dtype=np.int64))
        bar.update(min(ENCODE_CHUNK, len(docs) - i))
    bar.close()
    return np.concatenate(parts)


def prepare_data(data_cfg, directory: str | Path, progress: bool = True) -> PreparedData:
    """Build (or reuse) the tokenizer and shards for ``data_cfg`` in ``directory``."""
    out = Path(directory)
    ready = read_prepared(out, data_cfg)
    if ready is not None:
        return ready
    docs = corpus.truncate(corpus.load_corpus(data_cfg.sources), data_cfg.max_chars)
    train_docs, val_docs = corpus.split_documents(docs, data_cfg.val_fraction)
    split_docs = {"train": mix_retrieval(train_docs, data_cfg, data_cfg.seed),
                  "val": mix_retrieval(val_docs, data_cfg, data_cfg.seed + 1)}
    if data_cfg.tokenizer:  # a pretrained model's own tokenizer (train --init-from): never a new BPE
        tok = load_tokenizer(data_cfg.tokenizer, "data.tokenizer")
        if tok.get_vocab_size() > data_cfg.vocab_size:
            raise ValueError(f"data.tokenizer={data_cfg.tokenizer} has {tok.get_vocab_size()} tokens, more than "
                             f"data.vocab_size={data_cfg.vocab_size}")
    else:
        tok = train_tokenizer(split_docs["train"], data_cfg.vocab_size)
    dtype = "uint16" if data_cfg.vocab_size <= 2**16 else "uint32"
    out.mkdir(parents=True, exist_ok=True)
    tmp_tok = out / f".{TOKENIZER_NAME}.tmp-{os.getpid()}"
    try:
        if data_cfg.tokenizer:  # byte for byte the source's file
            atomic_copy(data_cfg.tokenizer, out / TOKENIZER_NAME)
        else:
            tok.save(str(tmp_tok))
            atomic_copy(tmp_tok, out / TOKENIZER_NAME)  # fsynced, then renamed
    finally:  # a failed write (a full disk) leaves no temporary file behind
        tmp_tok.unlink(missing_ok=True)
    counts = {}
    for split in SPLITS:
        ids = _encode(tok, split_docs[split], split, progress)
        tmp = out / f".{split}.bin.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                ids.astype(dtype).tofile(f)
                f.flush()
                os.fsync(f.fileno())
            fault_point(out / f"{split}.bin")
            tmp.replace(out / f"{split}.bin")
        except BaseException as e:
            tmp.unlink(missing_ok=True)
            if isinstance(e, OSError) and e.filename is None:  # a full disk names no file: name the shard
                raise OSError(e.errno, e.strerror, str(out / f"{split}.bin")) from None
            raise
        counts[split] = int(ids.size)
    meta = {"fingerprint": fingerprint(data_cfg), "dtype": dtype, "vocab_size": data_cfg.vocab_size,
            "num_tokens": counts, "documents": {s: len(d) for s, d in split_docs.items()},
            "data": dataclasses.asdict(data_cfg)}
    if data_cfg.retrieval_share > 0:
        meta["retrieval_doc_tokens"] = n = retrieval_doc_tokens(tok, split_docs["train"])
        if n > data_cfg.seq_len:
            logger.warning(f"retrieval documents are {n} tokens (median), longer than data.seq_len="
                           f"{data_cfg.seq_len}: few training windows hold a needle and its question; lower "
                           "data.retrieval_n_filler")
    atomic_json(out / META_NAME, meta)  # last, atomically: it marks the folder complete
    return PreparedData(out, dtype, data_cfg.vocab_size, counts)


def link_prepared(src: PreparedData, directory: str | Path) -> PreparedData:
    """Hard-link (or copy) prepared files into ``directory`` so a run directory holds its own data."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for name in (TOKENIZER_NAME, *(f"{s}.bin" for s in SPLITS), META_NAME):  # meta last: marks it complete
        dst = out / name
        tmp = out / f".{name}.link-{os.getpid()}"
        try:
            os.link(src.directory / name, tmp)
        except OSError:
            atomic_copy(src.directory / name, dst)
            continue
        try:
            fault_point(dst)
            os.replace(tmp, dst)  # never a moment without the file, nor a half-copied one
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return PreparedData(out, src.dtype, src.vocab_size, dict(src.num_tokens))


def check_fits(data: PreparedData, seq_len: int) -> None:
    """Refuse a window longer than a split (one clear line instead of an index error mid-run)."""
    for split in SPLITS:
        n = data.num_tokens[split]
        if n < seq_len + 2:
            raise ValueError(f"data.seq_len={seq_len} needs at least {seq_len + 2} tokens, but the {split} split "
                             f"has {n}; lower data.seq_len or give more text")


class WindowSampler:
    """Random window starts from a seeded generator; ``state_dict`` captures the position exactly."""

    def __init__(self, num_tokens: int, seq_len: int, seed: int) -> None:
        self.high = num_tokens - seq_len - 1  # last start whose window and shifted target fit
        if self.high < 1:
            raise ValueError(f"data.seq_len={seq_len} is longer than the {num_tokens} training tokens")
        self.seq_len = seq_len
        self.generator = torch.Generator().manual_seed(seed)
        self.batches_drawn = 0

    def next_starts(self, n: int) -> torch.Tensor:
        """(n,) window starts for one optimizer step, the same on every rank (each takes its slice)."""
        self.batches_drawn += 1
        return torch.randint(0, self.high + 1, (n,), generator=self.generator)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "batches_drawn": self.batches_drawn}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.batches_drawn = int(state["batches_drawn"])


def windows(tokens: np.ndarray, starts, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets, each (len(starts), seq_len) int64."""
    rows = np.stack([np.asarray(tokens[s:s + seq_len + 1], dtype=np.int64) for s in starts.tolist()])
    t = torch.from_numpy(rows)  # (B, seq_len + 1)
    return t[:, :-1], t[:, 1:]


def eval_starts(num_tokens: int, seq_len: int, count: int) -> torch.Tensor:
    """``count`` evenly spaced window starts over a split: the same validation windows at every evaluation."""
    high = num_tokens - seq_len - 1
    return torch.linspace(0, high, count).round().long()

