"""The language-model diagnostics' text: the printed summaries (``format_diagnostic``, ``format_v2_diagnostic``) and
docs/lm-sweep.md's blocks of both diagnostics (``markdown_table``, ``rerun_line``, ``reference_line``, ``scales_table``,
``rounding_text``; written by ``make docs``)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..model.variants import label
from ..studies.followup import interval
from ..studies.rounding import format_readings
from .diagnostic import ARMS, BASE, V1, V2

iv = interval  # an estimate with its interval (the estimate alone where there is none)


def format_v2_diagnostic(res: dict[str, Any]) -> str:
    """The DIFF V2 diagnostic's text summary: one line per arm and the rerun check."""
    a = res["arms"]

    lines = [f"DIFF V2 diagnostic at d_model {res['width']} (test-half loss, n = {a[V2]['D']['n']} paired seeds, 95%)",
             f"  DIFF V2 (lr {a[V2]['lr']:g}) minus baseline (lr {a[BASE]['lr']:g}): D {iv(a[V2]['D'])}"]
    for arm, x in a.items():
        if arm in (BASE, V2):
            continue
        edge = ", unresolved edge" if x["unresolved_edge"] else ""
        lines.append(f"  {arm:18s} lr {x['lr']:g}{edge}: D {iv(x['D'])}, C {iv(x['C'])}: {x['reading']}")
    lines.append(f"  the reruns against the reference's runs: {res['rerun']['verdict']}")
    return "\n".join(lines)


def markdown_table(res: dict[str, Any], variant: str) -> str:
    """docs/lm-sweep.md's table of a diagnostic (``variant`` DIFF V1's or DIFF V2's): per row its non-embedding
    parameters, chosen lr (and the grid's tuning-half losses for an arm), mean test loss, D, C, the share of the gap
    closed (DIFF V1's) and the reading."""
    a, what = res["arms"], label(variant)
    share = variant == V1
    lines = [f"| arm (one change to {what}) | non-embedding params | chosen lr | tuning-half loss over the grid | "
             f"test loss | D (arm - baseline) | C (arm - {what}) | " + "share closed | " * share + "reading |",
             "| --- " * (8 + share) + "|"]
    for name, x in a.items():
        arm = name not in (BASE, variant)
        grid = " / ".join(f"{g['lr']:g}: {g['tune_loss']:.3f}" for g in x.get("grid") or []) if arm else ""
        closed = ("" if x.get("share_closed") is None else f"{x['share_closed']:.0%}") + " | " if share else ""
        lines.append(f"| {'`' + name + '`' if arm else name} | {x['params_non_embedding']:,} | "
                     f"{x['lr']:g} | {grid} | {statistics.fmean(x['test_loss']):.3f} | "
                     f"{iv(x['D']) if 'D' in x else ''} | {iv(x['C']) if 'C' in x else ''} | {closed}"
                     f"{x.get('reading', '')} |")
    return "\n".join(lines)


def v2_markdown_table(res: dict[str, Any]) -> str:
    return markdown_table(res, V2)


def rerun_line(res: dict[str, Any], sweep: dict[str, Any], variant: str) -> str:
    """The reruns of a diagnostic against the reference sweep's runs, and the variant's D from both."""
    d = sweep["endpoints"][variant]["loss"][str(res["width"])]
    return (f"The reruns of the baseline and {label(variant)} against the reference sweep's runs: "
            f"{res['rerun']['verdict']}; {label(variant)}'s D {iv(res['arms'][variant]['D'])} from the reruns, "
            f"{iv(d)} in the sweep.")


