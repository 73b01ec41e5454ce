"""Table-driven bad input across every subcommand: every case exits 2 with exactly one
``difftransformer COMMAND: error:`` line naming the field or path, no traceback, and no file changed anywhere in
the workspace (a trained run, model directories, Hugging Face directories). Driven in-process (``cli.main``).

Text that is not UTF-8, in every flag and file that carries text: a non-UTF-8 byte of a command-line argument
reaches Python as a lone surrogate (``surrogateescape``: byte 0xff is U+DCFF), which the rows pass as such; one
test passes the real bytes to a real process. Files get Latin-1 bytes (``caf\xe9``)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from difftransformer import rundir
from difftransformer.cli import main
from difftransformer.train.config import load_config
from difftransformer.train.trainer import train

DEEP = "[" * 200_000 + "]" * 200_000  # deeper than Python's JSON parser can recurse
TRAIN = ["train", "--config", "tiny", "--no-progress"]
BAD = "\udcff"  # byte 0xff of a command-line argument, as Python receives it (surrogateescape)
LATIN1 = b"caf\xe9"  # not UTF-8: 0xe9 starts a three-byte sequence that does not follow


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A workspace: a 2-step tiny run, a copy of its checkpoint, and broken model / HF / run directories."""
    root = tmp_path_factory.mktemp("fuzz")
    train(load_config("tiny", {"data": {"max_chars": 30000}, "train": {"steps": 2, "eval_every": 2},
                               "checkpoint": {"every": 2}}), root / "run")
    ckpt = rundir.step_dir(root / "run", 2)
    shutil.copytree(ckpt, root / "model")
    shutil.copytree(ckpt, root / "corrupt")
    w = root / "corrupt" / rundir.WEIGHTS_NAME
    raw = bytearray(w.read_bytes())
    raw[-5] ^= 0xFF  # one flipped bit pattern inside the last tensor: NaN-ish weights if loaded
    w.write_bytes(bytes(raw))
    shutil.copytree(ckpt, root / "deep_model")
    (root / "deep_model" / rundir.MANIFEST_NAME).unlink()  # so the nesting, not the manifest, is what fails
    (root / "deep_model" / rundir.CONFIG_NAME).write_text(DEEP)
    (root / "deep_run").mkdir()
    rundir.run_config_path(root / "deep_run").write_text(DEEP)
    good_hf = {"model_type": "llama", "vocab_size": 512, "hidden_size": 32, "intermediate_size": 96,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    hf_cases = {"hf_heads0": {"num_attention_heads": 0}, "hf_rope_str": {"rope_scaling": "linear"},
                "hf_rope_linear": {"rope_scaling": {"type": "linear", "factor": 2.0}},
                "hf_rope_both": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                                 "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
                "hf_rope_list": {"rope_parameters": [1, 2]}, "hf_hidden_str": {"hidden_size": "abc"},
                "hf_eps_nan": {"rms_norm_eps": float("nan")}, "hf_theta_inf": {"rope_theta": float("inf")},
                "hf_layers_neg": {"num_hidden_layers": -1}, "hf_kv_bool": {"num_key_value_heads": True},
                "hf_model_type": {"model_type": "gpt2"}, "hf_vocab_float": {"vocab_size": 512.5}}
    for name, change in hf_cases.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps({**good_hf, **change}))
    (root / "hf_deep").mkdir()
    (root / "hf_deep" / "config.json").write_text("{\"model_type\": " + DEEP[:100_000] + "0" + DEEP[100_000:] + "}")
    (root / "hf_notdict").mkdir()
    (root / "hf_notdict" / "config.json").write_text("[1, 2]")
    (root / "bad.toml").write_text("[train\nlr = ")
    (root / "afile").write_text("x")
    # --- text that is not UTF-8, in every kind of file that carries text ------------------------------------------
    (root / "latin1.toml").write_bytes(b"[train]\nlr = 1e-3  # " + LATIN1 + b"\n")
    (root / "latin1.txt").write_bytes(b"In the beginning " + LATIN1 + b"\n\nAnd the earth was without form\n")
    (root / "latin1.jsonl").write_bytes(b'{"text": "' + LATIN1 + b'"}\n')
    (root / "latin1_dir").mkdir()
    (root / "latin1_dir" / "a.txt").write_bytes(LATIN1 + b" au lait\n")
    tok = (ckpt / rundir.TOKENIZER_NAME).read_bytes()
    (root / "latin1_tok.json").write_bytes(tok.replace(b'"version"', b'"v' + LATIN1 + b'"', 1))
    for name, file, data in [("tok_latin1", rundir.TOKENIZER_NAME, (root / "latin1_tok.json").read_bytes()),
                             ("chat_latin1", "chat_template.jinja", b"{{ messages[0].content }} " + LATIN1),
                             ("tokcfg_latin1", "tokenizer_config.json", b'{"eos_token": "' + LATIN1 + b'"}')]:
        shutil.copytree(ckpt, root / name)
        (root / name / file).write_bytes(data)
    (root / "hf_chat_latin1").mkdir()
    (root / "hf_chat_latin1" / "config.json").write_text(json.dumps(good_hf))
    (root / "hf_chat_latin1" / "chat_template.jinja").write_bytes(b"{{ bos_token }}" + LATIN1)
    # --- study outputs of the wrong shape (valid JSON): a list, another benchmark's, one lacking what is read ------
    for name, doc in [("list_study", [1, 2]), ("other_study", {"benchmark": "kv_retrieval_width_sweep"}),
                      ("thin_study", {"benchmark": "kv_retrieval", "config": {}, "conditions": []})]:
        (root / name).mkdir()
        for file in (rundir.RESULTS_NAME, rundir.SWEEP_RESULTS_NAME, rundir.LM_SWEEP_JOURNAL):
            (root / name / file).write_text(json.dumps(doc))
    (root / "tasks").mkdir()
    (root / "tasks" / "my_task.yaml").write_bytes(b"task: " + LATIN1 + b"\n")
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# (argv with {ws} for the workspace, a text the error line must hold)
ROOT = Path(__file__).resolve().parents[1]
CASES: list[tuple[list[str], str]] = [
    # --- train: every config section, non-finite and out of range -----------------------------------------
    *[([*TRAIN, "--out", "{ws}/new", f"--{key}={value}"], key.split(".", 1)[1]) for key, value in [
        ("train.lr", "inf"), ("train.lr", "nan"), ("train.lr", "-1e-3"), ("train.lr", "0"),
        ("train.min_lr", "inf"), ("train.min_lr", "1.0"), ("train.min_lr", "-1e-5"),
        ("train.grad_clip", "nan"), ("train.grad_clip", "-1"), ("train.grad_clip", "-inf"),
        ("train.weight_decay", "nan"), ("train.weight_decay", "-0.1"), ("train.beta1", "1.0"),
        ("train.beta1", "nan"), ("train.beta2", "-0.5"), ("train.beta2", "inf"), ("train.eps", "0"),
        ("train.eps", "nan"), ("train.warmup_steps", "-1"), ("train.steps", "0"), ("train.steps", "-5"),
        ("train.steps", "1.5"), ("train.batch_size", "0"), ("train.micro_batch_size", "3"),
        ("train.eval_every", "0"), ("train.eval_batches", "0"), ("train.seed", "-1"),
        ("train.device", "bogus"), ("train.device", "cuda:x"), ("train.device", "42"), ("train.device", "mps"),
        ("train.device", "cuda:99"),
        ("train.precision", "fp8"), ("train.parallel", "zero3"), ("train.compile", "maybe"),
        ("data.vocab_size", "4000000000"), ("data.vocab_size", "10"), ("data.vocab_size", "1e9"),
        ("data.seq_len", "1"), ("data.seq_len", "100000"), ("data.val_fraction", "0.7"),
        ("data.val_fraction", "nan"), ("data.val_fraction", "0"), ("data.retrieval_share", "1.0"),
        ("data.retrieval_share", "inf"), ("data.max_chars", "-5"), ("data.seed", "-2"),
        ("data.sources", "[]"), ("data.sources", "[1, 2]"), ("data.retrieval_n_needles", "0"),
        ("data.retrieval_n_needles", "100000"), ("data.retrieval_n_queries", "0"), ("data.retrieval_digits", "0"),
        ("data.retrieval_n_filler", "-1"), ("data.val_fraction", "inf"), ("data.prepared_dir", "3"),
        ("checkpoint.every", "0"), ("checkpoint.keep_last", "0"), ("log.every", "0"),
        ("log.tensorboard", "3"),
        ("model.init_std", "inf"), ("model.init_std", "nan"), ("model.init_std", "0"),
        ("model.rope_theta", "inf"), ("model.rope_theta", "-1"), ("model.norm_eps", "nan"),
        ("model.d_model", "0"), ("model.n_layers", "-1"), ("model.n_heads", "3"), ("model.head_dim", "3"),
        ("model.max_seq_len", "0"), ("model.attention", "diff_v3"), ("model.backend", "flash"),
        ("model.lambda_init", "1.5"), ("model.lambda_init", "nan"), ("model.v2_lambda", "relu"),
        ("model.tie_embeddings", "2"),
    ]],
    ([*TRAIN, "--out", "{ws}/new", "--model.d_model=1000000"], "GiB"),  # would abort in the allocator
    ([*TRAIN, "--out", "{ws}/new", "--data.vocab_size=1048576", "--model.d_model=400000"], "parameters"),
    ([*TRAIN[:1], "--config", "nope", "--out", "{ws}/new"], "nope"),
    ([*TRAIN[:1], "--config", "{ws}/bad.toml", "--out", "{ws}/new"], "bad.toml"),
    ([*TRAIN[:1], "--config", "{ws}/missing.toml", "--out", "{ws}/new"], "missing.toml"),
    ([*TRAIN, "--out", "{ws}/run"], "already holds a run"),
    ([*TRAIN, "--out", "{ws}/afile"], "--out {ws}/afile: it is a file, not a directory"),
    ([*TRAIN, "--out", "{ws}/afile/sub"], "--out {ws}/afile/sub: {ws}/afile is a file, not a directory"),
    (["train", "--out", "{ws}/run", "--resume"], "already at step 2"),
    (["train", "--out", "{ws}/run", "--resume", "--train.steps", "4", "--model.d_model", "64"], "d_model"),
    (["train", "--out", "{ws}/run", "--resume", "--train.steps", "4", "--data.max_chars", "1000"], "[data]"),
    (["train", "--out", "{ws}/run", "--resume", "--train.steps", "4", "--train.lr", "nan"], "train.lr"),
    ([*TRAIN, "--out", "{ws}/run", "--resume", "--train.steps", "4"], "[data]"),
    ([*TRAIN, "--out", "{ws}/model", "--resume"], "run_config.json"),
    (["train", "--out", "{ws}/deep_run", "--resume"], "run_config.json"),
    (["train", "--out", "{ws}/model", "--resume"], "--config is required"),
    # --- generate ------------------------------------------------------------------------------------------
    *[(["generate", "--run", "{ws}/run", "--prompt", "In the", *extra], text) for extra, text in [
        (["--temperature", "1e-45"], "temperature"), (["--temperature", "-1"], "temperature"),
        (["--temperature", "nan"], "temperature"), (["--temperature", "inf"], "temperature"),
        (["--top-k", "0"], "top_k"), (["--top-p", "0"], "top_p"), (["--top-p", "1.5"], "top_p"),
        (["--top-p", "nan"], "top_p"), (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--device", "bogus"], "bogus"), (["--tokenizer", "{ws}/afile"], "afile"),
        (["--tokenizer", "{ws}/none.json"], "none.json"),
    ]],
    (["generate", "--run", "{ws}/nothing", "--prompt", "a"], "nothing"),
    (["generate", "--checkpoint", "{ws}/afile", "--prompt", "a"], "afile"),
    (["generate", "--checkpoint", "{ws}/corrupt", "--prompt", "a"], "model.safetensors"),
    (["generate", "--checkpoint", "{ws}/deep_model", "--prompt", "a"], "nested too deeply"),
    (["generate", "--run", "{ws}/run", "--prompt", ""], "empty"),
    (["generate", "--checkpoint", "{ws}/hf_heads0", "--prompt", "a"], "hf_heads0"),
    # --- convert -------------------------------------------------------------------------------------------
    (["convert", "--from-hf", "{ws}/hf_heads0", "--out", "{ws}/o"], "num_attention_heads"),
    (["convert", "--from-hf", "{ws}/hf_rope_str", "--out", "{ws}/o"], "rope_scaling"),
    (["convert", "--from-hf", "{ws}/hf_rope_linear", "--out", "{ws}/o"], "'linear' is not implemented"),
    (["convert", "--from-hf", "{ws}/hf_rope_both", "--out", "{ws}/o"], "'yarn' is not implemented"),
    (["convert", "--from-hf", "{ws}/hf_rope_list", "--out", "{ws}/o"], "rope_parameters"),
    (["convert", "--from-hf", "{ws}/hf_hidden_str", "--out", "{ws}/o"], "hidden_size"),
    (["convert", "--from-hf", "{ws}/hf_eps_nan", "--out", "{ws}/o"], "rms_norm_eps"),
    (["convert", "--from-hf", "{ws}/hf_theta_inf", "--out", "{ws}/o"], "rope_theta"),
    (["convert", "--from-hf", "{ws}/hf_layers_neg", "--out", "{ws}/o"], "num_hidden_layers"),
    (["convert", "--from-hf", "{ws}/hf_kv_bool", "--out", "{ws}/o"], "num_key_value_heads"),
    (["convert", "--from-hf", "{ws}/hf_model_type", "--out", "{ws}/o"], "gpt2"),
    (["convert", "--from-hf", "{ws}/hf_vocab_float", "--out", "{ws}/o"], "vocab_size"),
    (["convert", "--from-hf", "{ws}/hf_deep", "--out", "{ws}/o"], "nested too deeply"),
    (["convert", "--from-hf", "{ws}/hf_notdict", "--out", "{ws}/o"], "JSON object"),
    (["convert", "--from-hf", "{ws}/nothing", "--out", "{ws}/o"], "nothing"),
    (["convert", "--from-hf", "{ws}/model", "--out", "{ws}/o"], "our own format"),
    (["convert", "--from-hf", "{ws}/model", "--v1-headwise-norm", "--out", "{ws}/o"], "--attention diff_v1 only"),
    (["convert", "--from-hf", "{ws}/model", "--attention", "diff_v1", "--seed", "-1", "--out", "{ws}/o"],
     "--seed must be >= 0"),
    (["convert", "--to-hf", "{ws}/corrupt", "--out", "{ws}/o"], "model.safetensors"),
    (["convert", "--to-hf", "{ws}/deep_model", "--out", "{ws}/o"], "nested too deeply"),
    (["convert", "--to-hf", "{ws}/deep_run", "--out", "{ws}/o"], "deep_run"),
    (["convert", "--to-hf", "{ws}/run", "--out", "{ws}/model"], "not an empty directory"),
    (["convert", "--to-hf", "{ws}/run", "--out", "{ws}/o", "--expect", "llama"], "not the expected"),
    # --- bench ---------------------------------------------------------------------------------------------
    *[(["bench", "attention", flag, value], flag) for flag, value in [
        ("--head-dim", "0"), ("--batch", "0"), ("--d-model", "0"), ("--repeats", "0"), ("--seq-lens", "0"),
        ("--kv-heads", "0"), ("--head-dim", "-4"), ("--batch", "-1")]],
    (["bench", "attention", "--d-model", "100", "--head-dim", "32"], "--head-dim"),
    *[(["bench", "train", flag, value], flag) for flag, value in [
        ("--batch", "0"), ("--steps", "0"), ("--seq-len", "0"), ("--rounds", "0"), ("--layers", "0"),
        ("--d-model", "0"), ("--vocab-size", "0"), ("--threads", "-1"), ("--kv-heads", "0"), ("--heads", "0"),
        ("--warmup", "-1"), ("--timeout", "0")]],
    *[(["bench", "decode", "--no-hf", flag, value], flag) for flag, value in [
        ("--batch", "0"), ("--contexts", "0"), ("--head-dim", "0"), ("--new-tokens", "0"), ("--layers", "0"),
        ("--rounds", "0"), ("--kv-heads", "0"), ("--vocab-size", "0")]],
    (["bench", "decode", "--no-hf", "--backend", "triton"], "--backend triton needs --device cuda"),
    *[(["bench", "layer", flag, value], flag) for flag, value in [
        ("--rounds", "0"), ("--warmup", "-1"), ("--threads", "-1"), ("--batch", "-1"), ("--seq-len", "-1"),
        ("--shapes", "vit,nope"), ("--modes", "jit"), ("--batch", "100000"), ("--seq-len", "1000000")]],
    # --- eval, report, retrieval, demo ----------------------------------------------------------------------
    *[(["eval", "needles", "--run", "{ws}/run", flag, value], why) for flag, value, why in [
        ("--lengths", "inf", "--lengths expects finite"), ("--lengths", "nan", "--lengths expects finite"),
        ("--lengths", "0,1", "length"), ("--depths", "a,b", "--depths expects comma-separated numbers"), ("--samples", "0", "samples")]],
    (["eval", "noise", "--run", "{ws}/nothing"], "nothing"),
    (["eval", "outliers", "--run", "{ws}/corrupt"], "corrupt"),
    (["eval", "positions", "--run", "{ws}/run", "--sequences", "1"], "sequences"),
    (["eval", "quantized", "--run", "{ws}/run", "--bits", "1"], "bits"),
    (["eval", "icl", "--run", "{ws}/run", "--orders", "0"], "orders"),
    (["eval", "noise", "--run", "{ws}/deep_model"], "nested"),
    (["report", "{ws}/nothing", "--out", "{ws}/o"], "nothing"),
    (["report", "{ws}/run", "--retrieval", "{ws}/nothing", "--out", "{ws}/o"], "nothing"),
    *[(["retrieval", "--out", "{ws}/o", flag, value], flag.lstrip("-").replace("-", "_")) for flag, value in [
        ("--seeds", "0"), ("--steps", "0"), ("--batch", "0"), ("--train-pairs", "0,4"), ("--train-context", "48,24"),
        ("--queries", "0"), ("--n-keys", "0"), ("--d-model", "0"), ("--workers", "0"), ("--lr-widen", "-1")]],
    (["retrieval", "--out", "{ws}/o", "--seed-base", "-1"], "seed_base must be an integer >= 0"),
    # a model no job could allocate (every job would fail alike): refused before the first job (issue 57)
    (["retrieval", "--out", "{ws}/o", "--n-keys", "1000000000", "--workers", "1"], "lower --n-keys (1,000,000,000"),
    (["retrieval", "--out", "{ws}/o", "--n-keys", "1000000000", "--sweep-width", "64,128"], "lower --n-keys"),
    (["retrieval", "--out", "{ws}/o", "--cpu-code-path", "avx3"], "invalid choice"),
    (["retrieval", "--out", "{ws}/o", "--primary", "p48c96"], "inside the trained lengths"),
    (["retrieval", "--out", "{ws}/o", "--sweep-width", "64"], "at least two distinct widths"),
    (["retrieval", "--out", "{ws}/o", "--sweep-width", "64,50"], "d_model"),
    (["retrieval", "--out", "{ws}/o", "--distractors", "close"], "distractors"),
    (["retrieval", "--out", "{ws}/o", "--lr-grid", "inf"], "lr"),
    (["bench", "attention", "--shape", "nope"], "--shape"),
    (["bench", "train", "--shape", "nope"], "--shape"),
    (["bench", "pretrained", "--hf-dir", "{ws}/run", "--rounds", "0"], "--rounds"),
    (["bench", "pretrained", "--hf-dir", "{ws}/run", "--batch", "0"], "--batch"),
    (["convert", "--from-gguf", "{ws}/afile", "--out", "{ws}/o"], "not a .gguf file"),
    (["convert", "--from-gguf", "{ws}/none.gguf", "--out", "{ws}/o"], "none.gguf"),
    (["lm-eval", "--model", "{ws}/nothing"], "not a run"),
    (["lm-eval", "--model", "{ws}/run", "--batch-size", "0"], "--batch-size"),
    # --- the device of every command that runs a model: one not there is one line before any model is read
    (["eval", "outliers", "--run", "{ws}/run", "--device", "mps"], "--device='mps' is not a device"),
    (["eval", "attnmap", "--run", "{ws}/run", "--device", "cuda:99"], "--device='cuda:99' but"),
    (["report", "{ws}/run", "--device", "cuda:99", "--out", "{ws}/o"], "--device='cuda:99' but"),
    (["report", "{ws}/run", "--device", "gpu", "--out", "{ws}/o"], "--device='gpu' is not a device"),
    (["lm-eval", "--model", "{ws}/run", "--device", "bogus"], "--device='bogus' is not a device"),
    (["lm-eval", "--model", "{ws}/run", "--device", "cuda:99"], "--device='cuda:99' but"),
    ([*TRAIN, "--out", "{ws}/new", "--init-from", "{ws}/nothing"], "nothing"),
    ([*TRAIN, "--out", "{ws}/new", "--init-from", "{ws}/run", "--model.n_layers", "3"], "--model.n_layers"),
    ([*TRAIN, "--out", "{ws}/new", "--data.tokenizer", "{ws}/afile"], "afile"),
    (["demo", "--out", "{ws}/afile", "--no-retrieval"], "--out {ws}/afile: it is a file, not a directory"),
    (["report", "{ws}/run", "--out", "{ws}/afile"], "--out {ws}/afile: it is a file, not a directory"),
    (["demo", "--out", "{ws}/o", "--seeds", "0"], "--seeds"),
    (["demo", "--out", "{ws}/o", "--config", "nope"], "nope"),
    (["demo", "--out", "{ws}/o", "--retrieval-seeds", "0"], "--retrieval-seeds"),
    (["demo", "--out", "{ws}/o", "--steps", "-3"], "--steps"),
    (["demo", "--out", "{ws}/o", "--lm-sweep", "{ws}/nothing"], "holds no sweep.json"),
    (["lm-sweep", "--out", "{ws}/o", "--widths", "32,32"], "two distinct"),
    (["lm-sweep", "--out", "{ws}/o", "--seeds", "0"], "seeds must be"),
    (["lm-sweep", "--out", "{ws}/o", "--diagnostic", "v1"], "--diagnostic v1 needs --reference DIR"),
    (["lm-sweep", "--out", "{ws}/o", "--diagnostic", "v1", "--reference", "{ws}/nothing"], "no lm-jobs.jsonl there"),
    (["lm-sweep", "--out", "{ws}/o", "--lr-grid", "1e-3,-1"], "lr_grid"),
    # the follow-ups (issue 70 item 8): one line, no OUT, before any job or token
    (["lm-sweep", "--out", "{ws}/o", "--data", "{ws}/nothing.txt"], "--data: {ws}/nothing.txt does not exist"),
    (["lm-sweep", "--out", "{ws}/o", "--mechanism", "--reference", "{ws}/nothing"], "--mechanism needs --diagnostics"),
    (["lm-sweep", "--out", "{ws}/o", "--mechanism", "--reference", "{root}/docs/results/lm-sweep-v2", "--diagnostics",
      "{ws}"], "no finished v1-diagnostic"),
    (["retrieval", "--out", "{ws}/o", "--longer", "1200", "--reference", "{ws}/nothing"], "no diagnostic.json there"),
    (["retrieval", "--out", "{ws}/o", "--mechanism", "--longer", "1200", "--reference",
      "{root}/docs/results/retrieval-diagnostic", "--longer-reference", "{root}/docs/results/retrieval-longer"],
     "the arms are read at 2400 steps"),
    (["retrieval", "--out", "{ws}/o", "--mechanism", "--longer", "2400", "--reference",
      "{root}/docs/results/retrieval-diagnostic", "--longer-reference", "{root}/docs/results/retrieval-longer"],
     "needs the arms' finished 600-step run first"),
    (["retrieval", "--out", "{ws}/o", "--longer", "1200,2400", "--rounding-check", "avx2", "--reference",
      "{root}/docs/results/retrieval-diagnostic"], "no re-reading there"),
    (["retrieval", "--out", "{ws}/o", "--protocol", "4", "--rounding-check", "avx2"],
     "no protocol version 4 there"),
    (["retrieval", "--out", "{ws}/o", "--protocol", "4", "--rounding-check", "avx2", "--quick"],
     "--quick does not go with --protocol 4 --rounding-check"),
    (["retrieval", "--out", "{ws}/o", "--protocol", "4", "--lr-grid", "1e-3,2e-3"], "--lr-grid does not go with"),
    (["retrieval", "--out", "{ws}/o", "--protocol", "3"], "invalid choice: 3"),
    (["lm-sweep", "--out", "{ws}/o", "--steps", "10", "--warmup-steps", "10"], "warmup_steps"),
    (["report", "{ws}/nothing", "--lm-sweep", "{ws}/nothing"], "nothing"),
    # --- every option that takes a study's output: a file of the wrong shape, named with what it lacks (issue 57)
    (["report", "{ws}/run", "--retrieval", "{ws}/list_study", "--out", "{ws}/o"],
     "--retrieval: {ws}/list_study/results.json is not a retrieval result: a JSON list, not an object"),
    (["report", "{ws}/run", "--retrieval", "{ws}/thin_study", "--out", "{ws}/o"],
     "--retrieval: {ws}/thin_study/results.json is not a retrieval result: it lacks \"variants\""),
    (["report", "{ws}/run", "--lm-sweep", "{ws}/other_study", "--out", "{ws}/o"],
     "--lm-sweep: {ws}/other_study/sweep.json is not a lm-sweep result: its \"benchmark\" is"),
    (["demo", "--lm-sweep", "{ws}/list_study", "--out", "{ws}/o"],
     "--lm-sweep: {ws}/list_study/sweep.json is not a lm-sweep result"),
    (["lm-sweep", "--rounding-of", "{ws}/list_study", "--cpu-code-path", "avx2", "--out", "{ws}/o"],
     "--rounding-of: {ws}/list_study/sweep.json is not a lm-sweep result"),
    (["lm-sweep", "--rounding-partial", "{ws}/list_study", "--out", "{ws}/o"],
     "{ws}/list_study/lm-jobs.jsonl is not a job journal"),
    (["retrieval", "--sweep-width", "32,64", "--reuse-jobs", "{ws}/list_study/results.json", "--out", "{ws}/o"],
     "{ws}/list_study/results.json is not a job journal"),
    (["demo", "--out", "{ws}/o", "--init-from", "{ws}/nothing"], "not a directory"),
    (["demo", "--out", "{ws}/o", "--init-from", "{ws}/plain", "--retrieval-seeds", "2"], "--retrieval-seeds"),
    # --- text that is not UTF-8: every text flag (named by the parser) and every text file (the flag and the file)
    (["generate", "--run", "{ws}/run", "--prompt", f"In the {BAD}\udcfe beginning"],
     "argument --prompt: not valid UTF-8 text (byte 0xff at character 8)"),
    (["generate", "--run", "{ws}/run", "--prompt", "a", "--prompt", f"b{BAD}"], "argument --prompt: not valid"),
    (["generate", "--run", "{ws}/run", "--prompt", "In the", "--stop", BAD], "argument --stop: not valid UTF-8"),
    (["generate", "--run", "{ws}/run", "--prompt", "In", "--tokenizer", "{ws}/latin1_tok.json"],
     "--tokenizer: {ws}/latin1_tok.json is not UTF-8 text"),
    (["generate", "--checkpoint", "{ws}/tok_latin1", "--prompt", "In"], "tokenizer.json is not UTF-8 text"),
    (["generate", "--checkpoint", "{ws}/chat_latin1", "--chat", "--prompt", "In"],
     "--chat: {ws}/chat_latin1/chat_template.jinja is not UTF-8 text"),
    (["generate", "--checkpoint", "{ws}/tokcfg_latin1", "--prompt", "In"],
     "--checkpoint: {ws}/tokcfg_latin1/tokenizer_config.json is not UTF-8 text"),
    (["train", "--config", "{ws}/latin1.toml", "--out", "{ws}/new"], "--config: {ws}/latin1.toml is not UTF-8 text"),
    (["demo", "--config", "{ws}/latin1.toml", "--out", "{ws}/o"], "--config: {ws}/latin1.toml is not UTF-8 text"),
    ([*TRAIN, "--out", "{ws}/new", "--data.sources", f'["{BAD}.txt"]'], "argument --data.sources: not valid UTF-8"),
    ([*TRAIN, "--out", "{ws}/new", "--model.attention", f"diff_v{BAD}"], "argument --model.attention: not valid"),
    ([*TRAIN, "--out", "{ws}/new", "--train.lora_base", f"me/{BAD}"], "argument --train.lora_base: not valid"),
    *[([*TRAIN, "--out", "{ws}/new", "--data.sources", f'["{{ws}}/{src}"]'],
       f"data.sources: {{ws}}/{file} is not UTF-8 text")
      for src, file in [("latin1.txt", "latin1.txt"), ("latin1.jsonl", "latin1.jsonl"),
                        ("latin1_dir", "latin1_dir/a.txt")]],
    ([*TRAIN, "--out", "{ws}/new", "--data.tokenizer", "{ws}/latin1_tok.json"],
     "data.tokenizer: {ws}/latin1_tok.json is not UTF-8 text"),
    ([*TRAIN, "--out", "{ws}/new", "--init-from", "{ws}/tok_latin1"], "--init-from {ws}/tok_latin1: "),
    (["convert", "--from-hf", "{ws}/hf_chat_latin1", "--out", "{ws}/o"],
     "--from-hf: {ws}/hf_chat_latin1/chat_template.jinja is not UTF-8 text"),
    (["convert", "--to-hf", "{ws}/tok_latin1", "--out", "{ws}/o"], "--to-hf: {ws}/tok_latin1/tokenizer.json is not"),
    (["convert", "--to-hf", "{ws}/run", "--out", "{ws}/o", "--base-model", f"me/m{BAD}"],
     "argument --base-model: not valid UTF-8"),
    (["convert", "--to-hf", "{ws}/run", "--out", "{ws}/o", "--license", f"mit{BAD}"], "argument --license: not valid"),
    (["lm-eval", "--model", "{ws}/run", "--tasks", f"kjv_cloze,{BAD}"], "argument --tasks: not valid UTF-8"),
    (["lm-eval", "--model", "{ws}/run", "--include-path", "{ws}/tasks"],
     "--include-path: {ws}/tasks/my_task.yaml is not UTF-8 text"),
    # --- the model card's metadata and the LoRA base -------------------------------------------------------------
    (["convert", "--to-hf", "{ws}/run", "--out", "{ws}/o", "--license", "MIT License"], "--license 'MIT License'"),
    (["convert", "--to-hf", "{ws}/run", "--out", "{ws}/o", "--base-model", "a b"], "--base-model 'a b'"),
    (["convert", "--from-hf", "{ws}/hf_heads0", "--out", "{ws}/o", "--license", "mit"], "--to-hf only"),
    ([*TRAIN, "--out", "{ws}/new", "--train.lora_base", " me/m"], "train.lora_base"),
]


def test_the_table_is_large():
    assert len(CASES) >= 100


@pytest.mark.parametrize("argv,text", CASES, ids=[" ".join(a[:3] + a[-2:]) for a, _ in CASES])
def test_bad_input_is_one_line_and_changes_nothing(ws, capsys, monkeypatch, argv, text):
    monkeypatch.delenv("DIFFTRANSFORMER_DEBUG", raising=False)
    argv = [a.replace("{ws}", str(ws)).replace("{root}", str(ROOT)) for a in argv]
    before = snapshot(ws)
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # the parser's own refusals (a flag's type) exit from inside argparse
        rc = e.code
    assert rc == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    command = argv[0]
    assert len(lines) == 1 and lines[0].startswith(f"difftransformer {command}: error: "), out.err
    assert text.replace("{ws}", str(ws)) in lines[0], lines[0]
    assert "Traceback" not in out.err + out.out
    assert snapshot(ws) == before
    assert not (ws / "new").exists() and not (ws / "o").exists()


def test_non_utf8_bytes_on_a_real_command_line_are_one_line(ws):
    """The issue's command, with the real bytes in argv (no shell, no in-process shortcut): one error line."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    env.pop("DIFFTRANSFORMER_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "difftransformer", "generate", "--run", str(ws / "run"), "--prompt",
                        b"In the \xff\xfe beginning"], capture_output=True, env=env, timeout=300)
    err = r.stderr.decode("utf-8", "replace").strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert err[0].startswith("difftransformer generate: error: argument --prompt: not valid UTF-8 text (byte 0xff")
    assert r.stdout == b""
