"""`difftransformer report RUN_DIR [RUN_DIR ...]`: every analysis on every run, one self-contained HTML page.

For each run (baseline, DIFF V1, DIFF V2; several seeds of each when given) the report reads the training metrics
(`metrics.jsonl`: loss, validation loss, gradient norm, lambda) and runs the analyses of `difftransformer eval`
(needles, noise, outliers, quantized, positions, icl, and the attention-map figure over one run per variant). It
writes ``OUT/report.html`` (plots embedded as base64 PNGs, so the page is one file), ``OUT/results.json`` (every
number the page shows) and the PNGs beside them.

Each of the paper's claims gets a verdict comparing DIFF (V1 and V2 separately) with the baseline: **held** when
DIFF is better by more than the margin, **did not hold** when it is worse by more than the margin, otherwise
**inconclusive at this scale**. The margin is twice the combined standard error (binomial for accuracies, over
samples for masses and losses, plus the spread over seeds when several seeds are given), and never less than a
stated minimum effect. Accuracy claims are also inconclusive when no model is clearly above chance.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import html
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from tqdm import tqdm

from .loading import EvalModel, load_for_eval

VARIANTS = ("baseline", "diff_v1", "diff_v2")
NAMES = {"baseline": "Baseline", "diff_v1": "DIFF V1", "diff_v2": "DIFF V2"}
HELD, NOT_HELD, INCONCLUSIVE = "held", "did not hold", "inconclusive at this scale"


# ---------------------------------------------------------------------------------------------- training curves
def read_metrics(run_dir: Optional[Path]) -> dict[str, Any]:
    """Training curves of a run's ``metrics.jsonl`` (empty lists for a bare model directory)."""
    out: dict[str, Any] = {"step": [], "loss": [], "grad_norm": [], "val_step": [], "val_loss": [], "lambda": {}}
    p = run_dir / "metrics.jsonl" if run_dir is not None else None
    if p is None or not p.is_file():
        return out
    for line in p.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill: the rest of the file is still good
        if "loss" in rec:
            out["step"].append(rec["step"])
            out["loss"].append(rec["loss"])
            out["grad_norm"].append(rec.get("grad_norm", float("nan")))
        if "val_loss" in rec:
            out["val_step"].append(rec["step"])
            out["val_loss"].append(rec["val_loss"])
            for k in ("lambda_v1", "lambda_v2"):
                if k in rec:
                    out["lambda"] = {"name": k, "step": rec["step"], "values": rec[k]}
    return out


def loss_spikes(loss: Sequence[float], skip: int = 0, window: int = 10, factor: float = 1.1) -> list[int]:
    """Indices where the training loss jumps above ``factor`` x the median of the previous ``window`` losses."""
    spikes = []
    for i in range(max(skip, window), len(loss)):
        ref = statistics.median(loss[i - window:i])
        if loss[i] > factor * ref:
            spikes.append(i)
    return spikes


def training_summary(ev: EvalModel) -> dict[str, Any]:
    m = read_metrics(ev.run_dir)
    warmup = ev.run_config.get("train", {}).get("warmup_steps", 0)
    every = ev.run_config.get("log", {}).get("every", 1)
    skip = sum(1 for s in m["step"] if s <= warmup)
    gn = [g for g, s in zip(m["grad_norm"], m["step"]) if s > warmup and math.isfinite(g)]
    m["spikes"] = [m["step"][i] for i in loss_spikes(m["loss"], skip)]
    m["log_every"] = every
    m["grad_norm_median"] = statistics.median(gn) if gn else None
    m["grad_norm_max"] = max(gn) if gn else None
    m["final_val_loss"] = m["val_loss"][-1] if m["val_loss"] else None
    return m


# ---------------------------------------------------------------------------------------------- analyses
@dataclass
class Settings:
    quick: bool = True
    seed: int = 0
    progress: bool = True


ANALYSIS_NAMES = ("needles", "noise", "outliers", "quantized", "positions", "icl")


