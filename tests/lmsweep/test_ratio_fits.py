"""Known-answer tests of the two ratio fits of the language-model sweep (Fig. 3a parameters, Fig. 3b tokens) and of
their verdict rule: curves built so that DIFF needs 0.5x, 1x or 2x what the baseline needs read held, inconclusive
and did not hold; and the fits recover the built ratio."""

import math

import numpy as np
import pytest

from difftransformer.eval import stats
from difftransformer.lmsweep.fits import param_ratio, ratio_verdict, token_ratio

PARAMS = np.array([66_000, 110_000, 197_000, 443_000], dtype=float)
SEEDS = 3


def law(n):
    """A loss falling linearly in log parameters, as the fit assumes."""
    return 6.0 - 0.25 * np.log(n)


def noisy(clean, rng, sd):
    return clean[:, None] + rng.normal(0, sd, size=(clean.size, SEEDS))  # (widths, seeds)


@pytest.mark.parametrize("ratio, verdict", [(0.5, stats.HELD), (1.0, stats.INCONCLUSIVE), (2.0, stats.NOT_HELD)])
def test_param_ratio_known_answer(ratio, verdict):
    rng = np.random.default_rng(1)
    base = noisy(law(PARAMS), rng, 0.01)
    diff = noisy(law(PARAMS / ratio), rng, 0.01)  # DIFF at N does what the baseline does at N / ratio
    assert param_ratio(PARAMS, law(PARAMS), PARAMS, law(PARAMS / ratio)) == pytest.approx(ratio, rel=1e-9)
    r = ratio_verdict(lambda idx: param_ratio(PARAMS, base[:, idx].mean(1), PARAMS, diff[:, idx].mean(1)), SEEDS)
    assert r["verdict"] == verdict, r
    assert r["ci"][0] <= r["estimate"] <= r["ci"][1]
    assert r["estimate"] == pytest.approx(ratio, rel=0.15)


def test_param_ratio_uses_each_variants_own_parameter_axis():
    # DIFF has 8% more parameters at every width and the same losses: it needs 1.08x the baseline's parameters
    assert param_ratio(PARAMS, law(PARAMS), PARAMS * 1.08, law(PARAMS)) == pytest.approx(1.08)


def test_param_ratio_undefined_for_a_flat_or_rising_curve():
    flat = np.full(4, 4.0)
    assert math.isnan(param_ratio(PARAMS, law(PARAMS), PARAMS, flat))
    assert math.isnan(param_ratio(PARAMS, flat, PARAMS, law(PARAMS)))
    rising = law(PARAMS)[::-1]
    r = ratio_verdict(lambda idx: param_ratio(PARAMS, law(PARAMS), PARAMS, rising), SEEDS)
    assert r["verdict"] == stats.INCONCLUSIVE and r["undefined_share"] == 1.0


TOKENS = np.arange(1, 13) * 51_200.0


def curve(t):
    return 3.0 + 40.0 * t ** -0.3


@pytest.mark.parametrize("ratio, verdict", [(0.5, stats.HELD), (1.0, stats.INCONCLUSIVE), (2.0, stats.NOT_HELD)])
def test_token_ratio_known_answer(ratio, verdict):
    rng = np.random.default_rng(2)
    base = curve(TOKENS)[None, :] + rng.normal(0, 0.003, size=(SEEDS, TOKENS.size))  # (seeds, points)
    diff = curve(TOKENS / ratio)[None, :] + rng.normal(0, 0.003, size=(SEEDS, TOKENS.size))
    r = ratio_verdict(lambda idx: token_ratio(TOKENS, base[idx].mean(0), diff[idx].mean(0)), SEEDS)
    assert r["verdict"] == verdict, r
    if ratio < 1:
        assert r["estimate"] == pytest.approx(ratio, rel=0.05)
    if ratio > 1:
        assert r["estimate"] == math.inf  # never reached within the run


def test_token_ratio_interpolates_in_log_tokens():
    t = [100.0, 200.0, 400.0, 800.0]
    base = [5.0, 4.0, 3.0, 2.0]
    diff = [4.0, 3.0, 1.5, 1.0]  # crosses 2.0 between 200 (3.0) and 400 (1.5): two thirds of the way in log t
    assert token_ratio(t, base, diff) == pytest.approx(200 * 2 ** (2 / 3) / 800)
    assert token_ratio(t, base, [1.0, 1.0, 1.0, 1.0]) == pytest.approx(100 / 800)  # already there at the first point
    assert token_ratio(t, base, [5.0, 4.0, 3.0, 2.0]) == pytest.approx(1.0)  # the same curve reaches it at the end
    assert token_ratio(t, base, [5.0, 4.0, 3.0, 2.1]) == math.inf


