"""`make gpu-check`'s summary: the raw outputs of its steps (``bench/gpu_check.py``) read back into one dict, written as
``summary.json`` and ``summary.md``, with the ``TRITON_AUTO_MEASURED`` entries the numbers support.

Each reader takes a command's printed text as it is (the tables of ``bench attention|train|decode``, pytest's last
line, ``bench/small_jobs.py``'s row lines) and keeps what it finds, so a step stopped by its time limit still gives
the rows it printed. Ratios are the benches' own, to the baseline's SDPA in the same run; nothing is recomputed
from times except the Triton-against-SDPA speedups of the proposals.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

CONFIG_PREFIX = "# triton config:"
SMALL_JOBS_PREFIX = "# small-jobs row: "  # bench/small_jobs.ROW_PREFIX (not imported: this module needs no torch)
ENV_PREFIX = "# gpu-check env: "
CANDIDATE_PREFIX = "# candidate: "  # bench/gpu_candidates.LINE (not imported: that module needs torch)
# The least Triton-over-SDPA speedup that counts as "faster" in a proposal. Two runs of the same path on the H200
# (2026-11-26: the baseline's decode tokens/s in the sdpa and the triton decode runs) differed by at most 0.6%,
# so 2% is about three times the noise between equal paths.
MIN_SPEEDUP = 1.02
PASSES_MEASURED = {"train": "attention fwd+bwd and the training step", "decode": "the decode step"}


def _float(s: str) -> float:
    return float(s.replace(",", ""))


# ---------------------------------------------------------------------------------------------- readers
def read_env(text: str) -> dict[str, Any]:
    """The probe's ``# gpu-check env: {json}`` line (``gpu_check env``), else {}."""
    for line in text.splitlines():
        if line.startswith(ENV_PREFIX):
            return json.loads(line[len(ENV_PREFIX):])
    return {}


def read_pytest(text: str) -> dict[str, Any]:
    """pytest -q's counts ("3 failed, 69 passed, 2 skipped, 15 warnings in 64.34s") and the FAILED/ERROR ids."""
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
    """The candidates step's lines, ``# candidate: ok|wrong|failed KEY CONFIG (...): reason (S s)``: counts per
    status, and the wrong and failed ones (key, config, reason). ``finished``: its count line was printed."""
    counts = {"ok": 0, "wrong": 0, "failed": 0}
    bad = []
    line_re = re.compile(re.escape(CANDIDATE_PREFIX) + r"(ok|wrong|failed) (\S+) (\S+) \(([^)]*)\): (.*?)"
                         r"(?: \([\d.]+ s\))?$")
    for line in text.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        status, key, config, where, reason = m.groups()
        counts[status] += 1
        if status != "ok":
            bad.append({"status": status, "key": key, "config": config, "where": where, "reason": reason})
    finished = re.search(r"^# candidates: \d+ ok, \d+ wrong, \d+ failed of", text, re.M) is not None
    head = re.search(r"^# candidates: (sm_\d+), \d+ candidates .*?, (\w+), T (\d+)", text, re.M)
    arch, dtype = (head.group(1), head.group(2)) if head else (None, None)
    return {"counts": counts, "bad": bad, "finished": finished, "arch": arch, "dtype": dtype}


def _shape(header: str) -> dict[str, Any]:
    shape = re.search(r"shape (\S+?)(?: with ([^:]+))?:", header)
    hd = re.search(r"head_dim=(\d+)|heads of (\d+)", header)
    dtype = re.search(r"\b(bfloat16|float16|float32)\b", header)
    return {"shape": shape.group(1) if shape else None, "overrides": shape.group(2) if shape else None,
            "head_dim": int(next(g for g in hd.groups() if g)) if hd else None,
            "dtype": dtype.group(1) if dtype else None}


def read_attention(text: str) -> dict[str, Any]:
    """``bench attention``: {shape, head_dim, dtype, labels (the DIFF cases), rows: {N: {"baseline_ms", label:
    time ratio}}}. The table: "N", the baseline's "3.0ms 87.6MB", then "1.54x 1.23xM" per case."""
    lines = text.splitlines()
    header = next((ln for ln in lines if ln.startswith("# attention fwd+bwd")), "")
    out: dict[str, Any] = {**_shape(header), "labels": [], "rows": {}}
    for i, line in enumerate(lines):
        words = line.split()
        if words[:1] == ["N"] and len(words) >= 3:
            pairs = [" ".join(words[j:j + 2]) for j in range(1, len(words), 2)]  # "baseline sdpa", "V1 triton"
            out["labels"] = pairs[1:]
            for row in lines[i + 1:]:
                cells = row.split()
                if not cells or not cells[0].isdigit() or not cells[1].endswith("ms"):
                    continue
                ratios = [c for c in cells[3:] if c.endswith("x")]  # time ratios; memory cells end in "xM"
                rec: dict[str, float] = {"baseline_ms": _float(cells[1][:-2])}
                rec.update({lab: _float(r[:-1]) for lab, r in zip(out["labels"], ratios)})
                out["rows"][int(cells[0])] = rec
            break
    return out