def run_analysis(name: str, ev: EvalModel, settings: Settings) -> dict[str, Any]:
    """One analysis of `difftransformer eval` with the report's quick or full settings."""
    import importlib

    mod = importlib.import_module(f"{__package__}.{name}")
    q, s, p = settings.quick, settings.seed, settings.progress
    if name == "needles":
        nd = mod.QUICK if q else mod.FULL
        return mod.run_needles(ev, nd["lengths"], nd["depths"], nd["samples"], s, progress=p)
    if name == "noise":
        return mod.run_noise(ev, mod.QUICK_SAMPLES if q else mod.FULL_SAMPLES, s, progress=p)
    if name == "outliers":
        return mod.run_outliers(ev, mod.QUICK_SEQS if q else mod.FULL_SEQS, s, progress=p)
    if name == "quantized":
        qz = mod.QUICK if q else mod.FULL
        return mod.run_quantized(ev, mod.WIDTHS, qz["sequences"], qz["samples"], s, progress=p)
    return getattr(mod, f"run_{name}")(ev, **_settings(mod, q), seed=s, progress=p)


def _settings(mod, quick: bool) -> dict[str, Any]:
    return dict(getattr(mod, "QUICK" if quick else "FULL", {}))


@dataclass
class RunResults:
    ev: EvalModel
    training: dict[str, Any]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def attention(self) -> str:
        return self.ev.attention


def evaluate_runs(evs: Sequence[EvalModel], settings: Settings) -> list[RunResults]:
    """Every analysis on every model. An analysis that fails on one model is recorded, not fatal."""
    out = []
    bar = tqdm(total=len(evs) * len(ANALYSIS_NAMES), desc="report", disable=not settings.progress, unit="analysis")
    for ev in evs:
        rr = RunResults(ev, training_summary(ev))
        for name in ANALYSIS_NAMES:
            bar.set_postfix_str(f"{ev.label}: {name}")
            try:
                rr.results[name] = run_analysis(name, ev, settings)
            except (ImportError, ValueError, RuntimeError) as e:  # e.g. a context too short for the task: say so on the page
                rr.errors[name] = f"{type(e).__name__}: {e}"
            bar.update()
        out.append(rr)
    bar.close()
    return out


# ---------------------------------------------------------------------------------------------- verdicts
@dataclass
class Measure:
    """One number per run with its standard error (0 when the analysis gives none)."""

    value: float
    se: float = 0.0


def _group(runs: Sequence[RunResults], key: Callable[[RunResults], Optional[Measure]]) -> dict[str, list[Measure]]:
    g: dict[str, list[Measure]] = {}
    for r in runs:
        try:
            m = key(r)
        except (KeyError, IndexError, TypeError, ZeroDivisionError):
            m = None
        if m is not None and math.isfinite(m.value):
            g.setdefault(r.attention, []).append(m)
    return g


def _mean_se(ms: Sequence[Measure]) -> tuple[float, float, float]:
    """(mean, standard error, seed spread max - min) of one variant's runs."""
    vals = [m.value for m in ms]
    mean = sum(vals) / len(vals)
    within = math.sqrt(sum(m.se ** 2 for m in ms)) / len(ms)
    between = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
    return mean, math.sqrt(within ** 2 + between ** 2), max(vals) - min(vals)


def compare(base: Sequence[Measure], diff: Sequence[Measure], higher_is_better: bool, min_effect: float,
            floor: Optional[float] = None) -> tuple[str, str]:
    """Verdict and a one-line reason for DIFF vs baseline on one measure (see the module docstring)."""
    mb, sb, spread_b = _mean_se(base)
    md, sd, spread_d = _mean_se(diff)
    delta = (md - mb) if higher_is_better else (mb - md)  # > 0: DIFF better
    margin = max(2 * math.sqrt(sb ** 2 + sd ** 2), min_effect)
    seeds = f"{len(base)}/{len(diff)} seed(s)"
    spread = f"; seed spread {spread_b:.3g} / {spread_d:.3g}" if len(base) > 1 or len(diff) > 1 else ""
    why = f"baseline {mb:.4g} vs DIFF {md:.4g} (margin {margin:.3g}, {seeds}{spread})"
    if floor is not None and max(mb, md) <= floor + margin:
        return INCONCLUSIVE, why + f"; neither is clearly above chance ({floor:.3g})"
    if delta > margin:
        return HELD, why
    if delta < -margin:
        return NOT_HELD, why
    return INCONCLUSIVE, why


