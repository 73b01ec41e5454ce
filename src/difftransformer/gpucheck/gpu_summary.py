"""`make gpu-check`'s summary: the raw outputs of its steps (``gpucheck/gpu_check.py``), read back by
``gpucheck/gpu_readers.py``, put into one dict, written as ``summary.json`` and ``summary.md``, with the
``TRITON_AUTO_MEASURED`` entries the numbers support.

Ratios are the benches' own, to the baseline's SDPA in the same run; nothing is recomputed from times except the
Triton-against-SDPA speedups of the proposals.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from .gpu_readers import READERS, split_parts, triton_configs

# The least Triton-over-SDPA speedup that counts as "faster" in a proposal. Two runs of the same path on the H200
# (2026-11-26: the baseline's decode tokens/s in the sdpa and the triton decode runs) differed by at most 0.6%,
# so 2% is about three times the noise between equal paths.
MIN_SPEEDUP = 1.02
PASSES_MEASURED = {"train": "attention fwd+bwd and the training step", "decode": "the decode step"}


# ---------------------------------------------------------------------------------------------- the summary
def expand(r: dict[str, Any]) -> list[dict[str, Any]]:
    """A step's result as the measurements it holds: itself, or for a step with parts one result per part (its
    text cut out of the step's, its status and seconds from its end line; "not run" where it did not start)."""
    if not r.get("parts"):
        return [r]
    cut = split_parts(r.get("text", ""))
    out = []
    for name, kind in r["parts"]:
        got = cut.get(name, {"text": "", "status": "not run", "seconds": None})
        status = got["status"] if got["status"] != "timeout" or r["status"] == "timeout" else "failed"
        out.append({"name": name, "kind": kind, "status": status, "rc": None, "seconds": got["seconds"],
                    "limit_s": None, "command": "", "output": r["output"], "text": got["text"], "part_of": r["name"]})
    return out


