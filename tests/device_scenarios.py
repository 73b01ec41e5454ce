"""The device checks: every path that runs on ``--device cuda``, run on the fake GPU (``tests/fakegpu.py``).

Run in a child process by ``tests/test_device_placement.py`` (the fake GPU is registered for the whole process):
``python tests/device_scenarios.py GROUP`` prints one JSON line per scenario, ``{"scenario", "ok", "error",
"seconds"}``, the error being the traceback's last lines. Each scenario runs the package's own function with the
model (or the job's device) on the fake GPU, to its end, and checks that it ran there (the parameters are fake-GPU
tensors) and, where the function is deterministic, that its result equals the same call on the CPU: the fake GPU
runs the CPU's kernels, so a difference means the path computed something else on the GPU.

Groups: ``analyses`` (each of the seven analyses against the CPU; the report's measuring loop ``evaluate_runs``,
which records an analysis's error instead of raising; ``TopAbs``), ``studies`` (the retrieval benchmark's job
function, which the width sweep runs too; the lm-sweep's), ``train`` (``difftransformer train`` on the fake GPU,
its run loaded by ``load_for_eval`` onto it, generation and the lm-eval adapter from it; the ``eval``, ``report``
and ``lm-eval`` commands with ``--device`` naming it), ``known-answers`` (the
check fails where it must: bdc804a's ``TopAbs``, a CPU input, a generator of the other device).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakegpu import FakeGpuTensor, fake_gpu, register

SCENARIOS: dict[str, dict[str, Callable[[], None]]] = {"known-answers": {}, "analyses": {}, "studies": {},
                                                        "train": {}}
MISMATCH = "Expected all tensors to be on the same device"

# bdc804a's TopAbs, verbatim (issue 48: ``lm-sweep --device cuda`` died on it): the known answer of both checks
OLD_TOPABS = '''
class TopAbs:
    """Streaming k-th largest |x| (k <= max(RANKS)) and an exact median over everything seen."""

    def __init__(self) -> None:
        self.top = torch.empty(0, dtype=torch.float64)
        self.values: list[torch.Tensor] = []

    def add(self, x: torch.Tensor) -> None:
        v = x.detach().abs().flatten().to(torch.float64)
        v = v[torch.isfinite(v)]  # the causal mask's -inf entries are not logits
        if v.numel() == 0:
            return
        both = torch.cat((self.top, v.topk(min(max(RANKS), v.numel())).values))
        self.top = both.topk(min(max(RANKS), both.numel())).values
        self.values.append(v.to(torch.float32))

    def result(self) -> dict[str, float]:
        if not self.values:
            raise ValueError("no finite values to rank")
        out = {f"top{k}": float(self.top[k - 1]) for k in RANKS if k <= self.top.numel()}
        out["median"] = float(torch.cat(self.values).median())
        return out
'''


def scenario(group: str, name: str):
    def add(fn):
        SCENARIOS[group][name] = fn
        return fn
    return add


def on_cpu():
    """The CPU reference runs SDPA's math kernel, the one SDPA picks on the fake GPU (a device without fused
    attention kernels): a forward pass then does the same arithmetic on both, and an analysis's result is equal
    bitwise. (Training is not: a backward pass and the optimizer take other kernels on a non-CPU device, e.g.
    SiLU's backward decomposed, per-tensor gradient norms; ``REL`` bounds those differences.)"""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.MATH)


def on_fake_gpu(model: torch.nn.Module) -> None:
    bad = [n for n, p in model.named_parameters() if not isinstance(p, FakeGpuTensor)]
    assert not bad, f"parameters not on the fake GPU: {bad[:3]}"


# A trained job's floats on the fake GPU and on the CPU (float32, a few steps; other backward kernels, see on_cpu).
# Measured 2026-12-02, largest relative difference: the lm-sweep job's diff_v2 outliers.hidden_state_median, 9.8e-7
# before the stacked q/k/v projection and 1.5e-6 after it (it moves the trajectory, not the devices apart: one
# stacked linear's gradients are bitwise equal on both). A device mix-up is an order-1 difference, far above this.
REL = 1e-5


def same(cpu: Any, gpu: Any, where: str, rel: float = 0.0, path: str = "") -> None:
    """``gpu`` equals ``cpu`` (floats within ``rel`` relative, bitwise for 0; everything else exactly) and holds no
    tensor; else an AssertionError naming the first key that differs."""
    assert not isinstance(gpu, torch.Tensor), f"{where}: a tensor in the result at {path or 'the top'}"
    if isinstance(cpu, dict) and isinstance(gpu, dict):
        assert cpu.keys() == gpu.keys(), f"{where}: keys {sorted(cpu)} on the CPU, {sorted(gpu)} on the fake GPU"
        for k in cpu:
            same(cpu[k], gpu[k], where, rel, f"{path}.{k}")
    elif isinstance(cpu, (list, tuple)) and isinstance(gpu, (list, tuple)) and len(cpu) == len(gpu):
        for i, (a, b) in enumerate(zip(cpu, gpu)):
            same(a, b, where, rel, f"{path}[{i}]")
    else:
        both_float = isinstance(cpu, float) and isinstance(gpu, float)
        equal = cpu == gpu or (both_float and (math.isclose(cpu, gpu, rel_tol=rel) or (cpu != cpu and gpu != gpu)))
        assert equal, f"{where}: {path or 'the result'} is {gpu!r} on the fake GPU, {cpu!r} on the CPU"


_TMP: list[tempfile.TemporaryDirectory] = []  # made by work(), removed when the process ends


def work(name: str) -> Path:
    """``data`` (the tiny preset's, shared) or ``run`` (trained by the scenario ``train``) in this run's folder."""
    if not _TMP:
        _TMP.append(tempfile.TemporaryDirectory())
    return Path(_TMP[0].name) / name


# ---------------------------------------------------------------------------------------------- known answers
def raises(fn: Callable[[], Any], text: str) -> str:
    """``fn()`` raises an error holding ``text``; its message."""
    try:
        fn()
    except Exception as e:  # any kind: the check is the message
        assert text in str(e), f"raised {type(e).__name__}: {e}, not {text!r}"
        return str(e)
    raise AssertionError(f"no error holding {text!r}")


@scenario("known-answers", "old-topabs")
def old_topabs() -> None:
    """bdc804a's TopAbs fails on the fake GPU where it failed on the H100 (its CPU running top meets the values in
    torch.cat), alone and inside ``outliers.collect`` (the lm-sweep job's call); it runs on the CPU."""
    from difftransformer.eval import outliers
    from difftransformer.model.config import ModelConfig
    from difftransformer.model.transformer import DiffTransformerLM

    ns: dict[str, Any] = {"torch": torch, "RANKS": outliers.RANKS}
    exec(OLD_TOPABS, ns)
    old = ns["TopAbs"]
    x = torch.randn(4, 30)
    ok = old()
    ok.add(x)
    assert ok.result()["top1"] == float(x.abs().max())
    model = DiffTransformerLM(ModelConfig.from_flavour("tiny", attention="diff_v2")).eval()
    windows = torch.randint(0, 64, (2, 16))
    real = outliers.TopAbs
    try:
        with fake_gpu() as dev:
            raises(lambda: old().add(x.to(dev)), MISMATCH + ", but found at least two devices, fakegpu:0 and cpu")
            model.to(dev)
            outliers.TopAbs = old
            raises(lambda: outliers.collect(model, windows.to(dev)), f"{MISMATCH}, but found at least two devices")
    finally:
        outliers.TopAbs = real


@scenario("known-answers", "device-rules")
def device_rules() -> None:
    """What CUDA refuses is refused (a CPU input, a CPU generator for a GPU draw and the reverse, numpy of a GPU
    tensor), what it allows is allowed (a 0-dim CPU tensor in a pointwise op, CPU indices, copies, reads), and the
    values are the CPU's: a forward pass on the fake GPU equals the CPU's bitwise (SDPA's math kernel on both)."""
    import numpy as np

    from difftransformer.model.config import ModelConfig
    from difftransformer.model.transformer import DiffTransformerLM

    model = DiffTransformerLM(ModelConfig.from_flavour("tiny", attention="diff_v1")).eval()
    x = torch.randint(0, 64, (2, 12))
    with on_cpu(), torch.no_grad():
        want = model(x).logits
    with fake_gpu() as dev, torch.no_grad():
        model.to(dev)
        on_fake_gpu(model)
        got = model(x.to(dev)).logits
        assert isinstance(got, FakeGpuTensor) and got.device == dev and torch.equal(got.cpu(), want)
        raises(lambda: model(x), MISMATCH)
        raises(lambda: torch.cat((got, want)), MISMATCH)
        raises(lambda: got[0] + want[0], MISMATCH)
        g = torch.Generator(device=dev).manual_seed(0)
        raises(lambda: torch.rand(3, generator=g), "Expected a 'cpu' device type for generator")
        raises(lambda: torch.rand(3, device=dev, generator=torch.Generator().manual_seed(0)),
               "Expected a 'fakegpu' device type for generator")
        raises(lambda: np.asarray(got), "can't convert fakegpu:0 device type tensor to numpy")
        y = got + torch.tensor(2.0) * torch.ones((), device=dev)  # a CPU scalar in a pointwise op: allowed
        assert torch.equal(y.cpu(), want + 2.0)
        assert torch.equal(got[torch.tensor([1, 0])].cpu(), want[[1, 0]])  # CPU indices: allowed
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist() and float(got[0, 0, 0]) == float(want[0, 0, 0])
        z = torch.zeros(3, device=dev)
        z[1:] = torch.ones(2)  # a copy from the host: allowed
        assert z.tolist() == [0.0, 1.0, 1.0] and isinstance(z, FakeGpuTensor)


# ---------------------------------------------------------------------------------------------- the analyses
def _eval_models() -> dict[str, Any]:
    """One untrained tiny model per variant with a BPE tokenizer of the embedded corpus, as ``EvalModel``s whose
    run config is a tiny run's (max_chars cut, so that ``positions`` finds long unseen texts; small needles)."""
    from difftransformer.data import corpus
    from difftransformer.data.tokenizer import train_tokenizer
    from difftransformer.eval.loading import EvalModel
    from difftransformer.model.config import ModelConfig
    from difftransformer.model.transformer import DiffTransformerLM

    data = {"sources": ["kjv"], "max_chars": 200000, "val_fraction": 0.05, "seq_len": 64, "retrieval_share": 0.3,
            "retrieval_n_needles": 2, "retrieval_n_queries": 1, "retrieval_digits": 2}
    train_docs, _ = corpus.split_documents(corpus.embedded_corpus("kjv"), 0.05)
    tok = train_tokenizer(corpus.truncate(train_docs, 200000), 512)
    evs = {}
    for i, variant in enumerate(("baseline", "diff_v1", "diff_v2")):
        torch.manual_seed(i)
        cfg = ModelConfig.from_flavour("tiny", attention=variant, vocab_size=tok.get_vocab_size(), max_seq_len=128)
        evs[variant] = EvalModel(variant, Path("untrained"), Path("untrained"), DiffTransformerLM(cfg).eval(), tok,
                                 64, None, 0, {"data": data, "train": {"seed": 0}})
    return evs


def _to(ev, device):
    return dataclasses.replace(ev, model=ev.model.to(device))


def _small(spec) -> Any:
    """The spec's quick settings cut to a few forward passes (the code paths are the same)."""
    small = {"needles": dict(lengths=(0.5, 1.0), depths=(0.0, 1.0), samples=2), "noise": dict(samples=3),
             "outliers": dict(sequences=2), "quantized": dict(sequences=2, samples=2, widths=(8, 4)),
             "positions": dict(sequences=2), "icl": dict(samples=4, orders=2), "attnmap": {}}[spec.name]
    return dataclasses.replace(spec.quick, **small)


def _analysis(name: str) -> Callable[[], None]:
    def run() -> None:
        from difftransformer.eval.analyses import ANALYSES
        from difftransformer.eval.spec import by_name

        spec = by_name(ANALYSES, name)
        evs = EVS()
        arg = list(evs.values()) if spec.multi_run else evs["diff_v2"]
        with on_cpu():
            cpu = spec.run(arg, _small(spec), 0, progress=False)
        with fake_gpu() as dev:
            gpu_arg = [_to(e, dev) for e in arg] if spec.multi_run else _to(arg, dev)
            for e in gpu_arg if spec.multi_run else [gpu_arg]:
                on_fake_gpu(e.model)
            gpu = spec.run(gpu_arg, _small(spec), 0, progress=False)
        same(cpu, gpu, name)
    return run


_EVS: dict[str, Any] = {}


def EVS() -> dict[str, Any]:
    if not _EVS:
        _EVS.update(_eval_models())
    return {k: dataclasses.replace(v, model=v.model.to("cpu")) for k, v in _EVS.items()}


for _name in ("needles", "noise", "outliers", "quantized", "positions", "icl", "attnmap"):
    scenario("analyses", _name)(_analysis(_name))


@scenario("analyses", "report")
def report_measuring() -> None:
    """The report's measuring loop (``evaluate_runs`` records an analysis's RuntimeError on the page instead of
    raising: here none may be recorded) and its multi-run analyses, at the report's quick settings."""
    from difftransformer.eval.analyses import MULTI_RUN
    from difftransformer.report import runner
    from difftransformer.report.results import Settings

    settings = Settings(quick=True, seed=0, progress=False)
    evs = EVS()
    real = runner.training_summary, runner.PER_RUN
    runner.training_summary = lambda ev: {}  # an untrained model has no run directory (not measuring code)
    runner.PER_RUN = tuple(dataclasses.replace(s, quick=_small(s)) for s in runner.PER_RUN)  # seconds, not minutes
    try:
        with fake_gpu() as dev:
            gpu = [_to(evs["baseline"], dev)]
            runs = runner.evaluate_runs(gpu, settings)
    finally:
        runner.training_summary, runner.PER_RUN = real
    errors = {f"{r.ev.label} {k}": v for r in runs for k, v in r.errors.items()}
    assert not errors, f"the report recorded errors: {errors}"
    assert [sorted(r.results) for r in runs] == [sorted(s.name for s in runner.PER_RUN)]
    with fake_gpu() as dev:
        for spec in MULTI_RUN:
            runner.run_analysis(spec, [_to(e, dev) for e in evs.values()], settings)


@scenario("analyses", "topabs")
def topabs() -> None:
    """``TopAbs`` fed the model's values (``retrieval/evaluate.py`` and ``lmsweep/job.py`` use it directly)."""
    from difftransformer.eval.outliers import TopAbs

    x = torch.randn(3, 50)
    cpu = TopAbs()
    cpu.add(x)
    with fake_gpu() as dev:
        gpu = TopAbs()
        gpu.add(x.to(dev))
        gpu.add(x.to(dev) * 2)
        res = gpu.result()
    cpu.add(x * 2)
    same(cpu.result(), res, "TopAbs")


def where(e: BaseException) -> str:
    """The error and the frames of the package and of this file that led to it (not torch's, not the fake GPU's)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if "difftransformer" in f.filename or f.filename == __file__]
    lines = [f"  {Path(f.filename).name}:{f.lineno} in {f.name}: {f.line}" for f in frames[-8:]]
    return "\n".join([*lines, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"])


def main(argv: list[str]) -> int:
    load()
    register()  # before any backward: autograd sizes its per-device queues at the first one
    torch.set_num_threads(1)
    names = [(g, n) for g in argv for n in SCENARIOS[g]] if argv else [(g, n) for g in SCENARIOS for n in SCENARIOS[g]]
    for group, name in names:
        t0 = time.perf_counter()
        try:
            SCENARIOS[group][name]()
            err = None
        except Exception as e:  # the scenario's failure, reported with where it happened; the others still run
            err = where(e)
        print(json.dumps({"scenario": name, "group": group, "ok": err is None, "error": err,
                          "seconds": round(time.perf_counter() - t0, 2)}), flush=True)
    return 0


def load() -> None:
    """Register the scenarios of the studies, training and generation (``device_scenarios_jobs.py``)."""
    import device_scenarios_jobs  # noqa: F401


if __name__ == "__main__":  # run as a script: the scenarios register in the module, not in this __main__ copy
    import device_scenarios

    device_scenarios.load()
    sys.exit(device_scenarios.main(sys.argv[1:]))
