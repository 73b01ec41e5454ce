"""Presets, AdamW groups, the learning-rate schedule and the logged metrics (lambda per layer)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from difftransformer.model.transformer import DiffTransformerLM
from difftransformer.train.config import OptimConfig, TrainConfig, list_presets, load_config
from difftransformer.train.metrics import LambdaProbe
from difftransformer import rundir
from difftransformer.train.optim import build_optimizer, lr_at, param_groups
from difftransformer.train.trainer import train
from train_helpers import metric_records, tiny_config


def test_presets_load_and_round_trip():
    assert {"tiny", "demo", "paper-3b"} <= set(list_presets())
    for name in list_presets():
        cfg = load_config(name)
        assert TrainConfig.from_dict(json.loads(cfg.to_json())) == cfg


def test_paper_3b_builds_on_meta_with_the_papers_shape():
    cfg = load_config("paper-3b")
    m = cfg.model
    assert (m.d_model, m.n_layers, m.head_dim, m.ffn_hidden, m.max_seq_len) == (3072, 28, 128, 8192, 4096)
    assert m.n_heads // 2 == 12  # 12 differential heads of 2 x 128 (the paper's 3B row)
    assert cfg.train.batch_size * cfg.data.seq_len == 4 * 1024 * 1024  # 4M-token batches
    counts = {}
    for attention in ("baseline", "diff_v1", "diff_v2"):
        with torch.device("meta"):
            model = DiffTransformerLM(m.replace(attention=attention))
        assert next(model.parameters()).device.type == "meta"
        counts[attention] = model.num_parameters()
    D, L, V, F, d, H = 3072, 28, 100288, 8192, 128, 24
    per_layer = 4 * D * D + 3 * D * F + 2 * D  # q, k, v, o; SwiGLU; two RMSNorms
    assert counts["baseline"] == 2 * V * D + L * per_layer + D
    assert counts["diff_v1"] == counts["baseline"] + L * (4 * d + 2 * d)  # lambda vectors, head-wise norm weight
    assert counts["diff_v2"] == counts["baseline"] + L * (D * D + D * H)  # doubled queries, W_lambda
    assert 3.1e9 < counts["diff_v1"] - 2 * V * D < 3.2e9  # ~3B without the (untied) embeddings


def test_demo_preset_size():
    cfg = load_config("demo")
    with torch.device("meta"):
        n = {a: DiffTransformerLM(cfg.model.replace(attention=a)).num_parameters()
             for a in ("baseline", "diff_v1", "diff_v2")}
    assert 5e6 <= n["baseline"] <= 20e6
    assert n["diff_v1"] / n["baseline"] < 1.001


@pytest.mark.parametrize("attention", ["baseline", "diff_v1", "diff_v2"])
def test_no_weight_decay_on_norms_biases_and_lambda(attention):
    cfg = tiny_config(model={"attention": attention})
    model = DiffTransformerLM(cfg.model)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    decay_names = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert decay_names | no_decay_names == set(names.values()) and not decay_names & no_decay_names
    for n, p in model.named_parameters():
        if p.ndim == 1 or "lambda" in n:
            assert n in no_decay_names, n
        else:
            assert n in decay_names, n
    if attention == "diff_v1":
        assert {"layers.0.attn.lambda_q1", "layers.0.attn.subln.weight"} <= no_decay_names
    if attention == "diff_v2":
        assert "layers.1.attn.wlambda.weight" in no_decay_names
    opt = build_optimizer(model, cfg.train)
    assert opt.defaults["betas"] == (cfg.train.beta1, cfg.train.beta2)


def test_warmup_then_cosine():
    t = OptimConfig(steps=110, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    lrs = [lr_at(s, t) for s in range(t.steps)]
    assert lrs[:10] == pytest.approx([1e-4 * (i + 1) for i in range(10)])  # linear up to the peak
    assert lrs[10] == pytest.approx(1e-3)
    assert lrs[60] == pytest.approx(1e-4 + 0.5 * 9e-4)  # half way down the cosine
    assert all(a > b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] > 1e-4 and lr_at(t.steps, t) == pytest.approx(1e-4)
    assert lr_at(0, OptimConfig(steps=5, warmup_steps=0, lr=1e-3, min_lr=0.0)) == pytest.approx(1e-3)


def test_lambda_probe_reads_v1_lambda_and_v2_mean_sigmoid():
    torch.manual_seed(0)
    x = torch.randint(0, 512, (2, 16))
    v1 = DiffTransformerLM(tiny_config().model)
    probe = LambdaProbe(v1.layers)
    v1(x)
    assert probe.result() == {"lambda_v1": pytest.approx(v1.lambdas())}

    v2 = DiffTransformerLM(tiny_config(model={"attention": "diff_v2"}).model)
    seen = []
    v2.layers[1].attn.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach()))
    probe = LambdaProbe(v2.layers)
    v2(x)
    want = torch.sigmoid(seen[0] @ v2.layers[1].attn.wlambda.weight.T).mean()
    res = probe.result()["lambda_v2_mean_sigmoid"]
    assert len(res) == 2 and res[1] == pytest.approx(float(want.detach()), rel=1e-6)
    probe.remove()
    v2(x)
    assert len(seen) == 2 and probe.result()["lambda_v2_mean_sigmoid"][1] == res[1]  # removed: not re-recorded


def test_tiny_trains_and_logs(tmp_path, prepared_dir):
    """Loss goes down; metrics.jsonl and TensorBoard hold loss, lr, grad norm, tokens/s and lambda per layer."""
    cfg = tiny_config(model={"attention": "diff_v2"}, data={"prepared_dir": prepared_dir},
                      train={"steps": 30, "eval_every": 15}, log={"tensorboard": True})
    res = train(cfg, tmp_path)
    assert res.steps == 30 and res.parameters == DiffTransformerLM(cfg.model).num_parameters()
    assert sum(res.losses[-5:]) / 5 < sum(res.losses[:5]) / 5 - 0.3
    assert res.tokens_per_s > 0 and math.isfinite(res.final_val_loss)
    rec = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rec = [r for r in rec if "loss" in r]
    assert [r["step"] for r in train_rec] == [5, 10, 15, 20, 25, 30]
    assert {"lr", "grad_norm", "tokens_per_s", "tokens"} <= set(train_rec[0])
    evals = [r for r in rec if "val_loss" in r]
    assert [r["step"] for r in evals] == [15, 30] and evals[-1]["val_loss"] == res.final_val_loss
    assert len(evals[-1]["lambda_v2_mean_sigmoid"]) == cfg.model.n_layers
    assert all(0 < v < 1 for v in evals[-1]["lambda_v2_mean_sigmoid"])
    # read back the way the report and the demo read it: the V2 lambda under its one defined key
    curves = rundir.read_metrics(tmp_path)
    assert curves["lambda"]["name"] == rundir.LAMBDA_V2 == "lambda_v2_mean_sigmoid"
    assert curves["lambda"]["step"] == 30 and curves["lambda"]["values"] == evals[-1][rundir.LAMBDA_V2]
    assert curves["val_loss"][-1] == res.final_val_loss and len(curves["tokens_per_s"]) == 6
    assert metric_records(tmp_path, "tokens")[30] == 30 * cfg.train.batch_size * cfg.data.seq_len

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss", "lambda_v2_mean_sigmoid/layer_0",
            "lambda_v2_mean_sigmoid/layer_1"} <= tags
    assert json.loads((tmp_path / "run_config.json").read_text())["model"]["attention"] == "diff_v2"
    assert (tmp_path / "tokenizer.json").is_file()


@pytest.mark.parametrize("attention", ["baseline", "diff_v1", "diff_v2"])
def test_parameter_estimate_matches_the_built_model(attention):
    """The memory check's count (meta device, extrapolated in n_layers) equals the real model's."""
    from difftransformer.model.transformer import DiffTransformerLM
    from difftransformer.train.trainer import estimated_parameters
    from suite_helpers import tiny_model_config

    cfg = tiny_model_config(attention, n_layers=5, tie_embeddings=False)
    assert estimated_parameters(cfg) == DiffTransformerLM(cfg).num_parameters()
    cfg = tiny_model_config(attention, n_layers=1)
    assert estimated_parameters(cfg) == DiffTransformerLM(cfg).num_parameters()


def test_a_bare_name_is_a_preset_even_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    """`demo --out demo` (a folder `demo` in the working directory) used to make `--config demo` fail."""
    from difftransformer.train.config import PRESETS_DIR, resolve_config_path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    (tmp_path / "tiny").write_text("not toml")
    assert resolve_config_path("demo") == PRESETS_DIR / "demo.toml"
    assert resolve_config_path("tiny") == PRESETS_DIR / "tiny.toml"
    assert load_config("demo").model == load_config(str(PRESETS_DIR / "demo.toml")).model
    (tmp_path / "mine.toml").write_text((PRESETS_DIR / "tiny.toml").read_text())
    assert resolve_config_path("mine.toml").resolve() == tmp_path / "mine.toml"
    assert resolve_config_path("./tiny").resolve() == tmp_path / "tiny"  # a path separator: a file


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_keeps_its_global_batch_on_any_process_count_that_divides_it(name):
    cfg = load_config(name)
    B = cfg.train.batch_size
    for world in (1, 2, 3, 4, 8):
        if B % world:
            with pytest.raises(ValueError, match=f"train.batch_size={B} cannot be shared by {world} processes"):
                cfg.batch_plan(world)
            continue
        micro, accum = cfg.batch_plan(world)
        assert micro * accum * world == B and 1 <= micro <= cfg.train.micro_batch_size
        assert cfg.accumulation(world) == accum
    assert cfg.batch_plan(1) == (cfg.train.micro_batch_size, B // cfg.train.micro_batch_size)


def test_batch_plan_known_answers():
    cfg = load_config("demo", {"train": {"batch_size": 16, "micro_batch_size": 16}})
    assert [cfg.batch_plan(w) for w in (1, 2, 4, 8)] == [(16, 1), (8, 1), (4, 1), (2, 1)]
    cfg = load_config("demo", {"train": {"batch_size": 24, "micro_batch_size": 4}})
    assert [cfg.batch_plan(w) for w in (1, 2, 3, 4, 8)] == [(4, 6), (4, 3), (4, 2), (3, 2), (3, 1)]
