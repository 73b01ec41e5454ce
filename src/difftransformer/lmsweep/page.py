"""The report page's section for ``difftransformer lm-sweep``'s output (its sweep.json and plots).

The sweep decides its verdicts and writes its rows to sweep.json (``verdict_rows``, ``sensitivity_rows``: lists of
strings, see ``lmsweep/sweep.py``); this page draws them and imports none of the sweep's code."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Optional

from ..model.variants import label
from ..rundir.files import LM_SWEEP_LR_PNG, LM_SWEEP_PARAMS_PNG, LM_SWEEP_TOKENS_PNG
from ..studies.page import deviations_note, image, provenance_note, slug, table
from .sweep_schema import LmSweepResults


def section(res: LmSweepResults, fig_dir: Path, provenance: Optional[dict[str, Any]] = None) -> str:
    """The HTML of the sweep's section (its ``Study.section``, ``study.py``); ``provenance``:
    the committed results' (``lmsweep.committed.provenance``), which the section then shows first and whose timings it
    gives (the rebuilt sweep.json holds the rebuild's)."""
    cfg = res["config"]
    grid = ", ".join(f"{x:g}" for x in cfg["lr_grid"])
    intro = (f"Pre-registered in the sweep's PROTOCOL.md (version {res['protocol_version']}). Widths d_model "
             f"{', '.join(str(w) for w in res['widths'])}, {cfg['n_layers']} layers; {res['tokens_per_run']:,} "
             f"training tokens per run (windows of {cfg['seq_len']}); every variant and width sees the same windows "
             f"in the same order at a seed. The lr grid ({grid}, widened at a chosen edge up to "
             f"{cfg.get('lr_widen', 1)} time(s)) ran on each of the "
             f"{len(res['seeds'])} paired seeds ({', '.join(str(s) for s in res['seeds'])}); each variant's lr per "
             "width was chosen on the tuning half of the validation windows, every endpoint is measured on the "
             "test half. Parameters are counted without the embedding and the output head. Intervals: paired t "
             "(95%) for differences and outlier ratios; for the Fig. 3 ratios a bootstrap over seeds, and a verdict "
             "needs every seed's own ratio on the same side of 1.")
    if "scale" in cfg:
        intro += f" Scale: {cfg['scale']}."
    parts = ["<h2>Language-model sweep: loss against parameters, tokens and learning rate</h2>",
             provenance_note(provenance) if provenance else "", f"<p>{html.escape(intro)}</p>"]
    for key, name in (("param_ratio", "Fig. 3a"), ("token_ratio", "Fig. 3b")):
        a = res.get("applicability", {}).get(key)
        if a is not None:  # version 2's premise of each Fig. 3 ratio (absent from a version 1 sweep.json)
            state = "measurable" if a["measurable"] else "not measurable at this scale"
            parts.append(f"<p class='note'>{name}'s premise (the baseline's loss falls): {state}; "
                         f"{html.escape(a['why'])}.</p>")
    parts.append(deviations_note(res.get("deviations")))
    if "verdict_rows" not in res:
        parts.append("<p class='note'>This sweep.json holds no verdict rows (written before the sweep wrote its own): "
                     "rerun <code>difftransformer lm-sweep --out DIR</code> with the same options to add them (it "
                     "resumes from its journal and runs no job).</p>")
    rows = res.get("verdict_rows", [])
    parts.append("<h3>Verdicts</h3>")
    parts.append(table(["endpoint", "variant", "estimate [95% interval]", "n", "verdict", "paper"],
                       [[endpoint, label(variant), est, n, verdict, paper]
                        for endpoint, variant, est, n, verdict, paper in rows],
                       cls=[slug(verdict) for _, _, _, _, verdict, _ in rows], left=6))
    per_width = []
    for v, ws in res["table"].items():
        for w in ws:
            mean = sum(w["test_loss"]) / len(w["test_loss"])
            per_width.append([label(v), w["width"], w["params_non_embedding"], w["params"], f"{w['lr']:g}"
                              + (" (grid widened)" if w["widened"] else "")
                              + (f" ({w['edge']})" if w.get("edge") else ""), f"{mean:.3f}", f"{w['floor']:.3f}"])
    parts.append("<h3>Each variant and width at its chosen learning rate</h3>")
    parts.append(table(["variant", "d_model", "non-embedding parameters", "parameters", "chosen lr",
                        "test-half loss (seed mean)", "unigram floor"], per_width, left=1))
    srows = res.get("sensitivity_rows", [])
    parts.append("<h3>Sensitivity rows (not counted as verdicts)</h3>"
                 + table(["endpoint", "variant", "estimate [95% interval]", "verdict"],
                         [[endpoint, label(variant), est, verdict] for endpoint, variant, est, verdict in srows],
                         left=4))
    div = ", ".join(f"{label(v)} {n} of {res['runs_total'][v]}" for v, n in res["diverged_runs"].items())
    t = (provenance or res)["timings"]  # a rebuild's own timings say how long reading the journal took
    parts.append(f"<p class='note'>Diverged runs over the whole sweep: {html.escape(div)}. Wall time "
                 f"{t['wall_s'] / 60:.0f} min for {t['jobs']} jobs on {t['workers']} workers.</p>")
    for name, alt in ((LM_SWEEP_PARAMS_PNG, "Loss against non-embedding parameters (Fig. 3a)"),
                      (LM_SWEEP_TOKENS_PNG, "Loss against training tokens (Fig. 3b)"),
                      (LM_SWEEP_LR_PNG, "Loss against learning rate")):
        if (fig_dir / name).is_file():
            parts.append(f"<h3>{html.escape(alt)}</h3>" + image(fig_dir / name, alt))
    return "".join(parts)
