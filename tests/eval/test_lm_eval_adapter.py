"""The lm-evaluation-harness adapter against the harness's own `hf` model on the same weights: loglikelihood,
rolling loglikelihood (texts longer than the window) and greedy generate_until agree."""

from __future__ import annotations

import math

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")
transformers = pytest.importorskip("transformers")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from difftransformer import rundir  # noqa: E402
from difftransformer.cli import main  # noqa: E402
from difftransformer.eval.lm_eval_adapter import DiffTransformerHarnessLM  # noqa: E402
from difftransformer.model.pretrained import save_pretrained  # noqa: E402
from difftransformer.model.transformer import DiffTransformerLM  # noqa: E402

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
        "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. ") * 3


def _randomised(model: DiffTransformerLM) -> DiffTransformerLM:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
    return model.eval()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A tiny baseline of ours with a random-enough function, and the same weights as a Hugging Face Llama."""
    root = tmp_path_factory.mktemp("lm_eval")
    assert main(["train", "--config", "tiny", "--model.attention", "baseline", "--train.steps", "1",
                 "--out", str(root / "run"), "--no-progress"]) == 0
    tok = rundir.tokenizer_path(root / "run")
    ours = {}
    for attention in ("baseline", "diff_v2"):
        cfg = DiffTransformerLM.from_pretrained(rundir.resolve_checkpoint(root / "run")).cfg.replace(attention=attention)
        torch.manual_seed(0)
        save_pretrained(_randomised(DiffTransformerLM(cfg)), root / attention, tokenizer_file=tok)
        ours[attention] = root / attention
    assert main(["convert", "--to-hf", str(ours["baseline"]), "--out", str(root / "hf")]) == 0
    # what the harness's hf model needs beside tokenizer.json: a tokenizer class and its end token
    transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok), eos_token="<|endoftext|>").save_pretrained(root / "hf")
    return root, ours


def _requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_same_numbers_as_the_harness_hf_model(dirs):
    root, ours = dirs
    mine = DiffTransformerHarnessLM(str(ours["baseline"]), batch_size=3, max_length=64)
    theirs = HFLM(pretrained=str(root / "hf"), device="cpu", batch_size=3, max_length=64, dtype="float32")
    pairs = [("And God said, Let there be", " light"), ("And God saw the light, that it was ", "good"),
             ("", "In the beginning"), ("The heaven and the earth " * 20, "were finished")]  # the last is truncated
    a, b = mine.loglikelihood(_requests("loglikelihood", pairs)), theirs.loglikelihood(_requests("loglikelihood", pairs))
    assert all(math.isfinite(x) and x < 0 for x, _ in a)
    for (x, gx), (y, gy) in zip(a, b):
        assert x == pytest.approx(y, abs=1e-4) and gx == gy
    texts = [(TEXT,), ("Short text.",)]  # the first spans several 64-token windows
    assert mine.loglikelihood_rolling(_requests("loglikelihood_rolling", texts)) == pytest.approx(
        theirs.loglikelihood_rolling(_requests("loglikelihood_rolling", texts)), abs=1e-3)
    gen = [("And God said,", {"until": ["."], "max_gen_toks": 12, "do_sample": False}),
           ("In the beginning", {"until": ["\n\n"], "max_gen_toks": 12, "do_sample": False})]
    assert mine.generate_until(_requests("generate_until", gen)) == theirs.generate_until(_requests("generate_until", gen))


def test_diff_v2_and_a_run_directory_are_scored(dirs):
    root, ours = dirs
    pairs = [("And God said, Let there be", " light"), ("And God said, Let there be", " darkness")]
    for where in (ours["diff_v2"], root / "run"):
        lm = DiffTransformerHarnessLM(str(where), batch_size=2)
        res = lm.loglikelihood(_requests("loglikelihood", pairs))
        assert all(math.isfinite(x) and x < 0 for x, _ in res) and res[0][0] != res[1][0]


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="not a run"):
        DiffTransformerHarnessLM(str(tmp_path))


def test_the_command_scores_the_built_in_task(dirs, tmp_path, capsys):
    from suite_helpers import cli_fails

    root, ours = dirs
    out = tmp_path / "res.json"
    assert main(["lm-eval", "--model", str(ours["diff_v2"]), "--limit", "5", "--out", str(out)]) == 0
    import json

    res = json.loads(out.read_text())["results"]["kjv_cloze"]
    assert 0.0 <= res["acc,none"] <= 1.0 and res["perplexity,none"] > 1.0
    assert "kjv_cloze: " in capsys.readouterr().out
    cli_fails(capsys, ["lm-eval", "--model", str(ours["diff_v2"]), "--tasks", "nope"], "unknown task(s) nope")
    cli_fails(capsys, ["lm-eval", "--model", str(tmp_path / "none"), "--limit", "5"], "not a run")
    cli_fails(capsys, ["lm-eval", "--model", str(ours["diff_v2"]), "--limit", "0"], "--limit")


def test_kjv_cloze_documents():
    from difftransformer.eval.lm_eval_cli import kjv_cloze_docs

    docs = kjv_cloze_docs(50)
    assert len(docs) == 50
    for d in docs:  # the context is the sentence up to the word; the target is one word with its space
        assert d["target"].startswith(" ") and d["target"][1:].isalpha() and not d["context"].endswith(" ")
