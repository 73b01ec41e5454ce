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
    try:
        rc = main(argv)
    except SystemExit as e:  # the parser's own refusals (a flag's type or choices) exit from inside argparse
        rc = e.code
    assert rc == 2
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


# Numbers rebuilt from a committed file on another machine are compared to this relative tolerance, never exactly:
# the analyses' means, fits and intervals go through numpy/OpenBLAS reductions whose summation order (and so the last
# bits) depends on the CPU and the BLAS build. Seen across two x86-64 CPUs: at most 2e-13 relative (issue 49). 1e-9
# leaves four orders of magnitude for other builds and is still far below the 3-4 digits any page prints, so a change
# of the analysis that moves a printed number fails; strings (verdicts, texts), booleans and integers compare exactly.
REBUILT_REL_TOL = 1e-9
REBUILT_ABS_TOL = 1e-12


def results_differences(got, want, path: str = "$") -> list[str]:
    """Where two JSON-like values differ, as ``path: got != want`` lines: floats beyond ``REBUILT_REL_TOL`` (or
    ``REBUILT_ABS_TOL`` near zero), anything else (strings, ints, bools, None, keys, lengths) exactly. An int and a
    float are different values here (a count that became a mean is a change)."""
    import math

    if isinstance(want, float) and isinstance(got, float) and not isinstance(got, bool):
        if math.isnan(want) and math.isnan(got):
            return []
        if math.isclose(got, want, rel_tol=REBUILT_REL_TOL, abs_tol=REBUILT_ABS_TOL):
            return []
        return [f"{path}: {got!r} != {want!r}"]
    if type(got) is not type(want):
        return [f"{path}: {type(got).__name__} {got!r} != {type(want).__name__} {want!r}"]
    if isinstance(want, dict):
        diffs = [f"{path}: keys {sorted(set(got) ^ set(want))} in one only"] if set(got) != set(want) else []
        for k in want:
            if k in got:
                diffs += results_differences(got[k], want[k], f"{path}.{k}")
        return diffs
    if isinstance(want, list):
        if len(got) != len(want):
            return [f"{path}: length {len(got)} != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in results_differences(g, w, f"{path}[{i}]")]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def assert_results_close(got, want) -> None:
    """``got`` equals ``want`` with floats to ``REBUILT_REL_TOL`` (see ``results_differences``)."""
    diffs = results_differences(got, want)
    assert not diffs, f"{len(diffs)} differences, first 20:\n  " + "\n  ".join(diffs[:20])
