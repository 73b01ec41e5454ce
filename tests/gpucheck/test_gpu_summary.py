"""`make gpu-check`'s readers and summary (``gpucheck/gpu_readers.py``, ``gpucheck/gpu_summary.py``) on text alone, no
process started: the real outputs of the H200 run (copied below) and made-up ones for the rules (proposals, goals),
the steps with parts cut into their measurements, the device smoke's and the kernel breakdown's lines, the tests
step's shard count. Fast: in `make test`'s parallel pass (the steps themselves run in test_gpu_check.py)."""
# ruff: noqa: E501  (the benches' outputs below are copied as printed, long lines included)

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difftransformer.gpucheck import gpu_readers, gpu_summary, gpu_tests, small_jobs

# ---------------------------------------------------------------------------------------------- the H200 outputs
# Printed on an NVIDIA H200 on 2026-11-26 at commit 5fdef50 (torch 2.11.0+cu130, Triton 3.6.0), the tables unedited:
# the same numbers as BENCHMARKS.md's "before" row. The attention run was stopped by a 90 s limit after N=8192. The
# benches now print data lines beside their tables (``# attention setup:`` / ``row:``, what the readers read); those
# here hold the tables' own numbers, put where the benches print them.
H200 = {
    "attention-3b": """\
# attention fwd+bwd, shape paper-3b: d_model=3072 head_dim=128 kv_heads=all batch=1 bfloat16 on cuda (16 threads).
# time: median over 3 rounds (after a warm-up round) of the ratio to baseline sdpa in the same round; cases run round-robin in one process.
# memory (xM): peak extra memory of one step, each case in a fresh process, relative to baseline sdpa.
     N        baseline sdpa              V1 sdpa            V1 triton              V2 sdpa            V2 triton
# attention setup: {"shape": "paper-3b", "overrides": null, "head_dim": 128, "dtype": "bfloat16", "labels": ["V1 sdpa", "V1 triton", "V2 sdpa", "V2 triton"]}
  4096      3.7ms   396.4MB     1.51x     1.49xM     2.55x     1.30xM     1.56x     1.49xM     3.41x     1.24xM
# attention row: {"n": 4096, "baseline_ms": 3.7, "V1 sdpa": 1.51, "V1 triton": 2.55, "V2 sdpa": 1.56, "V2 triton": 3.41}
 16384     19.7ms  1489.5MB     1.74x     1.52xM     4.93x     1.32xM     1.77x     1.42xM     7.45x     1.26xM
# attention row: {"n": 16384, "baseline_ms": 19.7, "V1 sdpa": 1.74, "V1 triton": 4.93, "V2 sdpa": 1.77, "V2 triton": 7.45}
""",
    "attention": """\
# attention fwd+bwd, shape bench: d_model=512 head_dim=64 kv_heads=all batch=1 bfloat16 on cuda (16 threads).
# time: median over 5 rounds (after a warm-up round) of the ratio to baseline sdpa in the same round; cases run round-robin in one process.
# memory (xM): peak extra memory of one step, each case in a fresh process, relative to baseline sdpa.
     N        baseline sdpa              V1 sdpa            V1 triton              V2 sdpa            V2 triton
# attention setup: {"shape": "bench", "overrides": null, "head_dim": 64, "dtype": "bfloat16", "labels": ["V1 sdpa", "V1 triton", "V2 sdpa", "V2 triton"]}
  2048      3.0ms    87.6MB     1.54x     1.23xM     1.52x     1.09xM     1.15x     1.23xM     1.26x     1.07xM
# attention row: {"n": 2048, "baseline_ms": 3.0, "V1 sdpa": 1.54, "V1 triton": 1.52, "V2 sdpa": 1.15, "V2 triton": 1.26}
  4096      2.5ms   110.8MB     1.51x     1.36xM     1.59x     1.14xM     1.20x     1.36xM     1.36x     1.11xM
# attention row: {"n": 4096, "baseline_ms": 2.5, "V1 sdpa": 1.51, "V1 triton": 1.59, "V2 sdpa": 1.2, "V2 triton": 1.36}
  8192      2.9ms   157.0MB     1.47x     1.51xM     1.72x     1.25xM     1.21x     1.51xM     2.05x     1.20xM
# attention row: {"n": 8192, "baseline_ms": 2.9, "V1 sdpa": 1.47, "V1 triton": 1.72, "V2 sdpa": 1.21, "V2 triton": 2.05}
/usr/lib/python3.12/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 3 leaked semaphore objects to clean up at shutdown
  warnings.warn('resource_tracker: There appear to be %d '
""",
    "decode-sdpa": """\
# decode tokens/s (greedy, static KV cache, cuda-graph step): 64 new tokens per row after a prefilled context; DIFF backend sdpa; d_model 512, 8 layers, 8 baseline heads of 64 (kv 8), vocab 8192; cuda bfloat16, 16 threads
# parameters: baseline 34,087,424, V1 34,090,496, V2 36,217,344
# median of 3 paired rounds after 1 warm-up round; ratios are medians of per-round tokens/s ratios within the same run
# load average (1 min) before: 1.89 on 16 CPUs
batch context baseline tok/s   V1 tok/s  V1/base   V2 tok/s  V2/base HF DiffLlama tok/s  ours V1/HF
# decode setup: {"shape": null, "overrides": null, "head_dim": 64, "dtype": "bfloat16", "backend": "sdpa", "labels": ["V1", "V2"]}
    1    2048        1,005.8      912.0   0.907x      927.3   0.921x                  -           -
# decode row: {"batch": 1, "context": 2048, "baseline_tok_s": 1005.8, "V1": 0.907, "V2": 0.921}
    1    8192          901.4      820.7   0.910x      837.1   0.929x                  -           -
# decode row: {"batch": 1, "context": 8192, "baseline_tok_s": 901.4, "V1": 0.91, "V2": 0.929}
    8    2048        7,197.4    6,582.0   0.914x    6,619.9   0.919x                  -           -
# decode row: {"batch": 8, "context": 2048, "baseline_tok_s": 7197.4, "V1": 0.914, "V2": 0.919}
    8    8192        5,989.5    5,539.7   0.925x    5,423.8   0.906x                  -           -
# decode row: {"batch": 8, "context": 8192, "baseline_tok_s": 5989.5, "V1": 0.925, "V2": 0.906}
# load average (1 min) after: 1.75
""",
    "decode-triton": """\
# decode tokens/s (greedy, static KV cache, cuda-graph step): 64 new tokens per row after a prefilled context; DIFF backend triton; d_model 512, 8 layers, 8 baseline heads of 64 (kv 8), vocab 8192; cuda bfloat16, 16 threads
# parameters: baseline 34,087,424, V1 34,090,496, V2 36,217,344
# median of 3 paired rounds after 1 warm-up round; ratios are medians of per-round tokens/s ratios within the same run
# load average (1 min) before: 1.63 on 16 CPUs
batch context baseline tok/s   V1 tok/s  V1/base   V2 tok/s  V2/base HF DiffLlama tok/s  ours V1/HF
# decode setup: {"shape": null, "overrides": null, "head_dim": 64, "dtype": "bfloat16", "backend": "triton", "labels": ["V1", "V2"]}
    1    2048        1,000.4      939.7   0.938x      970.9   0.971x                  -           -
# decode row: {"batch": 1, "context": 2048, "baseline_tok_s": 1000.4, "V1": 0.938, "V2": 0.971}
    1    8192          897.1      888.0   0.990x      920.9   1.027x                  -           -
# decode row: {"batch": 1, "context": 8192, "baseline_tok_s": 897.1, "V1": 0.99, "V2": 1.027}
    8    2048        7,201.2    6,815.8   0.947x    6,695.9   0.930x                  -           -
# decode row: {"batch": 8, "context": 2048, "baseline_tok_s": 7201.2, "V1": 0.947, "V2": 0.93}
    8    8192        5,982.0    5,650.0   0.945x    5,066.5   0.845x                  -           -
# decode row: {"batch": 8, "context": 8192, "baseline_tok_s": 5982.0, "V1": 0.945, "V2": 0.845}
# load average (1 min) after: 1.54
""",
    "train": """\
# training step (fwd + bwd + clip + AdamW), shape bench: seq 1024 x batch 8, d_model 512, 8 layers, 8 baseline heads of 64 (kv 8), FFN 1408, vocab 8192; cuda bfloat16, 16 threads; median of 5 steps after 2 warm-up, 1 round(s)
# load average (1 min) before: 0.88 on 16 CPUs
case             parameters   ms/step   tokens/s  vs baseline
# train setup: {"shape": "bench", "overrides": null, "head_dim": 64, "dtype": "bfloat16", "seq": 1024, "batch": 8, "layers": 8}
baseline sdpa    34,087,424      30.2    271,052       1.000x
# train row: {"label": "baseline sdpa", "params": 34087424, "ms": 30.2, "tokens_s": 271052.0, "ratio": 1.0}
V1 sdpa          34,090,496      40.6    201,676       0.744x
# train row: {"label": "V1 sdpa", "params": 34090496, "ms": 40.6, "tokens_s": 201676.0, "ratio": 0.744}
V1 triton        34,090,496      37.6    217,642       0.803x
# train row: {"label": "V1 triton", "params": 34090496, "ms": 37.6, "tokens_s": 217642.0, "ratio": 0.803}
V2 sdpa          36,217,344      42.0    194,896       0.719x
# train row: {"label": "V2 sdpa", "params": 36217344, "ms": 42.0, "tokens_s": 194896.0, "ratio": 0.719}
V2 triton        36,217,344      30.9    264,958       0.978x
# train row: {"label": "V2 triton", "params": 36217344, "ms": 30.9, "tokens_s": 264958.0, "ratio": 0.978}
# load average (1 min) after: 2.05; targets: V1 >= 0.92x, V2 >= 0.88x (tokens/s vs baseline)
""",
    "train-3b": """\
# training step (fwd + bwd + clip + AdamW), shape paper-3b with --layers 4: seq 4096 x batch 1, d_model 3072, 4 layers, 24 baseline heads of 128 (kv 24), FFN 8192, vocab 100288; cuda bfloat16, 16 threads; median of 5 steps after 2 warm-up, 1 round(s)
# load average (1 min) before: 1.85 on 16 CPUs
case             parameters   ms/step   tokens/s  vs baseline
# train setup: {"shape": "paper-3b", "overrides": "--layers 4", "head_dim": 128, "dtype": "bfloat16", "seq": 4096, "batch": 1, "layers": 4}
baseline sdpa  1,069,181,952      74.2     55,236       1.000x
# train row: {"label": "baseline sdpa", "params": 1069181952, "ms": 74.2, "tokens_s": 55236.0, "ratio": 1.0}
V1 sdpa        1,069,185,024      82.3     49,784       0.901x
# train row: {"label": "V1 sdpa", "params": 1069185024, "ms": 82.3, "tokens_s": 49784.0, "ratio": 0.901}
V1 triton      1,069,185,024      97.3     42,084       0.762x
# train row: {"label": "V1 triton", "params": 1069185024, "ms": 97.3, "tokens_s": 42084.0, "ratio": 0.762}
V2 sdpa        1,107,225,600      84.8     48,302       0.874x
# train row: {"label": "V2 sdpa", "params": 1107225600, "ms": 84.8, "tokens_s": 48302.0, "ratio": 0.874}
V2 triton      1,107,225,600     112.2     36,515       0.661x
# train row: {"label": "V2 triton", "params": 1107225600, "ms": 112.2, "tokens_s": 36515.0, "ratio": 0.661}
# load average (1 min) after: 1.16; targets: V1 >= 0.92x, V2 >= 0.88x (tokens/s vs baseline)
""",
    "tests": """\
FAILED tests/model/test_triton_diff.py::test_float64_matches_oracle[v1_padding]
FAILED tests/model/test_triton_diff.py::test_decode_validation[kw0-ValueError-one new token]
FAILED tests/model/test_triton_fallback.py::test_a_failed_launch_falls_back_once_with_one_warning[_diff_bwd_dq_kernel-diff_v2-opts2]
32 failed, 69 passed, 2 skipped, 15 warnings in 64.34s (0:01:04)
""",
}
KINDS = {"env": "env", "candidates": "candidates", "tests": "tests", "attention-3b": "attention", "attention": "attention",
         "decode-sdpa": "decode", "decode-triton": "decode", "train": "train", "train-3b": "train",
         "small-jobs": "small-jobs"}
