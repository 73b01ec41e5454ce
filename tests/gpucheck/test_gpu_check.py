"""`make gpu-check` (``gpucheck/gpu_check.py``, ``gpucheck/gpu_plan.py``, ``gpucheck/gpu_tests.py``, ``gpucheck/cuda_smoke.py``,
``gpucheck/small_jobs.py``, ``gpucheck/gpu_candidates.py``) without a GPU (the whole dry plan run once on the CPU at
toy size: test_gpu_check_dry.py, in the parallel pass, as it times nothing against the clock): the
GPU plan's commands parsed by the commands they call, its limits against the H100 times and the budget, the kill of
a step over its limit (its children too), a sharded test run stopped mid-way, the smoke's statuses, the candidates
step against the tuner. The readers and the summary on text: test_gpu_summary.py. The one GPU run must not fail for
a plumbing bug."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from difftransformer.gpucheck import cuda_smoke, gpu_check
from difftransformer.gpucheck import gpu_candidates, gpu_plan, gpu_readers, gpu_summary, small_jobs
from difftransformer.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
ENV = gpu_readers.ENV_PREFIX + json.dumps({"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0",
                                           "cuda_available": True, "device": "NVIDIA H200", "capability": [9, 0],
                                           "cpus": 16})


def result(name: str, kind: str, text: str) -> dict:
    return {"name": name, "kind": kind, "status": "ok", "rc": 0, "seconds": 1.0, "limit_s": 10.0,
            "command": "python3 -m x", "output": f"{name}.txt", "text": text}


# ---------------------------------------------------------------------------------------------- running steps
def _step(name: str, code: str, limit: float = 20) -> gpu_check.Step:
    """A step running ``code`` (``python -m timeit -n 1 -r 1 CODE`` runs it once)."""
    return gpu_check.Step(name, "tests", ("timeit", "-n", "1", "-r", "1", code), limit)


def test_a_step_over_its_limit_is_killed_with_its_children_and_keeps_its_output(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys; print('first row', flush=True); subprocess.run([sys.executable, '-c', "
            f"\"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)\"])")
    t0 = time.monotonic()
    r = gpu_check.run_step(_step("slow", code), tmp_path, limit_s=4)
    assert r["status"] == "timeout" and time.monotonic() - t0 < 20
    assert "first row" in r["text"] and "# gpu-check: slow timeout" in r["text"]
    assert (tmp_path / "slow.txt").read_text() == r["text"]
    pid = int(pid_file.read_text())
    for _ in range(50):  # the grandchild (a process the step started) is gone with the step's process group
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's grandchild {pid} outlived the time limit")


def test_a_failing_step_is_recorded_and_the_next_one_runs(tmp_path):
    steps = [_step("fails", "import os; os._exit(3)"), _step("runs", "print('ran')")]
    r = gpu_check.run_steps(steps, tmp_path, budget_s=60, log=lambda _: None)
    assert [(x["name"], x["status"], x["rc"]) for x in r] == [("fails", "failed", 3), ("runs", "ok", 0)]
    assert "ran" in r[1]["text"] and r[1]["command"].startswith("PYTHONPATH=src python3 -m timeit")


def test_each_step_gets_at_most_what_is_left_of_the_budget(tmp_path, monkeypatch):
    now = [0.0]
    seen = []

    def fake_run_step(step, out_dir, limit_s, python=sys.executable):
        seen.append((step.name, limit_s))
        now[0] += limit_s if step.name != "quick" else 1.0  # "quick" ends at once, the others use their limit
        return {"name": step.name, "kind": step.kind, "status": "ok" if step.name == "quick" else "timeout",
                "seconds": min(limit_s, 1.0 if step.name == "quick" else limit_s)}

    monkeypatch.setattr(gpu_check, "run_step", fake_run_step)
    steps = [gpu_check.Step(n, "tests", (), lim) for n, lim in (("quick", 30), ("a", 50), ("b", 100), ("c", 10))]
    r = gpu_check.run_steps(steps, tmp_path, budget_s=110, clock=lambda: now[0], log=lambda _: None)
    assert seen == [("quick", 30), ("a", 50), ("b", 59.0)]
    assert [x["status"] for x in r] == ["ok", "timeout", "timeout", "skipped"]


def test_a_sharded_test_run_stopped_by_its_limit_keeps_the_cases_it_got_to(tmp_path):
    """The tests step's runner stopped as a step over its limit is (SIGTERM to its process group, then KILL): it
    still prints the cases each shard got to. The toy file's cases 4 and 5 hang (after leaving a mark); the group is
    stopped once both marks are there."""
    (tmp_path / "test_toy.py").write_text(
        "import pathlib, time\nimport pytest\n\n@pytest.mark.parametrize('i', range(6))\ndef test_toy(i):\n"
        "    if i >= 4:\n        (pathlib.Path(__file__).parent / f'hangs{i}').touch()\n        time.sleep(120)\n"
        "    assert i != 1\n")
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", gpu_plan.TESTS, "--shards", "2", "--durations", "0",
                                 str(tmp_path / "test_toy.py")], stdout=out, stderr=subprocess.STDOUT,
                                env=gpu_check.child_env(), start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not ((tmp_path / "hangs4").exists() and (tmp_path / "hangs5").exists()):
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "out.txt").read_text()
                time.sleep(0.2)
        finally:
            gpu_check._stop(proc)  # TERM to the group, KILL 5 s later
    assert proc.returncode == 128 + 15  # it reported and left by itself, not killed
    got = gpu_readers.read_pytest((tmp_path / "out.txt").read_text())
    # shard 0 ran cases 0 (passed) and 2 (passed), hangs in 4; shard 1 ran 1 (failed) and 3 (passed), hangs in 5
    assert got["counts"] == {"passed": 3, "failed": 1} and not got["finished"] and got["unfinished"] == [0, 1]


# ---------------------------------------------------------------------------------------------- the plan
def _parse(step: gpu_check.Step) -> None:
    """Parse a step's command with the parser of the command it calls (a bad flag exits 2 here)."""
    module, *argv = step.args
    if module == "difftransformer":
        build_parser().parse_args(argv)
    elif argv[:1] == ["parts"]:
        gpu_check.build_parser().parse_args(argv)
        for part in step.parts:
            _parse(part)
    elif module == gpu_plan.SMALL_JOBS:
        small_jobs.build_parser().parse_args(argv)
    elif module == gpu_check.CANDIDATES:
        gpu_candidates.build_parser().parse_args(argv)
    elif module == gpu_plan.SMOKE:
        cuda_smoke.build_parser().parse_args(argv)
    elif module == gpu_plan.TESTS:
        assert all((ROOT / f).is_file() for f in argv if f.endswith(".py"))
    elif argv != ["env"]:
        pytest.fail(f"{step.name}: no parser for {module}")
    assert step.kind in gpu_readers.READERS or step.parts


