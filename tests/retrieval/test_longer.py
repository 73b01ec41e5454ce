"""The re-reading at longer training (retrieval/LONGER.md): its statistics (the sign-test interval, censored
crossings), the committed journal read back (the 600-step row is the committed diagnostic's own numbers; every
record's key is the one the study computes), and the command's refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from difftransformer.cli import main
from difftransformer.retrieval import longer as L
from difftransformer.retrieval.config import RetrievalConfig

ROOT = Path(__file__).resolve().parents[2]
DIAG = ROOT / "docs" / "results" / "retrieval-diagnostic"
OUT = ROOT / "docs" / "results" / "retrieval-longer"


def brute_sign_interval(xs, level=0.95):
    """The widest k with P(Binomial(n, 1/2) <= k - 1) <= (1 - level) / 2, from the binomial sum directly."""
    n = len(xs)
    k = max(k for k in range(0, n // 2 + 1) if sum(math.comb(n, i) for i in range(k)) / 2 ** n <= (1 - level) / 2)
    return sorted(xs)[k - 1], sorted(xs)[n - k], 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n


@pytest.mark.parametrize("n", [6, 8, 12, 20])
def test_sign_interval_is_the_binomial_order_statistics(n):
    xs = [float((7 * i) % n - n / 3) for i in range(n)]
    med, (lo, hi), cover = L.sign_interval(xs)
    b_lo, b_hi, b_cover = brute_sign_interval(xs)
    assert (lo, hi) == (b_lo, b_hi) and cover == pytest.approx(b_cover, abs=1e-12)
    assert cover >= 0.95 and lo <= med <= hi


def test_sign_interval_n12_is_the_3rd_and_10th():
    _med, ci, cover = L.sign_interval([float(i) for i in range(12)])
    assert ci == [2.0, 9.0] and abs(cover - 0.9614) < 1e-4


def test_a_run_that_never_crosses_counts_as_later_than_any():
    c = L.crossing([100, 100, None], [None, 50, None], steps=600)
    assert c["per_seed"] == [501, -50, 0]
    assert c["never"] == [1, 2]


def test_the_committed_journal_rebuilds():
    """The committed journal (complete or not) read back: its header is this study's on the diagnostic's
    configuration, every record's key is the one ``longer._key`` computes for its job, and the 600-step row repeats
    the committed diagnostic's D intervals and readings."""
    res = L.rebuild(DIAG, OUT)
    first = json.loads((DIAG / "diagnostic.json").read_text())
    row600 = res["lengths"][str(first["config"]["steps"])]
    for name in L.NAMES[1:]:
        assert row600[name]["D"]["ci"] == pytest.approx(first["rows"][name]["D"]["ci"], rel=1e-12)
        if name in first["rows"] and "reading" in first["rows"][name]:
            assert row600[name]["reading"] == first["rows"][name]["reading"]
    key = L._key(first["config"], "cpu")
    lines = (OUT / L.JOURNAL).read_text().splitlines()[1:]
    assert lines, "the journal holds no job"
    for line in lines:
        rec = json.loads(line)
        assert rec["key"] == key(L.LongJob(*rec["job"]))
    assert res["complete"][1] == len(L.NAMES) * len(L.STEPS) * len(RetrievalConfig.from_dict(first["config"])
                                                                    .test_seeds)


