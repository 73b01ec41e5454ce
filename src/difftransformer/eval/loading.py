"""What every analysis needs from a trained run: the model, its tokenizer, its training length and held-out text.

``load_for_eval`` accepts a run directory (its newest complete checkpoint is used) or a model directory, through the
package's one loader (``difftransformer.loading``); a Hugging Face directory is refused with how to convert it. Held-out
text is the run's validation split (``RUN_DIR/data/val.bin``, synthetic retrieval documents dropped) when present,
otherwise the validation documents of the embedded KJV corpus under the training code's own split rule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from tokenizers import Tokenizer

from .. import rundir
from ..data import corpus
from ..data.shards import read_prepared
from ..data.synthetic import RETRIEVAL_MARKER
from ..data.tokenizer import eos_id
from ..fileio import atomic_write
from ..loading import load_model
from ..model.transformer import DiffTransformerLM

DEFAULT_VAL_FRACTION = 0.02  # DataConfig.val_fraction's default


@dataclass
class EvalModel:
    """A trained model ready for evaluation, with where it came from."""

    label: str  # e.g. "diff_v1 seed 0": names the model in tables and plots
    source: Path  # the run or model directory given by the user
    checkpoint: Path  # the model directory actually loaded
    model: DiffTransformerLM
    tokenizer: Tokenizer
    train_len: int  # the training window (data.seq_len), or max_seq_len when unknown
    run_dir: Optional[Path] = None  # the run holding the checkpoint (None for a bare model directory)
    seed: Optional[int] = None
    run_config: dict[str, Any] = field(default_factory=dict)

    @property
    def attention(self) -> str:
        return self.model.cfg.attention

    def describe(self) -> dict[str, Any]:
        """The facts a result file records about the model it measured."""
        return {"label": self.label, "source": str(self.source), "checkpoint": str(self.checkpoint),
                "attention": self.attention, "seed": self.seed, "train_len": self.train_len,
                "parameters": self.model.num_parameters(), "model_config": self.model.cfg.to_dict()}


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's weights are: every tensor an analysis feeds it, or meets its outputs with, is made there
    (on ``--device cuda`` a CPU tensor meeting a GPU one is an error)."""
    return next(model.parameters()).device


def load_for_eval(path: str | Path, device: str | torch.device = "cpu", label: Optional[str] = None) -> EvalModel:
    """The model of a run or model directory, on ``device`` in float32, with its tokenizer."""
    source = Path(path)
    loaded = load_model(source, device=device, dtype=torch.float32, backend="sdpa", kinds=("run", "model"))
    model, checkpoint, run_dir = loaded.model, loaded.model_dir, loaded.run_dir
    run_cfg = rundir.read_run_config(run_dir)
    try:
        tok = loaded.tokenizer(where=f"--run {source}")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"--run {source}: {e}") from None
    train_len = int(run_cfg.get("data", {}).get("seq_len", model.cfg.max_seq_len))
    seed = run_cfg.get("train", {}).get("seed")
    label = label or f"{model.cfg.attention}" + (f" seed {seed}" if seed is not None else "")
    return EvalModel(label, source, checkpoint, model, tok, min(train_len, model.cfg.max_seq_len), run_dir, seed,
                     run_cfg)


# ---------------------------------------------------------------------------------------------- held-out text
def _run_val_tokens(ev: EvalModel) -> Optional[np.ndarray]:
    data = read_prepared(rundir.data_dir(ev.run_dir)) if ev.run_dir is not None else None
    if data is None:
        return None
    try:
        return np.asarray(data.tokens("val"))
    except FileNotFoundError:  # shards deleted to save space: fall back to the embedded corpus
        return None


def held_out_documents(ev: EvalModel, min_docs: int = 8) -> tuple[list[str], str]:
    """Validation documents (prose only) and a one-line note of where they came from."""
    ids = _run_val_tokens(ev)
    if ids is not None:
        eos = eos_id(ev.tokenizer)
        cuts = np.flatnonzero(ids == eos)
        docs, start = [], 0
        for c in [*cuts, len(ids)]:
            if c > start:
                docs.append(ev.tokenizer.decode(ids[start:c].tolist()))
            start = c + 1
        docs = [d for d in docs if RETRIEVAL_MARKER not in d and d.strip()]
        if len(docs) >= min_docs:
            return docs, f"the run's validation split ({len(docs)} prose documents)"
    val_fraction = ev.run_config.get("data", {}).get("val_fraction", DEFAULT_VAL_FRACTION)
    _, val = corpus.split_documents(corpus.embedded_corpus("kjv"), val_fraction)
    return val, f"validation documents of the embedded KJV corpus (val_fraction={val_fraction})"


def held_out_tokens(ev: EvalModel, docs: list[str]) -> torch.Tensor:
    """The documents as one token stream, separated by the EOS token: (N,) long, on the CPU (the windows cut from
    it go to the model's device where they are fed)."""
    eos = eos_id(ev.tokenizer)
    out: list[int] = []
    for enc in ev.tokenizer.encode_batch(docs):
        out.extend([*enc.ids, eos])
    return torch.tensor(out, dtype=torch.long, device="cpu")


def text_windows(ev: EvalModel, docs: list[str], length: int, count: int) -> torch.Tensor:
    """``count`` non-overlapping windows of ``length + 1`` tokens, evenly spread: (count, length + 1)."""
    stream = held_out_tokens(ev, docs)
    n_avail = stream.numel() // (length + 1)
    if n_avail < 1:
        raise ValueError(f"held-out text has {stream.numel()} tokens, fewer than one window of {length + 1}")
    count = min(count, n_avail)
    stride = n_avail // count
    return torch.stack([stream[i * stride * (length + 1):][: length + 1] for i in range(count)])


# ---------------------------------------------------------------------------------------------- results I/O
def write_json(result: dict[str, Any], path: Optional[str | Path]) -> None:
    """Write ``result`` as JSON to ``path`` (parents created), or print it when ``path`` is None."""
    text = json.dumps(result, indent=1, default=float)
    if path is None:
        print(text)
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, text + "\n")  # a kill mid-write leaves the old result, never a cut one
