"""Retrieval protocol version 4 (retrieval/PROTOCOL4.md, ``retrieval/protocol4.py``): its rules on their own (the lr
choices, the capability length, the conditions kept), its plan against the committed version-3 configuration, and
the whole protocol end to end at toy size (every phase, a resumed run that runs nothing, the rebuild equal to the
run byte for byte), and the command's refusals before any work."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from suite_helpers import cli_fails

from difftransformer.jobs import RunOptions
from difftransformer.retrieval import protocol4 as P
from difftransformer.retrieval.config import RetrievalConfig

ROOT = Path(__file__).resolve().parents[2]
KEEP = P.KEEP  # the protocol's band of kept conditions (the toy run below opens it while its tests run)


def _run(name, steps, seed, lr, **measures):
    base = {"val_training_distribution": 1.0, "val_training_loss": 1.0, "val_conditions": {}}
    return {"variant": name, "steps": steps, "seed": seed, "lr": lr, **base, **measures}


def test_the_plan_is_version_3s_configuration_with_the_candidates_added():
    """PROTOCOL4.md "Names": the task, the models and the training recipe are version 3's; only the test conditions
    grow (measurement), and the seeds are the protocol's fresh ones."""
    header = json.loads((ROOT / "docs/results/retrieval-v3/jobs.jsonl").read_text().splitlines()[0])["journal"]
    v3, plan = header["config"], P.Plan()
    v4 = plan.config.to_dict()
    assert {k: v for k, v in v4.items() if k != "conditions"} == {k: v for k, v in v3.items() if k != "conditions"}
    assert v4["conditions"][:len(v3["conditions"])] == v3["conditions"]
    assert {c["name"] for c in v4["conditions"]} >= {c.name for c in P.CANDIDATES}
    assert plan.val_seeds == tuple(range(4000, 4009)) and plan.test_seeds == tuple(range(6000, 6012))
    assert len(plan.names) == 8 and not set(plan.val_seeds) & set(plan.test_seeds)
    jobs, final = P.needed(plan, {})
    assert len(jobs) == 8 * 3 * 9 and not final and {j.steps for j in jobs} == {600}  # validation first


def test_speed_lr_is_the_best_training_distribution_accuracy_ties_to_the_lower_lr():
    plan = P.Plan(val_seeds=(1, 2), names=("baseline",))
    acc = {1e-3: 0.9, 2e-3: 0.95, 4e-3: 0.95}
    done = {P.V4Job("baseline", 600, s, lr): _run("baseline", 600, s, lr, val_training_distribution=a)
            for lr, a in acc.items() for s in (1, 2)}
    c = P.speed_lr(plan, "baseline", done)
    assert c.lr == 2e-3 and c.widened == []  # a tie with 4e-3 goes lower, and no widening at an edge


@pytest.mark.parametrize("losses, L", [((1.0, 0.95, 0.94), 1200), ((1.0, 0.7, 0.66), 2400),
                                       ((1.0, 0.7, 0.5), 4800)])
def test_the_capability_length_is_the_first_within_10_percent_of_the_next(losses, L):
    plan = P.Plan(val_seeds=(1, 2))
    done = {P.V4Job("baseline", st, s, 2e-3): _run("baseline", st, s, 2e-3, val_training_loss=x)
            for st, x in zip(plan.curve, losses) for s in (1, 2)}
    got = P.capability_length(plan, 2e-3, done)
    assert got is not None and got["L"] == L and list(got["curve"]) == ["1200", "2400", "4800"]
    done.pop(P.V4Job("baseline", 4800, 2, 2e-3))
    assert P.capability_length(plan, 2e-3, done) is None  # not before its jobs are in