ENV = gpu_readers.ENV_PREFIX + json.dumps({"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0",
                                           "cuda_available": True, "device": "NVIDIA H200", "capability": [9, 0],
                                           "cpus": 16})
SMALL_JOBS = "\n".join(gpu_readers.SMALL_JOBS_PREFIX + json.dumps(small_jobs.job_row(m, "baseline", p, s, 200, 600))
                       for m, p, s in (("one at a time", 1, [1.42]), ("8 processes", 8, [1.7, 1.9]),
                                       ("16 processes", 16, [2.9, 3.1])))


def result(name: str, text: str, status: str = "ok") -> dict:
    return {"name": name, "kind": KINDS[name], "status": status, "rc": 0, "seconds": 1.0, "limit_s": 10.0,
            "command": "python3 -m x", "output": f"{name}.txt", "text": text}


def h200_summary(**texts: str) -> dict:
    outputs = {"env": ENV, **H200, "small-jobs": SMALL_JOBS, **texts}
    return gpu_summary.summarize([result(n, t) for n, t in outputs.items()],
                                 {"commit": "5fdef50", "date": "2026-11-26", "mode": "gpu", "budget_s": 350.0,
                                  "wall_s": 300.0})


# ---------------------------------------------------------------------------------------------- readers
def test_readers_take_the_h200_tables():
    a3 = gpu_readers.read_attention(H200["attention-3b"])
    assert (a3["shape"], a3["head_dim"], a3["dtype"]) == ("paper-3b", 128, "bfloat16")
    assert a3["labels"] == ["V1 sdpa", "V1 triton", "V2 sdpa", "V2 triton"]
    assert a3["rows"][16384] == {"baseline_ms": 19.7, "V1 sdpa": 1.74, "V1 triton": 4.93, "V2 sdpa": 1.77,
                                 "V2 triton": 7.45}
    a = gpu_readers.read_attention(H200["attention"])
    assert sorted(a["rows"]) == [2048, 4096, 8192] and a["head_dim"] == 64 and a["rows"][8192]["V2 triton"] == 2.05
    t = gpu_readers.read_train(H200["train-3b"])
    assert (t["shape"], t["overrides"], t["head_dim"], t["seq"], t["batch"], t["layers"]) == \
        ("paper-3b", "--layers 4", 128, 4096, 1, 4)
    assert t["labels"] == ["V1 sdpa", "V1 triton", "V2 sdpa", "V2 triton"]
    assert t["rows"]["V2 triton"] == {"params": 1_107_225_600, "ms": 112.2, "tokens_s": 36_515, "ratio": 0.661}
    assert gpu_readers.read_train(H200["train"])["rows"]["baseline sdpa"]["tokens_s"] == 271_052
    d = gpu_readers.read_decode(H200["decode-triton"])
    assert (d["backend"], d["head_dim"], d["dtype"], d["labels"]) == ("triton", 64, "bfloat16", ["V1", "V2"])
    assert d["rows"][1] == {"batch": 1, "context": 8192, "baseline_tok_s": 897.1, "V1": 0.990, "V2": 1.027}
    p = gpu_readers.read_pytest(H200["tests"])
    assert p["counts"] == {"failed": 32, "passed": 69, "skipped": 2} and p["finished"]
    assert p["failed"][1] == "tests/model/test_triton_diff.py::test_decode_validation[kw0-ValueError-one"
    assert gpu_readers.read_env(ENV)["capability"] == [9, 0]


