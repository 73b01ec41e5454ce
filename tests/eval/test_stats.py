"""Oracle tests of the verdict statistics (eval/stats.py) and the long-context summaries (eval/long_context.py).

Every expected number is worked out here by hand or by an independent routine (scipy's t-tests), and every test
names the wrong implementation it catches (2 x SE instead of t, unpaired instead of paired, no chance gate...).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from difftransformer.eval import long_context as lc
from difftransformer.eval import stats as S


# ---------------------------------------------------------------------------------------------- critical values
def test_t_critical_values():
    assert S.t_crit(2) == pytest.approx(4.303, abs=5e-4)  # a 2 x SE margin would use 2
    assert S.t_crit(1) == pytest.approx(12.706, abs=5e-4)
    assert S.t_crit(math.inf) == pytest.approx(1.960, abs=5e-4)
    assert S.t_crit(4, level=0.9) == pytest.approx(2.132, abs=5e-4)


# ---------------------------------------------------------------------------------------------- compare_seeds
def test_clear_win_paired_t_by_hand():
    base, diff = [3.50, 3.52, 3.51], [3.30, 3.33, 3.31]  # validation loss, lower is better
    v = S.compare_seeds(base, diff, higher_is_better=False, min_effect=0.02)
    d = np.array(diff) - np.array(base)
    half = 4.3027 * d.std(ddof=1) / math.sqrt(3)
    assert v.verdict == S.HELD
    assert v.estimate == pytest.approx(d.mean())
    assert v.ci == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-5)
    assert v.n_seeds == (3, 3) and v.method == "paired t, df=2" and v.level == 0.95


def test_clear_loss():
    v = S.compare_seeds([0.40, 0.42, 0.41, 0.43], [0.20, 0.23, 0.20, 0.22], higher_is_better=True, min_effect=0.05)
    assert v.verdict == S.NOT_HELD
    assert v.ci[1] < -0.05


def test_t_not_two_se():
    """Mean paired difference 3 SE from 0 at n=3: past 2 x SE, inside 4.303 x SE, so inconclusive."""
    d = np.array([0.0, 1.0, 2.0])  # mean 1, SE 1/sqrt(3)
    d = d - d.mean() + 3 / math.sqrt(3)
    v = S.compare_seeds([0.0, 0.0, 0.0], list(d), higher_is_better=True, min_effect=0.0)
    assert v.verdict == S.INCONCLUSIVE and "interval includes 0" in v.reason


def test_pure_noise_with_seeds_reads_inconclusive():
    rng = np.random.default_rng(1)
    out = [S.compare_seeds(rng.normal(3.5, 0.05, 3), rng.normal(3.5, 0.05, 3), False, 0.02).verdict
           for _ in range(400)]
    assert out.count(S.INCONCLUSIVE) / len(out) > 0.9
    assert out.count(S.HELD) / len(out) < 0.04  # at most ~2.5% under the null, the min effect lowers it further
    v = S.compare_seeds([1.0, 1.2, 0.9], [1.1, 0.95, 1.05], higher_is_better=True, min_effect=0.0)
    assert v.verdict == S.INCONCLUSIVE and v.ci[0] < 0 < v.ci[1]


def test_min_effect_blocks_a_tiny_but_sure_difference():
    v = S.compare_seeds([3.500, 3.510, 3.520], [3.490, 3.499, 3.511], False, 0.02)
    assert v.ci[1] < 0  # the interval excludes 0 ...
    assert v.verdict == S.INCONCLUSIVE and "minimum effect" in v.reason  # ... but 0.01 < 0.02


def test_paired_vs_unpaired_against_scipy():
    base, diff = [1.0, 2.0, 3.0], [1.10, 2.12, 3.09]  # large seed spread, consistent paired gain
    p = S.compare_seeds(base, diff, True, 0.05, paired=True)
    u = S.compare_seeds(base, diff, True, 0.05, paired=False)
    assert p.verdict == S.HELD and u.verdict == S.INCONCLUSIVE
    assert p.ci == pytest.approx(tuple(st.ttest_rel(diff, base).confidence_interval()), abs=1e-9)
    assert u.ci == pytest.approx(tuple(st.ttest_ind(diff, base, equal_var=False).confidence_interval()), abs=1e-9)
    assert u.method.startswith("Welch t")


def test_unequal_lengths():
    with pytest.raises(ValueError, match="paired"):
        S.compare_seeds([1.0, 2.0], [1.0, 2.0, 3.0], True, 0.0)
    w = S.compare_seeds([1.0, 1.2], [2.0, 2.1, 2.2], True, 0.0, paired=False)
    assert w.ci == pytest.approx(tuple(st.ttest_ind([2.0, 2.1, 2.2], [1.0, 1.2], equal_var=False)
                                       .confidence_interval()), abs=1e-9)
    one = S.compare_seeds([1.0], [2.0, 2.1, 2.2], True, 0.0, paired=False)  # one side's spread unknown: pooled t
    assert one.ci == pytest.approx(tuple(st.ttest_ind([2.0, 2.1, 2.2], [1.0], equal_var=True)
                                         .confidence_interval()), abs=1e-9)
    assert "equal spread" in one.reason


def test_one_seed_uses_within_seed_se_and_says_so():
    v = S.compare_seeds([0.30], [0.50], True, 0.05, within_se=(0.04, 0.05))
    half = 1.95996 * math.hypot(0.04, 0.05)
    assert v.ci == pytest.approx((0.2 - half, 0.2 + half), abs=1e-4)
    assert v.verdict == S.HELD and v.method == "normal, within-seed SE" and "seed spread is unknown" in v.reason
    assert S.compare_seeds([0.30], [0.50], True, 0.05, within_se=0.12).verdict == S.INCONCLUSIVE  # 1.96*0.12 > 0.2
    none = S.compare_seeds([0.30], [0.50], True, 0.05)
    assert none.verdict == S.INCONCLUSIVE and all(math.isnan(x) for x in none.ci)
    assert "no within-seed standard error" in none.reason


@pytest.mark.parametrize("kwargs, name", [
    (dict(base=[], diff=[]), "base"), (dict(base=[1.0], diff=[float("nan")]), "diff"),
    (dict(base=[1.0, 2.0], diff=[1.0, 2.0], min_effect=-0.1), "min_effect"),
    (dict(base=[1.0, 2.0], diff=[1.0, 2.0], level=1.5), "level"),
    (dict(base=[1.0], diff=[2.0], within_se=-1.0), "within_se"),
])
def test_compare_seeds_validates(kwargs, name):
    args = dict(higher_is_better=True, min_effect=0.0) | kwargs
    with pytest.raises(ValueError, match=name):
        S.compare_seeds(**args)


def test_pair_by_seed():
    b, d, dropped = S.pair_by_seed({0: 1.0, 1: 2.0, 2: 3.0}, {2: 30.0, 0: 10.0})
    assert (b, d, dropped) == ([1.0, 3.0], [10.0, 30.0], [1])
    with pytest.raises(ValueError, match="share no seed"):
        S.pair_by_seed({0: 1.0}, {1: 1.0})


# ---------------------------------------------------------------------------------------------- accuracies
def test_wilson_known_values():
    assert S.wilson_interval(0.5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    lo, hi = S.wilson_interval(0.0, 32)
    assert lo == 0.0 and hi == pytest.approx(1.95996 ** 2 / (32 + 1.95996 ** 2), abs=1e-6)
    with pytest.raises(ValueError, match="acc"):
        S.wilson_interval(1.2, 10)
    with pytest.raises(ValueError, match="n "):
        S.wilson_interval(0.5, 0)


def test_above_chance_gate():
    assert not S.above_chance([0.40], 32, 0.25)  # Wilson lower bound 0.246
    assert S.above_chance([0.50], 32, 0.25)
    assert not S.above_chance([0.30, 0.31, 0.29], 32, 0.25)  # seeds agree, but 32 queries are few
    assert S.above_chance([0.60, 0.62, 0.58], 96, 0.25)
    with pytest.raises(ValueError, match="n_queries"):
        S.above_chance([0.5], 0, 0.25)


def test_accuracy_claim_gated_on_chance():
    v = S.compare_accuracy([0.22], [0.34], 32, chance=0.25)
    assert v.verdict == S.INCONCLUSIVE and "no model above chance" in v.reason
    w = S.compare_accuracy([0.30], [0.90], 96, chance=0.25)
    assert w.verdict == S.HELD and "seed spread is unknown" in w.reason


# ---------------------------------------------------------------------------------------------- ratios
def test_ratio_verdicts_on_known_inputs():
    base, diff = [300.0, 320.0, 310.0], [40.0, 45.0, 38.0]
    v = S.compare_ratio(base, diff)
    logs = np.log(diff) - np.log(base)
    half = 4.3027 * logs.std(ddof=1) / math.sqrt(3)
    assert v.verdict == S.HELD and v.scale == "ratio"
    assert v.estimate == pytest.approx(math.exp(logs.mean()))
    assert v.ci == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)), rel=1e-4)
    assert S.compare_ratio(base, [600.0, 650.0, 610.0]).verdict == S.NOT_HELD
    near = S.compare_ratio(base, [270.0, 290.0, 280.0])  # surely below 1, but only 10% smaller
    assert near.verdict == S.INCONCLUSIVE and near.ci[1] < 1 and "within 0.8-1.25" in near.reason
    assert S.compare_ratio([24.0], [7.8]).verdict == S.INCONCLUSIVE  # one seed, a lone peak: no interval
    one = S.compare_ratio([24.0], [7.8], within_se_log=0.2)
    assert one.verdict == S.HELD and one.ci[1] < 1
    noisy = S.compare_ratio(base, [250.0, 400.0, 310.0])  # the ratio interval straddles 1: said in ratio terms
    assert noisy.verdict == S.INCONCLUSIVE and noisy.ci[0] < 1 < noisy.ci[1]
    assert "ratio interval includes 1" in noisy.reason and "includes 0" not in noisy.reason
    with pytest.raises(ValueError, match="positive"):
        S.compare_ratio([0.0], [1.0])
    with pytest.raises(ValueError, match="max_ratio"):
        S.compare_ratio([1.0], [1.0], max_ratio=1.5)


def test_log_mean_se():
    g, se = S.log_mean_se([1.0, 100.0])
    assert g == pytest.approx(10.0) and se == pytest.approx(math.log(100) / 2)


# ---------------------------------------------------------------------------------------------- order spread
def test_null_spread_at_chance_is_large_and_gated():
    rng = np.random.default_rng(0)
    draws = rng.binomial(32, 0.25, size=(4000, 4)) / 32
    assert (draws.max(1) - draws.min(1)).mean() == pytest.approx(0.16, abs=0.015)  # the review's number
    verdicts = [S.compare_spread([list(draws[2 * i])], [list(draws[2 * i + 1])], 32, 0.25).verdict
                for i in range(300)]
    assert set(verdicts) == {S.INCONCLUSIVE}
    v = S.compare_spread([[0.25, 0.41, 0.22, 0.28]], [[0.25, 0.26, 0.25, 0.24]], 32, 0.25)
    assert "above chance" in v.reason


def test_spread_above_chance_is_compared():
    base, diff = [[0.90, 0.60, 0.75, 0.80]], [[0.82, 0.80, 0.81, 0.80]]
    v = S.compare_spread(base, diff, 96, 0.25)
    assert v.verdict == S.HELD and v.estimate == pytest.approx(0.02 - 0.30)
    assert S.compare_spread(diff, base, 96, 0.25).verdict == S.NOT_HELD
    seeds = S.compare_spread([[0.8, 0.6], [0.9, 0.7], [0.85, 0.6]], [[0.8, 0.79], [0.8, 0.78], [0.81, 0.8]], 96, 0.25)
    assert seeds.method == "paired t, df=2" and seeds.verdict == S.HELD


def test_spread_uncertainties():
    same = [[1, 0, 1, 1, 0]] * 3
    assert S.spread_interval(same) == (0.0, 0.0, 0.0, 0.0)  # order-robust: no spread in any resample
    s, lo, hi, se = S.spread_interval([[1] * 20 + [0] * 20, [0] * 20 + [1] * 20])
    assert s == 0.0 and hi > 0.2 and se > 0
    assert S.spread_interval([[1] * 10, [0] * 10])[:3] == (1.0, 1.0, 1.0)
    se = S.spread_se_binomial([0.25] * 4, 32, n_boot=4000)
    assert 0.04 < se < 0.09
    assert S.spread_se_binomial([0.0, 1.0], 32) == 0.0
    with pytest.raises(ValueError, match="correct"):
        S.spread_interval([[0, 2]])
    with pytest.raises(ValueError, match="accs"):
        S.spread_se_binomial([0.5], 32)


# ---------------------------------------------------------------------------------------------- page level
def test_smoke_run_gate():
    v = S.smoke_run(30)
    assert v.verdict == S.SMOKE and "30 training steps" in v.reason
    assert S.smoke_run(400) is None and S.smoke_run(99, 100) is not None and S.smoke_run(100, 100) is None
    with pytest.raises(ValueError, match="steps"):
        S.smoke_run(0)


def test_verdict_summary_counts_and_multiplicity():
    vs = ([S.compare_seeds([1.0, 1.1], [2.0, 2.1], True, 0.0)] * 3
          + [S.compare_seeds([1.0], [1.0], True, 0.0)] * 10 + [S.smoke_run(30)])
    out = S.verdict_summary(vs)
    assert out["total"] == 14 and out["tested"] == 3 and out["counts"][S.HELD] == 3
    assert out["counts"][S.INCONCLUSIVE] == 10 and out["counts"][S.SMOKE] == 1
    assert out["expected_false_held"] == pytest.approx(0.075)
    assert "14 verdicts" in out["note"] and "0.1" in out["note"]
    with pytest.raises(ValueError, match="verdicts"):
        S.verdict_summary(["held"])


def test_parameter_note():
    differs, note = S.parameter_note(5_310_720, 5_576_960, "DIFF V2")
    assert differs and note.startswith("DIFF V2 has 5.0% more parameters") and "does not account" in note
    assert not S.parameter_note(5_310_720, 5_312_256, "DIFF V1")[0]
    differs, note = S.parameter_note(5_310_720, 5_576_960, "DIFF V2", equal_size_base_params=5_570_000)
    assert differs and "baseline of equal size" in note
    with pytest.raises(ValueError, match="base_params"):
        S.parameter_note(0, 10)


# ---------------------------------------------------------------------------------------------- long context
def curves(early, mid, beyond, L=64, T=160, docs=6, noise=0.0, seed=0):
    """NLL curves with known levels: ``early`` on [0, L/8), ``mid`` on [L/2, L), ``beyond`` on [L, 2L); 9.0 elsewhere
    (positions past 2L included), which a summary must not read."""
    a = np.full((docs, T), 9.0)  # positions outside the three ranges must not matter
    a[:, :L // 8], a[:, L // 2:L], a[:, L:2 * L] = early, mid, beyond
    return a + np.random.default_rng(seed).normal(0, noise, a.shape)


def test_context_gains_known_answer():
    g = lc.context_gains(curves(5.0, 4.0, 4.5), 64)
    assert g["within"][:2] == pytest.approx((-1.0, -1.0)) and g["beyond"][0] == pytest.approx(-0.5)
    assert g["within"][3] == 6
    assert lc.context_gains(curves(5.0, 4.0, 4.5, T=100), 64)["beyond"] is None  # fewer than 2L positions
    noisy = lc.context_gains(curves(5.0, 4.0, 4.5, docs=40, noise=0.5), 64)
    assert noisy["within"][1] < -1.0 < noisy["within"][2]


def test_compare_context_gains():
    base = [curves(5.0, 4.0, 4.2, noise=0.05, seed=1)]  # gains -1.0 within, -0.8 beyond
    diff = [curves(5.2, 3.9, 4.9, noise=0.05, seed=2)]  # gains -1.3 within (better), -0.3 beyond (worse)
    v = lc.compare_context_gains(base, diff, 64)
    assert v["within"].verdict == S.HELD and v["within"].estimate == pytest.approx(-0.3, abs=0.02)
    assert v["beyond"].verdict == S.NOT_HELD and "seed spread is unknown" in v["beyond"].reason
    # A larger gain from a worse start (early 5.6, mid 4.2 against the baseline's 5.0, 4.0): not lower NLL in context.
    worse = lc.compare_context_gains(base, [curves(5.6, 4.2, 4.9, noise=0.05, seed=2)], 64)["within"]
    assert worse.estimate == pytest.approx(-0.4, abs=0.02) and worse.ci[1] < 0
    assert worse.verdict == S.INCONCLUSIVE and "worse start" in worse.reason
    seeds = lc.compare_context_gains([curves(5, 4, 4.2, seed=s, noise=0.05) for s in range(3)],
                                     [curves(5, 4, 4.2, seed=9 + s, noise=0.05) for s in range(3)], 64)
    assert seeds["within"].verdict == S.INCONCLUSIVE and seeds["within"].method == "paired t, df=2"
    with pytest.raises(ValueError, match="train_len"):
        lc.context_gains(curves(5, 4, 4), 4)
    with pytest.raises(ValueError, match="positions"):
        lc.context_gains(np.zeros((2, 10)), 64)
    with pytest.raises(ValueError, match="same documents"):
        lc.compare_context_gains([curves(5, 4, 4, docs=3)], [curves(5, 4, 4, docs=4)], 64)


def test_text_tokens():
    assert lc.text_tokens([[1, 2], [3, 4, 5]], 0, 4) == [1, 2, 0, 3, 4]
    assert lc.text_tokens([[1, 2], [3, 4, 5]], 0, 10) is None


def test_long_held_out_texts_are_never_trained():
    from difftransformer.data import corpus

    docs = corpus.embedded_corpus("kjv")
    used = corpus.truncate(docs, 200_000)  # the tiny preset's max_chars
    train, _ = corpus.split_documents(used, 0.05)
    texts = lc.long_held_out_texts(0.05, 200_000, min_chars=4000, max_texts=16)
    assert len(texts) == 16
    seen = set(train) | set(used)
    for t in texts:
        assert t.chars >= 4000 and t.source == "untrained remainder" and t.first >= len(used)
        assert not seen & set(t.paragraphs)
        assert list(t.paragraphs) == docs[t.first:t.first + len(t.paragraphs)]  # contiguous running text
    val = lc.long_held_out_texts(0.02, 0, min_chars=2500)  # whole corpus trained: only long validation paragraphs
    _, val_docs = corpus.split_documents(docs, 0.02)
    assert val and all(t.source == "validation paragraph" and t.paragraphs[0] in val_docs for t in val)
    with pytest.raises(ValueError, match="max_chars"):
        lc.long_held_out_texts(0.02, 0, min_chars=4000)
    with pytest.raises(ValueError, match="sources"):
        lc.long_held_out_texts(sources=["my.txt"])