@pytest.mark.parametrize("means, primary, kept, fallback", [
    ({"p48c96": 0.95, "p64c64": 0.5, "p64c96": 0.7, "p24c192": 0.35}, "p64c64", ["p64c64", "p64c96", "p24c192"],
     False),
    ({"p48c96": 0.95, "p64c64": 0.2, "p64c96": 0.93}, "p64c96", [], True),  # none kept: the lowest above 0.30
    ({"p48c96": 0.2, "p64c64": 0.1}, None, [], True),  # none above 0.30: capability is not read
])
def test_the_conditions_kept_and_the_primary(means, primary, kept, fallback):
    plan = P.Plan(val_seeds=(1,))
    conds = {c.name: means.get(c.name, 0.0) for c in P.CANDIDATES}
    done = {P.V4Job("baseline", 1200, 1, 2e-3): _run("baseline", 1200, 1, 2e-3, val_conditions=conds)}
    got = P.conditions_at(plan, 1200, 2e-3, done)
    assert got["primary"] == primary and got["kept"] == kept and got["fallback"] == fallback
    assert got["secondary"] == [n for n in kept if n != primary]


def test_a_v4_key_is_its_own():
    from difftransformer.retrieval import mechanism as M
    cfg = P.Plan().config.to_dict()
    k = P.key_of(cfg, "cpu")
    assert k(P.V4Job("v2_gain", 600, 6000, 2e-3)) != M._key(cfg, "cpu")(M.Job("v2_gain", 6000, 2e-3))
    assert len({k(P.V4Job(n, 600, 6000, 2e-3)) for n in P.NAMES}) == len(P.NAMES)
    assert k(P.V4Job("baseline", 600, 6000, 2e-3)) != k(P.V4Job("baseline", 1200, 6000, 2e-3))


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The whole protocol at toy size: 3 names, 2 validation and 2 test seeds, 10 steps for speed, the curve at 15
    and 20; the band of kept conditions opened to [0, 1] so that a toy model's accuracy keeps one."""
    mp = pytest.MonkeyPatch()
    mp.setattr(P, "KEEP", (0.0, 1.0))
    cfg = P.base_config(RetrievalConfig(d_model=16, batch=8, eval_contexts=4, val_contexts=4, lr_grid=(2e-3, 4e-3),
                                        warmup=5))
    plan = P.Plan(val_seeds=(1, 2), test_seeds=(3, 4), speed_steps=10, curve=(15, 20),
                  names=("baseline", "diff_v1", "v1_no_norm"), config=cfg)
    out = tmp_path_factory.mktemp("v4")
    res = P.run_protocol4(out, plan, RunOptions(workers=1, progress=False))
    yield plan, out, res
    mp.undo()


def test_every_phase_runs_and_both_endpoints_are_read(toy):
    plan, out, res = toy
    assert res["complete"][0] == res["complete"][1] == res["timings"]["jobs_run"]
    L, primary = res["length"]["L"], res["conditions"]["primary"]
    assert L in plan.curve and primary in {c.name for c in P.CANDIDATES}
    for n in plan.names:
        s, c = res["speed"][n], res["capability"][n]
        assert s["lr"] == res["speed_lrs"][n]["lr"] and c["lr"] == res["capability_lrs"][n]["lr"]
        assert len(c["accuracy"]) == 2
    arm = res["capability"]["v1_no_norm"]
    # C = arm - variant and D = arm - baseline, paired: D - C is the variant's own D
    assert arm["D"]["estimate"] - arm["C"]["estimate"] == pytest.approx(res["capability"]["diff_v1"]["D"]["estimate"])
    assert "speed_C" in res["speed"]["v1_no_norm"] and "speed_C" not in res["speed"]["diff_v1"]
    from difftransformer.retrieval.protocol4_text import format_protocol4, markdown_table
    text = format_protocol4(res)
    assert "endpoint 1, speed" in text and "endpoint 2, capability" in text and f"L = {L}" in text
    table = markdown_table(res)
    assert f"Finished: {res['complete'][0]} of" in table and all(f"| `{n}` |" in table for n in plan.names)
    assert markdown_table(P.rebuild(out, plan)) == table