def test_readers_keep_what_a_stopped_command_printed():
    cut = H200["attention"].splitlines()[:7]  # the header and N=2048 only, as when the limit hits at N=4096
    assert sorted(gpu_readers.read_attention("\n".join(cut))["rows"]) == [2048]
    stopped = gpu_readers.read_pytest("$ python3 -m pytest -q\n" + "." * 70 + "F" + "." * 9 + " [ 40%]\n..sE\n")
    assert stopped == {"counts": {"passed": 81, "failed": 1, "skipped": 1, "errors": 1}, "failed": [],
                       "finished": False}
    assert gpu_readers.read_train("# training step (fwd...)\n")["rows"] == {}
    assert gpu_readers.read_decode("")["rows"] == []
    assert gpu_readers.read_env("Traceback ...\n") == {}


def test_triton_config_lines_are_collected_per_step():
    line = '# triton config: sm_90/bfloat16/d128/dv256/v1/fwd/T4096 {"block_m": 128, "block_n": 64, "measured": 1}'
    s = h200_summary(**{"attention-3b": H200["attention-3b"] + line + "\n# triton config: odd not-json\n"})
    assert s["triton_configs"] == [
        {"step": "attention-3b", "key": "sm_90/bfloat16/d128/dv256/v1/fwd/T4096",
         "config": {"block_m": 128, "block_n": 64, "measured": 1}},
        {"step": "attention-3b", "key": "odd", "config": "not-json"}]
    assert "sm_90/bfloat16/d128/dv256/v1/fwd/T4096" in gpu_summary.render_md(s)