def test_a_seed_on_the_other_side_makes_it_inconclusive():
    # the seed means say 0.5 with a narrow bootstrap, but one seed alone says 1.5: the rule needs every seed
    per = {0: 0.5, 1: 0.5, 2: 1.5}

    def fn(idx):
        return 0.5 if len(idx) > 1 else per[int(idx[0])]
    r = ratio_verdict(fn, SEEDS)
    assert r["ci"][1] < 1 and r["verdict"] == stats.INCONCLUSIVE


# ---------------------------------------------------------------------------------------------- applicability (v2)
def _runs(params, losses):
    """Runs keyed by width (its index here), one dict per seed, as endpoint_b reads them."""
    return {i: [{"params_non_embedding": int(n), "params": int(n) * 3, "loss": float(x)} for x in row]
            for i, (n, row) in enumerate(zip(params, losses))}


def _endpoint_b(base, diff):
    from difftransformer.lmsweep.analysis import endpoint_b
    return endpoint_b(_runs(PARAMS, base), _runs(PARAMS, diff), lambda r: r["loss"], "params_non_embedding")


def test_a_flat_baseline_gives_not_measurable():
    from difftransformer.lmsweep.analysis import NOT_MEASURABLE
    rng = np.random.default_rng(3)
    flat = noisy(np.full(PARAMS.size, 3.9), rng, 0.01)  # v1's case: the baseline's loss barely moves with width
    diff = flat - 0.1  # a constant gap: any ratio read off a flat curve is huge or tiny
    r = _endpoint_b(flat, diff)
    assert r["verdict"] == NOT_MEASURABLE and not r["applicability"]["measurable"]
    assert r["applicability"]["ci"][1] >= 0 or r["applicability"]["fall"] < 0.1
    assert "premise failed" in r["why"] and "estimate" in r and "ci" in r  # computed and written, not judged


def test_a_small_but_certain_fall_is_not_measurable_either():
    from difftransformer.lmsweep.analysis import MIN_FALL, NOT_MEASURABLE, applicability
    rng = np.random.default_rng(4)
    shallow = noisy(4.0 - 0.02 * np.log(PARAMS), rng, 0.0005)  # falls 0.038 nats: a slope interval below 0
    a = applicability(np.log(PARAMS), shallow)
    assert a["ci"][1] < 0 and a["fall"] == pytest.approx(0.02 * np.log(PARAMS[-1] / PARAMS[0]), rel=0.05)
    assert a["fall"] < MIN_FALL and not a["measurable"] and "too small" in a["why"]
    assert _endpoint_b(shallow, shallow - 0.01)["verdict"] == NOT_MEASURABLE


@pytest.mark.parametrize("ratio, verdict", [(0.5, stats.HELD), (2.0, stats.NOT_HELD)])
def test_a_sloped_baseline_gives_the_built_ratio(ratio, verdict):
    rng = np.random.default_rng(1)
    base = noisy(law(PARAMS), rng, 0.01)
    diff = noisy(law(PARAMS / ratio), rng, 0.01)
    r = _endpoint_b(base, diff)
    assert r["applicability"]["measurable"] and r["applicability"]["fall"] > 0.4
    assert r["verdict"] == verdict and r["estimate"] == pytest.approx(ratio, rel=0.15)


def _curve_runs(variant, curves, steps):
    return [{"variant": variant, "seed": i, "lr": 1e-3, "diverged": False, "floor": 99.0, "test_loss": float(c[-1]),
             "curve": {"steps": list(steps), "test_loss": [float(x) for x in c]}} for i, c in enumerate(curves)]


def test_fig3b_premise_flat_second_half_gives_not_measurable_and_a_falling_one_the_built_ratio():
    from difftransformer.lmsweep.analysis import NOT_MEASURABLE, endpoint_c
    from difftransformer.lmsweep.config import LMSweepConfig
    c = LMSweepConfig(steps=300, batch=16, seq_len=128, eval_every=25)
    steps = np.arange(25, 301, 25)
    tokens = steps * 16 * 128.0
    rng = np.random.default_rng(5)
    base = curve(tokens)[None, :] + rng.normal(0, 0.003, size=(SEEDS, steps.size))
    diff = curve(tokens / 0.5)[None, :] + rng.normal(0, 0.003, size=(SEEDS, steps.size))
    r = endpoint_c(c, _curve_runs("baseline", base, steps), _curve_runs("diff_v2", diff, steps))
    assert r["applicability"]["measurable"] and r["verdict"] == stats.HELD
    assert r["estimate"] == pytest.approx(0.5, rel=0.05)
    flat = base.copy()
    flat[:, steps >= 150] = 3.9 + rng.normal(0, 0.003, size=(SEEDS, int((steps >= 150).sum())))
    r = endpoint_c(c, _curve_runs("baseline", flat, steps), _curve_runs("diff_v2", flat - 0.1, steps))
    assert r["verdict"] == NOT_MEASURABLE and not r["applicability"]["measurable"]
