import math

import numpy as np
import pytest

from difftransformer.eval.stats import HELD, INCONCLUSIVE, NOT_HELD
from difftransformer.retrieval.config import Condition, RetrievalConfig
from difftransformer.retrieval.sweep import analyse, fit_logit, format_sweep, params_at, run_sweep

N = 1024


def _curve(params, a, b, noise, rng):
    """Accuracies on logit(acc) = a + b log(params), one column per seed."""
    p = np.asarray(params, dtype=float)
    return [[float(1 / (1 + math.exp(-(a + b * math.log(x) + e)))) for e in rng.normal(0, noise, 8)] for x in p]


def _res(diff_scale: float, base_slope: float = 1.5, noise: float = 0.05):
    """DIFF's curve is the baseline's with every parameter count multiplied by ``1 / diff_scale``: it needs
    ``diff_scale`` times the baseline's parameters for any accuracy."""
    rng = np.random.default_rng(1)
    params = [20_000, 45_000, 80_000, 180_000]
    a = -base_slope * math.log(60_000)
    return {"widths": [32, 48, 64, 96], "n_queries": N,
            "params": {"baseline": params, "diff_v1": params},
            "accuracy": {"baseline": _curve(params, a, base_slope, noise, rng),
                         "diff_v1": _curve([p / diff_scale for p in params], a, base_slope, noise, rng)}}


def test_fit_recovers_a_known_curve():
    a, b = fit_logit([1e4, 1e5, 1e6], [1 / (1 + math.exp(-(-10 + 1.0 * math.log(x)))) for x in (1e4, 1e5, 1e6)], N)
    assert a == pytest.approx(-10, abs=1e-6) and b == pytest.approx(1.0, abs=1e-6)
    assert params_at(a, b, 0.5, N) == pytest.approx(math.exp(10), rel=1e-6)
    assert math.isnan(params_at(a, -1.0, 0.5, N))


@pytest.mark.parametrize("scale, verdict", [(0.5, HELD), (2.0, NOT_HELD), (1.0, INCONCLUSIVE)])
def test_parameter_ratio_and_verdict(scale, verdict):
    out = analyse(_res(scale), 64)
    r = out["ratios"]["diff_v1"]
    assert r["estimate"] == pytest.approx(scale, rel=0.15)
    assert r["verdict"] == verdict and r["ci"][0] <= r["estimate"] <= r["ci"][1]


def test_flat_curves_give_no_ratio():
    res = _res(0.5)
    res["accuracy"] = {v: [[1.0] * 8] * 4 for v in res["accuracy"]}  # saturated at every width
    r = analyse(res, 64)["ratios"]["diff_v1"]
    assert r["verdict"] == INCONCLUSIVE and "slope" in r["why"]


def test_tiny_sweep_end_to_end(tmp_path):
    cfg = RetrievalConfig(n_heads=2, n_layers=1, steps=3, batch=4, warmup=1, seeds=2, lr_grid=(2e-3, 4e-3),
                          cpu_code_path="machine",
                          eval_contexts=4, val_contexts=4, train_pairs=(2, 3), train_context=(4, 8), queries=2,
                          conditions=(Condition("p3c8", 3, 8), Condition("p3c12", 3, 12)), primary="p3c8",
                          extrapolation="p3c12", variants=("baseline", "diff_v1"))
    res = run_sweep(cfg, [16, 24], tmp_path, workers=1, progress=False)
    assert (tmp_path / "sweep.json").is_file() and (tmp_path / "sweep.png").stat().st_size > 1000
    assert res["params"]["baseline"][0] < res["params"]["baseline"][1]
    assert [len(x) for x in res["accuracy"]["diff_v1"]] == [2, 2]
    assert "diff_v1: parameters for the baseline's accuracy" in format_sweep(res)
    with pytest.raises(ValueError, match="two distinct widths"):
        run_sweep(cfg, [16], None, workers=1, progress=False)


def test_sweep_reuses_the_benchmarks_jobs_at_the_default_width(tmp_path):
    """The benchmark's jobs are the sweep's at the default width (same keys): --reuse-jobs reads them instead of
    running them, and the sweep's results are the same as without."""
    from difftransformer.retrieval.benchmark import run_benchmark
    cfg = RetrievalConfig(n_heads=2, n_layers=1, steps=3, batch=4, warmup=1, seeds=2, lr_grid=(2e-3, 4e-3), lr_widen=0,
                          cpu_code_path="machine", d_model=16, eval_contexts=4, val_contexts=4, train_pairs=(2, 3),
                          train_context=(4, 8), queries=2,
                          conditions=(Condition("p3c8", 3, 8), Condition("p3c12", 3, 12)), primary="p3c8",
                          extrapolation="p3c12", variants=("baseline", "diff_v1"))
    run_benchmark(cfg, tmp_path / "bench", workers=1, progress=False)
    fresh = run_sweep(cfg, [16, 24], tmp_path / "s1", workers=1, progress=False)
    reused = run_sweep(cfg, [16, 24], tmp_path / "s2", workers=1, progress=False,
                       reuse=tmp_path / "bench" / "jobs.jsonl")
    assert fresh["jobs_run"] == 16 and reused["jobs_run"] == 8  # width 16 (the default) came from the benchmark
    strip = lambda r: {k: v for k, v in r.items() if k not in ("wall_s", "jobs_run")}  # noqa: E731
    assert strip(fresh) == strip(reused)
