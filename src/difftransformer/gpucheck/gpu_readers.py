"""`make gpu-check`'s readers: each takes one step's printed text (``gpucheck/gpu_check.py``) as it is (the data lines
of ``bench attention|train|decode`` and ``bench kernels``, never their tables; the ``# gpu-tests:`` line or pytest's
last line, the row lines of ``gpucheck/small_jobs.py``, the candidates' and the smoke's lines, the probe's env
line) and keeps what it finds, so a step stopped by its time limit still gives the rows it printed. ``READERS`` maps
a step's kind to its reader; ``split_parts`` cuts the output of a step with parts into its parts; ``gpu_summary``
puts the results together.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

CONFIG_PREFIX = "# triton config:"
SMALL_JOBS_PREFIX = "# small-jobs row: "  # small_jobs.ROW_PREFIX (not imported: this module needs no torch)
ENV_PREFIX = "# gpu-check env: "
KERNELS_PREFIX = "# kernels row: "  # bench/kernels.ROW_PREFIX (needs torch)
TESTS_PREFIX = "# gpu-tests: "  # gpu_tests.LINE
PART_PREFIX = "# gpu-check part: "  # gpu_check.run_parts' lines around each part



def read_env(text: str) -> dict[str, Any]:
    """The probe's ``# gpu-check env: {json}`` line (``gpu_check env``), else {}."""
    for line in text.splitlines():
        if line.startswith(ENV_PREFIX):
            return json.loads(line[len(ENV_PREFIX):])
    return {}


def read_pytest(text: str) -> dict[str, Any]:
    """The tests step's ``# gpu-tests: {json}`` line (``gpucheck/gpu_tests.py``: its shards' counts summed), else
    pytest -q's counts ("3 failed, 69 passed, 2 skipped, 15 warnings in 64.34s") and the FAILED/ERROR ids."""
    sharded = [ln for ln in text.splitlines() if ln.startswith(TESTS_PREFIX)]
    if sharded:
        return json.loads(sharded[-1][len(TESTS_PREFIX):])
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if re.search(r"\b(passed|failed|skipped|error|errors|no tests ran)\b.* in [\d.]+s", line):
            counts = {}
            for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)", line):
                counts["errors" if what.startswith("error") else what] = int(n)
    failed = [m.group(2) for m in re.finditer(r"^(FAILED|ERROR) (\S+)", text, re.M)]
    if not counts:  # stopped before its last line: count the progress characters -q printed ("..F.s  [ 40%]")
        marks = "".join(m.group(1) for m in re.finditer(r"^([.FEsxX]+)\s*(?:\[\s*\d+%\])?$", text, re.M))
        names = {".": "passed", "F": "failed", "E": "errors", "s": "skipped", "x": "xfailed", "X": "xpassed"}
        for ch in marks:
            counts[names[ch]] = counts.get(names[ch], 0) + 1
        return {"counts": counts, "failed": failed, "finished": False}
    return {"counts": counts, "failed": failed, "finished": True}


def read_candidates(text: str) -> dict[str, Any]:
    """The candidates step's data lines (``gpu_candidates.format_line``): counts per status, and the wrong and failed
    ones (key, config, where, reason); ``finished``: its end line was printed; the GPU's arch and the dtype."""
    setup, rows, end = _data(text, "candidates")
    counts = {"ok": 0, "wrong": 0, "failed": 0}
    for r in rows:
        counts[r["status"]] += 1
    bad = [{k: r[k] for k in ("status", "key", "config", "where", "reason")} for r in rows if r["status"] != "ok"]
    return {"counts": counts, "bad": bad, "finished": end is not None, "arch": setup.get("arch"),
            "dtype": setup.get("dtype")}


def read_smoke(text: str) -> dict[str, Any]:
    """The smoke's data lines (``cuda_smoke.format_line``): one row per command (name, status, seconds, device_flag,
    reason); ``finished`` where its end line was printed; ``not_run``: the commands its setup line names that have
    no row (a step stopped by its limit)."""
    setup, rows, end = _data(text, "cuda-smoke")
    done = {r["name"] for r in rows}
    return {"rows": rows, "finished": end is not None,
            "not_run": [n for n in setup.get("commands", []) if n not in done]}


def read_kernels(text: str) -> dict[str, Any]:
    """``bench kernels``: its ``# kernels row: {json}`` lines."""
    return {"rows": [json.loads(ln[len(KERNELS_PREFIX):]) for ln in text.splitlines()
                     if ln.startswith(KERNELS_PREFIX)]}


