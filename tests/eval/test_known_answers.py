"""Known-answer cases: inputs built so that the right result is known exactly, and the analyses must report it."""

from __future__ import annotations

import math
import types

import pytest
import torch

from difftransformer.eval import icl, noise, outliers, positions, quantized
from difftransformer.eval.loading import held_out_documents, text_windows
from difftransformer.eval.needles import EncodedHaystack
from eval_helpers import fresh


# ---------------------------------------------------------------------------------------------- noise
def test_span_masses_of_a_hand_built_map():
    rows = torch.tensor([[0.10, 0.30, 0.20, 0.05, 0.15, 0.20],  # softmax-like: sums to 1
                         [0.40, -0.10, 0.25, 0.05, 0.00, 0.10]],  # differential: negative entries allowed
                        dtype=torch.float64)
    answer = torch.tensor([False, True, True, False, False, False])
    noise_mask = torch.tensor([True, False, False, True, True, False])  # key 5 (a question) is in neither
    a, n = noise.span_masses(rows, answer, noise_mask)
    torch.testing.assert_close(a, torch.tensor([0.50, 0.15], dtype=torch.float64))
    torch.testing.assert_close(n, torch.tensor([0.30, 0.45], dtype=torch.float64))
    # the noise-to-answer ratio of the first row is 0.6; the batch dims are kept
    a3, n3 = noise.span_masses(rows.expand(3, 2, 6), answer, noise_mask)
    assert a3.shape == n3.shape == (3, 2) and float(n3[1, 0] / a3[1, 0]) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="overlap"):
        noise.span_masses(rows, answer, answer)
    with pytest.raises(ValueError, match="do not match"):
        noise.span_masses(rows, answer[:5], noise_mask[:5])


def test_shares_of_a_hand_built_map_with_negative_entries():
    rows = torch.tensor([[0.10, 0.30, 0.20, 0.05, 0.15, 0.20],  # softmax-like
                         [0.40, -0.10, 0.25, 0.05, 0.00, 0.10]],  # differential: a negative answer entry
                        dtype=torch.float64)
    answer = torch.tensor([False, True, True, False, False, False])
    context = torch.tensor([True, True, True, True, True, False])  # key 5 (a question) is outside the context
    a, n = noise.shares(rows, answer, context)
    # row 0: |context| 0.80, answer 0.50, rest 0.30; row 1: |context| 0.40+0.10+0.25+0.05 = 0.80, answer
    # signed 0.15, rest |0.40|+|0.05| = 0.45
    torch.testing.assert_close(a, torch.tensor([0.625, 0.1875], dtype=torch.float64))
    torch.testing.assert_close(n, torch.tensor([0.375, 0.5625], dtype=torch.float64))
    neg = torch.tensor([[0.2, -0.3, 0.1, -0.4, 0.0, 0.0]], dtype=torch.float64)  # |context| 1.0
    a, n = noise.shares(neg, answer, context)
    assert float(a) == pytest.approx(-0.2) and float(n) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="inside the context"):
        noise.shares(rows, answer, ~answer)
    with pytest.raises(ValueError, match="do not match"):
        noise.shares(rows, answer[:5], context[:5])
    zero = torch.zeros(1, 6, dtype=torch.float64)  # nothing on the context: 0 and 0, not NaN
    assert [float(x) for x in noise.shares(zero, answer, context)] == [0.0, 0.0]


@pytest.mark.parametrize("c", [0.5, 3.0, 1e-3])
def test_shares_are_scale_free_and_signed_masses_scale(c):
    torch.manual_seed(1)
    rows = torch.randn(4, 3, 10, dtype=torch.float64)
    answer = torch.zeros(10, dtype=torch.bool)
    answer[2:5] = True
    context = torch.zeros(10, dtype=torch.bool)
    context[:8] = True
    for x, y in zip(noise.shares(rows, answer, context), noise.shares(c * rows, answer, context)):
        torch.testing.assert_close(x, y)
    for x, y in zip(noise.span_masses(rows, answer, context & ~answer),
                    noise.span_masses(c * rows, answer, context & ~answer)):
        torch.testing.assert_close(c * x, y)


