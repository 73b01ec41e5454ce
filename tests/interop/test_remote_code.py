"""The transformers remote-code export (interop/remote.py, interop/remote_code/): every variant loads with
``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` and computes our model's function.

Tiny random models (std 0.1 weights: logits of order 1-4, so a wrong layout shows as an O(1) difference) are
exported through the CLI, loaded by transformers and compared with ours: logits over a left-padded batch, greedy
generation with the dynamic cache, save_pretrained round trips, a Trainer step, a LoRA fine-tune merged and
converted back, and a process in which the difftransformer package cannot be imported (SmolLM2-135M as DIFF V2 as
remote code: tests/interop/test_smollm2.py, which converts it once for both of its tests).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from difftransformer.cli import main  # noqa: E402
from difftransformer.inference.generate import SamplingConfig, generate  # noqa: E402
from difftransformer.interop.hf import load_hf  # noqa: E402
from difftransformer.interop.remote import load_remote, save_remote  # noqa: E402
from difftransformer.interop.remote_code import (CODE_DIR, CODE_FILES, REMOTE_DEFAULTS,  # noqa: E402
                                                 config_from_remote, state_to_remote)
from difftransformer.model import DiffTransformerLM, ModelConfig  # noqa: E402
from difftransformer.model.pretrained import save_pretrained  # noqa: E402
from suite_helpers import cli_fails, randomise  # noqa: E402

VOCAB = 80
# The four variants the issue names, then ablations that no native class holds either (logits only).
VARIANTS = {
    "baseline": dict(attention="baseline"),
    "v1_paper": dict(attention="diff_v1"),
    "v1_per_head": dict(attention="diff_v1", v1_layout="per_head"),
    "v2": dict(attention="diff_v2"),
}
ABLATIONS = {
    "v1_ablation": dict(attention="diff_v1", headwise_norm=False, headwise_norm_weight=False, lambda_init=0.5,
                        tie_embeddings=True),
    "v2_ablation": dict(attention="diff_v2", v2_lambda="raw", v2_pairing="halves", n_kv_heads=4,
                        rope_type="llama3", rope_factor=8.0, rope_original_max_len=16),
    "v2_no_lambda_mqa": dict(attention="diff_v2", v2_lambda="none", n_kv_heads=1, tie_embeddings=True),
}
TOL = 1e-5
TRANSFORMERS_4 = int(transformers.__version__.split(".")[0]) < 5


def randomised(model: DiffTransformerLM, seed: int = 0) -> DiffTransformerLM:
    randomise(model, seed)
    if model.cfg.attention == "diff_v1" and model.cfg.v1_layout == "per_head":
        model.set_negative_weight(0.6)  # a warm-up weight that the export must carry (the buffer)
    return model.eval()


def ours(name: str) -> DiffTransformerLM:
    kw = {**VARIANTS, **ABLATIONS}[name]
    cfg = ModelConfig.from_flavour("tiny", vocab_size=VOCAB, ffn_hidden=96, max_seq_len=48, **kw)
    torch.manual_seed(0)
    return randomised(DiffTransformerLM(cfg))


def padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids (pad 0) and the attention mask, as a transformers tokenizer with padding_side='left'."""
    P = max(map(len, prompts))
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p)
        mask[i, P - len(p):] = 1
    return ids, mask


PROMPTS = [torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (14, 5, 9)]


def load(directory, **kw):
    return AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True, **kw).eval()


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (our model, its saved directory, the exported remote-code directory), exported through the CLI:
    DIFF V2 and V1 per_head need no flag, the baseline and V1 paper (which have native classes) --remote-code."""
    root = tmp_path_factory.mktemp("remote")
    out = {}
    for name in {**VARIANTS, **ABLATIONS}:
        model = ours(name)
        save_pretrained(model, root / f"ours_{name}")
        argv = ["convert", "--to-hf", str(root / f"ours_{name}"), "--out", str(root / f"rc_{name}")]
        if name in ("baseline", "v1_paper"):
            argv.append("--remote-code")
        assert main(argv) == 0
        out[name] = (model, root / f"ours_{name}", root / f"rc_{name}")
    return out


# ---------------------------------------------------------------------------------------------- the source files
def test_remote_code_imports_only_torch_and_transformers():
    allowed = {"__future__", "math", "typing", "torch", "transformers"}
    for name in CODE_FILES:
        tree = ast.parse((CODE_DIR / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # a relative import: one of the code files, copied beside it
                    assert f"{node.module}.py" in CODE_FILES, (name, node.module)
                    continue
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert roots <= allowed, (name, roots)


def test_remote_defaults_are_the_config_class_defaults():
    """transformers' save_pretrained may leave keys at their default out of config.json: remote.py reads them back
    with these defaults, which must be the config class's own."""
    from difftransformer.interop.remote_code.configuration_difftransformer import DiffTransformerConfig

    params = inspect.signature(DiffTransformerConfig.__init__).parameters
    assert {k: params[k].default for k in REMOTE_DEFAULTS} == REMOTE_DEFAULTS
    assert config_from_remote({"model_type": "difftransformer"}) == config_from_remote(DiffTransformerConfig().to_dict())


