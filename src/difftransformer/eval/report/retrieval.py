"""The report's lead section: the token-level retrieval benchmark (``difftransformer retrieval``) and its verdicts.

It reads the benchmark's ``results.json`` dict only (no model), so the report needs nothing of the benchmark's code.
Three claims of the paper are judged on it, each on an endpoint fixed before any run:
- "retrieves better among distractors" (Fig. 1, Table 2, Fig. 5): accuracy at the config's ``primary`` condition
  (default 2x the trained pairs and 4x the filler), paired by seed, gated on a model above chance;
- "more attention on the answer" and "less attention noise" (Table 3): the answering query's scale-free answer and
  noise shares at that condition, in each run's retrieval layer (the layer with the highest answer share);
- "more robust to quantised attention logits" (Fig. 8): the accuracy lost at 4-bit logits (the paper's lowest
  width) at the primary condition, lower is better.
"""

from __future__ import annotations

import html
import math
import statistics
from pathlib import Path
from typing import Any, Optional, Sequence

from .. import stats
from .verdicts import NAMES, row

QUANT_BITS = 4
FIGURES = (("accuracy_heatmap.png", "Accuracy by pairs x filler per variant (Fig. 5 style), seed mean"),
           ("accuracy_vs_difficulty.png", "Accuracy against difficulty, seed mean and standard deviation"),
           ("attention_shares.png", "Scale-free attention shares of the answering query"),
           ("quantization.png", "Accuracy with attention logits quantised (Fig. 8)"),
           ("attention_row.png", "One query's attention row per variant (Fig. 1)"))


def _runs(results: dict[str, Any], variant: str) -> list[dict[str, Any]]:
    return sorted(results["variants"][variant]["runs"], key=lambda r: r["seed"])


def _layer(run: dict[str, Any], condition: str) -> dict[str, float]:
    """The retrieval layer's shares: the layer whose answering query puts the largest share on the answer."""
    return max(run["conditions"][condition]["attention"], key=lambda l: l["answer_share"])


def _quant_drop(run: dict[str, Any], condition: str, bits: int) -> float:
    rows = run["quantized"][condition]
    full = next(r["accuracy"] for r in rows if r["bits"] is None)
    return full - next(r["accuracy"] for r in rows if r["bits"] == bits)


def _gate(results: dict[str, Any], b: list[dict], d: list[dict], cond: str) -> Optional[str]:
    n, chance = b[0]["conditions"][cond]["n_queries"], results["chance"]
    if any(stats.above_chance([r["conditions"][cond]["accuracy"] for r in rs], n, chance) for rs in (b, d)):
        return None
    return f"no model retrieves above chance ({chance:.3g}) at {cond}"


def _judge(results: dict[str, Any], claim: str, b: list[dict], d: list[dict]) -> stats.Verdict:
    cond = results["config"]["primary"]
    acc = lambda rs: [r["conditions"][cond]["accuracy"] for r in rs]  # noqa: E731
    if claim == "acc":
        return stats.compare_accuracy(acc(b), acc(d), b[0]["conditions"][cond]["n_queries"], results["chance"], 0.05)
    gate = _gate(results, b, d, cond)
    if gate:
        return stats.Verdict(stats.INCONCLUSIVE, math.nan, (math.nan, math.nan), (len(b), len(d)), "none", gate)
    if claim in ("answer_share", "noise_share"):
        get = lambda rs: [_layer(r, cond)[claim] for r in rs]  # noqa: E731
        return stats.compare_seeds(get(b), get(d), claim == "answer_share", 0.01)
    try:
        drops = [[_quant_drop(r, cond, QUANT_BITS) for r in rs] for rs in (b, d)]
    except (KeyError, StopIteration):
        return stats.Verdict(stats.INCONCLUSIVE, math.nan, (math.nan, math.nan), (len(b), len(d)), "none",
                             f"{QUANT_BITS}-bit accuracy at {cond} was not measured (see quant_conditions/quant_bits)")
    return stats.compare_seeds(drops[0], drops[1], False, 0.02)


CLAIMS = (("retrieves better among distractors", "Fig. 1, Table 2, Fig. 5", "acc",
           "accuracy at the primary condition {cond}; gate: above chance"),
          ("more attention on the answer (retrieval)", "Table 3", "answer_share",
           "answer share of |attention| in the retrieval layer at {cond} (scale-free)"),
          ("less attention noise (retrieval)", "Table 3", "noise_share",
           "share of |attention| on the rest of the context, retrieval layer, {cond} (scale-free)"),
          ("more robust to quantised attention logits", "Fig. 8", "quant",
           f"accuracy lost at {QUANT_BITS}-bit logits at {{cond}}; min effect 0.02"))