# ---------------------------------------------------------------------------------------------- the summary
def test_the_summary_shows_the_issue_table_and_writes_json_and_md(tmp_path):
    s = h200_summary()
    table = "\n".join(gpu_summary.ratio_table(s))
    assert "| measurement | V1 sdpa | V1 triton | V2 sdpa | V2 triton |" in table
    assert "N=4096 / 16384 (`attention-3b`) | 1.51x / 1.74x | 2.55x / 4.93x | 1.56x / 1.77x | 3.41x / 7.45x |" in table
    assert "(`train-3b`) | 0.90x | 0.76x | 0.87x | 0.66x |" in table
    assert "| decode tokens/s, batch 1/8, context 2048/8192 | 0.907-0.925x | 0.938-0.990x | 0.906-0.929x | " \
           "0.845-1.027x |" in table
    js, md = gpu_summary.write(s, tmp_path)
    back = json.loads(js.read_text())
    assert back["results"]["tests"]["counts"] == {"failed": 32, "passed": 69, "skipped": 2}
    assert back["results"]["attention-3b"]["rows"]["16384"]["V1 triton"] == 4.93
    assert back["env"]["device"] == "NVIDIA H200" and back["commit"] == "5fdef50"
    sj = back["results"]["small-jobs"]["rows"]
    assert [r["processes"] for r in sj] == [1, 8, 16]
    assert sj[1]["jobs_per_min"] == pytest.approx(8 * 60 / (1.9 * 3)) and sj[1]["vs_one_at_a_time"] > 1
    text = md.read_text()
    assert text.startswith("# GPU check: NVIDIA H200, commit 5fdef50")
    assert "32 failed, 69 passed, 2 skipped" in text and "- FAILED tests/model/test_triton_diff.py::" in text
    assert "| 16 | baseline | " in text