def test_package_module_runs_our_model(exported):
    """The modeling file as a module of this package (not the copy transformers makes), built from its config and
    given our weights by name: the same logits."""
    from difftransformer.interop.remote_code.configuration_difftransformer import DiffTransformerConfig
    from difftransformer.interop.remote_code.modeling_difftransformer import DiffTransformerForCausalLM

    model, _, rc = exported["v2"]
    cfg = json.loads((rc / "config.json").read_text())
    hf = DiffTransformerForCausalLM(DiffTransformerConfig(**cfg)).eval()
    hf.load_state_dict(state_to_remote(model.cfg, model.state_dict()), strict=True)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        assert (hf(ids).logits - model(ids).logits).abs().max() <= TOL


def test_compiled_rope_tables_are_one_operator(exported):
    """Under torch.compile the remote code's RoPE tables come from one opaque operator
    (``difftransformer_remote::rope_cos_sin``), not cos and sin that inductor would fuse into every rotated element
    (as for the package's model: tests/model/test_compile.py); the traced graphs give the eager logits."""
    model, _, rc = exported["v2_ablation"]  # Llama 3.1's scaled frequencies too
    hf = load(rc)
    graphs: list[set[str]] = []

    def record(gm, inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")})
        return gm.forward

    torch._dynamo.reset()
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        out, ref = torch.compile(hf, backend=record)(ids).logits, hf(ids).logits
    torch._dynamo.reset()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert any(any("rope_cos_sin" in op for op in ops) for ops in graphs), graphs
    assert not any(op in ("cos", "sin") or op.endswith((".cos", ".sin")) or "method cos" in op or "method sin" in op
                   for ops in graphs for op in ops), graphs


# ---------------------------------------------------------------------------------------------- the function
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("name", list(VARIANTS) + list(ABLATIONS))
def test_logits_match_ours_on_a_left_padded_batch(exported, name, impl):
    model, _, rc = exported[name]
    hf = load(rc, attn_implementation=impl)
    assert type(hf).__name__ == "DiffTransformerForCausalLM" and hf.config._attn_implementation == impl
    ids, mask = padded(PROMPTS)
    real = mask.bool()
    with torch.no_grad():
        want = model(ids, attention_mask=real).logits
        got = hf(input_ids=ids, attention_mask=mask).logits
        # generate's positions (counted from each row's first real token): RoPE sees only differences
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        got_pos = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        full = hf(input_ids=ids).logits  # no mask: plain causal, every token real
    assert want[real].abs().max() > 1.0  # far from a near-uniform output any layout would match
    assert (want - got)[real].abs().max() <= TOL
    assert (want - got_pos)[real].abs().max() <= TOL
    with torch.no_grad():
        assert (model(ids).logits - full).abs().max() <= TOL


def test_a_wrong_rope_layout_or_lambda_breaks_the_logits(exported):
    """The comparison above can fail: Llama's rotate-half RoPE, or a lambda_init off by 0.05, in the loaded remote
    module move the logits by far more than the tolerance."""
    model, _, rc = exported["v1_paper"]
    hf = load(rc)
    module = sys.modules[type(hf.model.layers[0].attn).__module__]  # the layers file, where apply_rope lives
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        want = model(ids).logits
        assert (hf(ids).logits - want).abs().max() <= TOL

        def rotate_half_rope(x, cos, sin):  # NeoX layout: channel i with i + d/2
            x1, x2 = x.chunk(2, dim=-1)
            c, s = cos.to(x.dtype), sin.to(x.dtype)
            return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)

        original = module.apply_rope
        module.apply_rope = rotate_half_rope
        try:
            assert (hf(ids).logits - want).abs().max() > 1e-2
        finally:
            module.apply_rope = original
        for layer in hf.model.layers:
            layer.attn.lambda_init += 0.05
        assert (hf(ids).logits - want).abs().max() > 1e-2


