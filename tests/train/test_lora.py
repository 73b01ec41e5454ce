"""LoRA in our trainer (``train --init-from DIR --train.lora_rank R``, ``model/lora.py``): only the adapters train
and the base stays bitwise; at B = 0 the model is the source exactly; the run's checkpoints hold the merged model,
resume exactly, and ``RUN/adapter`` is a PEFT adapter that peft puts onto the remote-code export of the source,
computing our LoRA model's logits and the merged model's; bad settings are one error line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from suite_helpers import cli_fails, tiny_model_config
from train_helpers import tiny_config, weights

from difftransformer import rundir
from difftransformer.cli import main
from difftransformer.interop.peft import export_adapter, load_adapter
from difftransformer.model.lora import (
    LORA_TARGETS,
    STATE_PREFIX,
    LoRALinear,
    apply_lora,
    lora_layers,
    merge_lora,
)
from difftransformer.model.pretrained import load_state_dict
from difftransformer.model.transformer import DiffTransformerLM
from difftransformer.rundir.files import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_WEIGHTS_NAME,
    MODEL_CARD_NAME,
    adapter_base_dir,
    adapter_dir,
)
from difftransformer.train.config import TrainConfig
from difftransformer.train.optim import build_optimizer

QUIET = ["--no-progress", "--log.tensorboard", "false"]
TOL = 1e-5
ALL = list(LORA_TARGETS)  # every kind of linear layer of DIFF V2: the attention, lambda, the SwiGLU and the head


def _randomised(model: DiffTransformerLM, seed: int) -> DiffTransformerLM:
    """std 0.1 weights (logits of order 1): a wrong layer or scaling shows as a large difference."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("lora")


@pytest.fixture(scope="module")
def sources(root):
    """Our model directories to adapt, with the tokenizer of a 1-step tiny run: DIFF V2 (the run's source), a
    baseline and a DIFF V1 with tied embeddings (refusals only)."""
    assert main(["train", "--config", "tiny", "--model.attention", "diff_v2", "--train.steps", "1",
                 "--out", str(root / "tok"), *QUIET]) == 0
    tok = rundir.tokenizer_path(root / "tok")
    cfg = tiny_config().model
    out = {}
    for name, changes in {"v2": dict(attention="diff_v2"), "baseline": dict(attention="baseline"),
                          "tied": dict(tie_embeddings=True)}.items():
        torch.manual_seed(0)
        model = _randomised(DiffTransformerLM(cfg.replace(**changes)), seed=1)
        out[name] = model.save_pretrained(root / name, tokenizer_file=tok)
    return out


@pytest.fixture(scope="module")
def lora_run(root, sources):
    run = root / "ft"
    assert main(["train", "--config", "tiny", "--init-from", str(sources["v2"]), "--train.lora_rank", "4",
                 "--train.lora_alpha", "8", "--train.lora_targets", str(ALL), "--train.steps", "6",
                 "--train.warmup_steps", "1", "--train.lr", "1e-2", "--checkpoint.every", "3", "--out", str(run),
                 *QUIET]) == 0
    return run


