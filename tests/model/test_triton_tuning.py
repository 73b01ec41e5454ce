"""The measured choice of tiles (``triton_tuning``): which candidates a launch may try, how one is chosen and
remembered, and that the kernels give the float64 oracle's answer when the tuner launches them repeatedly and then
with its choice.

The choice itself needs a GPU (``triton.testing.do_bench``); here the timer is replaced by one that runs the launch
once and reports a time we pick, so that a non-default candidate wins, and the kernels run in Triton's CPU
interpreter (TRITON_INTERPRET=1, set before triton is imported, as in test_triton_diff.py) with tuning forced on.
"""

from __future__ import annotations

import importlib
import json
import os

import pytest
import torch

from triton_interp import run_in_fresh_process, skip_unless_interpreting

from test_triton_diff import (  # noqa: E402  (the float64 oracle and its cases)
    F64_TOL,
    assert_close,
    decode_reference,
    make_case,
    make_decode_case,
    run_both,
)
from triton.runtime.errors import OutOfResources  # noqa: E402

td = importlib.import_module("difftransformer.kernels.triton_diff")
tdd = importlib.import_module("difftransformer.kernels.triton_decode")
tuning = importlib.import_module("difftransformer.kernels.triton_tuning")


@pytest.fixture(autouse=True)
def _interpreter_or_fresh_process(request):
    skip_unless_interpreting(request)


def test_in_fresh_interpreter_process(request):
    run_in_fresh_process(request)  # skipped by the autouse fixture where this process runs the kernels itself


@pytest.fixture
def fake_timer(monkeypatch):
    """Tuning on, an empty choice table, and a timer that runs the launch once and returns ``times[config]``
    (default 1.0 ms); ``tried`` lists the configs it timed."""
    import triton.testing

    state = {"times": {}, "tried": []}

    def do_bench(fn, warmup, rep):
        cfg = fn.__defaults__[0]  # tuned_launch binds the candidate as the lambda's default
        state["tried"].append(cfg)
        fn()
        return state["times"].get(cfg, 1.0)

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    monkeypatch.setattr(tuning, "tuning_enabled", lambda device: True)
    monkeypatch.setattr(tuning, "_CHOSEN", {})
    monkeypatch.setattr(tuning, "_MEASURED", set())
    return state


def test_tuned_launch_picks_the_fastest_skips_failures_and_remembers(fake_timer):
    a, b, c = (16, 16, 4, 1), (32, 16, 4, 2), (64, 64, 8, 3)
    fake_timer["times"] = {a: 3.0, b: 1.0}
    ran = []

    def launch(cfg):
        if cfg == c:
            raise OutOfResources(300_000, 232_448, "shared memory")  # a candidate this GPU cannot launch
        ran.append(cfg)

    key = (90, torch.bfloat16, 64, 64, "v2", "fwd", 1024)
    tuning.tuned_launch(key, [a, b, c], launch, torch.device("cpu"))
    assert fake_timer["tried"] == [a, b] and ran[-1] == b  # timed those that launched, then ran the fastest
    assert tuning.chosen_configs() == {"sm_90/bfloat16/d64/dv64/v2/fwd/T1024": {
        "block_m": 32, "block_n": 16, "num_warps": 4, "num_stages": 2, "measured": 1}}
    fake_timer["tried"].clear()
    tuning.tuned_launch(key, [a, b, c], launch, torch.device("cpu"))
    assert fake_timer["tried"] == [] and ran[-1] == b  # remembered: no second measurement
    lines = tuning.config_lines()
    assert lines == ['# triton config: sm_90/bfloat16/d64/dv64/v2/fwd/T1024 '
                     '{"block_m": 32, "block_n": 16, "measured": 1, "num_stages": 2, "num_warps": 4}']
    assert json.loads(lines[0].split(" ", 4)[4])["block_m"] == 32
    with pytest.raises(OutOfResources):  # every candidate failing: the error reaches the caller's fallback
        tuning.tuned_launch(key[:-1] + (2048,), [c], launch, torch.device("cpu"))  # one option: launched as is
    with pytest.raises(OutOfResources):
        tuning.tuned_launch(key[:-1] + (4096,), [c, c], launch, torch.device("cpu"))
    with pytest.raises(ValueError, match="ours"):  # a bug of ours is not a candidate failure
        tuning.tuned_launch(key[:-1] + (8192,), [a, b],
                            lambda cfg: (_ for _ in ()).throw(ValueError("ours")), torch.device("cpu"))