def retrieval_verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per claim and DIFF variant, paired by seed; a quick (smoke) benchmark gives no verdicts."""
    cond = results["config"]["primary"]
    out = []
    for title, paper, key, measure in CLAIMS:
        for v in ("diff_v1", "diff_v2"):
            if v not in results["variants"] or "baseline" not in results["variants"]:
                continue
            b, d = _runs(results, "baseline"), _runs(results, v)
            seeds = sorted({r["seed"] for r in b} & {r["seed"] for r in d})
            b, d = [r for r in b if r["seed"] in seeds], [r for r in d if r["seed"] in seeds]
            if results.get("quick") or results["config"]["steps"] < stats.SMOKE_MIN_STEPS:
                verdict = stats.Verdict(stats.SMOKE, math.nan, (math.nan, math.nan), (len(b), len(d)), "none",
                                        "a quick or short benchmark trains too few steps for any verdict (a smoke run)")
            else:
                verdict = _judge(results, key, b, d)
            out.append(row(title, paper, v, measure.format(cond=cond), verdict))
    return out


def baseline_floor(results: dict[str, Any], floor: float = 0.9) -> tuple[bool, list[float]]:
    """Whether the baseline reached ``floor`` at the training condition in every seed (the benchmark's premise:
    a task the baseline learns, so that differences at the harder conditions mean something)."""
    train = results["conditions"][0]["name"]
    accs = [r["conditions"][train]["accuracy"] for r in _runs(results, "baseline")]
    return all(a >= floor for a in accs), accs


def _interval(xs: Sequence[float], n: int) -> str:
    m, lo, hi = stats.accuracy_interval(xs, n)
    return f"{m:.3f} [{lo:.2f}, {hi:.2f}]"


def models_table(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    rows = [[NAMES.get(v, v), x["params"], x["chosen_lr"], len(x["runs"])] for v, x in results["variants"].items()]
    return ["variant", "parameters", "chosen lr", "seeds"], rows


def accuracy_table(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """One row per test condition (pairs, filler, context length), one column per variant."""
    cond_name = results["config"]["primary"]
    variants = list(results["variants"])
    rows = []
    for c in results["conditions"]:
        name = c["name"]
        first = _runs(results, variants[0])[0]["conditions"][name]
        label = name + (" (primary)" if name == cond_name else "") + (" (trained)" if c is results["conditions"][0]
                                                                      else "")
        rows.append([label, c.get("pairs"), c.get("filler"), first.get("seq_len")]
                    + [_interval([r["conditions"][name]["accuracy"] for r in _runs(results, v)], first["n_queries"])
                       for v in variants])
    return ["condition", "pairs", "filler", "length"] + [NAMES.get(v, v) for v in variants], rows


def shares_table(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    cond = results["config"]["primary"]
    keys = [k for k in ("answer_share", "noise_share", "answer_signed", "noise_signed")
            if k in _layer(_runs(results, next(iter(results["variants"])))[0], cond)]
    rows = []
    for v in results["variants"]:
        layers = [_layer(r, cond) for r in _runs(results, v)]
        rows.append([NAMES.get(v, v)] + [f"{statistics.fmean(l[k] for l in layers):.3f}" for k in keys])
    return ["variant (retrieval layer, seed mean)"] + keys, rows


def lr_table(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    rows = [[NAMES.get(v, v), g["lr"], f"{g['val_loss']:.4f}", "chosen" if g["lr"] == x["chosen_lr"] else ""]
            for v, x in results["variants"].items() for g in x["lr_grid"]]
    return ["variant", "lr", "validation answer loss", ""], rows


def section(results: dict[str, Any], fig_dir: Path, table, image) -> str:
    """The HTML of the lead section; ``table``/``image`` are the page's own helpers."""
    cfg = results["config"]
    ok, accs = baseline_floor(results)
    cond = cfg["primary"]
    intro = (f"Each context holds {cfg['n_pairs']} key-value facts (one token each) among {cfg['filler']} filler "
             f"tokens, then every key is asked once; chance is {results['chance']:.3g}. Trained {cfg['steps']} steps "
             f"per model, {len(accs)} seed(s) per variant on the same example stream, initialisation paired across "
             f"variants where shapes match; the learning rate of each variant was chosen from its grid on a "
             f"validation split. Test conditions pXfY: X times the pairs and Y times the filler of training. Primary "
             f"endpoint, fixed before any run: accuracy at {cond}. Cells: seed mean [95% interval].")
    floor = (f"The baseline reached at least 90% at the training condition in every seed "
             f"({', '.join(f'{a:.3f}' for a in accs)})." if ok else
             f"The baseline did NOT reach 90% at the training condition in every seed "
             f"({', '.join(f'{a:.3f}' for a in accs)}): differences at harder conditions are weaker evidence.")
    parts = [f"<p>{html.escape(intro)}</p>", f"<p>{html.escape(floor)}</p>"]
    if results.get("quick"):
        parts.append("<p class='note'>A quick benchmark: a smoke run, its numbers mean nothing.</p>")
    for make in (models_table, accuracy_table, shares_table, lr_table):
        head, rows = make(results)
        parts.append(table(head, rows, left=1))
    for name, title in FIGURES:
        if (fig_dir / name).is_file():
            parts.append(f"<h3>{html.escape(title)}</h3>" + image(fig_dir / name, title))
    t = results.get("timings", {})
    if t:
        parts.append(f"<p class='note'>Benchmark wall time {t.get('wall_s', 0) / 60:.1f} min with {t.get('workers')} "
                     f"worker(s).</p>")
    return "".join(parts)
