"""Protocol version 4's text (``retrieval --protocol 4``'s summary, ``format_protocol4``) and docs/retrieval.md's
table (``markdown_table``, written by ``make docs``), from a ``protocol4.json`` or a rebuild."""

from __future__ import annotations

from typing import Any, Optional

from ..studies.followup import interval
from .diagnostic import STARTED


def format_protocol4(res: dict[str, Any]) -> str:
    """The text summary: where the run stands, each choice made, each endpoint read."""
    done, total = res["complete"]
    lines = [("QUICK SMOKE RUN: too few seeds, steps and contexts to measure anything. " if res["quick"] else "")
             + f"retrieval protocol 4 (PROTOCOL4.md): {done} of {total} jobs asked so far are in"]
    plan = res["plan"]
    lrs = res["speed_lrs"]
    lines.append(f"  lrs at {plan['speed_steps']} steps (validation seeds): "
                 + ", ".join(f"{n} {'-' if c['lr'] is None else format(c['lr'], 'g')}" for n, c in lrs.items()))
    if res["speed"] is not None:
        lines.append("  endpoint 1, speed: first step below 1.0 nats minus the baseline's (median, sign-test "
                     "interval; negative = sooner)")
        for n, r in res["speed"].items():
            if "speed" in r:
                c = f"; minus its variant {interval(r['speed_C'][STARTED], '+g')}: {r['verdict_C']}" \
                    if "speed_C" in r else ""
                lines.append(f"    {n:18s} {interval(r['speed'][STARTED], '+g')}: {r['verdict']}{c}  below floor "
                             f"{r['below_floor']}")
    if res["length"] is not None:
        ln = res["length"]
        curve = ", ".join(f"{k} steps {v:.4f}" for k, v in ln["curve"].items())
        how = " (fixed)" if ln["fixed"] else f" (the baseline's validation loss: {curve})"
        lines.append(f"  capability length L = {ln['L']}{how}")
    if res["conditions"] is not None:
        c = res["conditions"]
        means = ", ".join(f"{n} {m:.3f}" for n, m in c["means"].items())
        lines.append(f"  conditions at L (the baseline's validation accuracy: {means}): primary "
                     f"{c['primary'] or 'none above 0.30: capability is not read'}"
                     + (" (none in [0.30, 0.90]: the lowest above 0.30)" if c["fallback"] and c["primary"] else "")
                     + (f", secondary {', '.join(c['secondary'])}" if c["secondary"] else ""))
    if res["capability"] is not None:
        lines.append(f"  endpoint 2, capability: accuracy at {res['conditions']['primary']} after L steps; D = minus "
                     "the baseline, C = minus the arm's variant (95% paired t)")
        for n, r in res["capability"].items():
            d = f"  D {interval(r['D'])}: {r['verdict']}" if "D" in r else ""
            c = f"  C {interval(r['C'])}: {r['reading']}" if "C" in r else ""
            lines.append(f"    {n:18s} lr {r['lr']:<6g} acc {r['mean']:.3f}{d}{c}  below floor {r['below_floor']}")
    return "\n".join(lines)


def phase(res: dict[str, Any]) -> str:
    """Which of PROTOCOL4.md's phases the run is in."""
    if any(c["lr"] is None for c in res["speed_lrs"].values()):
        return "validation: the lrs at the speed length"
    if res["length"] is None:
        return "validation: the baseline's curve"
    if res["conditions"] is not None and res["conditions"]["primary"] is None:
        return "finished: no capability condition" if res["speed"] is not None else "test seeds"
    if res["capability_lrs"] is None or any(c["lr"] is None for c in res["capability_lrs"].values()):
        return "validation: the lrs at L"
    return "finished" if res["speed"] is not None and res["capability"] is not None else "test seeds"


def table_rows(res: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The version-4 table's header and rows (docs/retrieval.md's ``markdown_table``, the report page's section):
    per name its lr at the speed length and the speed verdict (steps to 1.0 nats minus the baseline's), its lr at L,
    the accuracy at the primary capability condition, D with its verdict and an arm's C with its reading; each cell
    once the protocol has it."""
    plan, speed, cap = res["plan"], res["speed"] or {}, res["capability"] or {}
    primary = (res["conditions"] or {}).get("primary") or "the primary capability condition"
    L = (res["length"] or {}).get("L", "L")
    head = ["name", f"lr at {plan['speed_steps']} steps", "steps to 1.0 nats, minus baseline: verdict",
            f"lr at {L} steps", f"accuracy at `{primary}`", "D (minus baseline): verdict",
            "C (minus its variant): reading"]

    def lr(c: Optional[dict[str, Any]]) -> str:
        return "" if c is None or c["lr"] is None else f"{c['lr']:g}" + (" (edge)" if c["at_edge"] else "")

    rows = []
    for n in plan["names"]:
        s, c = speed.get(n, {}), cap.get(n, {})
        sp = f"{interval(s['speed'][STARTED], '+g')}: {s['verdict']}" if "speed" in s else ""
        d = f"{interval(c['D'])}: {c['verdict']}" if "D" in c else ""
        cc = f"{interval(c['C'])}: {c['reading']}" if "C" in c else ""
        acc = f"{c['mean']:.3f}" if c else ""
        rows.append([f"`{n}`", lr(res["speed_lrs"].get(n)), sp, lr((res["capability_lrs"] or {}).get(n)), acc, d,
                     cc])
    return head, rows


def standing(res: dict[str, Any], journal: str = "the committed journal") -> str:
    """Where the run stands: "Running: 12 of 40 jobs asked so far are in ``journal`` (its phase)." and L once
    chosen."""
    done, total = res["complete"]
    stage = phase(res)
    line = (f"{'Finished' if stage.startswith('finished') else 'Running'}: {done} of {total} jobs asked so far "
            f"are in {journal} ({stage}).")
    return line + (f" L = {res['length']['L']}." if res["length"] is not None else "")


def markdown_table(res: dict[str, Any]) -> str:
    """docs/retrieval.md's table of version 4 (``table_rows``), then where the run stands."""
    head, rows = table_rows(res)
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join([*lines, "", standing(res)])