def split_parts(text: str) -> dict[str, dict[str, Any]]:
    """A step with parts (``gpu_check parts``): {part name: {text, status, seconds}} for each part that started;
    status "ok"/"failed" from its end line, "timeout" where the step stopped before it (seconds: None)."""
    start_re = re.compile(r"^" + re.escape(PART_PREFIX) + r"(\S+) \S+ start", re.M)
    end_re = re.compile(r"^" + re.escape(PART_PREFIX) + r"(\S+) (ok|failed) \(rc -?\d+\) after ([\d.]+) s$", re.M)
    starts = list(start_re.finditer(text))
    out = {}
    for i, m in enumerate(starts):
        body = text[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        end = next((e for e in end_re.finditer(body) if e.group(1) == m.group(1)), None)
        out[m.group(1)] = {"text": body[:end.start()] if end else body, "status": end.group(2) if end else "timeout",
                           "seconds": float(end.group(3)) if end else None}
    return out


def _data(text: str, what: str) -> tuple[dict[str, Any], list[dict[str, Any]], Optional[dict[str, Any]]]:
    """A command's data lines (``bench/common.data_line`` and the like): its last ``# WHAT setup: {json}``, every
    ``# WHAT row: {json}`` and its ``# WHAT end: {json}`` (None where it stopped before it); the text beside them
    left unread."""
    setup_prefix, row_prefix, end_prefix = f"# {what} setup: ", f"# {what} row: ", f"# {what} end: "
    setup: dict[str, Any] = {}
    rows = []
    end = None
    for line in text.splitlines():
        if line.startswith(setup_prefix):
            setup = json.loads(line[len(setup_prefix):])
        elif line.startswith(row_prefix):
            rows.append(json.loads(line[len(row_prefix):]))
        elif line.startswith(end_prefix):
            end = json.loads(line[len(end_prefix):])
    return setup, rows, end


def _head(setup: dict[str, Any], *extra: str) -> dict[str, Any]:
    return {k: setup.get(k) for k in ("shape", "overrides", "head_dim", "dtype", *extra)}


def read_attention(text: str) -> dict[str, Any]:
    """``bench attention``: {shape, overrides, head_dim, dtype, labels (the DIFF cases), rows: {N: {"baseline_ms",
    label: time ratio}}}, from its setup and row lines."""
    setup, rows, _ = _data(text, "attention")
    return {**_head(setup), "labels": setup.get("labels", []),
            "rows": {r["n"]: {k: v for k, v in r.items() if k != "n"} for r in rows}}


def read_train(text: str) -> dict[str, Any]:
    """``bench train``: {shape, overrides, head_dim, dtype, labels, rows: {label: {params, ms, tokens_s, ratio}},
    seq, batch, layers}, from its setup and row lines."""
    setup, rows, _ = _data(text, "train")
    by_label = {r["label"]: {k: v for k, v in r.items() if k != "label"} for r in rows}
    return {**_head(setup), "labels": list(by_label)[1:], "rows": by_label, "seq": setup.get("seq"),
            "batch": setup.get("batch"), "layers": setup.get("layers")}


def read_decode(text: str) -> dict[str, Any]:
    """``bench decode``: {shape, overrides, head_dim, dtype, backend, labels, rows: [{batch, context, baseline_tok_s,
    label: ratio}]}, from its setup and row lines."""
    setup, rows, _ = _data(text, "decode")
    return {**_head(setup, "backend"), "labels": setup.get("labels", []), "rows": rows}


def read_small_jobs(text: str) -> dict[str, Any]:
    """``gpucheck/small_jobs.py``: its row lines, and jobs/min of each P-process row over one job at a time."""
    rows = [json.loads(ln[len(SMALL_JOBS_PREFIX):]) for ln in text.splitlines() if ln.startswith(SMALL_JOBS_PREFIX)]
    one = {r["variant"]: r["jobs_per_min"] for r in rows if r["processes"] == 1}
    for r in rows:
        if r["processes"] > 1 and r["variant"] in one:
            r["vs_one_at_a_time"] = r["jobs_per_min"] / one[r["variant"]]
    return {"rows": rows}


def triton_configs(text: str) -> list[dict[str, Any]]:
    """Every ``# triton config: KEY {json}`` line (the configs the kernels ran with), as {key, config}."""
    out = []
    for line in text.splitlines():
        if line.startswith(CONFIG_PREFIX):
            key, _, rest = line[len(CONFIG_PREFIX):].strip().partition(" ")
            try:
                config: Any = json.loads(rest)
            except ValueError:
                config = rest
            out.append({"key": key, "config": config})
    return out


READERS = {"env": read_env, "candidates": read_candidates, "tests": read_pytest, "attention": read_attention,
           "train": read_train, "decode": read_decode, "small-jobs": read_small_jobs, "smoke": read_smoke,
           "kernels": read_kernels}