def test_the_gpu_plan_parses_as_the_commands_it_calls_and_fits_the_slot():
    plan = gpu_check.gpu_plan()
    assert [s.name for s in plan] == ["env", "cuda-smoke", "candidates", "tests", "attention", "decode", "train",
                                      "small-jobs"]
    assert [p.name for s in plan for p in s.parts] == ["attention-3b", "attention-bench", "kernels-3b", "decode-sdpa",
                                                       "decode-triton", "train-bench", "train-3b"]
    for plan_ in (plan, gpu_check.dry_plan()):
        for s in plan_:
            _parse(s)
    # the budget: every limit at least MARGIN times its H100 time, all of them within the budget, which with the
    # run's start and summary is the 5-minute slot; the smoke at most a minute
    assert all(s.limit_s >= gpu_plan.MARGIN * s.basis_s > 0 for s in plan), [(s.name, s.limit_s / s.basis_s)
                                                                             for s in plan if s.basis_s]
    assert sum(s.limit_s for s in plan) <= gpu_plan.BUDGET_S <= 300 - 5
    assert next(s for s in plan if s.name == "cuda-smoke").limit_s <= 60
    # the module's table says each step's limit and basis
    table = {n: (float(lim), float(basis)) for n, lim, basis in
             re.findall(r"^(\S+)\s+(\d+) s\s+([\d.]+)\s", gpu_plan.__doc__, re.M)}
    assert {s.name: (s.limit_s, s.basis_s) for s in plan} == table
    assert f"add up to {sum(s.limit_s for s in plan):.0f} s" in " ".join(gpu_plan.__doc__.split())
    assert [s.name for s in gpu_check.dry_plan()] == [s.name for s in plan]
    assert gpu_check.dry_plan()[0].args == plan[0].args