def test_shares_ignore_lambda_when_both_maps_agree(evs):
    """The same first map A1 of a trained DIFF model, with A2 = A1: lambda 0 and 0.5 give rows A1 and 0.5 A1 --
    signed masses halve, shares stay. (The old signed noise would read this as "half the noise".)"""
    ev = evs["diff_v1"]
    docs, _ = held_out_documents(ev)
    w = text_windows(ev, docs, 32, 1)[:, :-1]
    with torch.no_grad():
        a1 = ev.model(w, return_maps=True).maps[0].attn1[0, :, -1, :]  # (heads, Tk) softmax rows of the last query
    answer = torch.zeros(a1.shape[-1], dtype=torch.bool)
    answer[5:9] = True
    context = torch.ones_like(answer)
    context[-2:] = False
    rows0, rows5 = a1 - 0.0 * a1, a1 - 0.5 * a1
    for x, y in zip(noise.shares(rows0, answer, context), noise.shares(rows5, answer, context)):
        torch.testing.assert_close(x, y)
    s0, s5 = noise.span_masses(rows0, answer, context & ~answer), noise.span_masses(rows5, answer, context & ~answer)
    torch.testing.assert_close(s5[1], 0.5 * s0[1])
    assert bool((s5[1] < s0[1]).all())  # the signed noise mass shrinks with lambda; the share does not


def test_summarise_per_layer_and_per_depth():
    m = {"answer_share": torch.tensor([[0.2, 0.4], [0.6, 0.8]], dtype=torch.float64),
         "noise_share": torch.tensor([[0.8, 0.6], [0.4, 0.2]], dtype=torch.float64),
         "answer_signed": torch.tensor([[0.1, 0.2], [0.3, 0.4]], dtype=torch.float64),
         "noise_signed": torch.tensor([[0.4, 0.3], [0.2, 0.1]], dtype=torch.float64)}
    s = noise.summarise(m, [0.0, 1.0])
    assert s["answer_share"] == pytest.approx(0.5) and s["noise_share"] == pytest.approx(0.5)
    assert s["answer_signed"] == pytest.approx(0.25) and s["noise_signed"] == pytest.approx(0.25)
    assert s["answer_share_sem"] == pytest.approx(float(torch.tensor([0.3, 0.7]).std()) / 2 ** 0.5)
    assert [p["answer_share"] for p in s["per_layer"]] == pytest.approx([0.4, 0.6])
    assert [p["noise_signed"] for p in s["per_layer"]] == pytest.approx([0.3, 0.2])
    assert set(s["per_layer"][0]) == {f"{k}{e}" for k in noise.MEASURES for e in ("", "_sem")}
    assert [(d["depth"], d["answer_share"], d["noise_share"]) for d in s["per_depth"]] == \
        [(0.0, pytest.approx(0.3), pytest.approx(0.7)), (1.0, pytest.approx(0.7), pytest.approx(0.3))]


def test_key_masks_split_context_into_answer_and_noise():
    e = EncodedHaystack(haystack=None, ids=list(range(10)), answer_start=9, target=(2, 4), context_end=6,
                        needle_first=[0])
    a, n = noise.key_masks(e, 9)
    assert a.tolist() == [False, False, True, True, False, False, False, False, False]
    assert n.tolist() == [True, True, False, False, True, True, False, False, False]  # questions excluded