def test_goals_read_against_item_3():
    goals = {(g["goal"], g["case"]): g for g in h200_summary()["goals"]}
    v1 = goals[("V1 attention fwd+bwd at head_dim 128 <= 1.55x", "V1 triton")]
    assert (v1["worst"], v1["where"], v1["met"]) == (4.93, "attention-3b N=16384", False)
    assert goals[("training at paper-3b >= 0.93x", "V1 sdpa")]["worst"] == 0.901
    assert goals[("decode >= 0.95x", "V2 triton")]["worst"] == 0.845
    assert not any(g["met"] for g in goals.values() if g["goal"].startswith("decode"))
    slower = goals[("fused kernel no slower than SDPA (speed triton / sdpa >= 1)", "V2 triton")]
    assert (slower["worst"], slower["where"], slower["met"]) == (pytest.approx(1.77 / 7.45), "attention-3b N=16384",
                                                                 False)


# ---------------------------------------------------------------------------------------------- the proposals rule
CASES = ("V1 sdpa", "V1 triton", "V2 sdpa", "V2 triton")


def _attention(rows: dict[int, tuple[float, float, float, float]], shape: str = "bench", hd: int = 64) -> str:
    """What ``bench attention`` reads back by: its setup and row lines."""
    lines = ["# attention setup: " + json.dumps({"shape": shape, "overrides": None, "head_dim": hd, "dtype": "bfloat16",
                                                 "labels": list(CASES)})]
    for n, r in rows.items():
        lines.append("# attention row: " + json.dumps({"n": n, "baseline_ms": 3.0, **dict(zip(CASES, r))}))
    return "\n".join(lines) + "\n"


def _train(ratios: tuple[float, float, float, float], shape: str = "bench", hd: int = 64) -> str:
    """What ``bench train`` reads back by: its setup and row lines."""
    rows = ["# train row: " + json.dumps({"label": lab, "params": 34_090_496, "ms": 30.0,
                                          "tokens_s": float(int(270_000 * r)), "ratio": r})
            for lab, r in zip(("baseline sdpa", *CASES), (1.0, *ratios))]
    setup = {"shape": shape, "overrides": None, "head_dim": hd, "dtype": "bfloat16", "seq": 1024, "batch": 8,
             "layers": 8}
    return "# train setup: " + json.dumps(setup) + "\n" + "\n".join(rows) + "\n"


