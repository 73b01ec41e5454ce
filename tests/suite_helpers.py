"""Helpers shared by the whole suite (also offered as fixtures by ``conftest.py``)."""

from __future__ import annotations

import torch

from difftransformer.cli import main
from difftransformer.model.config import ModelConfig


def tiny_model_config(attention: str = "diff_v1", **changes) -> ModelConfig:
    """The ``tiny`` flavour (4 heads of 16, 2 KV heads, 2 layers, vocab 64) with ``changes`` on top."""
    return ModelConfig.from_flavour("tiny", attention=attention, **changes)


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights far from their initialisation (matrices N(0, 0.1), lambda vectors N(0, 0.3), norm weights in
    [0.5, 1.5): a dropped or misplaced weight shows) from one seeded generator; the model in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif "lambda" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            else:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    return model.eval()


def cli_fails(capsys, argv: list[str], *expected: str, stdout_empty: bool = False) -> str:
    """``difftransformer <argv>`` exits 2 with one ``difftransformer CMD: error:`` line holding every ``expected``
    text and no traceback; ``stdout_empty``: nothing was printed before the error. Returns the line."""
    capsys.readouterr()
    assert main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith(f"difftransformer {argv[0]}: error: "), lines[0]
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in out.err + out.out
    if stdout_empty:
        assert out.out == "", out.out
    return lines[0]


def comparable_results(results: dict) -> dict:
    """A retrieval results.json without what measures the run rather than the models: times, load, where and how
    many jobs ran now (the ``timings`` block and every run's ``*_s`` fields)."""
    import json

    r = json.loads(json.dumps(results))
    r.pop("timings")
    for x in r["variants"].values():
        for key in ("runs", "matched_runs", "grid_runs"):
            for run in x[key]:
                for k in [k for k in run if k.endswith("_s")]:
                    run.pop(k)
    return r
