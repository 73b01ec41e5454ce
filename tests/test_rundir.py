"""The run directory module: metrics parsing, directory kinds, checkpoint choice, tokenizer checks."""

from __future__ import annotations

import json

import pytest

from difftransformer import rundir
from difftransformer.model.transformer import DiffTransformerLM


def write_lines(run, *lines: str) -> None:
    run.mkdir(parents=True, exist_ok=True)
    rundir.metrics_path(run).write_text("".join(lines))


def test_cut_metrics_line_is_skipped_by_every_reader(tmp_path):
    run = tmp_path / "run"
    write_lines(run, json.dumps({"step": 5, "loss": 3.0, "grad_norm": 1.0, "tokens_per_s": 100.0}) + "\n",
                json.dumps({"step": 5, "val_loss": 2.5, rundir.LAMBDA_V1: [0.2, 0.3]}) + "\n",
                '{"step": 10, "loss": 2.')  # a kill cut the last line
    assert [r["step"] for r in rundir.read_metric_records(run)] == [5, 5]
    m = rundir.read_metrics(run)
    assert m["step"] == [5] and m["loss"] == [3.0] and m["val_loss"] == [2.5] and m["tokens_per_s"] == [100.0]
    assert m["lambda"] == {"name": rundir.LAMBDA_V1, "step": 5, "values": [0.2, 0.3]}
    # on resume only the cut line goes (the file is never rewritten: the good lines stay byte for byte), and a
    # resume marker makes readers drop the records past the checkpoint
    good = rundir.metrics_path(run).read_text().rsplit("\n", 1)[0] + "\n"
    rundir.truncate_metrics_after(run, 5)
    text = rundir.metrics_path(run).read_text()
    assert text.startswith(good) and text.count("\n") == 3
    assert [r["step"] for r in rundir.read_metric_records(run)] == [5, 5]
    rundir.truncate_metrics_after(run, 4)
    assert rundir.metrics_path(run).read_text().startswith(good)
    assert rundir.read_metric_records(run) == []


def test_metrics_logger_resumes_over_a_cut_line(tmp_path):
    from difftransformer.train.metrics import MetricsLogger

    write_lines(tmp_path, json.dumps({"step": 5, "loss": 3.0}) + "\n", '{"step": 10, "lo')
    log = MetricsLogger(tmp_path, tensorboard=False, resume_step=5)
    log.log({"step": 10, "loss": 2.0})
    assert [r["step"] for r in rundir.read_metric_records(tmp_path)] == [5, 10]


def test_read_metrics_without_a_run():
    empty = rundir.read_metrics(None)
    assert empty["step"] == [] and empty["lambda"] == {}


def test_lambda_keys_are_the_variants_own():
    assert rundir.LAMBDA_KEYS == (rundir.LAMBDA_V1, rundir.LAMBDA_V2) == ("lambda_v1", "lambda_v2_mean_sigmoid")


def test_dir_kind(tmp_path, tiny_config):
    assert rundir.dir_kind(tmp_path / "missing") is None
    assert rundir.dir_kind(tmp_path) is None
    model_dir = DiffTransformerLM(tiny_config()).save_pretrained(tmp_path / "m")
    assert rundir.dir_kind(model_dir) == "model"
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert rundir.dir_kind(hf) == "hf"
    run = tmp_path / "run"
    rundir.checkpoints_dir(run).mkdir(parents=True)
    assert rundir.dir_kind(run) == "run"
    run2 = tmp_path / "run2"
    run2.mkdir()
    rundir.write_run_config(run2, "{}")
    assert rundir.dir_kind(run2) == "run" and rundir.read_run_config(run2) == {}


def test_checkpoint_choice(tmp_path, tiny_config):
    model = DiffTransformerLM(tiny_config("diff_v2"))
    run = tmp_path / "run"
    for step in (5, 20, 100):
        model.save_pretrained(rundir.step_dir(run, step))
    (rundir.checkpoints_dir(run) / "step_junk").mkdir()  # not a step: ignored
    (rundir.checkpoints_dir(run) / ".step_00000200.tmp-x").mkdir()  # a killed write
    assert [p.name for p in rundir.list_checkpoints(run)] == ["step_00000005", "step_00000020", "step_00000100"]
    assert [p.name for p in rundir.leftover_temp_checkpoints(run)] == [".step_00000200.tmp-x"]
    (rundir.step_dir(run, 100) / "manifest.json").unlink()  # incomplete
    warnings = []
    assert rundir.newest_complete_checkpoint(run, warn=warnings.append) == rundir.step_dir(run, 20)
    assert len(warnings) == 1 and "step_00000100" in warnings[0]
    assert rundir.resolve_checkpoint(run) == rundir.step_dir(run, 20)
    assert rundir.run_of_checkpoint(rundir.step_dir(run, 20)) == run
    assert rundir.run_of_checkpoint(tmp_path / "m") is None


def test_from_pretrained_refuses_a_run_directory(tmp_path, tiny_config):
    run = tmp_path / "run"
    DiffTransformerLM(tiny_config()).save_pretrained(rundir.step_dir(run, 1))
    with pytest.raises(FileNotFoundError, match="resolve_checkpoint"):
        DiffTransformerLM.from_pretrained(run)


def test_tokenizer_lookup_and_size_check(tmp_path):
    from difftransformer.data.tokenizer import train_tokenizer

    tok = train_tokenizer(["in the beginning was the word"] * 20, vocab_size=300)
    run = tmp_path / "run"
    ckpt = rundir.step_dir(run, 1)
    ckpt.mkdir(parents=True)
    tok.save(str(rundir.tokenizer_path(run)))
    assert rundir.find_tokenizer(ckpt, run) == rundir.tokenizer_path(run)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        rundir.find_tokenizer(ckpt)
    n = tok.get_vocab_size()
    assert rundir.read_tokenizer(rundir.tokenizer_path(run), n).get_vocab_size() == n
    with pytest.raises(ValueError, match="does not belong"):
        rundir.read_tokenizer(rundir.tokenizer_path(run), n - 1)


def test_resume_cuts_only_the_unfinished_line_of_a_long_metrics_file(tmp_path):
    # 66 good records (the run lost all of them when its metrics were rewritten) and a line cut mid-way
    good = "".join(json.dumps({"step": s, "loss": 1.0 / s, "lr": 1e-3, "tokens_per_s": 1234.5}) + "\n"
                   for s in range(1, 67))
    write_lines(tmp_path, good, '{"step": 67, "loss": 0.0' + " " * 5000)  # a cut line longer than one read block
    rundir.truncate_metrics_after(tmp_path, 60)
    text = rundir.metrics_path(tmp_path).read_text()
    assert text == good + json.dumps({rundir.RESUMED_KEY: 60}) + "\n"
    assert [r["step"] for r in rundir.read_metric_records(tmp_path)] == list(range(1, 61))


def test_a_variant_registered_later_has_its_lambda_read(tmp_path):
    from difftransformer.model import variants
    from difftransformer.model.attention import BaselineAttention

    class Toy(BaselineAttention):
        lambda_summary_name = "lambda_toy"

    write_lines(tmp_path, json.dumps({"step": 3, "val_loss": 2.0, "lambda_toy": [0.5]}) + "\n")
    assert rundir.read_metrics(tmp_path)["lambda"] == {}
    with variants.registered(variants.Variant("toy", label="Toy", short="toy", colour="#000000", cls=Toy)):
        assert rundir.lambda_keys()[-1] == "lambda_toy"
        assert rundir.read_metrics(tmp_path)["lambda"] == {"name": "lambda_toy", "step": 3, "values": [0.5]}
