"""The re-reading at longer training's rounding check (LONGER.md, issue 69 item 3): the finished re-reading's 1,200-
and 2,400-step jobs again under another CPU code path, each length's readings and each answer-table cell's class
under both (``retrieval --longer 1200,2400 --rounding-check CODE_PATH``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from ..jobs import RunOptions
from ..rundir.files import ROUNDING_NAME
from .config import RetrievalConfig
from .longer import JOURNAL, NAMES, STEPS, classify, first_reading, rebuild, run_longer

ROUNDING = "rounding-{code_path}"  # the rounding check's OUT, inside the re-reading's
ROUNDING_RESULTS = ROUNDING_NAME


def rounding_check(diag_dir: str | Path, out_dir: str | Path, code_path: str,
                   options: Optional[RunOptions] = None) -> dict[str, Any]:
    """LONGER.md's rounding check: the finished re-reading in ``out_dir``, every 1,200- and 2,400-step job again under
    ``code_path`` into OUT/rounding-CODE_PATH (resumable), each length's D, C and reading and each answer-table cell's
    class (speed, capability) under both code paths; the 600-step row is the committed diagnostic's in both (its own
    rounding check is the diagnostic's)."""
    from ..studies.rounding import compare_readings
    options = options or RunOptions(workers=2)
    first = first_reading(diag_dir)
    cfg = RetrievalConfig.from_dict(first["config"])
    if code_path == cfg.cpu_code_path:
        raise ValueError(f"--rounding-check {code_path}: the re-reading already ran that CPU code path; name another")
    if not (Path(out_dir) / JOURNAL).is_file():
        raise ValueError(f"--out {out_dir}: no re-reading there (its {JOURNAL}); the rounding check reruns a finished "
                         "one, e.g. docs/results/retrieval-longer")
    one = rebuild(diag_dir, out_dir)
    if one["complete"][0] < one["complete"][1]:
        raise ValueError(f"--out {out_dir}: the re-reading there is not finished ({one['complete'][0]} of "
                         f"{one['complete'][1]} jobs); its rounding check reruns a finished one")
    t0 = time.perf_counter()
    two = _run(diag_dir, Path(out_dir) / ROUNDING.format(code_path=code_path), STEPS, options, code_path)
    rows: dict[str, Any] = {}
    for st in STEPS:
        a, b = one["lengths"][str(st)], two["lengths"][str(st)]
        keep = ("D", "C", "reading")
        check = compare_readings({n: {k: a[n][k] for k in keep if k in a[n]} for n in NAMES[1:]},
                                 {n: {k: b[n][k] for k in keep if k in b[n]} for n in NAMES[1:]},
                                 {n: [sum(x == y for x, y in zip(a[n]["accuracy"], b[n]["accuracy"])),
                                      len(a[n]["accuracy"])] for n in NAMES[1:]})
        rows[str(st)] = check
    cls = {"first": classify(one["lengths"]), "second": classify(two["lengths"])}
    differ = [n for n in NAMES[1:] if cls["first"][n]["class"] != cls["second"][n]["class"]]
    return {"study": "retrieval longer training", "code_paths": [cfg.cpu_code_path, code_path], "lengths": rows,
            "classes": {n: [cls["first"][n]["class"], cls["second"][n]["class"]] for n in NAMES[1:]},
            "classes_differ": differ, "timings": {"wall_s": time.perf_counter() - t0, **options.describe()}}


def format_rounding(check: dict[str, Any]) -> str:
    p1, p2 = check["code_paths"]
    lines = [f"retrieval longer training: rounding check, {p1} (first) against {p2} (second)"]
    for st, c in check["lengths"].items():
        lines.append(f"  {st} steps: readings that differ: {', '.join(c['differ']) or 'none'}; runs bitwise equal "
                     f"{c['equal_runs'][0]} of {c['equal_runs'][1]}")
    for n, (a, b) in check["classes"].items():
        lines.append(f"  {n:30s} class {a} -> {b}")
    lines.append(f"  classes that differ: {', '.join(check['classes_differ']) or 'none'}")
    return "\n".join(lines)


def _run(diag_dir: str | Path, out_dir: Path, steps: tuple[int, ...], options: RunOptions, code_path: str):
    """``longer.run_longer`` under ``code_path`` (a seam the tests replace to check the reading without training)."""
    return run_longer(diag_dir, out_dir, steps, options, code_path)
