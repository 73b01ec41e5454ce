"""The report's HTML page: one self-contained file (styles inline, figures as base64 PNGs)."""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from ...model import variants as registry
from ...model.variants import label
from ..analyses import ANALYSES
from ..spec import by_name
from .results import RunResults, Settings
from .training import TITLE as TRAINING_TITLE
from .verdicts import HELD, INCONCLUSIVE, NOT_HELD, RULE, SMOKE, parameter_notes, summary_note

# The page's sections after the training one: the attention map of Fig. 1 sits right after the retrieval results
# it illustrates, the rest in the order of the paper's claims (analyses.ANALYSES).
PAGE_ORDER = ("needles", "attnmap", "noise", "outliers", "quantized", "positions", "icl")

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.6em 0 1.2em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}img{max-width:100%;border:1px solid #eee}
.held{background:#d9f2d9}.did-not-hold{background:#f8d7d7}.inconclusive-at-this-scale{background:#f4f1d0}
pre{background:#f7f7f7;padding:0.6em;overflow:auto;font-size:12px}.note{color:#555;font-size:0.92em}"""

# Tells a headless browser (and the render test) that every embedded image decoded.
CHECK_IMAGES = """<script>window.addEventListener('load',function(){var im=document.images,ok=im.length>0;
for(var i=0;i<im.length;i++){if(!(im[i].complete&&im[i].naturalWidth>0))ok=false;}
document.body.setAttribute('data-images-ok',ok?'yes':'no');document.body.setAttribute('data-images',im.length);});
</script>"""


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if math.isfinite(x) else "nan"
    return _esc(x)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], cls: Optional[Sequence[str]] = None,
          left: int = 1) -> str:
    """An HTML table; the first ``left`` columns are left-aligned text, ``cls`` gives each row a class."""
    h = "".join(f'<th class="l">{_esc(c)}</th>' if i < left else f"<th>{_esc(c)}</th>" for i, c in enumerate(header))
    body = []
    for k, row in enumerate(rows):
        cells = "".join(f'<td class="l">{_fmt(c)}</td>' if i < left else f"<td>{_fmt(c)}</td>"
                        for i, c in enumerate(row))
        attr = f' class="{cls[k]}"' if cls else ""
        body.append(f"<tr{attr}>{cells}</tr>")
    return f"<table><tr>{h}</tr>{''.join(body)}</table>"


def image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<p><img alt="{_esc(alt)}" src="data:image/png;base64,{data}"></p>'


def deviations_note(deviations: Optional[Sequence[str]]) -> str:
    """A study's departures from its protocol as its results file lists them (``deviations``), for its section of
    the page; nothing when there are none."""
    if not deviations:
        return ""
    return ("<p class='note'>Deviations from the protocol:</p><ul class='note'>"
            + "".join(f"<li>{_esc(d)}</li>" for d in deviations) + "</ul>")


def _slug(verdict: str) -> str:
    return verdict.replace(" ", "-")


def _verdict_rule() -> str:
    """The verdict rule, shown above the verdict table."""
    return RULE


def render_html(runs: Sequence[RunResults], rows: Sequence[dict[str, Any]], figures: dict[str, Path],
                settings: Settings, extra: dict[str, Any]) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>difftransformer report</title>"
             f"<style>{CSS}</style></head><body>",
             "<h1>Differential attention vs the baseline: report</h1>",
             f"<p class='note'>Written {_esc(_dt.datetime.now().isoformat(timespec='seconds'))} by difftransformer "
             f"{_esc(extra.get('version', ''))}; evaluation {'quick' if settings.quick else 'full'} settings, "
             f"evaluation seed {settings.seed}. Every number below was measured on the models listed, in this "
             "run of the report; nothing is copied from the paper except the reference column.</p>"]
    if extra.get("preface"):
        parts.append(f"<p>{extra['preface']}</p>")
    if "retrieval" in extra:  # the lead: the paper's central claim, on a task every variant learns
        rrows = extra["retrieval_rows"]
        parts += ["<h2>Retrieval among distractors: token-level key-value benchmark</h2>",
                  table(["claim", "variant", "verdict", "paper", "measure (primary endpoint)", "evidence"],
                        [[r["claim"], label(r["variant"]), r["verdict"], r["paper"], r["measure"], r["why"]]
                         for r in rrows], cls=[_slug(r["verdict"]) for r in rrows], left=6),
                  extra["retrieval"]]
    if "lm_sweep" in extra:  # the pre-registered language-model claims (Fig. 3), before the descriptive models
        parts.append(extra["lm_sweep"])
    if "retrieval" in extra or "lm_sweep" in extra:
        parts.append("<h2>Language models on the embedded corpus</h2>")
    # models
    mrows = []
    for r in runs:
        d = r.ev.run_config.get("data", {})
        mrows.append([r.ev.label, label(r.attention), r.ev.model.num_parameters(), r.ev.seed,
                      r.training.get("final_val_loss"), len(r.training["step"]) and r.training["step"][-1],
                      d.get("retrieval_share"), str(r.ev.source)])
    parts += ["<h2>Models</h2>",
              table(["run", "attention", "parameters", "seed", "final val loss", "steps", "retrieval share",
                     "directory"], mrows, left=2)]
    # verdicts
    n_seeds = {v: sum(r.attention == v for r in runs) for v in registry.names()}
    one_seed = " With one seed per variant the seed-to-seed spread is unknown." if max(n_seeds.values()) <= 1 else ""
    parts += ["<h2>Verdicts</h2>",
              "<p class='note'>Runs per variant: " + ", ".join(f"{label(v)} {n}" for v, n in n_seeds.items() if n)
              + "." + one_seed + " " + _esc(_verdict_rule()) + "</p>",
              table(["claim", "variant", "verdict", "paper", "measure (primary endpoint)", "evidence"],
                    [[r["claim"], label(r["variant"]), r["verdict"], r["paper"], r["measure"], r["why"]]
                     for r in rows], cls=[_slug(r["verdict"]) for r in rows], left=6)]
    counts = {v: {k: sum(1 for r in rows if r["variant"] == v and r["verdict"] == k)
                  for k in (HELD, NOT_HELD, INCONCLUSIVE, SMOKE)} for v in (x.name for x in registry.compared())}
    summary = "; ".join(f"{label(v)}: " + ", ".join(f"{n} {k}" for k, n in c.items() if n)
                        for v, c in counts.items() if sum(c.values()))
    rrows = extra.get("retrieval_rows", []) if "retrieval" in extra else []
    # The multiplicity note counts every verdict on the page, the retrieval benchmark's included.
    notes = [summary_note(list(rrows) + list(rows)), *parameter_notes(runs)]
    if rrows:
        notes[0] += f" ({len(rrows)} of them in the retrieval benchmark above, {len(rows)} here.)"
    parts.append(f"<p><b>Summary.</b> {_esc(summary)}.</p>"
                 + "".join(f"<p class='note'>{_esc(n)}</p>" for n in notes if n))
    # sections
    sec = extra.get("sections", {})
    headings = {s.name: s.heading for s in ANALYSES}
    for key, title in [("training", TRAINING_TITLE)] + [(k, headings[k]) for k in PAGE_ORDER]:
        parts.append(f"<h2>{_esc(title)}</h2>")
        if key in sec:
            parts.append(sec[key])
        if key in figures:
            parts.append(image(figures[key], title))
        errs = [(r.ev.label, r.errors[key]) for r in runs if key in r.errors]
        if errs:
            parts.append(table(["run", "not measured because"], errs, left=2))
    # configs
    parts.append("<h2>Configurations and seeds</h2>")
    for r in runs:
        cfg = r.ev.run_config or {"model": r.ev.model.cfg.to_dict()}
        parts.append(f"<details><summary>{_esc(r.ev.label)}: {_esc(r.ev.source)}</summary>"
                     f"<pre>{_esc(json.dumps(cfg, indent=1))}</pre></details>")
    parts.append(CHECK_IMAGES + "</body></html>")
    return "\n".join(parts)


