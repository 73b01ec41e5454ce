"""PROTOCOL.md's decisions on made-up job results: the lr choice on the tuning half, the widening at an edge, a
diverged run counted at the cap, the job list and when it is final, and the floor rule of the verdicts."""

import math

import pytest

from difftransformer.eval import stats
from difftransformer.lmsweep.analysis import Job, assemble, choose_lr, lr_choice, lr_scores, needed_jobs
from difftransformer.lmsweep.config import LMSweepConfig

CAP = math.log(4096)


def cfg(**kw):
    return LMSweepConfig(**{"widths": (16, 32), "seeds": 2, "seed_base": 0, "lr_grid": (2e-3, 4e-3, 8e-3),
                            "lr_widen": 1, "variants": ("baseline", "diff_v1"), **kw})


def run(width, variant, seed, lr, tune, test=None, diverged=False, floor=6.0):
    loss = tune if test is None else test
    return {"width": width, "variant": variant, "seed": seed, "lr": lr, "diverged": diverged,
            "tune_loss": None if diverged else tune, "test_loss": None if diverged else loss, "floor": floor,
            "params": 1000 * width, "params_non_embedding": 100 * width,
            "curve": {"steps": [1, 2, 3], "test_loss": [loss + 1, loss + 0.5, loss]},
            "outliers": None if diverged else {"attention_logit_top1": 5.0 + seed, "hidden_state_top1": 9.0 + seed}}


def bowl(c, best_lr, widths=None, variants=None, lrs=None, depth=1.0):
    """Every job's result, the loss lowest at best_lr (quadratic in log2 lr)."""
    out = {}
    for w in widths or c.widths:
        for v in variants or c.variants:
            for lr in lrs or c.lr_grid:
                for s in c.test_seeds:
                    loss = 4.0 - 0.001 * w + depth * (math.log2(lr / best_lr)) ** 2 + 0.01 * s
                    out[Job(w, v, s, lr)] = run(w, v, s, lr, loss)
    return out


def test_choice_is_the_lowest_seed_mean_tuning_loss_not_the_test_loss():
    runs = [run(16, "baseline", s, lr, tune, test) for s in (0, 1)
            for lr, tune, test in ((2e-3, 4.0, 3.0), (4e-3, 3.9, 3.5))]
    assert choose_lr(lr_scores(runs, CAP)) == 4e-3


def test_a_diverged_run_counts_at_the_cap():
    runs = [run(16, "baseline", 0, 8e-3, 3.0), run(16, "baseline", 1, 8e-3, 0, diverged=True),
            run(16, "baseline", 0, 4e-3, 4.0), run(16, "baseline", 1, 4e-3, 4.0)]
    s = {x["lr"]: x for x in lr_scores(runs, CAP)}
    assert s[8e-3]["tune_loss"] == pytest.approx((3.0 + CAP) / 2) and s[8e-3]["diverged"] == 1
    assert choose_lr(list(s.values())) == 4e-3


def test_an_edge_choice_widens_the_grid_once_then_settles():
    c = cfg()
    done = bowl(c, 16e-3)  # best past the top edge
    ch = lr_choice(c, 32, "baseline", done, CAP)
    assert ch.lr is None and ch.widened == [16e-3]
    jobs, final = needed_jobs(c, done, CAP)
    assert not final and Job(32, "baseline", 0, 16e-3) in jobs
    done.update(bowl(c, 16e-3, lrs=[16e-3]))
    ch = lr_choice(c, 32, "baseline", done, CAP)
    assert ch.lr == 16e-3 and ch.grid == [2e-3, 4e-3, 8e-3, 16e-3]  # still at an edge, but widened once only
    jobs, final = needed_jobs(c, done, CAP)
    assert final and set(jobs) == set(done)


def test_inside_choice_needs_no_widening():
    c = cfg()
    done = bowl(c, 4e-3)
    jobs, final = needed_jobs(c, done, CAP)
    assert final and len(jobs) == 2 * 2 * 3 * 2
    assert lr_choice(c, 16, "diff_v1", done, CAP).lr == 4e-3


def test_assemble_the_floor_rule_and_the_loss_endpoint():
    c = cfg(lr_widen=0)
    done = bowl(c, 4e-3)
    for s in c.test_seeds:  # DIFF better by 0.1 (+- a little) at the largest width
        j = Job(32, "diff_v1", s, 4e-3)
        done[j] = run(32, "diff_v1", s, 4e-3, done[j]["tune_loss"], done[j]["test_loss"] - 0.1 - 0.01 * s)
    res = assemble(c, done, CAP)
    e = res["endpoints"]["diff_v1"]
    assert e["loss"]["32"]["verdict"] == stats.HELD and e["loss"]["32"]["estimate"] == pytest.approx(-0.105)
    assert e["loss"]["16"]["verdict"] == stats.INCONCLUSIVE  # identical losses: the interval is a point at 0
    # one DIFF run above the unigram floor: the comparison is inconclusive whatever its interval
    j = Job(32, "diff_v1", 1, 4e-3)
    done[j] = {**done[j], "floor": 1.0}
    res = assemble(c, done, CAP)
    assert res["endpoints"]["diff_v1"]["loss"]["32"]["verdict"] == stats.INCONCLUSIVE
    assert "unigram floor" in res["endpoints"]["diff_v1"]["loss"]["32"]["why"]
    assert res["failed_floor_runs"]["diff_v1"] == 1