@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_generate_matches_ours_with_each_cache(exported, name):
    model, _, rc = exported[name]
    hf = load(rc)
    want = generate(model, PROMPTS, SamplingConfig(max_new_tokens=10, temperature=0.0), pad_id=0).tokens
    ids, mask = padded(PROMPTS)
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
        no_cache = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                               pad_token_id=0, use_cache=False)
        # transformers 4 allocates a static cache's values as wide as its keys: not DIFF V1 per_head's
        static = out if TRANSFORMERS_4 and name == "v1_per_head" else hf.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0,
            cache_implementation="static")
        step = hf(input_ids=ids, attention_mask=mask, use_cache=True)
    cache = getattr(step, "cache", None) or getattr(step, "past_key_values", None)
    assert isinstance(cache, transformers.DynamicCache) and cache.get_seq_length() == ids.shape[1]
    assert out[:, ids.shape[1]:].tolist() == want
    assert torch.equal(out, no_cache) and torch.equal(out, static)
    assert len({tuple(t) for t in want}) > 1  # the rows differ: the padding really is per row


# ---------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("name", list(VARIANTS) + ["v1_ablation"])
def test_from_hf_gives_our_state_dict_bitwise(exported, tmp_path, capsys, name):
    model, _, rc = exported[name]
    assert main(["convert", "--from-hf", str(rc), "--out", str(tmp_path / "back")]) == 0
    back = DiffTransformerLM.from_pretrained(tmp_path / "back")
    assert back.cfg == model.cfg and same_state(back.state_dict(), model.state_dict())
    assert same_state(load_hf(rc).state_dict(), model.state_dict())


def test_bfloat16_round_trip_is_bitwise(tmp_path):
    model = ours("v2").to(torch.bfloat16)
    save_remote(model, tmp_path / "rc")
    assert json.loads((tmp_path / "rc" / "config.json").read_text())["dtype"] == "bfloat16"
    assert same_state(load_remote(tmp_path / "rc").state_dict(), model.state_dict())


@pytest.mark.parametrize("name", ["v1_per_head", "v1_ablation"])  # a buffer (neg_weight); tied embeddings
def test_save_pretrained_round_trip_is_bitwise(exported, tmp_path, name):
    model, _, rc = exported[name]
    hf = load(rc)
    hf.save_pretrained(tmp_path / "saved")
    assert {"configuration_difftransformer.py", "modeling_difftransformer.py"} <= set(os.listdir(tmp_path / "saved"))
    again = load(tmp_path / "saved")
    assert same_state(hf.state_dict(), again.state_dict())
    assert same_state(load_hf(tmp_path / "saved").state_dict(), model.state_dict())  # and back to ours


# ---------------------------------------------------------------------------------------------- training
class TinyLM(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        x = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x.clone()}


def test_trainer_step_changes_the_weights(exported, tmp_path):
    from transformers import Trainer, TrainingArguments

    hf = load(exported["v2"][2])
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=1, per_device_train_batch_size=2,
                             use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, learning_rate=1e-2)
    result = Trainer(model=hf, args=args, train_dataset=TinyLM()).train()
    assert result.global_step == 1 and torch.isfinite(torch.tensor(result.training_loss))
    after = hf.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)  # every weight moved (V2 has no buffer)


def test_gradient_checkpointing_gives_the_same_gradients(exported):
    hf = load(exported["v1_paper"][2]).train()
    ids = torch.tensor([PROMPTS[0]])
    hf(input_ids=ids, labels=ids).loss.backward()
    want = {n: p.grad.clone() for n, p in hf.named_parameters()}
    hf.zero_grad()
    hf.gradient_checkpointing_enable()
    assert hf.model.gradient_checkpointing
    hf(input_ids=ids, labels=ids).loss.backward()
    assert all(torch.allclose(p.grad, want[n], atol=1e-6) for n, p in hf.named_parameters())