def test_a_resumed_run_runs_nothing_and_the_rebuild_is_the_run(toy):
    plan, out, res = toy
    again = P.run_protocol4(out, plan, RunOptions(workers=1, progress=False))
    assert again["timings"]["jobs_run"] == 0
    back = P.rebuild(out, plan)
    written = json.loads((out / P.RESULTS).read_text())
    for k in ("speed_lrs", "length", "conditions", "capability_lrs", "speed", "capability", "complete"):
        assert json.dumps(written[k]) == json.dumps(json.loads(json.dumps(back[k]))), k
    with pytest.raises(ValueError, match="its journal is not this protocol's"):
        P.rebuild(out, P.Plan())


def test_every_job_records_the_validation_measures(toy):
    from difftransformer.jobs import read_journal
    _, out, _ = toy
    _, records = read_journal(out / P.JOURNAL, P.STUDY.validate_run)
    for r in records.values():
        assert set(r["result"]["val_conditions"]) == {c.name for c in P.CANDIDATES}
        assert r["result"]["val_training_loss"] > 0


@pytest.mark.parametrize("extra, match", [
    (["--reference", "x"], "--reference does not go with --protocol 4"),
    (["--steps", "5"], "--steps does not go with --protocol 4"),
    (["--diagnostic"], "--diagnostic"),
    (["--rounding-check", "avx2", "--quick"], "--quick does not go with --protocol 4 --rounding-check"),
])
def test_the_command_refuses_before_any_work(extra, match, tmp_path, capsys):
    cli_fails(capsys, ["retrieval", "--protocol", "4", "--out", str(tmp_path / "o"), *extra], match)
    assert not (tmp_path / "o").exists()


def test_the_committed_journal_rebuilds(monkeypatch):
    """The committed version-4 journal (finished or not): every record's key is the one the protocol computes for its
    job under the default plan, every job one the protocol asks for given the others, and the rebuild reads it; once
    finished, the committed protocol4.json is that rebuild's reading."""
    monkeypatch.setattr(P, "KEEP", KEEP)
    from difftransformer.jobs import read_journal
    from difftransformer.retrieval.protocol4_text import markdown_table
    out = ROOT / "docs" / "results" / "retrieval-v4"
    plan = P.Plan()
    header, records = read_journal(out / P.JOURNAL, P.STUDY.validate_run)
    assert header["plan"] == plan.to_dict() and records
    key = P.key_of(plan.config.to_dict(), "cpu")
    done = {P.V4Job(*r["job"]): r["result"] for r in records.values()}
    asked, _ = P.needed(plan, done)
    for rec in records.values():
        job = P.V4Job(*rec["job"])
        assert rec["key"] == key(job) and job in asked
    res = P.rebuild(out, plan)
    assert res["complete"][0] == len(records)
    assert f"{len(records)} of {res['complete'][1]} jobs" in markdown_table(res)
    if res["complete"][0] == res["complete"][1]:  # finished (2026-12-06): the committed results are the rebuild's
        from difftransformer.studies.schema import read_checked
        written = read_checked(out / P.RESULTS, P.STUDY.validate)
        for k in ("plan", "complete", "speed_lrs", "length", "conditions", "capability_lrs", "speed", "capability"):
            assert json.dumps(written[k]) == json.dumps(json.loads(json.dumps(res[k]))), k


def test_the_default_plans_rebuild_reads_a_journal_once_per_state(tmp_path, monkeypatch):
    """``rebuild`` without a plan reads a journal once per state in a process (`make docs` and the answer table read
    the committed one several times): the same result again, a copy the caller may change; read again once the
    journal changes; never kept for another plan."""
    out = tmp_path / "v4"
    out.mkdir()
    shutil.copy(ROOT / "docs" / "results" / "retrieval-v4" / P.JOURNAL, out / P.JOURNAL)
    reads = []
    real = P.assess
    monkeypatch.setattr(P, "assess", lambda *a, **k: reads.append(1) or real(*a, **k))
    first = P.rebuild(out)
    first["complete"] = None
    again = P.rebuild(out)
    assert len(reads) == 1 and again["complete"] is not None and again == P.rebuild(out)
    lines = (out / P.JOURNAL).read_text().splitlines(keepends=True)
    (out / P.JOURNAL).write_text("".join(lines[:-1]))
    assert P.rebuild(out)["complete"][0] == again["complete"][0] - 1 and len(reads) == 2
    P.rebuild(out, P.Plan())
    P.rebuild(out, P.Plan())
    assert len(reads) == 4