def test_the_smokes_commands_parse_and_get_the_device_where_they_take_it(tmp_path):
    cmds = cuda_smoke.commands(tmp_path, "cuda")
    names = [n for n, _ in cmds]
    assert names[:4] == ["train-base", "train-v1", "train-v2", "generate"] and "generate-cuda-graph" in names
    assert {n for n in names if n.startswith("eval-")} == {f"eval-{a}" for a in cuda_smoke.ANALYSES}
    assert {"report", "retrieval", "retrieval-sweep", "lm-sweep", "demo", "bench-ops"} <= set(names)
    assert "generate-cuda-graph" not in [n for n, _ in cuda_smoke.commands(tmp_path, "cpu")]
    assert cuda_smoke.selected(cmds, ["generate"]) == {"generate", "train-v2"}  # --only: and the run it reads
    assert cuda_smoke.selected(cmds, ["eval-attnmap"]) == {"eval-attnmap", "train-base", "train-v1"}
    assert cuda_smoke.selected(cmds, None) == set(names)
    for name, argv in cmds:
        full, has = cuda_smoke.with_device(argv, "cuda")
        args = build_parser().parse_args(full)  # every toy command parses with the real parser
        if name.startswith("train"):
            assert "--train.device" in full and full[full.index("--train.device") + 1] == "cuda"
        elif has:
            assert args.device == "cuda", name
    for name in ("generate", "retrieval", "lm-sweep", "demo", "bench-ops"):  # these have the flag today
        assert cuda_smoke.with_device(dict(cmds)[name], "cuda")[1], name


def test_a_smoke_command_is_ok_failed_or_skipped(monkeypatch, capsys):
    import difftransformer.cli as cli

    def fake_main(argv):
        print("some output")
        if argv[0] == "boom":
            raise RuntimeError("Expected all tensors to be on the same device")
        if argv[0] == "extra":
            print("difftransformer lm-sweep: error: needs pip install 'difftransformer[corpus]'", file=sys.stderr)
            return 2
        return 0

    monkeypatch.setattr(cli, "main", fake_main)
    ok, boom, extra = (cuda_smoke.run_one(n, [n]) for n in ("ok", "boom", "extra"))
    assert ok["status"] == "ok" and not ok["reason"] and not ok["tail"]
    assert boom["status"] == "failed"
    assert boom["reason"] == "RuntimeError: Expected all tensors to be on the same device"
    assert "some output" in boom["tail"] and "Traceback" in boom["tail"]
    assert extra["status"] == "skipped" and "pip install" in extra["reason"]
    assert capsys.readouterr().out == ""  # each command's output is captured, not printed
    assert cuda_smoke.main(["--device", "cpu", "--only", "nope"]) == 2
    assert "--only nope: no such command" in capsys.readouterr().err