def test_lora_trains_merges_and_converts_back(exported, tmp_path):
    peft = pytest.importorskip("peft")
    base = load(exported["v1_per_head"][2])
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                     target_modules=["wq", "wk", "wv", "wo"]))
    trainable = [p for p in lora.parameters() if p.requires_grad]
    assert trainable and all(n.count("lora_") for n, p in lora.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    ids = torch.tensor([PROMPTS[0]])
    lora.train()
    for _ in range(2):  # LoRA's B starts at 0: the second step is the first to change the function
        lora(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    merged = lora.merge_and_unload().eval()
    merged.save_pretrained(tmp_path / "merged")
    assert main(["convert", "--from-hf", str(tmp_path / "merged"), "--out", str(tmp_path / "ours")]) == 0
    back = DiffTransformerLM.from_pretrained(tmp_path / "ours")
    original = exported["v1_per_head"][0]
    with torch.no_grad():
        want = merged(ids).logits
        assert (want - back(ids).logits).abs().max() <= TOL
        assert (want - original(ids).logits).abs().max() > 1e-3  # the fine-tune changed the function


# ---------------------------------------------------------------------------------------------- without us
def test_the_directory_runs_where_difftransformer_cannot_be_imported(exported, tmp_path):
    model, _, rc = exported["v2"]
    fake = tmp_path / "fake" / "difftransformer"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('difftransformer is not installed here')\n")
    script = textwrap.dedent(f"""
        import json, sys
        try:
            import difftransformer
        except ImportError as e:
            print("blocked:", e, file=sys.stderr)
        else:
            sys.exit("difftransformer was importable")
        import torch, transformers
        m = transformers.AutoModelForCausalLM.from_pretrained({str(rc)!r}, trust_remote_code=True).eval()
        assert not any(name.startswith("difftransformer") for name in sys.modules)
        with torch.no_grad():
            print(json.dumps(m(torch.tensor([{PROMPTS[0]!r}])).logits[0].tolist()))
    """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake"), "HF_MODULES_CACHE": str(tmp_path / "modules"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "blocked: difftransformer is not installed here" in done.stderr
    got = torch.tensor(json.loads(done.stdout.strip().splitlines()[-1]))
    with torch.no_grad():
        assert (model(torch.tensor([PROMPTS[0]])).logits[0] - got).abs().max() <= TOL


# ---------------------------------------------------------------------------------------------- the CLI
def test_cli_export_choices_and_errors(exported, tmp_path, capsys):
    _, saved, rc = exported["v2"]
    assert main(["convert", "--to-hf", str(saved), "--out", str(tmp_path / "v2"), "--expect", "diff_v2"]) == 0
    out = capsys.readouterr().out
    assert "no native transformers class (DiffLlama, Llama) holds attention='diff_v2'" in out
    assert "DiffTransformerForCausalLM as remote code" in out and "trust_remote_code=True" in out
    cfg = json.loads((tmp_path / "v2" / "config.json").read_text())
    assert cfg["model_type"] == "difftransformer" and cfg["auto_map"] == {
        "AutoConfig": "configuration_difftransformer.DiffTransformerConfig",
        "AutoModelForCausalLM": "modeling_difftransformer.DiffTransformerForCausalLM"}
    for name in CODE_FILES:
        assert (tmp_path / "v2" / name).read_bytes() == (CODE_DIR / name).read_bytes()
    # a baseline without --remote-code stays a native Llama
    assert main(["convert", "--to-hf", str(exported["baseline"][1]), "--out", str(tmp_path / "llama")]) == 0
    assert json.loads((tmp_path / "llama" / "config.json").read_text())["model_type"] == "llama"
    cli_fails(capsys, ["convert", "--from-hf", str(rc), "--remote-code", "--out", str(tmp_path / "x")],
              "--remote-code applies to --to-hf only")
    cli_fails(capsys, ["convert", "--from-hf", str(rc), "--expect", "diff_v1", "--out", str(tmp_path / "x")],
              "not the expected diff_v1")
    cli_fails(capsys, ["convert", "--to-hf", str(rc), "--out", str(tmp_path / "x")], "already a Hugging Face")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("changes, expected", [
    (dict(attention="diff_v3"), "ModelConfig.attention='diff_v3' is not allowed"),
    (dict(num_attention_heads=0), "ModelConfig.n_heads must be a positive integer"),
    (dict(hidden_size=32), "has shape"),
    (dict(num_hidden_layers=3), "does not match the config"),
])
def test_bad_remote_directories_fail_in_one_line(exported, tmp_path, capsys, changes, expected):
    bad = tmp_path / "bad"
    shutil.copytree(exported["v2"][2], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(changes)
    (bad / "config.json").write_text(json.dumps(cfg))
    cli_fails(capsys, ["convert", "--from-hf", str(bad), "--out", str(tmp_path / "out")], expected)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("changes, expected", [
    (dict(attention="diff_v3"), "DiffTransformerConfig.attention='diff_v3' is not allowed; choose one of baseline"),
    (dict(v1_layout="rows"), "DiffTransformerConfig.v1_layout='rows' is not allowed"),
    (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads=3 must divide"),
    (dict(lambda_init=1.5), "DiffTransformerConfig.lambda_init=1.5 is not allowed"),
    (dict(head_dim=15), "DiffTransformerConfig.head_dim=15 must be even"),
])
def test_the_remote_config_refuses_bad_values_by_name(changes, expected):
    from difftransformer.interop.remote_code.configuration_difftransformer import DiffTransformerConfig

    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        DiffTransformerConfig(**changes)


def test_foreign_tensors_are_refused(exported, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(exported["v2"][2], bad)
    state = load_file(bad / "model.safetensors")
    state["encoder.weight"] = torch.zeros(2)
    save_file(state, bad / "model.safetensors")
    with pytest.raises(ValueError, match="no place for: encoder.weight"):
        load_remote(bad)