@pytest.mark.parametrize("argv,match", [
    (["--longer", "1300"], "--longer: training lengths from 1200, 2400"),
    (["--longer", "1200", "--reference", "nowhere"], "no diagnostic.json there"),
    (["--longer", "1200", "--reference", str(DIAG), "--steps", "5"], "--steps does not go with --longer"),
    (["--longer", "1200"], "--reference"),
])
def test_bad_input_is_one_line_before_any_job(argv, match, tmp_path, capsys):
    out = tmp_path / "out"
    if "--reference" not in argv:
        argv = [*argv[:2], "--reference", str(DIAG), *argv[2:]] if "1300" in argv else argv
    assert main(["retrieval", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]
    assert not out.exists()


def _lengths(acc600: dict[str, list[float]], acc2400: dict[str, list[float]], thr600: dict[str, list]):
    """Rows at 600, 1,200 and 2,400 steps from given accuracies (1,200 = 2,400) and 600-step crossing steps."""
    names = L.NAMES
    def rows(acc, st, thr):
        t = {n: {k: thr.get(n, [300] * 12) for k in ("1", "0.3")} for n in names}
        return L.length_rows(acc, acc, t, {n: 0 for n in names}, st, 1024, 0.125)
    return {"600": rows(acc600, 600, thr600), "1200": rows(acc2400, 1200, {}), "2400": rows(acc2400, 2400, {})}


def _acc(level: float, wiggle: float = 0.01) -> list[float]:
    return [min(1.0, level + wiggle * ((i * 5) % 7 - 3) / 3) for i in range(12)]


def test_a_lead_that_vanishes_at_the_ceiling_and_came_sooner_is_a_speed_reading():
    base = {n: _acc(0.90) for n in L.NAMES}
    acc600 = {**base, "diff_v1": _acc(0.98, 0.005)}
    at_top = {n: [1.0] * 11 + [0.999] for n in L.NAMES}
    thr = {"baseline": [400 + i for i in range(12)], "diff_v1": [250 + i for i in range(12)]}
    c = L.classify(_lengths(acc600, at_top, thr))["diff_v1"]
    assert c["verdict"] == "above" and c["lengths"]["2400"]["status"] == "vanishes"
    assert c["lengths"]["2400"]["at_ceiling"] and c["class"] == "speed"


def test_a_lead_that_survives_is_a_capability_reading_and_a_reversal_is_neither():
    base = {n: _acc(0.90) for n in L.NAMES}
    acc600 = {**base, "diff_v1": _acc(0.97), "diff_v2": _acc(0.80)}
    later = {**{n: _acc(0.93) for n in L.NAMES}, "diff_v1": _acc(0.98), "diff_v2": _acc(0.97)}
    c = L.classify(_lengths(acc600, later, {}))
    assert c["diff_v1"]["class"] == "capability" and not c["diff_v1"]["lengths"]["2400"]["at_ceiling"]
    assert c["diff_v2"]["lengths"]["2400"]["status"] == "reverses" and c["diff_v2"]["class"] == "none"


def test_the_rounding_check_compares_every_length_and_class(monkeypatch, tmp_path):
    """``retrieval --longer 1200,2400 --rounding-check avx2``: the committed re-reading against a second run (here
    the same runs with one seed's accuracy moved, so that nothing trains): per length the readings that differ and
    the runs bitwise equal, and each cell's class under both code paths."""
    import copy
    import shutil

    one = L.rebuild(DIAG, OUT)
    two = copy.deepcopy(one)
    moved = two["lengths"]["2400"]["diff_v1"]
    moved["accuracy"][0] -= 0.5  # a rounding that is not a rounding: the check must see it
    calls = []

    def fake_run(diag, out, steps, options, code_path):
        calls.append((Path(out).name, steps, code_path))
        return two

    from difftransformer.retrieval import longer_rounding as LR
    monkeypatch.setattr(LR, "_run", fake_run)
    shutil.copytree(OUT, tmp_path / "longer")
    check = LR.rounding_check(DIAG, tmp_path / "longer", "avx2")
    assert calls == [("rounding-avx2", L.STEPS, "avx2")]
    assert check["code_paths"] == ["machine", "avx2"]
    eq = check["lengths"]["2400"]["rows"]["diff_v1"]["equal_runs"]
    assert eq == [11, 12] and check["lengths"]["1200"]["equal_runs"][0] == check["lengths"]["1200"]["equal_runs"][1]
    assert set(check["classes"]) == set(L.NAMES[1:])
    assert all(a == b for n, (a, b) in check["classes"].items() if n != "diff_v1")
    assert "classes that differ" in LR.format_rounding(check)
    with pytest.raises(ValueError, match="already ran that CPU code path"):
        LR.rounding_check(DIAG, tmp_path / "longer", "machine")
    with pytest.raises(ValueError, match="no re-reading there"):
        LR.rounding_check(DIAG, tmp_path / "nothing", "avx2")


def test_the_committed_rounding_check_rebuilds(tmp_path):
    """The committed AVX2 rerun of the 1,200- and 2,400-step jobs (docs/results/retrieval-longer/rounding-avx2,
    192 of 192 jobs): the check run again over a copy of the committed folders trains nothing and gives the committed
    rounding.json (less its timings); no reading and no answer-table class differs between the two code paths."""
    import shutil

    from difftransformer.jobs import RunOptions
    from difftransformer.retrieval import longer_rounding as LR
    shutil.copytree(OUT, tmp_path / "longer")
    check = LR.rounding_check(DIAG, tmp_path / "longer", "avx2", RunOptions(workers=1, progress=False))
    committed = json.loads((OUT / "rounding-avx2" / LR.ROUNDING_RESULTS).read_text())
    strip = lambda r: {k: v for k, v in json.loads(json.dumps(r)).items() if k != "timings"}  # noqa: E731
    assert strip(check) == strip(committed)
    assert check["classes_differ"] == [] and all(not c["differ"] for c in check["lengths"].values())
    assert [c["equal_runs"][1] for c in check["lengths"].values()] == [84, 84]