def _needles_section(runs: Sequence[RunResults]) -> str:
    rs = [r for r in runs if "needles" in r.results]
    if not rs:
        return ""
    t = rs[0].results["needles"]["task"]
    rows = [[r.ev.label, r.results["needles"]["mean_accuracy"], r.results["needles"]["first_token_accuracy"],
             r.results["needles"]["any_needle_first_token"], r.results["needles"]["last_answer_first_token"],
             t["random_needle"], t["chance"]] for r in rs]
    return (f"<p class='note'>{t['n_needles']} needles, {t['n_queries']} questions (the last scored), "
            f"{t['digits']}-digit numbers; exact match of the greedy answer. Chance (guessing the digits) "
            f"{t['chance']:.3g}; copying a random needle's number {t['random_needle']:.3g}.</p>"
            + table(["run", "mean accuracy", "first token right", "first token = some needle's",
                     "= the last answered question's (a wrong shortcut)", "random needle", "chance"], rows))


def _noise_section(runs: Sequence[RunResults]) -> str:
    rs = [r for r in runs if "noise" in r.results]
    rows = [[r.ev.label, r.results["noise"]["map"], r.results["noise"]["answer"], r.results["noise"]["noise"],
             r.results["noise"].get("answer_signed"), r.results["noise"].get("noise_signed"),
             r.results["noise"]["uniform_answer_share"]] for r in rs]
    out = table(["run", "map", "answer share", "noise share", "answer mass (signed)", "noise mass (signed)",
                 "uniform attention's answer share"], rows, left=2)
    out += ("<p>Shares are scale-free: the mass on the answer span, and the |mass| on the rest of the context, each "
            "divided by the row's total |mass| over the context. DIFF's rows sum to 1 - lambda, so the signed masses "
            "shrink with lambda even when the model attends no differently; the verdicts compare the shares.</p>")
    if any((r.results["noise"].get(k) or 0) < 0 for r in rs for k in ("answer_signed", "noise_signed")):
        out += ("<p>A negative signed mass is possible for DIFF: its map A1 - lambda*A2 is not a probability "
                "distribution, and where the second map outweighs the first the sum goes below zero.</p>")
    return out