def _tokens(n: int = 2, t: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (n, t), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- (1) (2)
def test_only_the_adapters_train_and_the_base_stays_bitwise():
    cfg = tiny_config(train={"lora_rank": 4})
    torch.manual_seed(0)
    model = DiffTransformerLM(cfg.model)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    wrapped = apply_lora(model, 4, 8.0, ["wq", "wk", "wv", "wo"], seed=0)
    assert wrapped == [f"layers.{i}.attn.{w}" for i in range(2) for w in ("wq", "wk", "wv", "wo")]
    lora_names = {f"{m}.lora_{x}.weight" for m in wrapped for x in "AB"}
    assert {n for n, p in model.named_parameters() if p.requires_grad} == lora_names
    optimizer = build_optimizer(model, cfg.train)
    seen = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert seen == {id(p) for n, p in model.named_parameters() if n in lora_names}
    x = _tokens()
    model.train()
    for _ in range(3):
        model(x[:, :-1], x[:, 1:]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())  # every base weight, bit for bit
    assert all(float(m.lora_B.weight.detach().abs().max()) > 0 for m in lora_layers(model).values())


@pytest.mark.parametrize("attention", ["baseline", "diff_v1", "diff_v2"])
def test_at_b_zero_the_lora_model_is_the_source_exactly(attention):
    torch.manual_seed(0)
    model = _randomised(DiffTransformerLM(tiny_model_config(attention)), seed=2)
    x = _tokens(seed=1).clamp(max=model.cfg.vocab_size - 1)
    with torch.no_grad():
        want = model(x).logits
        targets = [t for t in ALL if t != "wlambda" or attention == "diff_v2"]
        apply_lora(model, 4, 16.0, targets, seed=3)
        assert all(float(m.lora_A.weight.abs().max()) > 0 for m in lora_layers(model).values())
        assert torch.equal(model(x).logits, want)
        merged = merge_lora(model)
        assert not lora_layers(merged) and torch.equal(merged(x).logits, want)


# ---------------------------------------------------------------------------------------------- (3) the run
def test_the_run_trains_only_the_adapters_and_checkpoints_the_merged_model(lora_run, sources):
    source = load_state_dict(sources["v2"] / "model.safetensors")
    ckpt = rundir.resolve_checkpoint(lora_run)
    merged = weights(ckpt)
    state = load_state_dict(ckpt / "training_state.safetensors")
    lora = {k[len(STATE_PREFIX):]: v for k, v in state.items() if k.startswith(STATE_PREFIX)}
    adapted = sorted({k.rpartition(".")[0] for k in lora if k.endswith(".weight") and ".lora_" not in k})
    assert len(adapted) == 2 * 8 + 1  # wq wk wv wo wlambda w1 w2 w3 per layer, and the head
    for name in adapted:  # the frozen weights are the source's, bit for bit; the checkpoint's are merged
        assert torch.equal(lora[f"{name}.weight"], source[f"{name}.weight"])
        delta = lora[f"{name}.lora_B.weight"] @ lora[f"{name}.lora_A.weight"] * 2.0  # alpha / r = 8 / 4
        assert torch.allclose(merged[f"{name}.weight"], source[f"{name}.weight"] + delta, atol=1e-7)
        assert not torch.equal(merged[f"{name}.weight"], source[f"{name}.weight"])
    rest = set(source) - {f"{n}.weight" for n in adapted}
    assert rest and all(torch.equal(merged[k], source[k]) for k in rest)  # embeddings, norms: untouched
    optim = {k.removeprefix("optim.").rpartition(".")[0] for k in state if k.startswith("optim.")}
    assert optim == {k for k in lora if ".lora_" in k}  # the optimizer held the adapters, nothing else


def test_peft_on_the_remote_code_export_computes_our_lora_model(lora_run, sources, tmp_path):
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    hf_dir = tmp_path / "hf"
    assert main(["convert", "--to-hf", str(sources["v2"]), "--out", str(hf_dir), "--remote-code"]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True, dtype=torch.float32)
    adapter = adapter_dir(lora_run)
    with _no_missing_keys():
        tuned = peft.PeftModel.from_pretrained(hf, adapter).eval()
    saved = load_file(adapter / ADAPTER_WEIGHTS_NAME)
    loaded = peft.get_peft_model_state_dict(tuned, save_embedding_layers=False)
    assert set(loaded) == set(saved) and all(torch.equal(loaded[k], saved[k]) for k in saved)
    ours = load_adapter(DiffTransformerLM.from_pretrained(sources["v2"]), adapter).eval()
    assert all(isinstance(m, LoRALinear) for m in lora_layers(ours).values()) and len(lora_layers(ours)) == 17
    merged = DiffTransformerLM.from_pretrained(rundir.resolve_checkpoint(lora_run))
    base = DiffTransformerLM.from_pretrained(sources["v2"])
    x = _tokens()
    with torch.no_grad():
        want = ours(x).logits
        gap_peft = float((tuned(input_ids=x).logits - want).abs().max())
        gap_merged = float((merged(x).logits - want).abs().max())
        moved = float((base(x).logits - want).abs().max())
    print(f"max |logit gap|: peft on remote code vs ours {gap_peft:.2e}, merged vs ours {gap_merged:.2e}; "
          f"the adapters moved the logits by {moved:.2e}")
    assert gap_peft <= TOL and gap_merged <= TOL
    assert moved > 1e-3  # the adapters changed the function: the comparison can fail


def test_auto_peft_loads_the_run_adapter_onto_the_base_written_beside_it(lora_run, sources):
    """``AutoPeftModelForCausalLM.from_pretrained(RUN/adapter)``: adapter_config.json names RUN/adapter_base, the
    remote-code export of the frozen source (its weights the source's, bitwise), and the result computes our LoRA
    model's logits. The adapter's card says what it is."""
    peft = pytest.importorskip("peft")
    yaml = pytest.importorskip("yaml")
    from difftransformer.interop.hf import load_hf

    adapter, base = adapter_dir(lora_run), adapter_base_dir(lora_run)
    config = json.loads((adapter / ADAPTER_CONFIG_NAME).read_text())
    assert config["base_model_name_or_path"] == str(base.resolve())
    source = DiffTransformerLM.from_pretrained(sources["v2"]).state_dict()
    exported = load_hf(base).state_dict()  # convert --from-hf's reader: the source, bit for bit
    assert source.keys() == exported.keys() and all(torch.equal(source[k], exported[k]) for k in source)
    with _no_missing_keys():
        tuned = peft.AutoPeftModelForCausalLM.from_pretrained(adapter, trust_remote_code=True,
                                                              dtype=torch.float32).eval()
    ours = load_adapter(DiffTransformerLM.from_pretrained(sources["v2"]), adapter).eval()
    x = _tokens()
    with torch.no_grad():
        want = ours(x).logits
        gap = float((tuned(input_ids=x).logits - want).abs().max())
    print(f"max |logit gap|: AutoPeftModelForCausalLM(RUN/adapter) vs our LoRA model {gap:.2e}")
    assert gap <= TOL
    head, body = (adapter / MODEL_CARD_NAME).read_text(encoding="utf-8").split("---\n", 2)[1:]
    meta = yaml.safe_load(head)
    assert meta["library_name"] == "peft" and {"lora", "diff-v2", "differential-attention"} <= set(meta["tags"])
    assert "base_model" not in meta  # a local source: named in the text, never as hub metadata
    for text in ("rank 4, alpha 8", "step 6 of 6", "Validation loss", "of `v2` (`--init-from`)", "adapter_base",
                 f'AutoPeftModelForCausalLM.from_pretrained("{adapter}", trust_remote_code=True)', "2410.05258"):
        assert text in body, text
    assert (base / MODEL_CARD_NAME).is_file()


def test_auto_peft_with_tied_embeddings(sources, tmp_path):
    """A DIFF V1 source with tied embeddings: its base export holds the head once and AutoPeftModelForCausalLM
    computes our LoRA model's logits."""
    peft = pytest.importorskip("peft")
    run = tmp_path / "tied"
    assert main(["train", "--config", "tiny", "--init-from", str(sources["tied"]), "--train.lora_rank", "2",
                 "--train.steps", "2", "--train.lr", "1e-2", "--train.warmup_steps", "1", "--out", str(run),
                 *QUIET]) == 0
    tuned = peft.AutoPeftModelForCausalLM.from_pretrained(adapter_dir(run), trust_remote_code=True,
                                                          dtype=torch.float32).eval()
    ours = load_adapter(DiffTransformerLM.from_pretrained(sources["tied"]), adapter_dir(run)).eval()
    x = _tokens()
    with torch.no_grad():
        assert float((tuned(input_ids=x).logits - ours(x).logits).abs().max()) <= TOL


def test_lora_base_names_the_adapters_base_and_no_export_is_written(sources, tmp_path):
    """--train.lora_base NAME: adapter_config.json names it (a hub name: also the card's base_model), and the run
    writes no base of its own."""
    yaml = pytest.importorskip("yaml")
    run = tmp_path / "named"
    assert main(["train", "--config", "tiny", "--init-from", str(sources["v2"]), "--train.lora_rank", "2",
                 "--train.lora_base", "me/my-diff-v2", "--train.steps", "1", "--out", str(run), *QUIET]) == 0
    assert json.loads((adapter_dir(run) / ADAPTER_CONFIG_NAME).read_text())["base_model_name_or_path"] == \
        "me/my-diff-v2"
    assert not adapter_base_dir(run).exists()
    meta = yaml.safe_load((adapter_dir(run) / MODEL_CARD_NAME).read_text(encoding="utf-8").split("---\n")[1])
    assert meta["base_model"] == "me/my-diff-v2"


class _no_missing_keys:
    """peft warns about adapter tensors it found no place for, or places it found no tensor for: none allowed."""

    def __enter__(self):
        import warnings
        self._cm = warnings.catch_warnings(record=True)
        self._log = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        bad = [str(w.message) for w in self._log if "missing" in str(w.message).lower()
               or "unexpected" in str(w.message).lower()]
        assert not bad, bad


def test_resume_continues_the_adapters_exactly(lora_run, tmp_path):
    """The copy keeps step 6's RUN/adapter without its checkpoint (a kill between the two writes): the resumed run
    writes it again, bit for bit."""
    run = tmp_path / "resumed"
    shutil.copytree(lora_run, run, ignore=shutil.ignore_patterns("run.lock"))
    shutil.rmtree(rundir.step_dir(run, 6))
    assert main(["train", "--out", str(run), "--resume", *QUIET]) == 0
    a, b = rundir.step_dir(lora_run, 6), rundir.step_dir(run, 6)
    assert weights(a).keys() == weights(b).keys()
    assert all(torch.equal(weights(a)[k], weights(b)[k]) for k in weights(a))
    sa, sb = (load_state_dict(d / "training_state.safetensors") for d in (a, b))
    assert all(torch.equal(sa[k], sb[k]) for k in sa if k.startswith(STATE_PREFIX))
    cfg = TrainConfig.from_dict(rundir.read_run_config(lora_run))
    exported = export_adapter(a, tmp_path / "exported", cfg.train)  # any checkpoint's, as the run writes it
    for name in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME):
        assert (exported / name).read_bytes() == (adapter_dir(lora_run) / name).read_bytes()
    assert (adapter_dir(run) / ADAPTER_WEIGHTS_NAME).read_bytes() == (adapter_dir(lora_run) / ADAPTER_WEIGHTS_NAME
                                                                      ).read_bytes()
    # the copy's adapter names the copy's own base export (an absolute path), otherwise the same config
    moved, original = (json.loads((adapter_dir(r) / ADAPTER_CONFIG_NAME).read_text()) for r in (run, lora_run))
    assert moved.pop("base_model_name_or_path") == str(adapter_base_dir(run).resolve())
    assert original.pop("base_model_name_or_path") == str(adapter_base_dir(lora_run).resolve())
    assert moved == original