def _binomial_se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1.0 / max(n, 1)) / max(n, 1))


def _needle_acc(r: RunResults) -> Measure:
    x = r.results["needles"]
    n = x["samples_per_cell"] * len(x["lengths"]) * len(x["depths"])
    return Measure(x["mean_accuracy"], _binomial_se(x["mean_accuracy"], n))


def _noise(key: str) -> Callable[[RunResults], Measure]:
    return lambda r: Measure(r.results["noise"][key], r.results["noise"][f"{key}_sem"])


def _outlier(kind: str) -> Callable[[RunResults], Measure]:
    return lambda r: Measure(r.results["outliers"][kind]["top1"])


def _quant_row(r: RunResults, bits: int) -> dict[str, Any]:
    return next(row for row in r.results["quantized"]["rows"] if row["bits"] == bits)


def _quant_acc(bits: int) -> Callable[[RunResults], Measure]:
    def f(r: RunResults) -> Measure:
        acc = _quant_row(r, bits)["accuracy"]
        return Measure(acc, _binomial_se(acc, r.results["quantized"]["samples"]))
    return f


def _quant_loss(bits: int) -> Callable[[RunResults], Measure]:
    return lambda r: Measure(_quant_row(r, bits)["loss_increase"])


def _positions_tail(r: RunResults) -> Measure:
    x = r.results["positions"]
    return Measure(x["tail_nll"], x.get("tail_nll_se", 0.0))


def _icl_best(r: RunResults) -> Measure:
    x = r.results["icl"]
    return Measure(x["max_shot_accuracy"], _binomial_se(x["max_shot_accuracy"], x.get("max_shot_samples", 1)))


def _icl_spread(r: RunResults) -> Measure:
    return Measure(r.results["icl"]["order"]["spread"])


def _val_loss(r: RunResults) -> Optional[Measure]:
    v = r.training.get("final_val_loss")
    return Measure(v) if v is not None else None


def _grad_max(r: RunResults) -> Optional[Measure]:
    g = r.training.get("grad_norm_max")
    return Measure(g) if g is not None else None


def _spikes(r: RunResults) -> Optional[Measure]:
    return Measure(float(len(r.training["spikes"]))) if r.training["step"] else None


def _chance(runs: Sequence[RunResults], analysis: str, key: str = "chance") -> Optional[float]:
    for r in runs:
        x = r.results.get(analysis)
        if x is not None:
            return x.get("task", x).get(key)
    return None


@dataclass
class Claim:
    title: str
    paper: str  # the paper's figure or table and its number
    measure: Callable[[RunResults], Optional[Measure]]
    higher_is_better: bool
    min_effect: float
    unit: str
    floor: Optional[Callable[[Sequence[RunResults]], Optional[float]]] = None
    only: Optional[str] = None  # a claim about one variant (V2's seed claims)