def _only(**texts: str) -> dict:
    return gpu_summary.summarize([result("env", ENV), *(result(n.replace("_", "-"), t) for n, t in texts.items())],
                                 {"commit": "x"})


def test_a_pass_is_proposed_only_where_triton_beats_sdpa_everywhere():
    fast = _attention({2048: (1.50, 1.20, 1.20, 1.00), 8192: (1.50, 1.40, 1.20, 1.10)})
    ps = gpu_summary.proposals(_only(attention=fast, train=_train((0.74, 0.80, 0.72, 0.98))))
    assert [(p["entry"], p["measurements"]) for p in ps] == [("((9, 0), torch.bfloat16, 64, 'train')", 6)]
    assert ps[0]["worst_speedup"] == pytest.approx(1.50 / 1.40) and ps[0]["worst"] == "V1 attention N=8192"
    # one measurement where triton loses (V2 at N=8192) and there is no proposal
    slow = _attention({2048: (1.50, 1.20, 1.20, 1.00), 8192: (1.50, 1.40, 1.20, 1.30)})
    assert gpu_summary.proposals(_only(attention=slow, train=_train((0.74, 0.80, 0.72, 0.98)))) == []
    # within the noise margin (1% faster) is not faster
    assert gpu_summary.proposals(_only(attention=fast, train=_train((0.80, 0.808, 0.72, 0.98)))) == []
    # attention alone (the training step not measured at that head_dim) proposes nothing
    assert gpu_summary.proposals(_only(attention=fast)) == []
    # no capability (the probe failed): nothing
    s = _only(attention=fast, train=_train((0.74, 0.80, 0.72, 0.98)))
    s["env"] = {}
    assert gpu_summary.proposals(s) == []


def test_head_dims_are_proposed_apart_and_decode_from_both_decode_runs():
    s = _only(attention_3b=_attention({4096: (1.5, 1.4, 1.5, 1.4)}, "paper-3b", 128),
              train_3b=_train((0.90, 0.95, 0.87, 0.92), "paper-3b", 128),
              attention=_attention({2048: (1.5, 1.6, 1.2, 1.1)}), train=_train((0.74, 0.80, 0.72, 0.98)))
    assert [p["entry"] for p in gpu_summary.proposals(s)] == ["((9, 0), torch.bfloat16, 128, 'train')"]
    # V2 at batch 8 now beats sdpa's 0.919x / 0.906x by the margin (it was 1.2% faster at context 2048: within it)
    tri = H200["decode-triton"].replace("0.930x", "0.960x").replace("0.845x", "0.950x")  # the table, and its data
    tri = tri.replace('"V2": 0.93}', '"V2": 0.96}').replace('"V2": 0.845}', '"V2": 0.95}')
    decode = _only(decode_sdpa=H200["decode-sdpa"], decode_triton=tri)
    assert [p["entry"] for p in gpu_summary.proposals(decode)] == ["((9, 0), torch.bfloat16, 64, 'decode')"]
    assert gpu_summary.proposals(_only(decode_sdpa=H200["decode-sdpa"], decode_triton=H200["decode-triton"])) == []
    assert gpu_summary.proposals(h200_summary()) == []  # the H200 run: triton lost somewhere in every pass



# ---------------------------------------------------------------------------------------------- steps with parts
def _part(name: str, kind: str, text: str, end: str = "ok") -> str:
    p = gpu_readers.PART_PREFIX
    tail = "" if end is None else f"\n{p}{name} {end} (rc {0 if end == 'ok' else 1}) after 2.5 s\n"
    return f"{p}{name} {kind} start: PYTHONPATH=src python3 -m x\n{text}{tail}"


