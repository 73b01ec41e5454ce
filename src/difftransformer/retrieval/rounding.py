"""The rounding check (PROTOCOL.md, "Reproducibility and the rounding check"): every job again under another CPU
code path, and the two verdict tables side by side.

Another instruction set rounds differently (fused multiply-adds, vector widths, reduction orders); a chaotic training
run turns that into other numbers. A verdict that differs between the two runs rests on rounding, not on the
variants, and the page says so. ``OUT/rounding.json`` holds both tables; ``OUT/rounding-CODE_PATH/`` the second run
(results.json, its job journal: resumable like the first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, cast

from ..jobs import RunOptions
from ..studies.schema import RoundingCheck, RoundingRow, VerdictCells, compare_verdicts
from .benchmark_schema import RetrievalResults, VerdictRow
from .config import RetrievalConfig
from .statistics import verdicts


def estimate_text(r: VerdictRow) -> str:
    """A verdict's estimate and interval in words, as rounding.json's rows hold them."""
    st = r["stats"]
    lo, hi = st["ci"]
    return f"{st['estimate']:+.3f} [{lo:+.3f}, {hi:+.3f}]" if all(map(math.isfinite, (lo, hi))) else "no interval"


def verdict_cells(results: RetrievalResults) -> list[VerdictCells]:
    """One row per counted verdict (the tuned lr): claim, variant, estimate and interval, verdict."""
    return [VerdictCells(r["claim"], r["variant"], estimate_text(r), r["verdict"]) for r in verdicts(results)]


def compare(first_: Mapping[str, Any], second_: Mapping[str, Any]) -> RoundingCheck:
    """The rounding check of two ``RetrievalResults`` (``studies.schema.compare_verdicts``, the sweep's too): both
    verdict tables side by side, the verdicts and the chosen lrs that differ, and how many grid runs kept bitwise the
    same primary accuracy."""
    first, second = cast(RetrievalResults, first_), cast(RetrievalResults, second_)
    lrs = {v: [first["variants"][v]["tuned_lr"], second["variants"][v]["tuned_lr"]] for v in first["variants"]}
    check = compare_verdicts(verdict_cells(first), verdict_cells(second),
                             [first["cpu"]["code_path"], second["cpu"]["code_path"]],
                             {v: [ab] for v, ab in lrs.items() if ab[0] != ab[1]})
    runs = [(r1, r2) for v in first["variants"]
            for r1, r2 in zip(first["variants"][v].get("grid_runs", []), second["variants"][v].get("grid_runs", []))]
    prim = first["config"]["primary"]
    equal = sum(r1["conditions"][prim]["accuracy"] == r2["conditions"][prim]["accuracy"] for r1, r2 in runs)
    check["torch_kernels"] = [first["cpu"]["torch_kernels"], second["cpu"]["torch_kernels"]]
    check["chosen_lr"] = lrs
    check["grid_runs_equal_at_primary"] = [equal, len(runs)]
    return check


def rounding_check(first: Mapping[str, Any], cfg: RetrievalConfig, out_dir: str | Path, workers: int = 2,
                   progress: bool = True, quick: bool = False, options: Optional[RunOptions] = None
                   ) -> RoundingCheck:
    """Run the benchmark of ``cfg`` (the first run's configuration under another code path) into
    ``out_dir/rounding-PATH``; the command writes the check to ``out_dir/rounding.json``
    (``studies.cli.write_rounding``)."""
    from .benchmark import run_benchmark
    if cfg.cpu_code_path == first["config"]["cpu_code_path"]:
        raise ValueError(f"--rounding-check {cfg.cpu_code_path}: the benchmark already ran that CPU code path; "
                         "name another one")
    second = run_benchmark(cfg, Path(out_dir) / f"rounding-{cfg.cpu_code_path}", workers=workers, progress=progress,
                           quick=quick, options=options)
    return compare(first, second)


def format_rounding(check_: Mapping[str, Any]) -> str:
    """The check's text (a ``RoundingCheck``)."""
    check = cast(RoundingCheck, check_)
    kernels = check.get("torch_kernels") or [[], []]
    (p1, p2) = (f"{c} ({', '.join(k)})" for c, k in zip(check["code_paths"], kernels))
    lines = [f"rounding check: the verdicts under CPU code path {p1} and {p2}"]
    rows = [RoundingRow._make(r) for r in check["rows"]]
    for r in rows:
        lines.append(f"  {r.variant:<8} {r.endpoint[:44]:<44} {r.verdict + ' ' + r.estimate:<40} "
                     f"{r.other_verdict} {r.other_estimate}" + ("   DIFFERS" if r.same == "NO" else ""))
    lrs = ", ".join(f"{v} {a:g}/{b:g}" for v, (a, b) in check.get("chosen_lr", {}).items())
    eq, n = check.get("grid_runs_equal_at_primary", [0, 0])
    lines.append(f"chosen lr (first/second): {lrs}; grid runs with the same primary accuracy: {eq} of {n}")
    differ = [r for r in rows if r.same != "yes"]
    lines.append(f"{len(differ)} verdict(s) differ" + (": " + "; ".join(
        f"{r.variant} {r.endpoint}: {r.verdict} vs {r.other_verdict}" for r in differ) if differ
        else ": every verdict survives the other code path's rounding"))
    return "\n".join(lines)