def claims() -> list[Claim]:
    return [
        Claim("lower validation loss at the same parameters and tokens", "Fig. 3; V2: 0.02-0.03 below baseline",
              _val_loss, False, 0.02, "final validation loss (nats); min effect 0.02 when seed spread is unknown"),
        Claim("better multi-needle retrieval", "Table 2: N=6, R=2 at 4K 0.85 vs 0.55", _needle_acc, True, 0.05,
              "mean exact-match accuracy over the grid", lambda rs: _chance(rs, "needles", "random_needle")),
        Claim("more attention on the answer span", "Table 3: 0.27-0.40 vs 0.03-0.09", _noise("answer"), True, 0.01,
              "attention mass on the target needle at the answering query"),
        Claim("less attention noise", "Table 3: 0.01-0.02 vs 0.49-0.54", _noise("noise"), False, 0.01,
              "attention mass on the rest of the context"),
        Claim("smaller attention-logit outliers", "Table 5: top-1 38.8 vs 318.0", _outlier("attention_logits"), False,
              0.0, "top-1 |attention logit|; DIFF must be below 0.8x baseline", None),
        Claim("smaller hidden-state outliers", "Table 5: top-1 1688 vs 3609", _outlier("hidden_states"), False, 0.0,
              "top-1 |hidden state|; DIFF must be below 0.8x baseline", None),
        Claim("retrieval kept at 6-bit attention logits", "Fig. 8", _quant_acc(6), True, 0.05,
              "retrieval accuracy with 6-bit logits", lambda rs: _chance(rs, "quantized", "random_needle")),
        Claim("smaller loss increase at 4-bit attention logits", "Fig. 8: 4-bit DIFF ~ 6-bit baseline",
              _quant_loss(4), False, 0.005, "validation loss increase at 4 bits vs full precision"),
        Claim("lower NLL deep into long context", "Fig. 4", _positions_tail, False, 0.02,
              "mean NLL over the last quarter of the positions evaluated"),
        Claim("more accurate many-shot in-context learning", "Fig. 6", _icl_best, True, 0.05,
              "accuracy at the largest shot count that fits", lambda rs: _chance(rs, "icl")),
        Claim("less sensitive to demonstration order", "Fig. 7", _icl_spread, False, 0.05,
              "best - worst accuracy over orderings"),
        Claim("fewer loss spikes", "V2 article (seed 002)", _spikes, False, 1.0,
              "training steps whose loss exceeds 1.1x the median of the previous 10 (after warm-up)"),
        Claim("smaller gradient-norm peaks", "V2 article (seed 002)", _grad_max, False, 0.0,
              "largest pre-clipping gradient norm after warm-up; DIFF must be below 0.8x baseline"),
    ]


RATIO_CLAIMS = {"smaller attention-logit outliers", "smaller hidden-state outliers", "smaller gradient-norm peaks"}


def verdicts(runs: Sequence[RunResults]) -> list[dict[str, Any]]:
    """One row per claim and DIFF variant present: verdict, reason, the values compared."""
    rows = []
    for c in claims():
        g = _group(runs, c.measure)
        for v in ("diff_v1", "diff_v2"):
            if v not in {r.attention for r in runs}:
                continue
            row = {"claim": c.title, "paper": c.paper, "variant": v, "measure": c.unit}
            if "baseline" not in g or v not in g:
                missing = "baseline" if "baseline" not in g else NAMES[v]
                row.update(verdict=INCONCLUSIVE, why=f"not measured for {missing} (see the errors below)")
            elif c.title in RATIO_CLAIMS:
                mb, md = _mean_se(g["baseline"])[0], _mean_se(g[v])[0]
                ratio = md / mb if mb else float("inf")
                verdict = HELD if ratio < 0.8 else NOT_HELD if ratio > 1.25 else INCONCLUSIVE
                row.update(verdict=verdict, why=f"baseline {mb:.4g} vs DIFF {md:.4g} (ratio {ratio:.2f}; held below "
                                                f"0.8, did not hold above 1.25)")
            else:
                floor = c.floor(runs) if c.floor else None
                verdict, why = compare(g["baseline"], g[v], c.higher_is_better, c.min_effect, floor)
                row.update(verdict=verdict, why=why)
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- plots
def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(plt, fig, axes, path: Path, grid: bool = True) -> None:
    """Legends (and a light grid) on every panel, then write the PNG and free the figure."""
    for a in axes:
        a.legend(fontsize=7)
        if grid:
            a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


COLORS = {"baseline": "#555555", "diff_v1": "#1f77b4", "diff_v2": "#d62728"}


