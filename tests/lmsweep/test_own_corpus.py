"""``lm-sweep --data PATH,...`` (issue 70 item 5): the protocol on your own corpus, end to end at toy size on a text
file the test writes: a tokenizer trained on it, the sweep's jobs on its tokens, the corpus named in sweep.json and
the printed table; a changed file is new tokens (its fingerprint), and a missing one is one line before any work.
The keys of a sweep without --data are those of before (the field is written only when set)."""

from __future__ import annotations

import json

from difftransformer.cli import main
from difftransformer.lmsweep import sweep
from difftransformer.lmsweep.config import LMSweepConfig
from difftransformer.lmsweep.sweep import run_lm_sweep

TINY = LMSweepConfig(preset="tiny", widths=(16, 32), steps=4, warmup_steps=1, batch=2, seq_len=16, seeds=2,
                     lr_grid=(4e-3, 8e-3), lr_widen=0, eval_every=4, variants=("baseline", "diff_v2"),
                     outlier_windows=2)


def corpus_file(path, words: str) -> str:
    lines = [f"{words} {i} the quick brown fox jumps over the lazy dog while {words} sleeps." for i in range(400)]
    path.write_text("\n\n".join(lines))
    return str(path)


def test_the_sweep_on_your_own_text(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "plot_all", lambda res, out: [])  # the plots: nothing here reads them
    text = corpus_file(tmp_path / "mine.txt", "Ada")
    cfg = TINY.replace(data=(text,))
    res = run_lm_sweep(cfg, tmp_path / "out", workers=1, progress=False)
    assert res["config"]["data"] == [text]
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["config"]["data"] == [text]
    assert f"corpus: your own (--data): {text}" in sweep.format_sweep(res)
    fp_mine = sweep.prepare(cfg, tmp_path / "out", False)[1]
    fp_kjv = sweep.prepare(TINY, tmp_path / "kjv", False)[1]
    assert fp_mine != fp_kjv
    corpus_file(tmp_path / "mine.txt", "Grace")  # the same path, other words: other tokens
    assert sweep.prepare(cfg, tmp_path / "other", False)[1] != fp_mine
    assert "data" not in TINY.to_dict()  # without --data: the keys and headers of every run before


def test_a_missing_corpus_is_one_line_before_any_work(tmp_path, capsys):
    rc = main(["lm-sweep", "--out", str(tmp_path / "o"), "--quick", "--data", str(tmp_path / "nothing.txt")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "nothing.txt does not exist" in err, err
    assert not (tmp_path / "o").exists()