def test_a_step_with_parts_is_read_part_by_part():
    config = '# triton config: sm_90/bfloat16/d128/dv128/v2/fwd/T16384 {"block_m": 128, "measured": 1}\n'
    text = ("$ PYTHONPATH=src python3 -m difftransformer.gpucheck.gpu_check parts attention\n"
            + _part("attention-3b", "attention", H200["attention-3b"] + config)
            + _part("attention-bench", "attention", H200["attention"] + config, end="failed")
            + _part("decode-sdpa", "decode", H200["decode-sdpa"][:300], end=None))
    step = {"name": "attention", "kind": "parts", "status": "timeout", "rc": -15, "seconds": 31.0, "limit_s": 31.0,
            "command": "x", "output": "attention.txt", "text": text,
            "parts": [["attention-3b", "attention"], ["attention-bench", "attention"], ["decode-sdpa", "decode"],
                      ["kernels-3b", "kernels"]]}
    s = gpu_summary.summarize([result("env", ENV), step], {"commit": "x"})
    rows = {st["name"]: (st["status"], st["seconds"], st.get("part_of")) for st in s["steps"]}
    assert rows == {"env": ("ok", 1.0, None), "attention": ("timeout", 31.0, None),
                    "attention-3b": ("ok", 2.5, "attention"), "attention-bench": ("failed", 2.5, "attention"),
                    "decode-sdpa": ("timeout", None, "attention"), "kernels-3b": ("not run", None, "attention")}
    assert s["results"]["attention-3b"]["rows"][16384]["V2 triton"] == 7.45  # each part read as its own step
    assert sorted(s["results"]["attention-bench"]["rows"]) == [2048, 4096, 8192]
    assert s["results"]["kernels-3b"]["rows"] == []
    assert [c["step"] for c in s["triton_configs"]] == ["attention-3b"]  # printed by both: kept once, where first
    md = gpu_summary.render_md(s)
    assert "| attention / attention-3b | ok | 2.5 | - | attention.txt |" in md
    assert "| attention / kernels-3b | not run | - | - | attention.txt |" in md
    assert "(`attention-3b`) | 1.51x / 1.74x |" in md
    # a step that ended (not killed) but whose part has no end line: the part failed (its process died)
    assert gpu_summary.expand({**step, "status": "failed"})[2]["status"] == "failed"


# ---------------------------------------------------------------------------------------------- smoke, kernels, tests
def test_the_smoke_lines_name_each_failure_in_the_summary():
    from difftransformer.gpucheck import cuda_smoke

    def row(name, status, reason="", tail=""):
        return {"name": name, "status": status, "seconds": 1.25, "cpu_s": 0.5, "reason": reason, "tail": tail}

    lines = [cuda_smoke.format_line(row("train-v1", "ok")),
             cuda_smoke.format_line(row("eval-outliers", "failed", "RuntimeError: Expected all tensors to be on the "
                                        "same device, but got cuda:0 and cpu", "Traceback ...\n  File x"), False),
             cuda_smoke.format_line(row("lm-sweep", "skipped", "difftransformer lm-sweep: error: the embedded corpus "
                                        "needs pip install 'difftransformer[corpus]'"))]
    r = gpu_readers.read_smoke("\n".join(lines))
    assert [(x["name"], x["status"], x["device_flag"]) for x in r["rows"]] == [
        ("train-v1", "ok", True), ("eval-outliers", "failed", False), ("lm-sweep", "skipped", True)]
    assert r["rows"][1]["reason"].startswith("RuntimeError: Expected all tensors") and not r["finished"]
    done = gpu_readers.read_smoke("\n".join([*lines, cuda_smoke.count_lines({"ok": 1, "failed": 1, "skipped": 1}, 9.0)]))
    assert done["finished"] and len(done["rows"]) == 3 and done["not_run"] == []
    head = cuda_smoke.head_lines(["train-v1", "eval-outliers", "lm-sweep", "report"], "cuda", Path("/tmp/x"))
    lines = [head, *lines]  # its first line names them all: one has no line (the step's limit came first)
    assert gpu_readers.read_smoke("\n".join(lines))["not_run"] == ["report"]
    s = gpu_summary.summarize([result("env", ENV), {**result("env", "\n".join(lines)), "name": "cuda-smoke",
                                                    "kind": "smoke"}], {"commit": "x"})
    md = gpu_summary.render_md(s)
    assert "1 ok, 1 failed, 1 skipped (an optional package missing on this machine)" in md
    assert "- FAILED `eval-outliers`: RuntimeError: Expected all tensors" in md
    assert "- SKIPPED `lm-sweep`: " in md and "without a --device flag (ran where the command puts it): eval-outliers" in md
    assert "- NOT RUN (the step stopped first): report" in md


