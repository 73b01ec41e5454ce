"""The language-model sweep's rounding check (PROTOCOL.md, "Reproducibility" and "Clarifications"): the same sweep
under two CPU code paths, its verdicts side by side. ``compare``: two finished sweeps; ``partial_rounding``: two
journals, one or both unfinished, on the widths both finished, or the chosen scope (``analysis.rounding_jobs``) at
the reference's lr choices."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, cast

from ..model import variants as registry
from ..studies.schema import RoundingCheck, RoundingRow, VerdictCells, compare_verdicts, rounding_counts
from .analysis import Choices, Job, assemble, lr_choice
from .config import LMSweepConfig
from .sweep import JOURNAL, verdict_rows
from .sweep_schema import validate_lm_run


def compare(other: dict[str, Any], res: dict[str, Any]) -> dict[str, Any]:
    """The rounding check's comparison (``studies.schema.compare_verdicts``, the retrieval benchmark's too: the
    reference first): the same sweep under two CPU code paths (``other`` the reference run's sweep.json, ``res`` this
    run): both verdict tables side by side, the verdicts and lr choices that differ."""
    if {k: v for k, v in res["config"].items() if k != "cpu_code_path"} != \
            {k: v for k, v in other["config"].items() if k != "cpu_code_path"}:
        raise ValueError("--rounding-of: that sweep ran another configuration (only the CPU code path may differ)")
    def cells(r: dict[str, Any]) -> list[VerdictCells]:
        return [VerdictCells(x.endpoint, x.variant, x.estimate, x.verdict) for x in verdict_rows(r)]
    lrs = {v: [[w, x, y] for w, x, y in zip(res["widths"], other["chosen_lr"][v], res["chosen_lr"][v]) if x != y]
           for v in res["chosen_lr"]}
    # matched by name: a row whose jobs the other run lacks reads "not run"
    check = compare_verdicts(cells(other), cells(res), [other["config"]["cpu_code_path"],
                                                         res["config"]["cpu_code_path"]],
                             {v: d for v, d in lrs.items() if d})
    return cast(dict[str, Any], check)  # a RoundingCheck (a plain dict while lmsweep/cli.py holds it as one)


def format_rounding(check_: Mapping[str, Any]) -> str:
    """The check's text (a ``RoundingCheck``, or ``partial_rounding``'s, which holds one)."""
    check = cast(RoundingCheck, check_)
    p, q = check["code_paths"]
    lines = [f"rounding check: the same sweep under CPU code path {p!r} (reference) and {q!r}",
             f"{'endpoint':<36} {'variant':<8} {p + ': estimate':<30} {'verdict':<26} {q + ': estimate':<30} "
             f"{'verdict':<26} same"]
    for r in map(RoundingRow._make, check["rows"]):  # a list each when read back from rounding.json
        lines.append(f"{r.endpoint:<36} {r.variant:<8} {r.estimate:<30} {r.verdict:<26} {r.other_estimate:<30} "
                     f"{r.other_verdict:<26} {r.same}")
    lines.append(f"{check['verdicts_same']} of {check['verdicts']} verdicts the same"
                 + (f" ({check['not_run']} not run)" if check.get("not_run") else "") + "; lr choices that differ: "
                 + (", ".join(f"{v} at d={w}: {x:g} vs {y:g}" for v, d in check["lr_choices_differ"].items()
                              for w, x, y in d) or "none"))
    return "\n".join(lines)


def loss_cap(c: LMSweepConfig) -> float:
    """ln(vocabulary): the loss a diverged run counts as (the preset's tokenizer size)."""
    from .job import train_config
    return math.log(train_config(c, c.widths[0], c.variants[0], 0, 1e-3, "").model.vocab_size)


def read_journal(out_dir: str | Path) -> tuple[dict[str, Any], dict[Job, dict[str, Any]]]:
    """(header, {job: result}) of a sweep's journal, finished or not (read by the runner's one rule: a torn last line
    is skipped)."""
    from ..jobs import read_journal as read
    path = Path(out_dir) / JOURNAL
    if not path.is_file():
        raise ValueError(f"{out_dir} holds no {JOURNAL} (not a language-model sweep's output)")
    header, records = read(path, validate_lm_run)
    return header, {Job(*rec["job"]): rec["result"] for rec in records.values()}


def _configs(ref_dir: str | Path, other_dir: str | Path):
    """Both sweeps' journals, configurations and loss cap, refused unless only the CPU code path differs."""
    (ha, da), (hb, db) = read_journal(ref_dir), read_journal(other_dir)
    ca, cb = LMSweepConfig.from_dict(ha["config"]), LMSweepConfig.from_dict(hb["config"])
    if ca.replace(cpu_code_path="machine") != cb.replace(cpu_code_path="machine") or ha["data"] != hb["data"]:
        raise ValueError("the two sweeps ran other configurations (only the CPU code path may differ)")
    if ca.cpu_code_path == cb.cpu_code_path:
        raise ValueError(f"both sweeps ran the CPU code path {ca.cpu_code_path!r}: nothing to check")
    return (ca, da), (cb, db), loss_cap(ca)


def reference_choices(ref_dir: str | Path) -> Choices:
    """A finished sweep's lr choices at every width (the rounding check's chosen scope runs at them)."""
    header, done = read_journal(ref_dir)
    c = LMSweepConfig.from_dict(header["config"])
    cap = loss_cap(c)
    ch = {w: {v: lr_choice(c, w, v, done, cap) for v in c.variants} for w in c.widths}
    if any(x.lr is None for d in ch.values() for x in d.values()):
        raise ValueError(f"{ref_dir}: an lr choice is not settled yet (the reference sweep is unfinished)")
    return ch


SCOPES = ("all", "chosen")  # the rounding check's scopes (PROTOCOL.md, "Clarifications")


def partial_rounding(ref_dir: str | Path, other_dir: str | Path, scope: str = "all") -> dict[str, Any]:
    """The rounding check on the widths that two sweeps (same configuration, two CPU code paths) have both
    finished, one or both runs unfinished: the verdicts of those widths side by side (the Fig. 3a ratio only when
    every width is in: its fit needs them all) and, over every job both ran, how many losses are bitwise equal.
    ``scope`` "chosen": the other run holds the chosen scope (``analysis.rounding_jobs``): it is decided at the
    reference's lr choices, and a width counts as finished once its jobs at those lrs are in."""

    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    (ca, da), (cb, db), cap = _configs(ref_dir, other_dir)
    base = registry.reference().name
    ref_ch = reference_choices(ref_dir) if scope == "chosen" else None

    def complete(c: LMSweepConfig, done: dict[Job, dict[str, Any]], w: int, given: Optional[Choices]) -> bool:
        ch = given[w] if given else {v: lr_choice(c, w, v, done, cap) for v in c.variants}
        if any(x.lr is None for x in ch.values()):
            return False
        need = {Job(w, v, s, ch[v].lr) for v in c.variants for s in c.test_seeds}  # type: ignore[arg-type]
        if given is None:  # the whole sweep's width also holds the matched-lr jobs
            need |= {Job(w, v, s, ch[base].lr) for v in c.variants for s in c.test_seeds}  # type: ignore[arg-type]
        return need <= done.keys()
    widths = tuple(w for w in sorted(ca.widths) if complete(ca, da, w, None) and complete(cb, db, w, ref_ch))
    both = sorted(set(da) & set(db))
    equal = sum(da[j]["test_loss"] == db[j]["test_loss"] for j in both)
    gaps = [abs(da[j]["test_loss"] - db[j]["test_loss"]) for j in both
            if da[j]["test_loss"] is not None and db[j]["test_loss"] is not None]
    out: dict[str, Any] = {"scope": scope, "widths": list(widths), "jobs_both": len(both), "jobs_equal": equal,
                           "max_abs_loss_gap": max(gaps) if gaps else None, "jobs": [len(da), len(db)]}
    if not widths:
        out.update(rows=[], note="no width finished by both")
        return out
    res_a = {"config": ca.to_dict(), **assemble(ca, da, cap, widths)}
    res_b = {"config": cb.to_dict(), **assemble(cb, db, cap, widths, ref_ch and {w: ref_ch[w] for w in widths})}
    check = compare(res_a, res_b)
    every = len(widths) == len(ca.widths)
    rows = [r for r in check["rows"] if every or not RoundingRow._make(r).endpoint.startswith("(b)")]  # a fit over
    # a subset of the widths: not the protocol's
    note = ("" if every else "the Fig. 3a ratio is left out: its fit needs every width; the rows at the largest "
            f"width finished by both stand for the protocol's largest-width endpoints only when it is d_model "
            f"{ca.largest}")
    if scope == "chosen":
        note = ("; ".join(x for x in (note, "the lr choices are the reference run's (not replayed under the other "
                                      "code path: a choice that rounding would move is not checked)") if x))
    out.update(code_paths=check["code_paths"], rows=rows, **rounding_counts(rows),
               lr_choices_differ=check["lr_choices_differ"], note=note)
    return out


def format_partial_rounding(check: dict[str, Any]) -> str:
    lines = [f"jobs run by both: {check['jobs_both']} (of {check['jobs'][0]} and {check['jobs'][1]}); test losses "
             f"bitwise equal: {check['jobs_equal']}; largest difference {check['max_abs_loss_gap']}",
             f"widths both finished: {check['widths']}" + (f"; {check['note']}" if check["note"] else "")]
    if check["rows"]:
        lines.insert(0, format_rounding(check))
    return "\n".join(lines)
