"""The diagnostics' rounding check, shared by both studies: one diagnostic's readings from its first run and from the
same jobs run again under another CPU code path, side by side.

A diagnostic's first run chose each arm's learning rate on its grid; the check reruns, under the other code path,
only the jobs at those chosen lrs (every seed of the baseline, the variant and every arm) and reads D, C and the
arm's reading from them with the diagnostic's own rule. It does not replay the lr choices: a choice that rounding
would move is not checked (the same limit as ``lm-sweep --rounding-scope chosen``).

A row is ``{"lr", "D", "C", "reading"}`` (``C`` and ``reading`` for arms only; ``D`` absent for the baseline), each
interval ``{"estimate", "ci", ...}``.
"""

from __future__ import annotations

from typing import Any

from .followup import interval

SCOPE = "chosen"


def compare_readings(first: dict[str, dict[str, Any]], second: dict[str, dict[str, Any]],
                     equal: dict[str, list[int]]) -> dict[str, Any]:
    """Per name (in ``first``'s order) both rows and whether the reading survives; the names whose reading differs;
    ``equal``: per name [runs whose endpoint is bitwise equal in both, runs]."""
    if list(first) != list(second):
        raise ValueError(f"the rounding check's rows {list(second)} are not the first run's {list(first)}")
    rows = {n: {"first": first[n], "second": second[n], "equal_runs": equal[n],
                "survives": first[n].get("reading") == second[n].get("reading")} for n in first}
    differ = [n for n, r in rows.items() if not r["survives"]]
    eq = [sum(e[0] for e in equal.values()), sum(e[1] for e in equal.values())]
    return {"scope": SCOPE, "rows": rows, "differ": differ, "equal_runs": eq}




def format_readings(check: dict[str, Any], title: str) -> str:
    """The text of a diagnostic's rounding check: per variant and arm D and C under both code paths and the
    reading."""
    (p1, p2) = check["code_paths"]
    lines = [f"{title}: rounding check at the first run's chosen lrs, {p1} (first) against {p2} (second); "
             "D = minus the baseline, C = minus the arm's variant"]
    for name, r in check["rows"].items():
        a, b = r["first"], r["second"]
        if "D" not in a:
            continue
        c = f"  C {interval(a.get('C'))} -> {interval(b.get('C'))}" if "C" in a else ""
        read = (f"  {a['reading']} -> {b['reading']}" + ("" if r["survives"] else "   DIFFERS")) if "reading" in a \
            else ""
        lines.append(f"  {name:28s} lr {a['lr']:<6g} D {interval(a['D'])} -> {interval(b['D'])}{c}{read}")
    eq, n = check["equal_runs"]
    lines.append(f"runs with a bitwise-equal endpoint under both: {eq} of {n}")
    lines.append(f"{len(check['differ'])} reading(s) differ" + (": " + ", ".join(check["differ"]) if check["differ"]
                                                                else ": every reading survives the other rounding"))
    return "\n".join(lines)