def test_no_measuring_where_it_is_off(monkeypatch):
    """Off CUDA (the interpreter, the CPU) a launch runs the default (the first option) and records nothing."""
    monkeypatch.setattr(tuning, "_CHOSEN", {})
    ran = []
    tuning.tuned_launch(("k",), [(16, 16, 4, 1), (32, 32, 4, 2)], ran.append, torch.device("cpu"))
    assert ran == [(16, 16, 4, 1)] and tuning._CHOSEN == {}
    assert not tuning.tuning_enabled(torch.device("cpu"))


def test_candidates_come_from_the_fit_table():
    """Where the committed table has the launch: the default first, then the candidates that fit; elsewhere
    (float32, another GPU, head width 16) only the default."""
    default = td.default_config(128, 256, torch.bfloat16, 90)["fwd"]
    opts = tuning.candidates(90, torch.bfloat16, 128, 256, False, "fwd", default)
    rows = {tuple(r["config"]): r for r in tuning_fits()["sm_90/v1/d128/fwd"]}
    assert opts[0] == default and rows[default]["fits"]
    assert set(opts) == {c for c, r in rows.items() if r["fits"]}
    for arch, dtype, d, dv in ((90, torch.float32, 128, 256), (86, torch.bfloat16, 128, 256),
                               (90, torch.bfloat16, 16, 32)):
        assert tuning.candidates(arch, dtype, d, dv, False, "fwd", default) == [default]
    assert tuning.seq_bucket(1) == 256 and tuning.seq_bucket(4096) == 4096 and tuning.seq_bucket(4097) == 8192
    assert tuning.variant_of(64, 128, False) == "v1" and tuning.variant_of(64, 64, True) == "v2"
    assert tuning.variant_of(64, 64, False) == "v1_per_head"


def test_candidates_listed_in_the_skip_file_are_left_out(tmp_path, monkeypatch):
    """gpu-check's candidates step writes the candidates that were wrong or failed on the GPU to the file named by
    $DIFFTRANSFORMER_TRITON_SKIP; the tuner leaves them out (the default too), keeps the default where all are
    listed, and reads the file again when it changes."""
    default = td.default_config(128, 256, torch.bfloat16, 90)["fwd"]
    full = tuning.candidates(90, torch.bfloat16, 128, 256, False, "fwd", default)
    assert len(full) >= 3
    path = tmp_path / "skip.json"
    monkeypatch.setenv(tuning.SKIP_ENV, str(path))
    assert tuning.candidates(90, torch.bfloat16, 128, 256, False, "fwd", default) == full  # no file yet

    def write(entries):
        path.write_text(json.dumps({"version": 1, "skip": [
            {"key": k, "config": list(c), "status": "wrong", "reason": "test"} for k, c in entries]}))
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new stamp even on coarse clocks

    write([("sm_90/v1/d128/fwd", full[0]), ("sm_90/v1/d128/fwd", full[2]), ("sm_90/v2/d128/fwd", full[1])])
    assert tuning.candidates(90, torch.bfloat16, 128, 256, False, "fwd", default) == [full[1], *full[3:]]
    assert tuning.candidates(80, torch.bfloat16, 128, 256, False, "fwd", default)[0] == default  # another arch
    write([("sm_90/v1/d128/fwd", c) for c in full])
    assert tuning.candidates(90, torch.bfloat16, 128, 256, False, "fwd", default) == [default]
    monkeypatch.delenv(tuning.SKIP_ENV)
    assert tuning.candidates(90, torch.bfloat16, 128, 256, False, "fwd", default) == full


def tuning_fits():
    from difftransformer.kernels.triton_fits import FITS

    return FITS


# (case, candidates per kernel the fake timer makes win): d 64, so that 64-wide tiles are real candidates
TUNED_CASES = {
    "v1_d64_padding": dict(b=2, hq=2, hk=1, t=45, d=64, lam_value=0.7, pads=[0, 9]),
    "v2_d64_gqa2": dict(b=1, hq=4, hk=2, t=40, d=64, dv_mult=1, shared_k=True, lam="row"),
}


