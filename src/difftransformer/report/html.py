"""The report's HTML page: one self-contained file (styles inline, figures as base64 PNGs)."""

from __future__ import annotations

import base64
import datetime as _dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..eval.analyses import ANALYSES
from ..eval.spec import by_name
from ..eval.stats import SMOKE_MIN_STEPS
from ..model import variants as registry
from ..model.variants import label
from ..studies.page import counts_line, esc, image, inline, table, verdict_table
from .results import RunResults, Settings
from .training import TITLE as TRAINING_TITLE
from .verdicts import RULE, SMOKE, min_steps, parameter_notes, summary_note

# The page's sections after the training one: the attention map of Fig. 1 sits right after the retrieval results
# it illustrates, the rest in the order of the paper's claims (analyses.ANALYSES).
PAGE_ORDER = ("needles", "attnmap", "noise", "outliers", "quantized", "positions", "icl")

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.6em 0 1.2em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}img{max-width:100%;border:1px solid #eee}
.held{background:#d9f2d9}.did-not-hold{background:#f8d7d7}.inconclusive-at-this-scale{background:#f4f1d0}
pre{background:#f7f7f7;padding:0.6em;overflow:auto;font-size:12px;white-space:pre-wrap;overflow-wrap:anywhere}
.note{color:#555;font-size:0.92em}code{background:#f3f3f3;padding:0 3px;font-size:0.92em}
.wide{overflow-x:auto;border:1px solid #eee}.wide img{max-width:none;border:0}
.provenance{border:2px solid #c9a227;background:#fff8e1;padding:0.5em 0.9em}
details.smoke{border:1px solid #ccc;padding:0.3em 0.9em;margin:0.8em 0}details.smoke>summary{cursor:pointer}"""

# Tells a headless browser (and the render test) that every embedded image decoded.
CHECK_IMAGES = """<script>window.addEventListener('load',function(){var im=document.images,ok=im.length>0;
for(var i=0;i<im.length;i++){if(!(im[i].complete&&im[i].naturalWidth>0))ok=false;}
document.body.setAttribute('data-images-ok',ok?'yes':'no');document.body.setAttribute('data-images',im.length);});
</script>"""


# Figures drawn wider than the page (one bar per key, each key's token written under it: Fig. 1's attention map of
# a short context) are shown at their own size in a box that scrolls sideways, so that their labels stay legible.
WIDE = ("attnmap",)
COLUMN_PX = 1100  # the page's column (CSS max-width)


def wide_image(path: Path, alt: str) -> str:
    raw = path.read_bytes()
    if int.from_bytes(raw[16:20], "big") <= COLUMN_PX:  # the PNG header's width: it fits the column
        return image(path, alt)
    data = base64.b64encode(raw).decode()
    return (f"<p class='note'>Drawn at full size (scroll sideways).</p><div class='wide'><img alt=\"{esc(alt)}\" "
            f"src=\"data:image/png;base64,{data}\"></div>")


def _verdict_rule() -> str:
    """The verdict rule, shown above the verdict table."""
    return RULE


def multiplicity_note(rrows: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], fold: bool,
                      lead: str = "the retrieval benchmark") -> str:
    """How many verdicts the page makes and how many would read "held" by chance: the studies' counted ones
    (``rrows``, ``Study.verdicts``; ``lead`` names those studies) and the language models' (``rows``), a smoke run's
    rows not counted (they judge nothing), the language-model sweep's neither (its own family); "" when there are
    none. ``fold``: the language models' section is folded (no verdict table of its own), so the note sits under the
    studies' sections."""
    counted = [r for r in [*rrows, *rows] if r["verdict"] != SMOKE]
    note = summary_note(counted)
    n_lead = sum(r["verdict"] != SMOKE for r in rrows)
    if note and n_lead and not fold:
        note += f" ({n_lead} of them in {lead} above, {len(counted) - n_lead} here.)"
    return note


def _head(settings: Settings, extra: dict[str, Any]) -> list[str]:
    shown = (["the answer table"] if extra.get("answer") else []) + [
        f"{study.what}'s section" for study, _, _, committed in extra.get("studies", []) if committed]
    committed = (f" The exceptions are {' and '.join(shown)}: committed results, not measured in this run, each "
                 "saying where it comes from." if shown else "")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>difftransformer report</title>"
             f"<style>{CSS}</style></head><body>",
             "<h1>Differential attention vs the baseline: report</h1>",
             f"<p class='note'>Written {esc(_dt.datetime.now().isoformat(timespec='seconds'))} by difftransformer "
             f"{esc(extra.get('version', ''))}; evaluation {'quick' if settings.quick else 'full'} settings, "
             f"evaluation seed {settings.seed}. Every number below was measured in this run of the report, on the "
             "models and results it names; nothing is copied from the paper except the column headed "
             f"&ldquo;paper&rdquo;.{committed}</p>"]
    if extra.get("preface"):
        parts.append(f"<p>{inline(extra['preface'])}</p>")
    return parts


def _lead(extra: dict[str, Any], note: str) -> list[str]:
    """The committed answer table, then the pre-registered studies in the registry's order, each drawing its own
    section (the retrieval benchmark first: the paper's central claim), with ``note``, the multiplicity note, after
    them when the language models below judge nothing."""
    parts = [extra["answer"]] if "answer" in extra else []  # which attention for which job (committed results)
    parts += [section for _, section, _, _ in extra.get("studies", [])]
    if note:
        parts.append(f"<p class='note'>{esc(note)}</p>")
    return parts


def _models(runs: Sequence[RunResults], h: str) -> list[str]:
    mrows = []
    for r in runs:
        d = r.ev.run_config.get("data", {})
        mrows.append([r.ev.label, label(r.attention), r.ev.model.num_parameters(), r.ev.seed,
                      r.training.get("final_val_loss"), len(r.training["step"]) and r.training["step"][-1],
                      d.get("retrieval_share"), str(r.ev.source)])
    return [f"<{h}>Models</{h}>",
            table(["run", "attention", "parameters", "seed", "final val loss", "steps", "retrieval share",
                   "directory"], mrows, left=2)]


def _verdicts(runs: Sequence[RunResults], rows: Sequence[dict[str, Any]], note: str) -> list[str]:
    n_seeds = {v: sum(r.attention == v for r in runs) for v in registry.names()}
    one_seed = " With one seed per variant the seed-to-seed spread is unknown." if max(n_seeds.values()) <= 1 else ""
    notes = [note, *parameter_notes(runs)]
    return ["<h2>Verdicts</h2>",
            "<p class='note'>Runs per variant: " + ", ".join(f"{label(v)} {n}" for v, n in n_seeds.items() if n)
            + "." + one_seed + " " + esc(_verdict_rule()) + "</p>", verdict_table(rows),
            f"<p><b>Summary.</b> {esc(counts_line(rows))}.</p>"
            + "".join(f"<p class='note'>{esc(n)}</p>" for n in notes if n)]


def _sections(runs: Sequence[RunResults], figures: dict[str, Path], extra: dict[str, Any], h: str) -> list[str]:
    parts = []
    sec = extra.get("sections", {})
    headings = {s.name: s.heading for s in ANALYSES}
    for key, title in [("training", TRAINING_TITLE)] + [(k, headings[k]) for k in PAGE_ORDER]:
        parts.append(f"<{h}>{esc(title)}</{h}>")
        if key in sec:
            parts.append(sec[key])
        if key in figures:
            parts.append(wide_image(figures[key], title) if key in WIDE else image(figures[key], title))
        errs = [(r.ev.label, r.errors[key]) for r in runs if key in r.errors]
        if errs:
            sub = f"h{int(h[1]) + 1}"
            parts.append(f"<{sub}>{esc(title)}: not measured on every run</{sub}>"
                         + table(["run", "not measured because"], errs, left=2))
    parts.append(f"<{h}>Configurations and seeds</{h}>")
    for r in runs:
        cfg = r.ev.run_config or {"model": r.ev.model.cfg.to_dict()}
        parts.append(f"<details><summary>{esc(r.ev.label)}: {esc(r.ev.source)}</summary>"
                     f"<pre>{esc(json.dumps(cfg, indent=1))}</pre></details>")
    return parts


def _folded(runs: Sequence[RunResults], rows: Sequence[dict[str, Any]], body: list[str]) -> list[str]:
    """The language models of a smoke run after a lead study: one short paragraph, the rest collapsed."""
    steps = min_steps(runs)
    claims = len({r["claim"] for r in rows})
    return [f"<h2>The demo's language models: {steps} training steps each (a smoke run)</h2>",
            f"<p>{len(runs)} language models ({', '.join(esc(r.ev.label) for r in runs)}) trained on the embedded "
            f"corpus to show the pipeline and every analysis. At {steps} steps (fewer than "
            f"{SMOKE_MIN_STEPS}: the report's smoke rule) their losses and analyses are descriptive and none of the "
            f"{claims} claims is judged on them; the studies above are the comparisons.</p>",
            "<details class='smoke'><summary>Their parameters, training curves and analyses (descriptive, no "
            "verdicts)</summary>", *body, "</details>"]


def render_html(runs: Sequence[RunResults], rows: Sequence[dict[str, Any]], figures: dict[str, Path],
                settings: Settings, extra: dict[str, Any]) -> str:
    studies = extra.get("studies", [])
    rrows = [r for _, _, counted, _ in studies for r in counted or []]
    lead = " and ".join(study.what for study, _, counted, _ in studies if counted)
    smoke = bool(rows) and all(r["verdict"] == SMOKE for r in rows)
    fold = smoke and bool(studies)
    note = multiplicity_note(rrows, rows, fold, lead)
    parts = _head(settings, extra) + _lead(extra, note if fold else "")
    if fold:
        body = _models(runs, "h3") + [f"<p class='note'>{esc(n)}</p>" for n in parameter_notes(runs)]
        parts += _folded(runs, rows, body + _sections(runs, figures, extra, "h3"))
    else:
        if studies:
            parts.append("<h2>Language models on the embedded corpus</h2>")
        parts += _models(runs, "h2") + _verdicts(runs, rows, note) + _sections(runs, figures, extra, "h2")
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
    return (f"<p class='note'>{esc(rs[0].results['quantized']['scheme'])}; random-needle level "
            f"{t['random_needle']:.3g}, chance {t['chance']:.3g}.</p>" + table(head, rows))


def _module_section(runs: Sequence[RunResults], name: str) -> str:
    """The analysis's own text (its spec's ``format``), one per run: for analyses without a table here."""
    if not any(name in r.results for r in runs):
        return ""
    fmt = by_name(ANALYSES, name).format
    texts = [fmt(r.results[name]) for r in runs if name in r.results]
    return "".join(f"<pre>{esc(t)}</pre>" for t in texts)



# Analyses with a comparison table of their own; every other per-run analysis shows its spec's text.
TABLES = {"needles": _needles_section, "noise": _noise_section, "outliers": _outliers_section,
          "quantized": _quantized_section}


def analysis_section(runs: Sequence[RunResults], name: str) -> str:
    return TABLES[name](runs) if name in TABLES else _module_section(runs, name)