def _outliers_section(runs: Sequence[RunResults]) -> str:
    rs = [r for r in runs if "outliers" in r.results]
    rows = []
    for r in rs:
        x = r.results["outliers"]
        rows.append([r.ev.label] + [x[k].get(s) for k in ("attention_logits", "hidden_states")
                                    for s in ("top1", "top10", "median")])
    return table(["run", "logit top-1", "logit top-10", "logit median", "hidden top-1", "hidden top-10",
                  "hidden median"], rows)


def _quantized_section(runs: Sequence[RunResults]) -> str:
    rs = [r for r in runs if "quantized" in r.results]
    if not rs:
        return ""
    bits = [row["bits"] for row in rs[0].results["quantized"]["rows"]]
    head = ["run"] + [f"loss {b or 'full'}" for b in bits] + [f"acc {b or 'full'}" for b in bits]
    rows = [[r.ev.label] + [row["loss"] for row in r.results["quantized"]["rows"]]
            + [row["accuracy"] for row in r.results["quantized"]["rows"]] for r in rs]
    t = rs[0].results["quantized"]["task"]
    return (f"<p class='note'>{_esc(rs[0].results['quantized']['scheme'])}; random-needle level "
            f"{t['random_needle']:.3g}, chance {t['chance']:.3g}.</p>" + table(head, rows))


def _module_section(runs: Sequence[RunResults], name: str) -> str:
    """The analysis's own text (its spec's ``format``), one per run: for analyses without a table here."""
    if not any(name in r.results for r in runs):
        return ""
    fmt = by_name(ANALYSES, name).format
    texts = [fmt(r.results[name]) for r in runs if name in r.results]
    return "".join(f"<pre>{_esc(t)}</pre>" for t in texts)



# Analyses with a comparison table of their own; every other per-run analysis shows its spec's text.
TABLES = {"needles": _needles_section, "noise": _noise_section, "outliers": _outliers_section,
          "quantized": _quantized_section}


def analysis_section(runs: Sequence[RunResults], name: str) -> str:
    return TABLES[name](runs) if name in TABLES else _module_section(runs, name)
