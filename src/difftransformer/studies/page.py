"""The report page's HTML pieces a study's section is built from (each study's ``page.py``), below the studies so
that a study draws its own section and the report (``report/html.py``) only places it: one number format, tables,
embedded images, Markdown's `code` spans, the protocol's deviations, the box over committed results, and the
coloured verdict table."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from ..eval import stats
from ..model import variants as registry
from ..model.variants import label


def esc(x: Any) -> str:
    return html.escape(str(x))


def inline(text: Any) -> str:
    """``text`` escaped for HTML, with Markdown's `code` spans (the CLI's help and the protocols write them) as
    <code>: the page shows no literal backticks."""
    parts = esc(text).split("`")
    if len(parts) % 2 == 0:  # an odd number of backticks: no pairs to trust
        return esc(text)
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def fmt(x: Any) -> str:
    """One number format for the whole page: integers with thousands separators; decimals to 3 places (1,000 and
    above: to the unit with separators; below 0.001: 3 significant digits, as 1.23e-04)."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.3f}" if x == 0 or abs(x) >= 1e-3 else f"{x:.2e}"
    return inline(x)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], cls: Optional[Sequence[str]] = None,
          left: int = 1) -> str:
    """An HTML table; the first ``left`` columns are left-aligned text, ``cls`` gives each row a class."""
    h = "".join(f'<th class="l">{esc(c)}</th>' if i < left else f"<th>{esc(c)}</th>" for i, c in enumerate(header))
    body = []
    for k, row in enumerate(rows):
        cells = "".join(f'<td class="l">{fmt(c)}</td>' if i < left else f"<td>{fmt(c)}</td>"
                        for i, c in enumerate(row))
        attr = f' class="{cls[k]}"' if cls else ""
        body.append(f"<tr{attr}>{cells}</tr>")
    return f"<table><tr>{h}</tr>{''.join(body)}</table>"


def image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<p><img alt="{esc(alt)}" src="data:image/png;base64,{data}"></p>'


def slug(verdict: str) -> str:
    """A verdict as the CSS class of its row ("did not hold" -> "did-not-hold")."""
    return verdict.replace(" ", "-")


def deviations_note(deviations: Optional[Sequence[str]]) -> str:
    """A study's departures from its protocol as its results file lists them (``deviations``), for its section of
    the page; nothing when there are none."""
    if not deviations:
        return ""
    return ("<p class='note'>Deviations from the protocol:</p><ul class='note'>"
            + "".join(f"<li>{inline(d)}</li>" for d in deviations) + "</ul>")


def provenance_note(prov: dict[str, Any]) -> str:
    """The box that opens a study's section when its results are committed ones (e.g. ``lmsweep.committed``'s): not
    measured in this run, where and when they were, and the commands that measure them again."""
    t = prov["timings"]
    return ("<div class='provenance'><p><b>Not measured in this run.</b> These are the repository's committed "
            f"results ({esc(prov['what'])}; <code>{esc(prov['folder'])}</code>): {t['jobs']} jobs "
            f"run at commit {esc(prov['commit'])} on {esc(prov['date'])}, in "
            f"{t['wall_s'] / 60:.0f} min on {t['workers']} worker processes on {esc(prov['machine'])} (CPU "
            f"kernels {esc(', '.join(prov['cpu_kernels']))}). This run rebuilt the tables, verdicts and "
            "plots below from that journal with this code, training nothing.</p><p>To measure them again (about "
            f"{t['wall_s'] / 60:.0f} min on 2 cores): <code>{esc(prov['command'])}</code>, then "
            f"<code>difftransformer demo --lm-sweep {esc(prov['command'].split('--out ')[-1])}</code> shows "
            "that sweep here instead.</p></div>")


VERDICT_HEADER = ["claim", "variant", "verdict", "paper", "measure (primary endpoint)", "evidence"]


def verdict_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Verdict rows (``stats.verdict_row``'s dicts) as the page's coloured table."""
    return table(VERDICT_HEADER, [[r["claim"], label(r["variant"]), r["verdict"], r["paper"], r["measure"], r["why"]]
                                  for r in rows], cls=[slug(r["verdict"]) for r in rows], left=6)


def counts_line(rows: Sequence[Mapping[str, Any]]) -> str:
    """"DIFF V1: 3 held, 2 did not hold; DIFF V2: ..." over ``rows``."""
    kinds = (stats.HELD, stats.NOT_HELD, stats.INCONCLUSIVE, stats.SMOKE)
    counts = {v: {k: sum(1 for r in rows if r["variant"] == v and r["verdict"] == k) for k in kinds}
              for v in (x.name for x in registry.compared())}
    return "; ".join(f"{label(v)}: " + ", ".join(f"{n} {k}" for k, n in c.items() if n)
                     for v, c in counts.items() if sum(c.values()))