def reference_line(res: dict[str, Any]) -> str:
    """The DIFF V1 diagnostic's sensitivity row: the reference sweep's own baseline and DIFF V1 runs in place of the
    reruns."""
    a = res["arms"]
    same = all(a[arm]["reading_reference"] == a[arm]["reading"] for arm in ARMS)
    return ("Sensitivity, with the reference sweep's own baseline and DIFF V1 runs in place of the reruns: DIFF V1 D "
            f"{iv(a[V1]['D_reference'])}; " + "; ".join(f"`{arm}` D {iv(a[arm]['D_reference'])}, C "
                                                       f"{iv(a[arm]['C_reference'])}: {a[arm]['reading_reference']}"
                                                       for arm in ARMS)
            + (". Every reading is the one of the reruns." if same else ". Not every reading is the reruns' one."))


def scales_table(res: dict[str, Any]) -> str:
    """Eq. (3) checked at LM settings: per DIFF V1 model (the variant and each arm) and layer, the seed means of
    lambda_init, the learned lambda, each head's output RMS before and after the norm, RMS(g), the RMS after the
    (1 - lambda_init) multiplier, and its ratio to the RMS after the norm (blank: the model has no norm)."""
    def f(x: Any, spec: str = ".3f") -> str:
        return "" if x is None else format(x, spec)
    lines = ["| model | layer | lambda_init | learned lambda | RMS before the norm | RMS after the norm | RMS(g) | "
             "RMS after the multiplier | after the multiplier / after the norm |", "| --- " * 9 + "|"]
    for name, x in res["arms"].items():
        for s in x.get("v1_scales") or []:
            lines.append(f"| {name if name == V1 else '`' + name + '`'} | {s['layer']} | {f(s['lambda_init'])} | "
                         f"{f(s['lambda'])} | {f(s['before_norm'])} | {f(s['after_norm'])} | {f(s['weight_rms'])} | "
                         f"{f(s['after_multiplier'])} | {f(s.get('multiplier_ratio'), '.6f')} |")
    return "\n".join(lines)


def rounding_text(check: dict[str, Any]) -> str:
    """A diagnostic's rounding check as docs/lm-sweep.md gives it: how many readings survive, how many runs are
    bitwise equal, the largest move of a D or C (rounded up to 3 decimals), then ``format_readings``' text."""
    rows = check["rows"].values()
    read = [r for r in rows if "reading" in r["first"]]
    moves = [abs(r["first"][k]["estimate"] - r["second"][k]["estimate"]) for r in rows for k in ("D", "C")
             if k in r["first"]]
    eq, n = check["equal_runs"]
    return (f"**{sum(r['survives'] for r in read)} of {len(read)} readings survive**; {eq} of {n} runs have a "
            f"bitwise-equal test loss under both code paths, and no D or C moved by more than "
            f"{math.ceil(max(moves) * 1000) / 1000:.3f} nats:\n\n```\n{format_readings(check, check['study'])}\n```")


def format_diagnostic(res: dict[str, Any]) -> str:
    """The text summary: one line per arm and the rerun check."""
    a = res["arms"]

    lines = [f"DIFF V1 diagnostic at d_model {res['width']} (n = {a[V1]['D']['n']} paired seeds, 95%)",
             f"  DIFF V1 (lr {a[V1]['lr']:g}) minus baseline (lr {a[BASE]['lr']:g}): D {iv(a[V1]['D'])}"]
    for arm in ARMS:
        x = a[arm]
        share = "" if x["share_closed"] is None else f", share closed {x['share_closed']:+.0%}"
        edge = ", unresolved edge" if x["unresolved_edge"] else ""
        lines.append(f"  {arm:10s} lr {x['lr']:g}{edge}: D {iv(x['D'])}, C {iv(x['C'])}{share}: {x['reading']}")
    lines.append(f"  the reruns against the reference's runs: {res['rerun']['verdict']}")
    lines.append(f"  sensitivity, with the reference's own baseline and DIFF V1 runs: DIFF V1 D "
                 f"{iv(a[V1]['D_reference'])}; " + "; ".join(f"{arm} {a[arm]['reading_reference']}" for arm in ARMS))
    return "\n".join(lines)
