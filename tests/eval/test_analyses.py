"""Every analysis of `difftransformer eval` on a tiny trained run per variant: well-formed results (keys, shapes,
values in range, chance levels printed), plots written, and the keys the report reads present."""

from __future__ import annotations

import math

import pytest
import torch
from eval_helpers import roundtrip

from difftransformer import report
from difftransformer.eval import attnmap, icl, needles, noise, outliers, positions, quantized
from difftransformer.report import html as report_html
from difftransformer.report import verdicts

VARIANTS = ("baseline", "diff_v1", "diff_v2")
PNG = b"\x89PNG\r\n\x1a\n"


def _png(path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 1000


def test_haystack_records_the_last_answered_number(evs):
    import random
    import re

    from difftransformer.data.synthetic import needle_haystack

    tok = evs["baseline"].tokenizer
    rng = random.Random(3)
    for _ in range(20):
        h = needle_haystack(rng, ["Filler one here.", "Filler two there."], n_filler=4, depth=0.5, n_needles=4,
                            n_queries=3, digits=2)
        last = re.findall(r"A: (\w+) (\d+)\.", h.prompt)[-1]  # the last answered question in the text
        assert len(h.answered) == 2 and (h.answered[-1].city, h.answered[-1].number) == last
        assert h.target not in h.answered  # answered questions never ask the target
        e = needles.encode_haystack(tok, h)
        assert e.last_answer_first == tok.encode(f" {last[1]}").ids[0]
    bare = needle_haystack(rng, [], n_filler=0, depth=0.0, n_needles=2, n_queries=1)
    assert bare.answered == [] and needles.encode_haystack(tok, bare).last_answer_first is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_needles(evs, variant):
    ev = evs[variant]
    r = roundtrip(needles.run_needles(ev, lengths=(0.5, 1.0), depths=(0.0, 1.0), samples=4, progress=False))
    assert r["analysis"] == "needles" and r["model"]["attention"] == variant
    assert r["task"] == {"n_needles": 2, "n_queries": 1, "digits": 2, "chance": 0.01, "random_needle": 0.5}
    assert len(r["accuracy"]) == len(r["lengths"]) and all(len(row) == 2 for row in r["accuracy"])
    assert all(L <= ev.model.cfg.max_seq_len for L in r["lengths"]) and r["lengths"] == sorted(r["lengths"])
    for row, toks, L in zip(r["accuracy"], r["mean_tokens"], r["lengths"]):
        assert all(0.0 <= a <= 1.0 for a in row)
        assert all(0 < t <= L for t in toks)  # a haystack never exceeds its length
    flat = [a for row in r["accuracy"] for a in row]
    assert r["mean_accuracy"] == pytest.approx(sum(flat) / len(flat))
    assert 0.0 <= r["first_token_accuracy"] <= r["any_needle_first_token"] <= 1.0
    assert 0.0 <= r["last_answer_first_token"] <= 1.0
    text = needles.format_needles(r)
    assert "chance 0.01" in text and "random needle 0.5" in text


@pytest.mark.parametrize("variant", VARIANTS)
def test_noise(evs, variant):
    ev = evs[variant]
    r = roundtrip(noise.run_noise(ev, samples=6, progress=False))
    n_layers = ev.model.cfg.n_layers
    assert r["analysis"] == "noise" and len(r["answer_per_layer"]) == len(r["noise_per_layer"]) == n_layers
    assert r["answer"] == pytest.approx(sum(r["answer_per_layer"]) / n_layers)
    assert r["noise"] == pytest.approx(sum(r["noise_per_layer"]) / n_layers)
    assert 0.0 < r["uniform_answer_share"] < 1.0
    if variant == "baseline":  # softmax rows: non-negative, at most 1 over the context
        assert r["map"] == "softmax map"
        for a, n in zip(r["answer_per_layer"], r["noise_per_layer"]):
            assert 0.0 <= a and 0.0 <= n and a + n <= 1.0 + 1e-9
    else:  # A1 - lambda*A2 rows sum to 1 - lambda: bounded by 1 + |lambda| in absolute value
        assert r["map"].startswith("differential map")
        assert all(abs(x) <= 2.0 for x in r["answer_per_layer"] + r["noise_per_layer"])
    assert r["answer_sem"] >= 0 and r["noise_sem"] >= 0
    # the old keys are the scale-free shares; shares of |row| lie in [0, 1] (the answer's is signed)
    assert (r["answer"], r["noise"], r["answer_sem"], r["noise_sem"]) == \
        (r["answer_share"], r["noise_share"], r["answer_share_sem"], r["noise_share_sem"])
    assert 0.0 <= r["noise_share"] <= 1.0 and -1.0 <= r["answer_share"] <= 1.0
    assert r["answer_share"] + r["noise_share"] <= 1.0 + 1e-9
    for k in ("answer_signed", "noise_signed"):
        assert math.isfinite(r[k]) and r[f"{k}_sem"] >= 0
    assert len(r["per_layer"]) == n_layers
    assert r["noise_signed"] == pytest.approx(sum(p["noise_signed"] for p in r["per_layer"]) / n_layers)
    assert [d["depth"] for d in r["per_depth"]] == list(noise.DEPTHS)  # 6 haystacks cycle over all 5 depths
    assert sum(d["samples"] for d in r["per_depth"]) == 6
    text = noise.format_noise(r)
    assert "uniform attention" in text and "by needle depth" in text and "signed" in text


@pytest.mark.parametrize("variant", VARIANTS)
def test_outliers(evs, variant):
    ev = evs[variant]
    r = roundtrip(outliers.run_outliers(ev, n_seqs=2, progress=False))
    assert r["sequences"] == 2 and r["length"] == ev.train_len
    for kind in ("attention_logits", "hidden_states"):
        s = r[kind]
        ranked = [s[f"top{k}"] for k in outliers.RANKS]
        assert ranked == sorted(ranked, reverse=True)
        assert 0.0 <= s["median"] <= ranked[-1]
    assert len(r["top1_logit_per_layer"]) == ev.model.cfg.n_layers
    assert max(r["top1_logit_per_layer"]) == pytest.approx(r["attention_logits"]["top1"], rel=1e-6)
    for kind in ("attention_logits", "hidden_states"):  # one top-1 per window; the largest is the overall top-1
        per = r["per_sequence"][kind]
        assert len(per) == 2 and all(v > 0 for v in per)
        assert max(per) == pytest.approx(r[kind]["top1"], rel=1e-6)
    text = outliers.format_outliers(r)
    assert "attention_logits" in text and "median" in text


@pytest.mark.parametrize("variant", VARIANTS)
def test_quantized(evs, variant):
    ev = evs[variant]
    r = roundtrip(quantized.run_quantized(ev, sequences=2, samples=4, progress=False))
    assert [row["bits"] for row in r["rows"]] == [None, 16, 8, 6, 4]
    full = r["rows"][0]
    assert full["loss_increase"] == 0.0 and full["accuracy_drop"] == 0.0
    for row in r["rows"]:
        assert math.isfinite(row["loss"]) and 0.0 <= row["accuracy"] <= 1.0
        assert row["loss_increase"] == pytest.approx(row["loss"] - full["loss"])
        assert row["loss_increase_se"] >= 0.0
    assert full["loss_increase_se"] == 0.0 and r["rows"][-1]["loss_increase_se"] > 0.0  # 4 bits moves each window
    assert abs(r["rows"][1]["loss_increase"]) < 1e-3  # 16 bits: the loss does not move
    text = quantized.format_quantized(r)
    assert "chance 0.01" in text and "random needle 0.5" in text


@pytest.mark.parametrize("variant", VARIANTS)
def test_positions(evs, variant):
    ev = evs[variant]
    r = roundtrip(positions.run_positions(ev, factor=2.0, sequences=4, progress=False))
    T = r["length"]
    assert r["analysis"] == "positions" and r["train_len"] == 64 and T == 128 == 2 * r["train_len"]
    assert r["note"] is None  # 2x fits in max_seq_len 128: nothing clipped
    assert r["positions"] == list(range(1, T + 1)) and len(r["nll"]) == len(r["cumulative_nll"]) == T
    # long untrained documents, each read from its start: documents x positions, the same for every model
    assert r["sequences"] == 4 and len(r["nll_docs"]) == 4 and all(len(d) == T for d in r["nll_docs"])
    assert "never trained on" in r["held_out"]
    nll = torch.tensor(r["nll"], dtype=torch.float64)
    torch.testing.assert_close(nll, torch.tensor(r["nll_docs"], dtype=torch.float64).mean(0), atol=1e-4, rtol=0)
    assert bool((nll > 0).all()) and float(nll.max()) < 3 * math.log(ev.model.cfg.vocab_size)
    torch.testing.assert_close(torch.tensor(r["cumulative_nll"], dtype=torch.float64),
                               nll.cumsum(0) / torch.arange(1, T + 1, dtype=torch.float64))
    assert r["tail_start"] == T - T // 4 + 1
    assert r["tail_nll"] == pytest.approx(float(nll[-(T // 4):].mean()))
    assert r["tail_mean_nll"] == r["tail_nll"] and r["tail_nll_se"] > 0
    assert r["within_train_nll"] == pytest.approx(float(nll[:64].mean()))
    assert r["beyond_train_nll"] == pytest.approx(float(nll[64:].mean()))
    from difftransformer.eval.long_context import context_gains
    g = context_gains(r["nll_docs"], 64)
    for key in ("within", "beyond"):
        assert [r[key]["mean"], r[key]["low"], r[key]["high"], r[key]["n_docs"]] == pytest.approx(list(g[key]),
                                                                                                  abs=1e-9)
    assert "held_out" in r and r["model"]["attention"] == variant
    text = positions.format_positions(r)
    assert "<- training length" in text and "tail (positions 97-128)" in text and "beyond it [L, 2L)" in text


def test_positions_reads_the_same_documents_for_every_model(evs):
    a, b = (positions.long_documents(evs[v], 128, 4)[0] for v in ("baseline", "diff_v2"))
    assert torch.equal(a, b)


def test_positions_clips_the_default_and_refuses_positions_past_max_seq_len(evs):
    ev = evs["diff_v1"]
    r = positions.run_positions(ev, factor=3.0, sequences=2, progress=False)
    assert r["length"] == 128 and "clipped to the model's max_seq_len 128" in r["note"]
    assert "note: " in positions.format_positions(r)
    with pytest.raises(ValueError, match=r"--length 129 must be in \[2, 128\].*max_seq_len"):
        positions.run_positions(ev, sequences=2, length=129, progress=False)
    r = positions.run_positions(ev, sequences=2, length=32, progress=False)  # within the training length
    assert r["length"] == 32 and r["beyond_train_nll"] is None and len(r["nll"]) == 32
    assert r["within"] is None and r["beyond"] is None and "no context gain" in r["note"]  # fewer than L positions
    r = positions.run_positions(ev, sequences=2, length=100, progress=False)  # past L, short of 2L: no "beyond"
    assert r["within"] is not None and r["beyond"] is None
    assert "beyond it [L, 2L):                   n/a" in positions.format_positions(r)


@pytest.mark.parametrize("variant", VARIANTS)
def test_icl(evs, variant):
    ev = evs[variant]
    r = roundtrip(icl.run_icl(ev, classes=4, samples=8, orders=3, words=4, progress=False))
    assert r["analysis"] == "icl" and r["chance"] == 0.25 == r["task"]["chance"]
    assert r["task"]["classes"] == 4 and len(set(r["task"]["label_ids"])) == 4
    for w, i in zip(r["task"]["labels"], r["task"]["label_ids"]):
        assert ev.tokenizer.encode(" " + w).ids == [i]  # every label is one token
    shots = r["shots"]
    assert shots[0] == 0 and shots == sorted(set(shots)) and shots[-1] == r["max_shots"] >= 1
    assert len(r["accuracy"]) == len(r["label_mass"]) == len(r["prompt_tokens"]) == len(shots)
    assert all(a in {k / 8 for k in range(9)} for a in r["accuracy"])  # 8 queries
    assert all(0.0 < m <= 1.0 for m in r["label_mass"])
    assert all(L <= r["context"] == ev.train_len for L in r["prompt_tokens"])
    assert r["prompt_tokens"] == sorted(r["prompt_tokens"])  # more shots, longer prompts
    assert r["max_shot_accuracy"] == r["accuracy"][-1] and r["max_shot_samples"] == 8
    o = r["order"]
    assert len(o["accuracies"]) == 3 and 1 <= o["shots"] <= r["max_shots"]
    assert o["spread"] == pytest.approx(o["best"] - o["worst"]) and 0.0 <= o["spread"] <= 1.0
    # per-query outcomes per ordering: what stats.spread_interval bootstraps; they reproduce the accuracies
    assert o["samples"] == 8 and len(o["correct"]) == 3 and all(len(c) == 8 for c in o["correct"])
    assert all(v in (0, 1) for c in o["correct"] for v in c)
    assert [sum(c) / 8 for c in o["correct"]] == o["accuracies"]
    from difftransformer.eval.stats import spread_interval
    assert spread_interval(o["correct"], n_boot=50)[0] == pytest.approx(o["spread"])
    text = icl.format_icl(r)
    rows = [line for line in text.splitlines()[2:-1]]
    assert len(rows) == len(shots) and all(line.split()[2] == "0.250" for line in rows)  # chance on every row
    assert "(chance 0.250)" in text.splitlines()[-1]


def test_icl_more_context_fits_more_shots(evs):
    ev = evs["baseline"]
    short = icl.run_icl(ev, samples=4, orders=1, words=4, context=40, progress=False)
    long = icl.run_icl(ev, samples=4, orders=1, words=4, context=128, progress=False)
    assert short["max_shots"] < long["max_shots"]
    assert max(long["prompt_tokens"]) <= 128 and max(short["prompt_tokens"]) <= 40
    assert icl.run_icl(ev, classes=2, samples=4, orders=1, words=4, progress=False)["chance"] == 0.5


def test_attnmap(evs, tmp_path):
    models = [evs[v] for v in VARIANTS]
    r = roundtrip(attnmap.run_attnmap(models, seed=0))
    assert [m["attention"] for m in r["maps"]] == list(VARIANTS)
    K = r["n_keys"]
    assert len(r["tokens"]) == K and r["query_pos"] == K - 1
    for m in r["maps"]:
        assert len(m["row"]) == len(m["normalized_row"]) == K
        assert sum(abs(x) for x in m["normalized_row"]) == pytest.approx(1.0)
        assert -1.0 <= m["answer_score"] <= 1.0 and -1.0 <= m["noise_score"] <= 1.0
        assert len(m["answer_score_per_layer"]) == 2
    baseline = r["maps"][0]
    assert sum(baseline["row"]) == pytest.approx(1.0)  # a softmax row
    assert 0.0 < r["uniform_answer_score"] < 1.0
    assert "uniform attention" in attnmap.format_attnmap(r)
    attnmap.plot_attnmap(r, tmp_path / "a.png")
    _png(tmp_path / "a.png")


def test_plots_of_the_new_analyses(evs, tmp_path):
    pos = [positions.run_positions(evs[v], sequences=2, progress=False) for v in VARIANTS]
    positions.plot_positions(pos, tmp_path / "positions.png")
    _png(tmp_path / "positions.png")
    res = [icl.run_icl(evs[v], samples=4, orders=2, words=4, progress=False) for v in VARIANTS]
    icl.plot_icl(res, tmp_path / "icl.png")
    _png(tmp_path / "icl.png")


def test_report_reads_positions_and_icl(evs):
    """The report calls both analyses with its QUICK/FULL settings and reads the keys of its claims."""
    runs = []
    for v in ("baseline", "diff_v2"):
        rr = report.RunResults(evs[v], {"step": [], "spikes": []})
        for mod in (positions, icl):
            rr.results[mod.SPEC.name] = report.run_analysis(mod.SPEC, evs[v], report.Settings(quick=True,
                                                                                          progress=False))
        runs.append(rr)
    for mod in (positions, icl):
        assert type(mod.FULL) is type(mod.QUICK) and mod.SPEC.full is mod.FULL and mod.SPEC.quick is mod.QUICK
    assert runs[0].results["icl"]["task"]["chance"] == 0.25
    rows = {(row["claim"], row["variant"]): row for row in verdicts.verdicts(runs)}
    for claim in ("lower NLL within the training length", "more accurate many-shot in-context learning",
                  "less sensitive to demonstration order"):
        assert "not measured" not in rows[(claim, "diff_v2")]["why"], rows[(claim, "diff_v2")]
    html = report_html.analysis_section(runs, "positions") + report_html.analysis_section(runs, "icl")
    assert "training length" in html and "chance" in html


# Small settings of each spec's own settings class, so the uniform run(ev, settings, seed) is exercised quickly.
TINY = {
    "needles": needles.NeedlesSettings(lengths=(1.0,), depths=(0.5,), samples=2),
    "noise": noise.NoiseSettings(samples=2),
    "outliers": outliers.OutliersSettings(sequences=1),
    "quantized": quantized.QuantizedSettings(sequences=1, samples=2, widths=(8, 4)),
    "positions": positions.PositionsSettings(factor=1.0, sequences=2),
    "icl": icl.IclSettings(classes=2, samples=2, orders=2, words=4),
    "attnmap": attnmap.AttnmapSettings(),
}


def test_every_spec_runs_formats_and_plots_with_its_uniform_signature(evs, tmp_path):
    from difftransformer.eval.analyses import ANALYSES

    assert [s.name for s in ANALYSES] == list(TINY)
    for spec in ANALYSES:
        assert type(spec.quick) is type(spec.full) is type(TINY[spec.name]), spec.name
        ev = [evs[v] for v in VARIANTS] if spec.multi_run else evs["diff_v1"]
        r = roundtrip(spec.run(ev, TINY[spec.name], 0, progress=False))
        assert r["analysis"] == spec.name
        text = spec.format(r)
        assert isinstance(text, str) and text, spec.name
        spec.plot(r if spec.multi_run else [r], tmp_path / f"{spec.name}.png")
        _png(tmp_path / f"{spec.name}.png")


def test_every_claim_is_fed_by_one_spec_or_the_training_curves():
    from difftransformer.eval.analyses import ANALYSES

    titles = [c.title for c in verdicts.claims()]
    declared = [t for s in ANALYSES for t in s.claims]
    assert len(declared) == len(set(declared)) and set(declared) <= set(titles)
    training = {"lower validation loss at the same parameters and tokens", "fewer loss spikes",
                "smaller gradient-norm peaks"}
    assert set(titles) - set(declared) == training
    assert set(report_html.PAGE_ORDER) == {s.name for s in ANALYSES}
