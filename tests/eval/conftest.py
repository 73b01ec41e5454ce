"""Fixtures of the evaluation tests: one tiny trained run per attention variant, trained once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

VARIANTS = ("baseline", "diff_v1", "diff_v2")


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[str, Path]:
    """``{variant: run_dir}``: the tiny preset for 10 steps, 128-token positions (training windows of 64, so
    positions can go to 2x the training length), and small retrieval documents in the data (2 needles, 1
    question, 2 digits) so that needle haystacks fit in the context."""
    import torch

    from difftransformer.train.config import load_config
    from difftransformer.train.trainer import train

    root = tmp_path_factory.mktemp("eval_runs")
    prepared = root / "prepared"
    prepared.mkdir()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for variant in VARIANTS:
            cfg = load_config("tiny", {
                "model": {"attention": variant, "max_seq_len": 128},
                "data": {"prepared_dir": str(prepared), "seq_len": 64, "retrieval_share": 0.3,
                         "retrieval_n_needles": 2, "retrieval_n_queries": 1, "retrieval_digits": 2,
                         "retrieval_n_filler": 3},
                "train": {"steps": 10, "eval_every": 10},
                "checkpoint": {"every": 10},
                "log": {"progress": False, "tensorboard": False},
            })
            train(cfg, root / variant, progress=False)
            out[variant] = root / variant
    finally:
        torch.set_num_threads(before)
    return out


@pytest.fixture(scope="session")
def evs(runs):
    """``{variant: EvalModel}`` loaded once; a test that changes a model must copy it first (``eval_helpers.fresh``)."""
    from difftransformer.eval.loading import load_for_eval

    return {v: load_for_eval(p) for v, p in runs.items()}