def test_the_report_reads_it_and_its_section_marks_a_smoke_run(toy, tmp_path):
    """Version 4 as a registered study: ``report --retrieval-v4 DIR`` reads protocol4.json (checked), and the section
    shows both endpoints' table; a ``--quick`` run's section says it is a smoke run, a full one's does not."""
    from difftransformer.report.studies import STUDIES
    from difftransformer.retrieval import protocol4_study as S
    from difftransformer.studies.registry import by_name
    plan, out, res = toy
    assert by_name("retrieval-v4") is S.STUDY and [s.name for s in STUDIES][:2] == ["retrieval", "retrieval-v4"]
    read = S.STUDY.read(out, "--retrieval-v4")
    html = S.STUDY.section(read, out, None)
    assert "speed and capability as separate endpoints" in html and "Smoke run" not in html
    assert all(f"<code>{n}</code>" in html for n in plan.names) and f"L = {res['length']['L']}" in html
    assert "Smoke run" in S.STUDY.section({**read, "quick": True}, out, None)
    assert "in its journal (finished" in html and "`" not in html and "min of CPU in training" in html
    (tmp_path / P.RESULTS).write_text(json.dumps({**read, "benchmark": "retrieval"}))
    with pytest.raises(ValueError, match="--retrieval-v4: .* is not a retrieval --protocol 4 result"):
        S.STUDY.read(tmp_path, "--retrieval-v4")


def test_the_demo_runs_the_quick_form_into_its_folder(toy, tmp_path, monkeypatch):
    """``demo``'s stage runs ``quick_plan`` (here the toy plan, its journal already there: nothing to train) into
    OUT/retrieval-v4 and writes its protocol4.json; ``quick_plan`` itself is the smoke run's."""
    from difftransformer.retrieval import protocol4_study as S
    plan, out, res = toy
    assert P.quick_plan().quick and not P.Plan().quick
    monkeypatch.setattr(P, "quick_plan", lambda: plan)
    (tmp_path / "retrieval-v4").mkdir()
    shutil.copy(out / P.JOURNAL, tmp_path / "retrieval-v4" / P.JOURNAL)
    folder = S.smoke_run(tmp_path, progress=False)
    got = json.loads((folder / P.RESULTS).read_text())
    assert folder == tmp_path / "retrieval-v4" and got["timings"]["jobs_run"] == 0
    assert got["capability"] == json.loads(json.dumps(res["capability"]))