def test_bad_flags_are_one_line(capsys, tmp_path, monkeypatch):
    assert gpu_check.main(["run", "--dry-run", "--out", str(tmp_path), "--steps", "nope"]) == 2
    assert capsys.readouterr().err.strip().startswith("gpu-check: error: --steps nope: no such step; choose from")
    assert gpu_check.main(["run", "--budget", "0", "--out", str(tmp_path)]) == 2
    assert gpu_check.main(["parts", "env"]) == 2
    assert capsys.readouterr().err.strip().endswith("parts: step 'env' has no parts")
    assert small_jobs.main(["--device", "cpu", "--processes", "1"]) == 2
    assert "--processes takes counts >= 2" in capsys.readouterr().err
    from difftransformer.cli import main as cli_main

    for argv, says in ((["--shape", "nope"], "--shape 'nope' is not a model shape"),
                       (["--repeats", "0"], "--repeats must be a positive integer"),
                       (["--device", "cpu", "--dtype", "float32"], "set TRITON_INTERPRET=1")):
        if "TRITON_INTERPRET" in says:
            monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        assert cli_main(["bench", "kernels", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("difftransformer bench: error: ") and says in err[0], err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_the_check_stops_with_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "difftransformer.gpucheck.gpu_check", "run", "--out", str(tmp_path)],
                       capture_output=True, text=True, env=gpu_check.child_env(), timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert re.fullmatch(r"gpu-check needs a CUDA device: torch \S+: torch.cuda.is_available\(\) is False\n", p.stderr)


def test_a_small_job_process_that_fails_stops_its_group_with_the_reason():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"2 processes: not all reached the start .*nope"):
        small_jobs.processes_row("nope", 2, steps=1, warmup=0, device="cpu", timeout=60)
    assert time.monotonic() - t0 < 60  # the barrier broke at once, not at its timeout


# ---------------------------------------------------------------------------------------------- candidates and tests
def test_the_tests_step_runs_the_default_tiles_and_every_step_gets_the_skip_list(tmp_path):
    from difftransformer.kernels import triton_tuning

    tests = next(s for s in gpu_check.gpu_plan() if s.name == "tests")
    assert dict(tests.env) == {"DIFFTRANSFORMER_TRITON_TUNE": "0"}
    assert [s.name for s in gpu_check.dry_plan() if dict(s.env).get("DIFFTRANSFORMER_TRITON_TUNE")] == ["tests"]
    assert gpu_check.SKIP_ENV == triton_tuning.SKIP_ENV
    code = ("import os; print('tune', os.environ.get('DIFFTRANSFORMER_TRITON_TUNE')); "
            f"print('skip', os.environ[{gpu_check.SKIP_ENV!r}])")
    step = gpu_check.Step("envs", "tests", ("timeit", "-n", "1", "-r", "1", code), 20, tests.env)
    r = gpu_check.run_step(step, tmp_path, 20)
    assert "tune 0" in r["text"] and f"skip {tmp_path.resolve() / gpu_check.SKIP_FILE}" in r["text"]
    assert r["command"].startswith("DIFFTRANSFORMER_TRITON_TUNE=0 PYTHONPATH=src python3 -m timeit")
    plain = gpu_check.run_step(_step("plain", code), tmp_path, 20)
    assert "tune None" in plain["text"]


# Run in a fresh process with Triton's interpreter (this one may hold a triton imported without it): the plan for
# sm_90 and sm_80, the heads of each form, and candidates checked with the real launch, a broken one (the kernel
# given another lambda than the oracle) and one that fails as the H200's compiler did.
PROBE = r"""
import json, sys
import torch
from difftransformer.gpucheck import gpu_candidates as gc
from difftransformer.model import variants
from difftransformer.kernels import triton_tuning as tuning
from difftransformer.kernels.triton_diff import default_config

shape_kernels = json.loads(sys.argv[1])
out = {"heads": {s: [list(gc.layer_heads(s, v.name)) for v in variants.compared()] for s in shape_kernels}}
for arch in (90, 80):
    got = [(j.shape, j.attention, j.kernel, j.form, j.d, list(j.config)) for j in gc.plan(arch)]
    want = []
    for shape, kernels in shape_kernels.items():
        for v in variants.compared():
            hq, hk, d, dv, shared = gc.layer_heads(shape, v.name)
            for k in kernels:
                default = default_config(d, dv, torch.bfloat16, arch)[k]
                want += [(shape, v.name, k, tuning.variant_of(d, dv, shared), d, list(c))
                         for c in tuning.candidates(arch, torch.bfloat16, d, dv, shared, k, default)]
    out[arch] = {"got": got, "want": want}

def broken(job, x, arch):
    return gc.run_candidate(job, {**x, "lam": x["lam"] + 0.25}, arch)

def fails(job, x, arch):
    raise RuntimeError("PassManager::run failed")

lines = []
for kernel, form in (("fwd", "v1"), ("bwd_dkdv", "v1"), ("bwd_dq", "v2"), ("decode", "v2")):
    job = [j for j in gc.plan(90) if j.kernel == kernel and j.form == form and j.d == 64][-1]
    for launch in (gc.run_candidate, broken, fails):
        r = gc.check_job(job, 90, "cpu", 32, torch.float32, launch=launch)
        lines.append(gc.format_line(r))
out["lines"] = lines
print(json.dumps(out))
"""


