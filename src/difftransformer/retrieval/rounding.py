"""The rounding check (PROTOCOL.md, "Reproducibility and the rounding check"): every job again under another CPU
code path, and the two verdict tables side by side.

Another instruction set rounds differently (fused multiply-adds, vector widths, reduction orders); a chaotic training
run turns that into other numbers. A verdict that differs between the two runs rests on rounding, not on the
variants, and the page says so. ``OUT/rounding.json`` holds both tables; ``OUT/rounding-CODE_PATH/`` the second run
(results.json, its job journal: resumable like the first).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, cast

from ..jobs import RunOptions
from ..rundir.studies import RetrievalResults, RetrievalRounding, RoundingDiffer, RoundingVerdict
from .config import RetrievalConfig
from .statistics import verdicts


def verdict_table(results: RetrievalResults) -> list[RoundingVerdict]:
    """One row per counted verdict: claim, variant, verdict, estimate, interval, seeds."""
    return [{"claim": r["claim"], "variant": r["variant"], "verdict": r["verdict"],
             "estimate": r["stats"]["estimate"], "ci": r["stats"]["ci"], "n": r["stats"]["n_seeds"][0]}
            for r in verdicts(results)]


def compare(first_: Mapping[str, Any], second_: Mapping[str, Any]) -> RetrievalRounding:
    """Both verdict tables (of two ``RetrievalResults``), the verdicts that differ, the chosen lrs and the per-seed
    numbers that differ."""
    first, second = cast(RetrievalResults, first_), cast(RetrievalResults, second_)
    a, b = verdict_table(first), verdict_table(second)
    differ: list[RoundingDiffer] = [
        {"claim": x["claim"], "variant": x["variant"], "first": x["verdict"], "second": y["verdict"]}
        for x, y in zip(a, b) if x["verdict"] != y["verdict"]]
    lrs = {v: [first["variants"][v]["tuned_lr"], second["variants"][v]["tuned_lr"]] for v in first["variants"]}
    runs = [(v, r1, r2) for v in first["variants"]
            for r1, r2 in zip(first["variants"][v]["grid_runs"], second["variants"][v]["grid_runs"])]
    prim = first["config"]["primary"]
    equal = sum(r1["conditions"][prim]["accuracy"] == r2["conditions"][prim]["accuracy"] for _, r1, r2 in runs)
    return {"code_paths": [first["cpu"], second["cpu"]], "first": a, "second": b, "differ": differ,
            "chosen_lr": lrs, "grid_runs_equal_at_primary": [equal, len(runs)]}


def rounding_check(first: Mapping[str, Any], cfg: RetrievalConfig, out_dir: str | Path, workers: int = 2,
                   progress: bool = True, quick: bool = False, options: Optional[RunOptions] = None
                   ) -> RetrievalRounding:
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
    """The check's text (a ``RetrievalRounding``)."""
    check = cast(RetrievalRounding, check_)
    (p1, p2) = (f"{c['code_path']} ({', '.join(c['torch_kernels'])})" for c in check["code_paths"])
    lines = [f"rounding check: the verdicts under CPU code path {p1} and {p2}"]
    for x, y in zip(check["first"], check["second"]):
        cell = lambda r: f"{r['verdict']} {r['estimate']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]"  # noqa: E731
        lines.append(f"  {x['variant']:<8} {x['claim'][:44]:<44} {cell(x):<40} {cell(y)}"
                     + ("   DIFFERS" if x["verdict"] != y["verdict"] else ""))
    lrs = ", ".join(f"{v} {a:g}/{b:g}" for v, (a, b) in check["chosen_lr"].items())
    eq, n = check["grid_runs_equal_at_primary"]
    lines.append(f"chosen lr (first/second): {lrs}; grid runs with the same primary accuracy: {eq} of {n}")
    lines.append(f"{len(check['differ'])} verdict(s) differ" + (": " + "; ".join(
        f"{d['variant']} {d['claim']}: {d['first']} vs {d['second']}" for d in check["differ"]) if check["differ"]
        else ": every verdict survives the other code path's rounding"))
    return "\n".join(lines)
