"""The language-model diagnostics' text: the printed summaries (``format_diagnostic``, ``format_v2_diagnostic``) and
docs/lm-sweep.md's DIFF V2 table (``v2_markdown_table``, written by ``make docs``)."""

from __future__ import annotations

import statistics
from typing import Any

from ..studies.followup import interval
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


def v2_markdown_table(res: dict[str, Any]) -> str:
    """docs/lm-sweep.md's table of the DIFF V2 diagnostic: per row its non-embedding parameters, chosen lr (and the
    grid's tuning-half losses for an arm), mean test loss, D, C and reading."""
    a = res["arms"]
    lines = ["| arm (one change to DIFF V2) | non-embedding params | chosen lr | tuning-half loss over the grid | "
             "test loss | D (arm - baseline) | C (arm - DIFF V2) | reading |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, x in a.items():
        grid = " / ".join(f"{g['lr']:g}: {g['tune_loss']:.3f}" for g in x.get("grid") or [])
        lines.append(f"| {'`' + name + '`' if name not in (BASE, V2) else name} | {x['params_non_embedding']:,} | "
                     f"{x['lr']:g} | {grid} | {statistics.fmean(x['test_loss']):.3f} | "
                     f"{iv(x['D']) if 'D' in x else ''} | {iv(x['C']) if 'C' in x else ''} | {x.get('reading', '')} |")
    return "\n".join(lines)


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