def test_the_kernel_breakdown_counts_flops_and_reads_back():
    import argparse

    from difftransformer.bench import kernels

    lays = {a: kernels.layout("paper-3b", a) for a in ("baseline", "diff_v1", "diff_v2")}
    assert [(x["q_heads"], x["k_heads"], x["v_heads"], x["d"], x["dv"], x["keys"]) for x in lays.values()] == [
        (24, 24, 24, 128, 128, None), (24, 24, 12, 128, 256, "paired"), (48, 24, 24, 128, 128, "shared")]
    n = 16384
    base, v1, v2 = (kernels.flops(lays[a], 1, n) for a in lays)
    assert base["fwd"] == 4 * 24 * n * n * 128 / 2 and base["bwd"] == 2.5 * base["fwd"]  # FlashAttention's count
    assert v1["fwd"] == 24 * n * n * (128 + 256) == 1.5 * base["fwd"] and v2["fwd"] == 2 * base["fwd"]
    assert v1["dK/dV kernel"] == 12 * n * n * (4 * 128 + 2 * 256) and v2["dQ kernel"] == 24 * n * n * (4 * 128 + 128)
    cases = [("baseline sdpa", "baseline", "sdpa"), ("V1 sdpa", "diff_v1", "sdpa"), ("V1 triton", "diff_v1", "triton")]
    times = {"baseline sdpa": {"fwd": 10.0, "bwd": 20.0}, "V1 sdpa": {"fwd": 15.0, "bwd": 35.0},
             "V1 triton": {"fwd": 20.0, "fwd kernel": 19.0, "bwd": 60.0, "dK/dV kernel": 40.0, "dQ kernel": 18.0}}
    rows = kernels.rows_of(cases, times, lays, argparse.Namespace(batch=1, shape="paper-3b"), n)
    dkdv = next(r for r in rows if r["what"] == "dK/dV kernel")
    assert (dkdv["vs_base"], dkdv["vs_sdpa"]) == (2.0, 40.0 / 35.0)
    assert dkdv["tflops"] == pytest.approx(v1["dK/dV kernel"] / 40e-3 / 1e12)
    text = "\n".join(kernels.ROW_PREFIX + json.dumps(r) for r in rows)
    assert gpu_readers.read_kernels(text)["rows"] == json.loads(json.dumps(rows))
    s = gpu_summary.summarize([result("env", ENV), {**result("env", text), "name": "kernels-3b", "kind": "kernels"}],
                              {"commit": "x"})
    md = gpu_summary.render_md(s)
    assert "## Where the fused kernel loses (`kernels-3b`)" in md
    assert f"| V1 triton | dK/dV kernel | 16384 | 40.00 | {dkdv['tflops']:.1f} | 2.00x | 1.14x |" in md


def test_the_tests_step_sums_its_shards_and_keeps_an_unfinished_ones_cases():
    done = "..F.s [100%]\nFAILED tests/model/test_x.py::test_a[bf16] - AssertionError\n1 failed, 3 passed, 1 skipped, 40 deselected in 9.10s\n"
    cut = "$ pytest\n..s.\n"
    r = gpu_tests.combine([done, cut], [1, None])
    assert r == {"counts": {"failed": 1, "passed": 6, "skipped": 2}, "failed": ["tests/model/test_x.py::test_a[bf16]"],
                 "finished": False, "shards": 2, "unfinished": [1]}
    text = "# shard 0/2 ...\n" + done + gpu_tests.LINE + json.dumps(r) + "\n"
    assert gpu_readers.read_pytest(text) == r  # the step's own line, not a shard's pytest line
    assert gpu_tests.combine([done, done.replace("1 failed, ", "")], [1, 0])["finished"]
    # more shards than cases: an empty shard ends with pytest's "no tests ran" (5), which is not a failure
    assert gpu_tests.combine([done, "no tests ran in 0.01s\n"], [1, 5])["finished"]
    s = gpu_summary.summarize([result("env", ENV), result("tests", text)], {"commit": "x"})
    assert "1 failed, 6 passed, 2 skipped (stopped before pytest's summary line: the cases it got to); 2 shards at " \
           "once, 1 did not end" in gpu_summary.render_md(s)