def test_the_rounding_check_reruns_the_test_jobs_and_reads_both_endpoints_again(toy, tmp_path, monkeypatch):
    """``retrieval --protocol 4 --rounding-check``: exactly the test jobs (every name at 600 steps at its speed lr and
    at L at its capability lr) run again (here a seam returns them, one name's accuracy at L moved), but those that
    ran under the pinned kernels already; both endpoints are read again with the protocol's rules, and a reading
    that moves is named; the reruns bitwise equal and each pair's kernels are counted; the check refuses a code path
    the protocol ran and an unfinished protocol."""
    import copy

    from difftransformer.jobs import read_journal
    from difftransformer.retrieval import protocol4_rounding as R
    plan, out, res = toy
    work = tmp_path / "v4"
    shutil.copytree(out, work)
    lines = (work / P.JOURNAL).read_text().splitlines()
    recs = [json.loads(x) for x in lines[1:]]
    for r in recs:  # as if run on an AVX-512 machine, but the baseline's speed jobs (as if on an AVX2 one)
        r["result"]["cpu_capability"] = "AVX2" if (r["job"][0], r["job"][1]) == ("baseline", plan.speed_steps) else "AVX512"
    (work / P.JOURNAL).write_text("\n".join([lines[0], *map(json.dumps, recs)]) + "\n")
    _, records = read_journal(work / P.JOURNAL, P.STUDY.validate_run)
    first = {P.V4Job(*r["job"]): r["result"] for r in records.values()}
    L, primary = res["length"]["L"], res["conditions"]["primary"]
    flip = 1.0 if res["capability"]["diff_v1"]["verdict"] == "inconclusive" else 0.0
    asked: list = []

    def rerun(plan_, jobs, where, code_path, options):
        asked.extend(jobs)
        got = {}
        for j in jobs:
            r = copy.deepcopy(first[j])
            r["cpu_capability"] = "AVX2"
            if j.name == "diff_v1" and j.steps == L:
                r["conditions"][primary]["accuracy"] = flip
                r["final_window_loss"] += 1.0
            got[j] = r
        return got, len(got)
    monkeypatch.setattr(R, "_rerun", rerun)
    check = R.rounding_check(work, "avx2", RunOptions(workers=1, progress=False), plan)
    want = [P.V4Job(n, plan.speed_steps, s, res["speed_lrs"][n]["lr"]) for n in plan.names for s in plan.test_seeds]
    want += [P.V4Job(n, L, s, res["capability_lrs"][n]["lr"]) for n in plan.names for s in plan.test_seeds]
    assert asked == [j for j in want if (j.name, j.steps) != ("baseline", plan.speed_steps)]  # not the AVX2 ones: the same bits
    assert check["speed"]["differ"] == [] and check["speed"]["equal_runs"] == [4, 4]
    assert check["speed"]["kernels"] == {"AVX2: not rerun": 2, "AVX512 -> AVX2": 4}
    cap = check["capability"]
    assert "diff_v1" in cap["differ"] and set(cap["differ"]) <= {"diff_v1", "v1_no_norm"}
    assert cap["equal_runs"] == [4, 6] and cap["rows"]["baseline"]["survives"]
    assert check["differ"] == [f"capability: {n}" for n in cap["differ"]]
    assert cap["kernels"] == {"AVX512 -> AVX2": 6}
    written = json.loads((work / "rounding-avx2" / "rounding.json").read_text())
    assert written["capability"] == json.loads(json.dumps(cap)) and written["timings"]["jobs_run"] == 10
    assert "DIFFERS" in R.format_rounding(check) and "kernels of each pair" in R.format_rounding(check)
    with pytest.raises(ValueError, match="the protocol ran that CPU code path"):
        R.rounding_check(work, "machine", RunOptions(workers=1, progress=False), plan)
    lines = (work / P.JOURNAL).read_text().splitlines()
    (work / P.JOURNAL).write_text("\n".join(lines[:4]) + "\n")
    with pytest.raises(ValueError, match="is not finished"):
        R.rounding_check(work, "avx2", RunOptions(workers=1, progress=False), plan)
    with pytest.raises(ValueError, match="no protocol version 4 there"):
        R.rounding_check(tmp_path / "none", "avx2", RunOptions(workers=1, progress=False), plan)