@pytest.mark.parametrize("name", list(TUNED_CASES))
def test_tuned_kernels_match_the_oracle(name, fake_timer, monkeypatch):
    """No tiles given: each kernel is launched once per candidate by the (fake) timer, then with the winner; the
    output and every gradient still equal the float64 oracle's (the kernels rewrite their outputs whole)."""
    monkeypatch.setattr(td, "_device_arch", lambda device: 90)
    win = {"fwd": (32, 16, 4, 2), "bwd_dkdv": (16, 32, 4, 2), "bwd_dq": (32, 32, 8, 3)}
    options = {k: [(16, 16, 4, 1), w, (64, 64, 8, 2)] for k, w in win.items()}
    monkeypatch.setattr(tuning, "candidates", lambda arch, dtype, d, dv, shared_k, kernel, default: options[kernel])
    fake_timer["times"] = {w: 0.5 for w in win.values()}
    inputs, key_mask = make_case(**TUNED_CASES[name])
    assert_close(run_both(inputs, key_mask, block_m=None, block_n=None), F64_TOL)
    chosen = {k.split("/")[5]: (v["block_m"], v["block_n"], v["num_warps"], v["num_stages"])
              for k, v in tuning.chosen_configs().items()}
    assert chosen == win
    assert len(fake_timer["tried"]) == 9  # three candidates for each of the three kernels


def test_tuned_decode_matches_the_oracle(fake_timer, monkeypatch):
    """The decode step's candidates change the split count (the partials are per candidate); the merged output
    equals the oracle's with the winner."""
    monkeypatch.setattr(tdd, "_device_arch", lambda device: 90)
    win = (0, 32, 4, 3)
    monkeypatch.setattr(tuning, "candidates", lambda *a: [(0, 16, 4, 2), win, (0, 64, 4, 2)])
    fake_timer["times"] = {win: 0.5}
    inputs, key_mask = make_decode_case(hq=4, hk=2, d=64, dv_mult=2, n=70, lens=[70, 33], pads=[0, 5])
    q1, q2, k1, k2, v, lam = inputs
    scale = q1.shape[-1] ** -0.5
    with torch.no_grad():
        out = tdd.triton_diff_decode(q1, q2, k1, k2, v, lam, scale, key_mask)
    assert (out - decode_reference(q1, q2, k1, k2, v, lam, scale, key_mask)).abs().max().item() < F64_TOL
    assert list(tuning.chosen_configs().values())[0]["block_n"] == 32 and len(fake_timer["tried"]) == 3


SPLIT_CASES = {  # DIFF V1 (dv = 2d) with the value width split over 2 and 4 programs
    "v1_d16_split2_padding": (dict(b=2, hq=2, hk=1, t=37, d=16, lam_value=0.8, pads=[0, 20]), 16),
    "v1_d32_split4_gqa2": (dict(b=1, hq=4, hk=2, t=33, d=32, lam_value=-0.6), 16),
}


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_value_split_forward_matches_the_oracle(name, fake_timer, monkeypatch):
    """A forward candidate with a 5th entry (block_dv < dv) splits the value columns over programs that each
    recompute the scores; output, LSEs (hence every gradient) and O2 equal the float64 oracle's. It is the only
    forward option here (so nothing else writes the outputs first), and the launches are checked to be split."""
    case, block_dv = SPLIT_CASES[name]
    monkeypatch.setattr(td, "_device_arch", lambda device: 90)
    options = {"fwd": [(16, 16, 4, 1, block_dv)], "bwd_dkdv": [(16, 16, 4, 1)], "bwd_dq": [(16, 16, 4, 1)]}
    monkeypatch.setattr(tuning, "candidates", lambda arch, dtype, d, dv, shared_k, kernel, default: options[kernel])
    real, seen = td._diff_fwd_kernel, []

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append((grid, kwargs["BLOCK_DV"], kwargs["DV"]))
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(td, "_diff_fwd_kernel", Recording())
    inputs, key_mask = make_case(**case)
    assert_close(run_both(inputs, key_mask, block_m=None, block_n=None), F64_TOL)
    (grid, got_dv, dv), = seen
    t = case["t"]
    assert got_dv == block_dv < dv and grid[0] == -(-t // 16) * (dv // block_dv)