def _shapes_the_plan_runs() -> dict[str, set[str]]:
    """{shape: kernels} of the GPU plan's bench commands (parts included): attention, train and kernels run fwd and
    both backward kernels, decode the decode kernel; a command without --shape runs the bench shape."""
    out: dict[str, set[str]] = {}
    for s in (p for step in gpu_check.gpu_plan() for p in (step.parts or (step,))):
        args = list(s.args)
        what = args[2] if args[:2] == ["difftransformer", "bench"] else None
        if what is None or ("triton" not in args and what != "kernels"):
            continue
        shape = args[args.index("--shape") + 1] if "--shape" in args else "bench"
        out.setdefault(shape, set()).update(gpu_candidates.TRAIN_KERNELS if what != "decode" else ("decode",))
    return out


def test_the_candidates_step_covers_what_the_tuner_tries_and_catches_a_wrong_one():
    shapes = _shapes_the_plan_runs()
    assert shapes == {k: set(v) for k, v in gpu_candidates.SHAPE_KERNELS.items()}
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps({k: sorted(v) for k, v in shapes.items()})],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**gpu_check.child_env(), "TRITON_INTERPRET": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    # the benches' layers (train.py's docstring): bench V1 4 differential heads of 64 with values of 128, V2 8 pairs
    # of one shared key map; paper-3b V1 12 heads of 128 (values 256), V2 24
    assert out["heads"] == {"bench": [[4, 4, 64, 128, False], [8, 8, 64, 64, True]],
                            "paper-3b": [[12, 12, 128, 256, False], [24, 24, 128, 128, True]]}
    for arch in ("90", "80"):
        got, want = out[arch]["got"], out[arch]["want"]
        assert sorted(map(json.dumps, got)) == sorted(map(json.dumps, want))
        assert len(got) == len(set(map(json.dumps, got)))
        assert {g[2] for g in got} == {"fwd", "bwd_dkdv", "bwd_dq", "decode"}
        assert any(g[5][4:] for g in got if g[0] == "paper-3b")  # V1's value-split forward candidates too
    assert len(out["90"]["got"]) > len(out["80"]["got"]) > 16  # more fit in sm_90's 227 KB than sm_80's 163 KB
    read = gpu_readers.read_candidates("\n".join(out["lines"]))
    assert read["counts"] == {"ok": 4, "wrong": 4, "failed": 4}
    assert [b["status"] for b in read["bad"]] == ["wrong", "failed"] * 4
    assert read["bad"][0]["key"] == "sm_90/v1/d64/fwd" and "tol" in read["bad"][0]["reason"]
    assert read["bad"][1]["reason"].startswith("RuntimeError: PassManager::run failed")
    s = gpu_summary.summarize([result("env", "env", ENV), result("candidates", "candidates", "\n".join(out["lines"]))],
                              {"commit": "x"})
    md = gpu_summary.render_md(s)
    assert "4 ok, 4 wrong (test failures" in md and "- WRONG sm_90/v2/d64/bwd_dq " in md