def plot_training(runs: Sequence[RunResults], path: Path) -> None:
    """Training loss (spikes marked), validation loss and gradient norm per run."""
    plt = _plt()
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.6))
    for r in runs:
        t, c = r.training, COLORS.get(r.attention)
        if not t["step"]:
            continue
        ax[0].plot(t["step"], t["loss"], color=c, lw=0.8, label=r.ev.label)
        sp = set(t["spikes"])
        xs = [s for s in t["step"] if s in sp]
        ax[0].scatter(xs, [l for s, l in zip(t["step"], t["loss"]) if s in sp], color=c, marker="^", s=18)
        ax[1].plot(t["val_step"], t["val_loss"], color=c, marker="o", ms=3, label=r.ev.label)
        ax[2].plot(t["step"], t["grad_norm"], color=c, lw=0.8, label=r.ev.label)
    ax[0].set(title="training loss (triangles: spikes)", xlabel="step", ylabel="loss")
    ax[1].set(title="validation loss", xlabel="step")
    ax[2].set(title="gradient norm before clipping", xlabel="step", yscale="log")
    save_figure(plt, fig, ax, path)


def plot_noise(runs: Sequence[RunResults], path: Path) -> None:
    plt = _plt()
    rs = [r for r in runs if "noise" in r.results]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    for r in rs:
        x = r.results["noise"]
        layers = range(len(x["answer_per_layer"]))
        ax[0].plot(layers, x["answer_per_layer"], marker="o", color=COLORS.get(r.attention), label=r.ev.label)
        ax[1].plot(layers, x["noise_per_layer"], marker="o", color=COLORS.get(r.attention), label=r.ev.label)
    ax[0].set(title="attention on the answer span", xlabel="layer")
    ax[1].set(title="attention on the rest of the context (noise)", xlabel="layer")
    save_figure(plt, fig, ax, path)


def plot_outliers(runs: Sequence[RunResults], path: Path) -> None:
    plt = _plt()
    rs = [r for r in runs if "outliers" in r.results]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    keys = ["top1", "top10", "median"]
    w = 0.8 / max(1, len(rs))
    for i, r in enumerate(rs):
        for a, kind in zip(ax, ("attention_logits", "hidden_states")):
            vals = [r.results["outliers"][kind].get(k, float("nan")) for k in keys]
            a.bar([j + i * w for j in range(len(keys))], vals, w, color=COLORS.get(r.attention), label=r.ev.label)
    for a, title in zip(ax, ("|attention logits|", "|hidden states|")):
        a.set_xticks([j + 0.4 - w / 2 for j in range(len(keys))], keys)
        a.set(title=title, yscale="log")
    save_figure(plt, fig, ax, path, grid=False)


def plot_quantized(runs: Sequence[RunResults], path: Path) -> None:
    plt = _plt()
    rs = [r for r in runs if "quantized" in r.results]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    for r in rs:
        rows = r.results["quantized"]["rows"]
        bits = [row["bits"] or 32 for row in rows]
        ax[0].plot(bits, [row["loss"] for row in rows], marker="o", color=COLORS.get(r.attention), label=r.ev.label)
        ax[1].plot(bits, [row["accuracy"] for row in rows], marker="o", color=COLORS.get(r.attention),
                   label=r.ev.label)
    if rs:
        t = rs[0].results["quantized"]["task"]
        ax[1].axhline(t["random_needle"], ls="--", color="k", lw=0.8, label="random needle")
    ax[0].set(title="validation loss vs attention-logit bits (32 = full)", xlabel="bits", xscale="log")
    ax[1].set(title="retrieval accuracy vs bits", xlabel="bits", xscale="log", ylim=(-0.02, 1.02))
    save_figure(plt, fig, ax, path)


# ---------------------------------------------------------------------------------------------- HTML
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