# ---------------------------------------------------------------------------------------------- (4) refusals
@pytest.mark.parametrize("source, args, expected", [
    (None, ["--train.lora_rank", "4"], ["train.lora_rank=4 needs --init-from"]),
    ("v2", ["--train.lora_rank", "4", "--train.lora_targets", '["wq", "wz"]'],
     ["train.lora_targets", "'wz' is not a linear layer", "choose from wq, wk"]),
    ("v2", ["--train.lora_rank", "-1"], ["train.lora_rank=-1 must be >= 0"]),
    ("v2", ["--train.lora_rank", "4", "--train.lora_alpha", "0"], ["train.lora_alpha=0 must be > 0"]),
    ("v2", ["--train.lora_rank", "4", "--train.lora_dropout", "1.0"], ["train.lora_dropout=1.0 must be in [0, 1)"]),
    ("baseline", ["--train.lora_rank", "4", "--train.lora_targets", '["wlambda"]'],
     ["'wlambda' matches no module of this model (baseline attention)", "output, w1, w2, w3, wk, wo, wq, wv"]),
    ("tied", ["--train.lora_rank", "4", "--train.lora_targets", '["output"]'], ["'output' is tied"]),
    ("baseline", ["--train.lora_rank", "4", "--model.attention", "diff_v2"],
     ["train.lora_rank=4 trains adapters for", "--model.attention diff_v2 would convert it"]),
])
def test_bad_lora_settings_are_one_error_line(sources, tmp_path, capsys, source, args, expected):
    init = ["--init-from", str(sources[source])] if source else []
    cli_fails(capsys, ["train", "--config", "tiny", *init, *args, "--out", str(tmp_path / "run"), *QUIET],
              *expected, stdout_empty=True)
    assert not (tmp_path / "run").exists()


def test_resume_keeps_the_runs_lora_settings(lora_run, capsys):
    before = sorted(p.name for p in rundir.checkpoints_dir(lora_run).iterdir())
    cli_fails(capsys, ["train", "--out", str(lora_run), "--resume", "--train.steps", "8", "--train.lora_rank", "8",
                       *QUIET], "--resume: train.lora_rank=8 differs from the run's 4", stdout_empty=True)
    assert sorted(p.name for p in rundir.checkpoints_dir(lora_run).iterdir()) == before