def test_config_refuses_bad_values():
    for kw, needle in (({"widths": (32,)}, "two distinct"), ({"lr_grid": (0.0,)}, "positive"),
                       ({"n_heads": 3}, "n_heads"), ({"warmup_steps": 400}, "warmup_steps"),
                       ({"variants": ("baseline",)}, "DIFF"), ({"cpu_code_path": "avx9"}, "cpu_code_path"),
                       ({"widths": (16, 18)}, "divisible")):
        with pytest.raises(ValueError, match=needle):
            LMSweepConfig(**kw)
    with pytest.raises(ValueError, match="unknown"):
        LMSweepConfig.from_dict({"width": 3})


def test_a_diverged_seed_at_the_chosen_lr_is_tabled_at_the_cap_and_makes_its_comparisons_inconclusive():
    c = cfg(lr_widen=0)
    done = bowl(c, 4e-3)
    for lr in c.lr_grid:  # seed 0 diverges at every lr: the choice still falls on 4e-3 (the other seed's best)
        done[Job(32, "diff_v1", 0, lr)] = run(32, "diff_v1", 0, lr, 0, diverged=True)
    res = assemble(c, done, CAP)
    row = res["table"]["diff_v1"][1]
    assert row["lr"] == 4e-3 and row["test_loss"][0] == CAP and row["diverged"] == [0]
    e = res["endpoints"]["diff_v1"]
    assert e["loss"]["32"]["verdict"] == stats.INCONCLUSIVE and "diverged" in e["loss"]["32"]["why"]
    assert e["token_ratio"]["verdict"] == stats.INCONCLUSIVE and e["token_ratio"]["estimate"] is None
    assert res["diverged_runs"]["diff_v1"] == 3


def test_rounding_check_lines_up_the_verdicts_and_names_what_differs():
    from difftransformer.lmsweep.rounding import compare, format_rounding
    c = cfg(lr_widen=0)
    done = bowl(c, 4e-3)
    for s in c.test_seeds:
        j = Job(32, "diff_v1", s, 4e-3)
        done[j] = run(32, "diff_v1", s, 4e-3, done[j]["tune_loss"], done[j]["test_loss"] - 0.1 - 0.01 * s)
    a = {"config": {**c.to_dict(), "cpu_code_path": "machine"}, **assemble(c, done, CAP)}
    other = bowl(c, 4e-3)
    for s in c.test_seeds:  # the other code path: DIFF behind at d=32, and another lr chosen for the baseline
        j = Job(32, "diff_v1", s, 4e-3)
        other[j] = run(32, "diff_v1", s, 4e-3, other[j]["tune_loss"], other[j]["test_loss"] + 0.1 + 0.01 * s)
        j = Job(16, "baseline", s, 8e-3)
        other[j] = run(16, "baseline", s, 8e-3, 1.0)
    b = {"config": {**c.to_dict(), "cpu_code_path": "avx2"}, **assemble(c, other, CAP)}
    check = compare(a, b)
    assert check["code_paths"] == ["machine", "avx2"]
    row = next(r for r in check["rows"] if r[0] == "(a) loss, d=32 (primary)")
    assert (row[3], row[5], row[6]) == (stats.HELD, stats.NOT_HELD, "NO")
    assert check["lr_choices_differ"] == {"baseline": [[16, 4e-3, 8e-3]]}  # as rounding.json holds it
    assert "lr choices that differ: baseline at d=16: 0.004 vs 0.008" in format_rounding(check)
    with pytest.raises(ValueError, match="another configuration"):
        compare(a, {**b, "config": {**b["config"], "steps": 7}})


def test_partial_rounding_compares_the_widths_both_journals_finished(tmp_path):
    import json

    from difftransformer.lmsweep.rounding import JOURNAL, format_partial_rounding, partial_rounding
    c = cfg(widths=(16, 32, 48), lr_widen=0)
    full = bowl(c, 4e-3)

    def journal(path, code_path, jobs):
        path.mkdir()
        lines = [json.dumps({"journal": {"config": {**c.to_dict(), "cpu_code_path": code_path}, "data": "x"}})]
        lines += [json.dumps({"key": str(i), "job": list(j), "result": r}) for i, (j, r) in enumerate(jobs.items())]
        (path / JOURNAL).write_text("\n".join(lines) + "\n")
    journal(tmp_path / "ref", "machine", full)
    other = {j: r for j, r in full.items() if j.width != 16}  # the other run stopped before width 16
    j = Job(48, "diff_v1", 0, 2e-3)
    other[j] = {**other[j], "test_loss": other[j]["test_loss"] + 1e-6}  # one loss rounded otherwise
    journal(tmp_path / "avx2", "avx2", other)
    check = partial_rounding(tmp_path / "ref", tmp_path / "avx2")
    assert check["widths"] == [32, 48] and check["jobs_both"] == len(other) and check["jobs_equal"] == len(other) - 1
    assert check["max_abs_loss_gap"] == pytest.approx(1e-6)
    assert check["verdicts_same"] == check["verdicts"] and not any(r[0].startswith("(b)") for r in check["rows"])
    assert "widths both finished: [32, 48]" in format_partial_rounding(check)
    journal(tmp_path / "same", "machine", other)
    with pytest.raises(ValueError, match="nothing to check"):
        partial_rounding(tmp_path / "ref", tmp_path / "same")