def test_uniform_rows_give_the_uniform_answer_share():
    """A row spread evenly over the context puts exactly span/context on the answer."""
    rows = torch.full((4, 8), 1 / 8, dtype=torch.float64)
    answer = torch.zeros(8, dtype=torch.bool)
    answer[3:5] = True
    a, n = noise.span_masses(rows, answer, ~answer)
    torch.testing.assert_close(a, torch.full((4,), 0.25, dtype=torch.float64))
    torch.testing.assert_close(n, torch.full((4,), 0.75, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------- quantized
def test_quantize_logits_grid():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 5) * 4
    for bits in (4, 6, 8):
        q = quantized.quantize_logits(bits)(x)
        levels = 2 ** (bits - 1) - 1
        visible = torch.ones(5, 5, dtype=torch.bool).tril()
        amax = x.masked_fill(~visible, 0).abs().amax(dim=(-2, -1), keepdim=True)
        scale = amax / levels
        steps = q / scale
        assert bool(((steps - steps.round()).abs() < 1e-4).all())  # on the grid
        assert bool((((q - x).abs() <= scale / 2 + 1e-6) | ~visible).all())  # nearest point of the grid
        for b in range(2):
            for h in range(3):
                assert q[b, h][visible].unique().numel() <= 2 * levels + 1
    with pytest.raises(ValueError, match="--bits"):
        quantized.quantize_logits(1)


@pytest.mark.parametrize("variant", ["baseline", "diff_v1", "diff_v2"])
def test_16_bit_logits_change_the_loss_by_less_than_1e_3(evs, variant):
    ev = evs[variant]
    docs, _ = held_out_documents(ev)
    windows = text_windows(ev, docs, ev.train_len, 3)
    full = quantized.text_loss(ev.model, windows)
    with quantized.quantized_attention(ev.model, 16):
        q16 = quantized.text_loss(ev.model, windows)
    with quantized.quantized_attention(ev.model, 2):  # a 3-level grid does move it: the hook is in effect
        q2 = quantized.text_loss(ev.model, windows)
    assert abs(q16 - full) < 1e-3
    assert abs(q2 - full) > abs(q16 - full)
    assert all(layer.attn.logits_hook is None for layer in ev.model.layers)  # removed afterwards


# ---------------------------------------------------------------------------------------------- outliers
@torch.no_grad()
def test_planted_hidden_state_outlier_is_reported(evs):
    """Blocks that add nothing (W_o = W_2 = 0) leave the embeddings as the residual stream: a planted value in
    one embedding channel is the largest |hidden state| exactly."""
    ev = fresh(evs["baseline"])
    m = ev.model
    for layer in m.layers:
        layer.attn.wo.weight.zero_()
        layer.ffn.w2.weight.zero_()
    m.tok_embeddings.weight[:, 5] = -1234.5  # every token: every position of every layer holds it
    r = outliers.run_outliers(ev, n_seqs=2, progress=False)
    assert r["hidden_states"]["top1"] == 1234.5
    assert r["hidden_states"]["top100"] == 1234.5  # 2 windows x 64 positions x 2 layers of it
    assert r["hidden_states"]["median"] < 1.0


@torch.no_grad()
def test_planted_attention_logit_outlier_is_reported(evs):
    """Embeddings all ones make every normalised input the ones vector; W_q, W_k that map it to a*u and b*u (one
    unit vector u, head 0 only) give logits a*b*cos(angle)/sqrt(d), largest on the diagonal where RoPE's
    rotations cancel: the top-1 |logit| is a*b/sqrt(d)."""
    ev = fresh(evs["baseline"])
    m = ev.model
    d_model, d = m.cfg.d_model, m.cfg.head_dim
    a, b = 20.0, 30.0
    u = torch.zeros(d)
    u[0], u[1] = 0.6, 0.8
    m.tok_embeddings.weight.fill_(1.0)
    for i, layer in enumerate(m.layers):
        layer.attn_norm.weight.fill_(1.0)
        layer.attn.wq.weight.zero_()
        layer.attn.wk.weight.zero_()
        if i == 0:  # q head 0 = a*u, kv head 0 = b*u (rows: head-major, width d)
            layer.attn.wq.weight[:d] = (a * u / d_model)[:, None].expand(d, d_model)
            layer.attn.wk.weight[:d] = (b * u / d_model)[:, None].expand(d, d_model)
    expected = a * b / math.sqrt(d) / (1 + m.cfg.norm_eps)  # RMSNorm of ones: 1/sqrt(1 + eps), squared
    r = outliers.run_outliers(ev, n_seqs=2, progress=False)
    assert r["attention_logits"]["top1"] == pytest.approx(expected, rel=1e-5)
    assert r["top1_logit_per_layer"][0] == pytest.approx(expected, rel=1e-5)
    assert r["top1_logit_per_layer"][1] == 0.0  # W_q = 0: every logit of layer 1 is 0
    assert r["attention_logits"]["median"] == 0.0  # most maps (heads > 1, layer 1) are all zeros


# ---------------------------------------------------------------------------------------------- positions
@torch.no_grad()
@pytest.mark.parametrize("variant", ["baseline", "diff_v2"])
def test_uniform_model_has_log_vocab_nll_at_every_position(evs, variant):
    ev = fresh(evs[variant])
    ev.model.output.weight.zero_()  # logits 0: the uniform distribution over the vocabulary
    r = positions.run_positions(ev, sequences=3, progress=False)
    expected = math.log(ev.model.cfg.vocab_size)
    assert len(r["nll"]) == 128 and len(r["nll_docs"]) == 3
    for key in ("nll", "cumulative_nll"):
        assert max(abs(x - expected) for x in r[key]) < 1e-9, key
    assert r["tail_nll"] == pytest.approx(expected, abs=1e-9) and r["tail_nll_se"] == pytest.approx(0.0, abs=1e-9)
    assert r["within_train_nll"] == pytest.approx(expected) and r["beyond_train_nll"] == pytest.approx(expected)
    for key in ("within", "beyond"):  # no gain from context at all
        assert r[key]["mean"] == pytest.approx(0.0, abs=1e-3)


def test_positions_nll_matches_the_models_own_loss(evs):
    """The per-position NLL averaged over positions and documents is the model's mean next-token loss on the same
    long documents; nll_docs holds those per-document values (4 decimals)."""
    ev = evs["diff_v1"]
    r = positions.run_positions(ev, sequences=3, length=48, seed=2, progress=False)
    docs, _ = positions.long_documents(ev, 48, 3)
    assert docs.shape == (3, 49)
    with torch.no_grad():
        loss = float(ev.model(docs[:, :-1], docs[:, 1:]).loss)
    assert r["cumulative_nll"][-1] == pytest.approx(loss, rel=1e-5)
    nd = torch.tensor(r["nll_docs"], dtype=torch.float64)
    assert nd.shape == (3, 48) and float(nd.mean()) == pytest.approx(loss, abs=1e-4)
    assert all(v == round(v, 4) for row in r["nll_docs"] for v in row)


def test_positions_context_gains_of_a_known_curve(evs):
    """A model whose NLL at position t is known: the gains are the known differences, within and beyond L."""
    ev = fresh(evs["diff_v1"])
    V, L = ev.model.cfg.vocab_size, ev.train_len  # L = 64

    docs, _ = positions.long_documents(ev, 2 * L, 3)
    unused = min(set(range(V)) - set(docs[:, 1:].flatten().tolist()))  # a token that is never a target

    def logits(idx):  # uniform up to position L; beyond it the unused token gets logit 2: every target's NLL rises
        out = torch.zeros(*idx.shape, V)
        out[:, L:, unused] = 2.0
        return out

    ev.model = _Wrapped(ev.model, logits)
    r = positions.run_positions(ev, sequences=3, progress=False)
    assert r["length"] == 2 * L and len(r["nll_docs"]) == 3
    base = math.log(V)
    high = math.log(V - 1 + math.exp(2.0))  # beyond L the target's share falls: NLL rises
    assert r["within"]["mean"] == pytest.approx(0.0, abs=1e-3) and r["within"]["n_docs"] == 3
    assert r["beyond"]["mean"] == pytest.approx(high - base, abs=1e-3)
    assert r["beyond"]["low"] <= r["beyond"]["mean"] <= r["beyond"]["high"]
    assert r["early_nll"] == pytest.approx(base, abs=1e-3)


def test_positions_without_untrained_long_text_returns_a_note(evs, monkeypatch):
    """A run that trained on the whole corpus (the demo preset) has no untrained long text: no crash, no NLL.
    (Its longest validation paragraph has 3,749 characters: a tokenizer of 40 characters per token would need
    6,400 for 128 tokens, so none is long enough, as for the demo's 512 tokens of a larger vocabulary.)"""
    ev = fresh(evs["diff_v1"])
    monkeypatch.setattr(positions, "chars_per_token", lambda ev, sample: 40.0)
    ev.run_config = {**ev.run_config, "data": {**ev.run_config.get("data", {}), "max_chars": 0,
                                               "val_fraction": 0.02}}
    r = positions.run_positions(ev, sequences=8, length=127, progress=False)
    assert r["nll_docs"] == [] and r["within"] is None and r["beyond"] is None
    assert "no long held-out text" in r["note"] and "max_chars" in r["note"]
    assert "no long held-out text" in positions.format_positions(r)
    with pytest.raises(ValueError, match="--sequences must be >= 2"):
        positions.run_positions(ev, sequences=1, progress=False)


def test_positions_with_one_long_text_measures_nothing(evs, monkeypatch):
    """One document gives no interval over documents: nothing measured, with a note (not a NaN interval)."""
    from difftransformer.eval.long_context import long_held_out_texts

    ev = fresh(evs["diff_v1"])
    monkeypatch.setattr(positions, "long_held_out_texts", lambda **kw: long_held_out_texts(**kw)[:1])
    r = positions.run_positions(ev, sequences=4, progress=False)
    assert r["nll_docs"] == [] and "1 held-out text(s) reach 129 tokens" in r["note"]
    monkeypatch.setattr(positions, "long_held_out_texts", lambda **kw: long_held_out_texts(**kw)[:2])
    r = positions.run_positions(ev, sequences=4, progress=False)  # two: measured, and the note says few exist
    assert len(r["nll_docs"]) == 2 and "only 2 of the 4 requested held-out texts" in r["note"]


# ---------------------------------------------------------------------------------------------- icl
class _Wrapped(torch.nn.Module):
    """A stand-in for the model with the real one's config; ``fn(ids) -> logits``."""

    def __init__(self, real, fn):
        super().__init__()
        self.cfg, self.real, self.fn = real.cfg, real, fn

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return self.real.num_parameters(exclude_embeddings)

    def forward(self, idx, *args, **kwargs):
        return types.SimpleNamespace(logits=self.fn(idx))


def test_icl_constant_model_scores_chance_exactly(evs):
    """Logits that never change: the first label always wins the tie, and balanced queries make that 1/K."""
    ev = evs["diff_v1"]
    V = ev.model.cfg.vocab_size
    const = fresh(ev)
    const.model = _Wrapped(ev.model, lambda idx: torch.zeros(*idx.shape, V))
    r = icl.run_icl(const, classes=4, samples=12, orders=3, words=4, progress=False)
    assert all(a == 0.25 for a in r["accuracy"])
    assert all(m == pytest.approx(4 / V) for m in r["label_mass"])
    assert r["order"]["accuracies"] == [0.25] * 3 and r["order"]["spread"] == 0.0
    # the first label (book 0) wins every tie: query i is right exactly when it is of book i % 4 == 0
    assert r["order"]["correct"] == [[int(i % 4 == 0) for i in range(12)]] * 3


def test_icl_oracle_scores_one_and_reads_the_last_prompt_token(evs):
    """A model that knows each query's book puts its label on the last prompt token: accuracy 1 at every shot count,
    so the scoring reads the right position of right-padded prompts and maps labels to books in order."""
    ev = evs["diff_v1"]
    task = icl.build_task(ev, 4, 4, seed=0)
    enc = icl.Encoder(ev, task)
    answers: dict[int, dict[tuple, int]] = {}  # piece length -> {query piece: its label token}
    for pool in task.queries:
        for t, c in pool:
            piece = tuple(enc.piece(t, c, False))
            answers.setdefault(len(piece), {})[piece] = task.label_ids[c]
    V = ev.model.cfg.vocab_size

    def oracle(idx):  # at every position that ends a query, that query's label
        logits = torch.zeros(*idx.shape, V)
        for b, row in enumerate(idx.tolist()):
            for t in range(len(row)):
                for n, table in answers.items():
                    label = table.get(tuple(row[t + 1 - n:t + 1])) if t + 1 >= n else None
                    if label is not None:
                        logits[b, t, label] = 10.0
        return logits

    o = fresh(ev)
    o.model = _Wrapped(ev.model, oracle)
    r = icl.run_icl(o, classes=4, samples=8, orders=2, words=4, progress=False)
    assert r["accuracy"] == [1.0] * len(r["shots"]) and r["order"]["accuracies"] == [1.0, 1.0]
    assert r["task"]["labels"] == task.labels


def test_icl_prompt_layout(evs):
    ev = evs["baseline"]
    task = icl.build_task(ev, 3, 4, seed=0)
    enc = icl.Encoder(ev, task)
    demos = [task.demos[2][0], task.demos[0][0]]
    q = task.queries[1][0]
    ids = enc.prompt(demos, q)
    assert ids[0] == enc.eos and len(ids) == 1 + sum(len(enc.piece(t, c, True)) for t, c in demos) + len(
        enc.piece(*q, False))
    text = ev.tokenizer.decode(ids[1:])
    assert text == (f"{demos[0][0]} -> {task.labels[2]}\n{demos[1][0]} -> {task.labels[0]}\n{q[0]} ->")
    # queries and demonstrations never share a snippet; all are 4 words long
    for c in range(3):
        assert not {t for t, _ in task.queries[c]} & {t for t, _ in task.demos[c]}
        assert all(len(t.split()) == 4 for t, _ in task.queries[c] + task.demos[c])


def test_noise_section_explains_negative_differential_mass():
    from types import SimpleNamespace

    from difftransformer.report.html import _noise_section

    def run(label, answer, noise):  # shares are never negative for noise; the signed masses can be
        return SimpleNamespace(ev=SimpleNamespace(label=label),
                               results={"noise": {"map": "differential", "answer": 0.1, "noise": 0.9,
                                                  "answer_signed": answer, "noise_signed": noise,
                                                  "uniform_answer_share": 0.05}})

    assert "negative signed mass" not in _noise_section([run("base", 0.02, 0.3), run("v2", 0.01, 0.1)])
    assert "negative signed mass" in _noise_section([run("base", 0.02, 0.3), run("v1", -0.004, -0.09)])