def read_train(text: str) -> dict[str, Any]:
    """``bench train``: {shape, head_dim, seq, batch, layers, rows: {label: {params, ms, tokens_s, ratio}}}."""
    header = next((ln for ln in text.splitlines() if ln.startswith("# training step")), "")
    out: dict[str, Any] = {**_shape(header), "labels": [], "rows": {}}
    sb = re.search(r"seq (\d+) x batch (\d+)", header)
    layers = re.search(r"(\d+) layers", header)
    out.update(seq=int(sb.group(1)) if sb else None, batch=int(sb.group(2)) if sb else None,
               layers=int(layers.group(1)) if layers else None)
    row = re.compile(r"^(\S.*?)\s+([\d,]+)\s+([\d.]+)\s+([\d,]+)\s+([\d.]+)x$")
    for line in text.splitlines():
        m = row.match(line.strip())
        if m and not line.startswith("#"):
            label = m.group(1)
            out["rows"][label] = {"params": int(_float(m.group(2))), "ms": _float(m.group(3)),
                                  "tokens_s": _float(m.group(4)), "ratio": _float(m.group(5))}
    out["labels"] = list(out["rows"])[1:]
    return out


def read_decode(text: str) -> dict[str, Any]:
    """``bench decode``: {backend, head_dim, dtype, labels, rows: [{batch, context, baseline_tok_s, label: ratio}]}.
    The columns: batch, context, the baseline's tok/s, then "<V> tok/s" and "<V>/base" per variant, then HF's."""
    lines = text.splitlines()
    header = next((ln for ln in lines if ln.startswith("# decode tokens/s")), "")
    backend = re.search(r"DIFF backend (\S+?);", header)
    out: dict[str, Any] = {**_shape(header), "backend": backend.group(1) if backend else None, "labels": [],
                           "rows": []}
    for i, line in enumerate(lines):
        if line.split()[:2] == ["batch", "context"]:
            out["labels"] = re.findall(r"(\S+)/base", line)
            for row in lines[i + 1:]:
                cells = row.split()
                if len(cells) < 3 or not (cells[0].isdigit() and cells[1].isdigit()):
                    continue
                ratios = [c for c in cells[3:] if c.endswith("x")]
                rec: dict[str, Any] = {"batch": int(cells[0]), "context": int(cells[1]),
                                       "baseline_tok_s": _float(cells[2])}
                rec.update({lab: _float(r[:-1]) for lab, r in zip(out["labels"], ratios)})
                out["rows"].append(rec)
            break
    return out


def read_small_jobs(text: str) -> dict[str, Any]:
    """``bench/small_jobs.py``: its row lines, and jobs/min of each P-process row over one job at a time."""
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
           "train": read_train, "decode": read_decode, "small-jobs": read_small_jobs}


# ---------------------------------------------------------------------------------------------- the summary
def summarize(results: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The summary of one check: ``results`` (per step: name, kind, status, seconds, limit_s, command, output
    path, and ``text``, its raw output) read by each kind's reader; ``meta``: commit, budget, wall time, mode."""
    steps, parsed, configs = [], {}, []
    env: dict[str, Any] = {}
    for r in results:
        steps.append({k: r[k] for k in ("name", "kind", "status", "rc", "seconds", "limit_s", "command", "output")})
        text = r.get("text", "")
        data = READERS[r["kind"]](text) if r["kind"] in READERS else {}
        if r["kind"] == "env":
            env = data
        else:
            parsed[r["name"]] = {"kind": r["kind"], **data}
        configs += [{"step": r["name"], **c} for c in triton_configs(text)]
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
    out += [f"| {st['name']} | {st['status']} | {st['seconds']:.1f} | {st['limit_s']:.0f} | {st['output']} |"
            for st in s["steps"]]
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
                    + ("" if r["finished"] else " (stopped before pytest's summary line: the cases it got to)")]
            out += [f"- FAILED {f}" for f in r["failed"]]
    out += ["", "## Ratios", "", *ratio_table(s)]
    for name, r in s["results"].items():
        if r["kind"] == "decode" and r["rows"]:
            out += ["", f"Decode, backend {r['backend']} (`{name}`): " + "; ".join(
                f"batch {x['batch']} context {x['context']}: baseline {x['baseline_tok_s']:,.0f} tok/s, "
                + ", ".join(f"{lab} {x[lab]:.3f}x" for lab in r["labels"] if lab in x) for x in r["rows"])]
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