def summarize(results: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The summary of one check: ``results`` (per step: name, kind, status, seconds, limit_s, command, output
    path, ``text``, its raw output, and its ``parts`` [name, kind]) read by each kind's reader, a step with parts
    part by part; ``meta``: commit, budget, wall time, mode."""
    steps, parsed, configs, seen = [], {}, [], set()
    env: dict[str, Any] = {}
    keys = ("name", "kind", "status", "rc", "seconds", "limit_s", "command", "output")
    for step in results:
        steps.append({k: step[k] for k in keys})
        for r in expand(step):
            if r is not step:
                steps.append({**{k: r[k] for k in keys}, "part_of": r["part_of"]})
            text = r.get("text", "")
            data = READERS[r["kind"]](text) if r["kind"] in READERS else {}
            if r["kind"] == "env":
                env = data
            else:
                parsed[r["name"]] = {"kind": r["kind"], **data}
            for c in triton_configs(text):  # a part prints its process's configs so far: each once, where first
                key = (c["key"], json.dumps(c["config"], sort_keys=True))
                if key not in seen:
                    seen.add(key)
                    configs.append({"step": r["name"], **c})
    summary = {**meta, "env": env, "steps": steps, "results": parsed, "triton_configs": configs}
    summary["proposals"] = proposals(summary)
    summary["goals"] = goals(summary)
    return summary


def _of(summary: dict[str, Any], kind: str) -> Iterable[tuple[str, dict[str, Any]]]:
    return ((name, r) for name, r in summary["results"].items() if r["kind"] == kind)


def _pairs(labels: Iterable[str], triton: str = "triton", sdpa: str = "sdpa") -> list[tuple[str, str, str]]:
    """(variant short name, its triton label, its sdpa label) for the variants measured with both."""
    labels = list(labels)
    return [(lab.split()[0], lab, lab.split()[0] + " " + sdpa) for lab in labels
            if lab.endswith(" " + triton) and lab.split()[0] + " " + sdpa in labels]


def speedups(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Triton over SDPA for each variant, per measurement: attention time (sdpa ratio / triton ratio, each to the
    baseline in its run), training tokens/s (triton ratio / sdpa ratio), decode tokens/s (the triton run's
    ratio / the sdpa run's, each to the baseline of its own run). Above 1: Triton faster."""
    out = []
    for name, r in _of(summary, "attention"):
        for variant, tri, sd in _pairs(r["labels"]):
            for n, row in r["rows"].items():
                if tri in row and sd in row:
                    out.append({"pass": "train", "head_dim": r["head_dim"], "dtype": r["dtype"], "variant": variant,
                                "what": f"{name} N={n}", "speedup": row[sd] / row[tri]})
    for name, r in _of(summary, "train"):
        for variant, tri, sd in _pairs(r["labels"]):
            out.append({"pass": "train", "head_dim": r["head_dim"], "dtype": r["dtype"], "variant": variant,
                        "what": name, "speedup": r["rows"][tri]["ratio"] / r["rows"][sd]["ratio"]})
    runs = {r["backend"]: (name, r) for name, r in _of(summary, "decode")}
    if "triton" in runs and "sdpa" in runs:
        (_, tri_run), (_, sd_run) = runs["triton"], runs["sdpa"]
        sd_rows = {(x["batch"], x["context"]): x for x in sd_run["rows"]}
        for x in tri_run["rows"]:
            y = sd_rows.get((x["batch"], x["context"]))
            for lab in tri_run["labels"]:
                if y is not None and lab in x and lab in y:
                    out.append({"pass": "decode", "head_dim": tri_run["head_dim"], "dtype": tri_run["dtype"],
                                "variant": lab, "what": f"decode batch {x['batch']} context {x['context']}",
                                "speedup": x[lab] / y[lab]})
    return out


def proposals(summary: dict[str, Any], min_speedup: float = MIN_SPEEDUP) -> list[dict[str, Any]]:
    """The ``TRITON_AUTO_MEASURED`` entries (capability, dtype, head_dim, pass) this check supports: Triton at least
    ``min_speedup`` times faster than SDPA for EVERY variant in EVERY measurement of that pass, head_dim and dtype
    (a training pass needs its training step measured too: attention alone is a part of it). Proposals only: the
    table is edited by hand, with the summary's numbers beside it."""
    cap = summary.get("env", {}).get("capability")
    if not cap:
        return []
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for s in speedups(summary):
        groups.setdefault((s["pass"], s["head_dim"], s["dtype"]), []).append(s)
    out = []
    for (pass_, hd, dtype), ss in sorted(groups.items(), key=str):
        if pass_ == "train" and not any(s["what"] in summary["results"] for s in ss):
            continue  # attention alone: no training step measured at this head_dim
        worst = min(ss, key=lambda s: s["speedup"])
        if worst["speedup"] >= min_speedup:
            out.append({"capability": list(cap), "dtype": dtype, "head_dim": hd, "pass": pass_,
                        "entry": f"(({cap[0]}, {cap[1]}), torch.{dtype}, {hd}, {pass_!r})",
                        "worst_speedup": worst["speedup"], "worst": f"{worst['variant']} {worst['what']}",
                        "measurements": len(ss)})
    return out


def goals(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 41 item 3's goals against this run's numbers: each goal's worst measured value and whether it holds."""
    rows: list[dict[str, Any]] = []

    def add(goal: str, label: str, values: list[tuple[float, str]], limit: float, at_most: bool) -> None:
        if values:
            value, where = (max if at_most else min)(values)
            rows.append({"goal": goal, "case": label, "worst": value, "where": where,
                         "met": value <= limit if at_most else value >= limit})

    for name, r in _of(summary, "attention"):
        if r["head_dim"] == 128:
            for lab in r["labels"]:
                if lab.startswith("V1 ") and lab.endswith(" triton"):
                    add("V1 attention fwd+bwd at head_dim 128 <= 1.55x", lab,
                        [(row[lab], f"{name} N={n}") for n, row in r["rows"].items() if lab in row], 1.55, True)
    by_variant: dict[str, list[tuple[float, str]]] = {}
    for s in speedups(summary):  # attention, training and decode alike: Triton's speed over SDPA's
        by_variant.setdefault(s["variant"], []).append((s["speedup"], s["what"]))
    for variant, values in by_variant.items():
        add("fused kernel no slower than SDPA (speed triton / sdpa >= 1)", f"{variant} triton", values, 1.0, False)
    for _, r in _of(summary, "decode"):
        for lab in r["labels"]:
            add("decode >= 0.95x", f"{lab} {r['backend']}",
                [(x[lab], f"batch {x['batch']} context {x['context']}") for x in r["rows"] if lab in x], 0.95, False)
    for name, r in _of(summary, "train"):
        if r["shape"] == "paper-3b":
            for lab in r["labels"]:
                limit = {"V1": 0.93, "V2": 0.90}.get(lab.split()[0])
                if limit is not None:
                    add(f"training at paper-3b >= {limit:.2f}x", lab, [(r["rows"][lab]["ratio"], name)], limit, False)
    return rows


# ---------------------------------------------------------------------------------------------- writing
def _x(v: Optional[float]) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}x"


def ratio_table(summary: dict[str, Any]) -> list[str]:
    """The issue's table: a row per measurement, a column per DIFF case (ratios to the baseline's SDPA)."""
    labels: list[str] = []
    for r in summary["results"].values():
        if r["kind"] in ("attention", "train"):
            labels += [lab for lab in r["labels"] if lab not in labels]
        if r["kind"] == "decode":
            labels += [f"{lab} {r['backend']}" for lab in r["labels"] if f"{lab} {r['backend']}" not in labels]
    lines = ["| measurement | " + " | ".join(labels) + " |", "| --- |" + " --- |" * len(labels)]
    for name, r in summary["results"].items():
        if r["kind"] == "attention" and r["rows"]:
            ns = sorted(r["rows"])
            cells = [" / ".join(_x(r["rows"][n].get(lab)) for n in ns) for lab in labels]
            title = (f"attention fwd+bwd, shape {r['shape']} (head_dim {r['head_dim']}), "
                     f"N={' / '.join(map(str, ns))} (`{name}`)")
        elif r["kind"] == "train" and r["rows"]:
            cells = [_x(r["rows"].get(lab, {}).get("ratio")) for lab in labels]
            title = (f"training tokens/s, shape {r['shape']}, {r['layers']} layers, {r['batch']} x {r['seq']} "
                     f"(`{name}`)")
        else:
            continue
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    decode = [r for r in summary["results"].values() if r["kind"] == "decode" and r["rows"]]
    if decode:
        cells = []
        for lab in labels:
            vals = [x[lab.split()[0]] for r in decode for x in r["rows"]
                    if f"{lab.split()[0]} {r['backend']}" == lab and lab.split()[0] in x]
            cells.append(f"{min(vals):.3f}-{max(vals):.3f}x" if vals else "-")
        bs = sorted({x["batch"] for r in decode for x in r["rows"]})
        cs = sorted({x["context"] for r in decode for x in r["rows"]})
        lines.append(f"| decode tokens/s, batch {'/'.join(map(str, bs))}, context {'/'.join(map(str, cs))} | "
                     + " | ".join(cells) + " |")
    return lines


def step_row(st: dict[str, Any]) -> str:
    """A row of the steps table; a part's row names its step ("attention / kernels-3b") and has no limit."""
    name = f"{st['part_of']} / {st['name']}" if st.get("part_of") else st["name"]
    seconds = "-" if st["seconds"] is None else f"{st['seconds']:.1f}"
    limit = "-" if st["limit_s"] is None else f"{st['limit_s']:.0f}"
    return f"| {name} | {st['status']} | {seconds} | {limit} | {st['output']} |"


def smoke_section(s: dict[str, Any]) -> list[str]:
    """The device smoke: its counts, and each command that failed (or was skipped) with its reason."""
    out = []
    for name, r in s["results"].items():
        if r["kind"] != "smoke":
            continue
        counts = {st: sum(x["status"] == st for x in r["rows"]) for st in ("ok", "failed", "skipped")}
        out += ["", f"## Every command on the device (`{name}`)", "",
                f"{counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped (an optional package "
                "missing on this machine) of the commands at toy size"
                + ("" if r["finished"] else " (stopped before its count line: the commands it got to)") + "."]
        out += [f"- {x['status'].upper()} `{x['name']}`: {x['reason']}" for x in r["rows"] if x["status"] != "ok"]
        if r.get("not_run"):
            out.append(f"- NOT RUN (the step stopped first): {', '.join(r['not_run'])}")
        no_flag = [x["name"] for x in r["rows"] if not x["device_flag"]]
        if no_flag:
            out.append(f"- without a --device flag (ran where the command puts it): {', '.join(no_flag)}")
    return out


def kernels_section(s: dict[str, Any]) -> list[str]:
    """The fused kernel's breakdown: ms, TFLOP/s and the time over the baseline's and over SDPA's same pass."""
    out = []
    for name, r in s["results"].items():
        if r["kind"] != "kernels" or not r["rows"]:
            continue
        first = r["rows"][0]
        out += ["", f"## Where the fused kernel loses (`{name}`)", "",
                f"Shape {first['shape']}, N={'/'.join(str(n) for n in dict.fromkeys(x['n'] for x in r['rows']))}: "
                "each pass and each fused kernel, GPU time; TFLOP/s of the FLOP counts in `bench/kernels.py`; "
                "x base: time over the baseline SDPA's same pass; x sdpa: over the same variant's SDPA pass.", "",
                "| case | what | N | ms | TFLOP/s | x base | x sdpa |", "| --- | --- | --- | --- | --- | --- | --- |"]
        out += [f"| {x['case']} | {x['what']} | {x['n']} | {x['ms']:.2f} | {x['tflops']:.1f} | {_x(x['vs_base'])} | "
                f"{_x(x['vs_sdpa'])} |" for x in r["rows"]]
    return out


def render_md(s: dict[str, Any]) -> str:
    env = s.get("env", {})
    card = env.get("device", "no GPU")
    out = [f"# GPU check: {card}, commit {s.get('commit', 'unknown')}", "",
           f"Source digest {s.get('source_digest', '?')} (`gpu_check.source_digest()` of the code that ran).", "",
           f"{s.get('mode', 'gpu')} run on {s.get('date', '?')}: torch {env.get('torch', '?')}, Triton "
           f"{env.get('triton', '?')}, CUDA {env.get('cuda', '?')}, capability {env.get('capability', '?')}, "
           f"{env.get('cpus', '?')} CPUs; {s.get('wall_s', 0):.0f} s of a {s.get('budget_s', 0):.0f} s budget. "
           "Ratios are to the baseline's SDPA in the same run (attention: time, lower is better; training and "
           "decode: tokens/s, higher is better). Raw outputs beside this file.", "",
           "## Steps", "", "| step | status | seconds | limit | output |", "| --- | --- | --- | --- | --- |"]
    out += [step_row(st) for st in s["steps"]]
    out += smoke_section(s)
    for name, r in s["results"].items():
        if r["kind"] == "candidates":
            c = r["counts"]
            out += ["", f"## Triton candidates (`{name}`)", "",
                    f"{c['ok']} ok, {c['wrong']} wrong (test failures: a config the tuner may pick computes a wrong "
                    f"answer), {c['failed']} failed to compile or launch"
                    + ("" if r["finished"] else " (stopped before its count line: the candidates it got to)")
                    + f"; each against the float64 oracle ({r.get('arch') or '?'}, {r.get('dtype') or '?'}). Wrong "
                    "and failed ones are left out of the later steps' tuning."]
            out += [f"- {'WRONG' if b['status'] == 'wrong' else 'FAILED'} {b['key']} {b['config']} ({b['where']}): "
                    f"{b['reason']}" for b in r["bad"]]
    for name, r in s["results"].items():
        if r["kind"] == "tests":
            c = r["counts"]
            out += ["", f"## Tests (`{name}`)", "",
                    (", ".join(f"{v} {k}" for k, v in c.items()) or "none ran")
                    + ("" if r["finished"] else " (stopped before pytest's summary line: the cases it got to)")
                    + (f"; {r['shards']} shards at once" if r.get("shards") else "")
                    + (f", {len(r['unfinished'])} did not end" if r.get("unfinished") else "")]
            out += [f"- FAILED {f}" for f in r["failed"]]
    out += ["", "## Ratios", "", *ratio_table(s)]
    for name, r in s["results"].items():
        if r["kind"] == "decode" and r["rows"]:
            out += ["", f"Decode, backend {r['backend']} (`{name}`): " + "; ".join(
                f"batch {x['batch']} context {x['context']}: baseline {x['baseline_tok_s']:,.0f} tok/s, "
                + ", ".join(f"{lab} {x[lab]:.3f}x" for lab in r["labels"] if lab in x) for x in r["rows"])]
    out += kernels_section(s)
    for name, r in s["results"].items():
        if r["kind"] == "small-jobs":
            out += ["", f"## Retrieval jobs per minute sharing one device (`{name}`)", "",
                    "| processes | variant | job s | ms/step | jobs/min | vs one at a time |",
                    "| --- | --- | --- | --- | --- | --- |"]
            out += [f"| {x['processes']} | {x['variant']} | {x['job_s']:.2f} | {x['ms_per_step']:.2f} | "
                    f"{x['jobs_per_min']:.1f} | {_x(x.get('vs_one_at_a_time'))} |" for x in r["rows"]]
    out += ["", "## Goals (issue 41, item 3)", "", "| goal | case | worst | where | met |",
            "| --- | --- | --- | --- | --- |"]
    out += [f"| {g['goal']} | {g['case']} | {g['worst']:.3f} | {g['where']} | {'yes' if g['met'] else 'NO'} |"
            for g in s["goals"]]
    out += ["", "## Triton configs chosen", ""]
    out += [f"- `{c['step']}`: {c['key']} {json.dumps(c['config'], sort_keys=True)}" for c in s["triton_configs"]]
    if not s["triton_configs"]:
        out.append("none printed")
    out += ["", "## Proposed `TRITON_AUTO_MEASURED` entries", "",
            f"(capability, dtype, head_dim, pass) where Triton was at least {MIN_SPEEDUP:.2f}x SDPA's speed for every "
            "variant in every measurement of that pass (" + "; ".join(f"{p}: {w}" for p, w in PASSES_MEASURED.items())
            + "; prefill is not measured here). Proposals only: edit the table by hand, citing this file.", ""]
    out += [f"- `{p['entry']}`: worst {p['worst_speedup']:.3f}x ({p['worst']}), {p['measurements']} measurements"
            for p in s["proposals"]]
    if not s["proposals"]:
        out.append("none")
    return "\n".join(out) + "\n"


def write(summary: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """``summary.json`` and ``summary.md`` in ``out_dir``."""
    js, md = out_dir / "summary.json", out_dir / "summary.md"
    js.write_text(json.dumps(summary, indent=1, sort_keys=True, default=str) + "\n")
    md.write_text(render_md(summary))
    return js, md