def _slug(verdict: str) -> str:
    return verdict.replace(" ", "-")


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
    # models
    mrows = []
    for r in runs:
        d = r.ev.run_config.get("data", {})
        mrows.append([r.ev.label, NAMES.get(r.attention, r.attention), r.ev.model.num_parameters(), r.ev.seed,
                      r.training.get("final_val_loss"), len(r.training["step"]) and r.training["step"][-1],
                      d.get("retrieval_share"), str(r.ev.source)])
    parts += ["<h2>Models</h2>",
              table(["run", "attention", "parameters", "seed", "final val loss", "steps", "retrieval share",
                     "directory"], mrows, left=2)]
    # verdicts
    n_seeds = {v: sum(r.attention == v for r in runs) for v in VARIANTS}
    parts += ["<h2>Verdicts</h2>",
              f"<p class='note'>Runs per variant: "
              + ", ".join(f"{NAMES[v]} {n}" for v, n in n_seeds.items() if n)
              + ". With one seed per variant the seed-to-seed spread is unknown, so the margins below cover only "
                "the sampling error of the evaluation and a stated minimum effect. " + _esc(__doc__.split("\n\n")[2])
              + "</p>",
              table(["claim", "variant", "verdict", "paper", "measure", "evidence"],
                    [[r["claim"], NAMES[r["variant"]], r["verdict"], r["paper"], r["measure"], r["why"]]
                     for r in rows], cls=[_slug(r["verdict"]) for r in rows], left=6)]
    counts = {v: {k: sum(1 for r in rows if r["variant"] == v and r["verdict"] == k)
                  for k in (HELD, NOT_HELD, INCONCLUSIVE)} for v in ("diff_v1", "diff_v2")}
    summary = "; ".join(f"{NAMES[v]}: {c[HELD]} held, {c[NOT_HELD]} did not hold, {c[INCONCLUSIVE]} inconclusive"
                        for v, c in counts.items() if sum(c.values()))
    parts.append(f"<p><b>Summary.</b> {_esc(summary)}.</p>")
    # sections
    sec = extra.get("sections", {})
    for key, title in [("training", "Training: loss, validation loss, gradient norm"),
                       ("needles", "Multi-needle retrieval (Table 2, Fig. 5)"),
                       ("attnmap", "Attention maps on one needle example (Fig. 1)"),
                       ("noise", "Attention noise (Table 3)"), ("outliers", "Activation outliers (Table 5)"),
                       ("quantized", "Quantised attention logits (Fig. 8)"),
                       ("positions", "NLL by position (Fig. 4)"),
                       ("icl", "Many-shot in-context learning and order robustness (Fig. 6-7)")]:
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


# ---------------------------------------------------------------------------------------------- sections
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
             r.results["noise"]["uniform_answer_share"]] for r in rs]
    out = table(["run", "map", "answer mass", "noise mass", "uniform attention's answer mass"], rows, left=2)
    if any(r.results["noise"][k] < 0 for r in rs for k in ("answer", "noise")):
        out += ("<p>A negative mass is possible for DIFF: its map A1 - lambda*A2 is not a probability distribution, "
                "and where the second map outweighs the first the sum goes below zero. The noise verdict compares the "
                "signed sums, as the paper's Table 3 does.</p>")
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
    """The analysis module's own text table, one per run (positions, icl)."""
    import importlib
    if not any(name in r.results for r in runs):
        return ""
    fmt = getattr(importlib.import_module(f"{__package__}.{name}"), f"format_{name}")
    texts = [fmt(r.results[name]) for r in runs if name in r.results]
    return "".join(f"<pre>{_esc(t)}</pre>" for t in texts)


def _module_plot(runs: Sequence[RunResults], name: str, path: Path) -> bool:
    import importlib
    res = [r.results[name] for r in runs if name in r.results]
    if not res:
        return False
    getattr(importlib.import_module(f"{__package__}.{name}"), f"plot_{name}")(res, path)
    return True