def test_a_rounding_check_that_has_not_finished_says_where_it_stands(toy, tmp_path):
    """``protocol4_rounding.progress`` (what `make docs` shows while the check runs): the reruns its journal holds
    (under the check's own keys) of those it asks, every test job that ran under other kernels; a journal of another
    code path is refused, and an unfinished protocol has no check to stand anywhere."""
    from difftransformer.jobs import read_journal
    from difftransformer.retrieval import protocol4_rounding as R
    plan, out, res = toy
    work = tmp_path / "v4"
    shutil.copytree(out, work)
    lines = (work / P.JOURNAL).read_text().splitlines()
    recs = [json.loads(x) for x in lines[1:]]
    for r in recs:  # as if every job ran on an AVX-512 machine, whichever this one is
        r["result"]["cpu_capability"] = "AVX512"
    (work / P.JOURNAL).write_text("\n".join([lines[0], *map(json.dumps, recs)]) + "\n")
    _, records = read_journal(work / P.JOURNAL, P.STUDY.validate_run)
    first = {P.V4Job(*r["job"]): r["result"] for r in records.values()}
    rerun = R._finished(work, "avx2", plan)[3]
    n = 2 * len(plan.names) * len(plan.test_seeds)  # both endpoints' test jobs, none of which ran under AVX2
    assert len(rerun) == n and R.progress(work, "avx2", plan) == (0, n)
    where = work / R.ROUNDING.format(code_path="avx2")
    where.mkdir()
    journal = R.STUDY.open_journal(where, R.STUDY.header(plan=plan.to_dict(), code_path="avx2"))
    key = P.key_of(plan.config.replace(cpu_code_path="avx2").to_dict(), "cpu")
    for job in rerun[:5]:
        journal.append(key(job), list(job), first[job])
    journal.append(P.key_of(plan.config.to_dict(), "cpu")(rerun[5]), list(rerun[5]), first[rerun[5]])  # not its key
    assert R.progress(work, "avx2", plan) == (5, n)
    with pytest.raises(ValueError, match="not this protocol's rounding check under avx512"):
        shutil.copytree(where, work / R.ROUNDING.format(code_path="avx512"))
        R.progress(work, "avx512", plan)
    lines = (work / P.JOURNAL).read_text().splitlines()
    (work / P.JOURNAL).write_text("\n".join(lines[:-1]) + "\n")  # one test job short: not finished
    with pytest.raises(ValueError, match="not finished"):
        R.progress(work, "avx2", plan)


def test_the_committed_rounding_check_is_its_journals(monkeypatch, tmp_path):
    """The committed AVX2 rounding check (finished 2026-12-07): every record of its journal is one of the reruns the
    check asks of the committed protocol, under the check's own key, run under AVX2 kernels; the committed protocol's
    journal and the check's give the committed rounding.json with no job run; docs/retrieval.md quotes its readings,
    and its words (every speed reading survives; on capability DIFF V2's and v1_gain's do not) are the file's."""
    from difftransformer.jobs import read_journal
    from difftransformer.retrieval import protocol4_rounding as R
    from difftransformer.rundir.files import ROUNDING_NAME
    monkeypatch.setattr(P, "KEEP", KEEP)
    out, where = ROOT / "docs" / "results" / "retrieval-v4", R.ROUNDING.format(code_path="avx2")
    _, records = read_journal(out / where / P.JOURNAL, P.STUDY.validate_run)
    done, asked = R.progress(out, "avx2")
    assert done == len(records) == asked == 188  # 92 test jobs at 600 steps and 96 at L ran under AVX-512
    assert {r["result"]["cpu_capability"] for r in records.values()} == {"AVX2"}
    shutil.copy(out / P.JOURNAL, tmp_path / P.JOURNAL)
    (tmp_path / where).mkdir()
    shutil.copy(out / where / P.JOURNAL, tmp_path / where / P.JOURNAL)
    check = json.loads(json.dumps(R.rounding_check(tmp_path, "avx2", RunOptions(workers=1, progress=False))))
    committed = json.loads((out / where / ROUNDING_NAME).read_text())
    assert check["timings"]["jobs_run"] == 0 and check["timings"]["jobs"] == 188
    strip = lambda r: {k: v for k, v in r.items() if k != "timings"}  # noqa: E731
    assert strip(check) == strip(committed)
    assert R.format_rounding(committed) in (ROOT / "docs" / "retrieval.md").read_text()
    moved = {e: [n for n, r in committed[e]["rows"].items() if not r["survives"]] for e in ("speed", "capability")}
    assert moved == {"speed": [], "capability": ["diff_v2", "v1_gain"]}