def test_partial_rounding_on_a_single_finished_width(tmp_path):
    import json

    from difftransformer.lmsweep.rounding import JOURNAL, partial_rounding
    c = cfg(widths=(16, 32, 48), lr_widen=0)
    full = bowl(c, 4e-3)
    for name, code_path, jobs in (("ref", "machine", full),
                                  ("avx2", "avx2", {j: r for j, r in full.items() if j.width == 48})):
        (tmp_path / name).mkdir()
        lines = [json.dumps({"journal": {"config": {**c.to_dict(), "cpu_code_path": code_path}, "data": "x"}})]
        lines += [json.dumps({"key": str(i), "job": list(j), "result": r}) for i, (j, r) in enumerate(jobs.items())]
        (tmp_path / name / JOURNAL).write_text("\n".join(lines) + "\n")
    check = partial_rounding(tmp_path / "ref", tmp_path / "avx2")
    assert check["widths"] == [48] and check["verdicts"] == check["verdicts_same"] > 0
    assert {r[0] for r in check["rows"]} >= {"(a) loss, d=48 (primary)", "(c) Fig. 3b token ratio"}


def test_the_widening_stops_at_its_bound_and_reports_the_unresolved_edge():
    from difftransformer.lmsweep.analysis import UNRESOLVED_EDGE, unresolved_edge
    c = cfg(lr_grid=(4e-3, 8e-3, 16e-3), lr_widen=2)
    done = bowl(c, 128e-3)  # best far past the top edge: two widenings (32e-3, 64e-3) do not reach it
    for lr in (32e-3, 64e-3):
        ch = lr_choice(c, 32, "baseline", done, CAP)
        assert ch.lr is None and ch.widened[-1] == lr
        done.update(bowl(c, 128e-3, lrs=[lr]))
    ch = lr_choice(c, 32, "baseline", done, CAP)
    assert ch.lr == 64e-3 and ch.widened == [32e-3, 64e-3] and unresolved_edge(c, ch)
    jobs, final = needed_jobs(c, done, CAP)
    assert final and Job(32, "baseline", 0, 128e-3) not in jobs  # bounded: no third widening
    res = assemble(c, done, CAP)
    assert res["table"]["baseline"][1]["edge"] == UNRESOLVED_EDGE
    assert {"variant": "baseline", "width": 32, "lr": 64e-3} in res["unresolved_edges"]
    inside = bowl(c, 8e-3)  # an interior choice is resolved
    assert not unresolved_edge(c, lr_choice(c, 32, "baseline", inside, CAP))
    assert assemble(c, inside, CAP)["unresolved_edges"] == []


def test_v2_head_counts_and_scales():
    from difftransformer.lmsweep.config import SCALES, cpu_config, gpu_config
    from difftransformer.model.config import ModelConfig
    for c in (cpu_config(), gpu_config()):
        assert c.n_heads >= 4 and c.seeds >= 5 and c.lr_widen >= 1
        for w in c.widths:  # every width: at least 2 differential heads, an even head_dim the model accepts
            m = ModelConfig(attention="diff_v1", d_model=w, n_heads=c.n_heads, vocab_size=64, n_layers=1)
            assert m.n_diff_heads >= 2 and m.head_dim == w // c.n_heads and m.head_dim % 2 == 0
    assert cpu_config() == LMSweepConfig() and set(SCALES) == {"cpu", "gpu"}
    g = gpu_config()
    assert g.scale == "gpu" and g.steps * g.batch > 4 * cpu_config().steps * cpu_config().batch
    with pytest.raises(ValueError, match="scale"):
        LMSweepConfig(scale="tpu")


def test_a_ratio_from_a_flat_fit_prints_in_exponent_form():
    """A near-flat premise fit gives ratios like 8.6e17 (the AVX2 rounding check's DIFF V1 Fig. 3a); printed with
    three decimals that was a 280-digit number in the table."""
    from difftransformer.lmsweep.sweep import _ratio
    assert _ratio(89.40192) == "89.402" and _ratio(0.2231) == "0.223" and _ratio("inf") == ">1 (not reached)"
    assert _ratio(8.634025240277856e17) == "8.63e+17" and _ratio(5.748e280) == "5.75e+280" and _ratio(None) == "n/a"