# ---------------------------------------------------------------------------------------------- driver
def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path, quick: bool = True, seed: int = 0,
                 progress: bool = True, preface: str = "") -> Path:
    """Evaluate ``run_dirs`` and write ``out_dir/report.html`` (returned) and ``out_dir/results.json``."""
    from .. import __version__
    from . import needles

    if not run_dirs:
        raise ValueError("report: give at least one RUN_DIR")
    evs = [load_for_eval(p) for p in run_dirs]
    vocab = {ev.tokenizer.get_vocab_size() for ev in evs}
    if len(vocab) > 1:
        raise ValueError(f"report: the runs use different tokenizers (vocabulary sizes {sorted(vocab)}); "
                         "compare runs trained on the same tokens")
    labels = [ev.label for ev in evs]
    for i, ev in enumerate(evs):  # two runs of one variant and seed: name them by directory
        if labels.count(ev.label) > 1:
            ev.label = f"{ev.label} ({Path(ev.source).name})"
    settings = Settings(quick, seed, progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = evaluate_runs(evs, settings)

    figures: dict[str, Path] = {}
    plot_training(runs, out / "training.png")
    figures["training"] = out / "training.png"
    nd = [r.results["needles"] for r in runs if "needles" in r.results]
    if nd:
        needles.plot_heatmaps(nd, out / "needles.png")
        figures["needles"] = out / "needles.png"
    for name, fn in (("noise", plot_noise), ("outliers", plot_outliers), ("quantized", plot_quantized)):
        if any(name in r.results for r in runs):
            fn(runs, out / f"{name}.png")
            figures[name] = out / f"{name}.png"
    for name in ("positions", "icl"):
        if _module_plot(runs, name, out / f"{name}.png"):
            figures[name] = out / f"{name}.png"
    attn = None
    try:
        from . import attnmap
        first = {}
        for r in runs:  # one run per variant, the first given
            first.setdefault(r.attention, r.ev)
        attn = attnmap.run_attnmap(list(first.values()), seed=seed)
        attnmap.plot_attnmap(attn, out / "attnmap.png")
        figures["attnmap"] = out / "attnmap.png"
    except (ImportError, ValueError, RuntimeError) as e:
        for r in runs:
            r.errors["attnmap"] = f"{type(e).__name__}: {e}"
            break

    rows = verdicts(runs)
    sections = {"needles": _needles_section(runs), "noise": _noise_section(runs),
                "outliers": _outliers_section(runs), "quantized": _quantized_section(runs),
                "positions": _module_section(runs, "positions"), "icl": _module_section(runs, "icl"),
                "training": table(["run", "final val loss", "loss spikes", "grad-norm median", "grad-norm max",
                                   "learned lambda (last eval)"],
                                  [[r.ev.label, r.training["final_val_loss"], len(r.training["spikes"]),
                                    r.training["grad_norm_median"], r.training["grad_norm_max"],
                                    ", ".join(f"{v:.3f}" for v in r.training["lambda"].get("values", []))]
                                   for r in runs])}
    page = render_html(runs, rows, figures, settings,
                       {"version": __version__, "sections": sections, "preface": html.escape(preface)})
    results = {"settings": vars(settings), "verdicts": rows,
               "runs": [{"model": r.ev.describe(), "training": r.training, "results": r.results,
                         "errors": r.errors} for r in runs],
               "attnmap": attn}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    tmp = out / "report.html.tmp"
    tmp.write_text(page)
    tmp.replace(out / "report.html")
    return out / "report.html"


def run_cli(args: argparse.Namespace) -> int:
    path = write_report(args.runs, args.out, quick=not args.full, seed=args.seed, progress=not args.no_progress)
    print(f"report written to {path}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="run every analysis over several runs and write one HTML report",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="run (or model) directories: e.g. a baseline, a DIFF V1 and a DIFF V2 run, several seeds each")
    p.add_argument("--out", default="report", metavar="DIR", help="where report.html, results.json and the PNGs go "
                                                                  "(default ./report)")
    p.add_argument("--full", action="store_true", help="the larger evaluation settings (more samples; slower)")
    p.add_argument("--seed", type=int, default=0, help="seed of the evaluation samples")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_cli)
