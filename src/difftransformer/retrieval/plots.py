"""Plots of a ``run_benchmark`` results dict (matplotlib, Agg backend). Each function writes one PNG and returns
its path; ``plot_all`` writes every one. Values are means over seeds with the seed standard deviation as error
bars; no verdicts here (the statistics over seeds live elsewhere)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path

from ..eval.plotting import color, label
from ..rundir.files import (
    ACCURACY_HEATMAP_PNG,
    ACCURACY_VS_DIFFICULTY_PNG,
    ACCURACY_VS_LR_PNG,
    ATTENTION_ROW_PNG,
    ATTENTION_SHARES_PNG,
    QUANTIZATION_PNG,
)
from ..studies.report import plt
from ..studies.report import save as _save
from .benchmark_schema import RetrievalResults


def _ms(xs: Iterable[float]) -> tuple[float, float]:
    xs = list(xs)
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _acc(results: RetrievalResults, v: str, cond: str) -> tuple[float, float]:
    return _ms(r["conditions"][cond]["accuracy"] for r in results["variants"][v]["runs"])


def _accuracy_axis(ax, bars: list[tuple[float, float]]) -> None:
    """An accuracy axis from 0 to just above 1, or above the highest mean + sd, so that no error bar is cut."""
    ax.set_ylim(0, max([1.02] + [m + s + 0.03 for m, s in bars]))


def plot_accuracy_heatmap(results: RetrievalResults, path) -> Path:
    """Fig. 5 style: accuracy over (pairs x context length) per variant, random distractors, mean over seeds
    (tuned lr); the trained context lengths end at the dashed line."""
    conds = [c for c in results["conditions"] if c["distractors"] == "random"]
    pm = sorted({c["pairs"] for c in conds})
    fm = sorted({c["context"] for c in conds})
    trained = [i for i, c in enumerate(fm) if c <= results["config"]["train_context"][1]]
    vs = list(results["variants"])
    fig, axes = plt.subplots(1, len(vs), figsize=(3.8 * len(vs), 3.4), squeeze=False, layout="constrained")
    for ax, v in zip(axes[0], vs):
        grid = [[float("nan")] * len(fm) for _ in pm]
        for c in conds:
            grid[pm.index(c["pairs"])][fm.index(c["context"])] = _acc(results, v, c["name"])[0]
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
        for i in range(len(pm)):
            for j in range(len(fm)):
                ax.text(j, i, f"{grid[i][j]:.2f}", ha="center", va="center", fontsize=8,
                        color="k" if grid[i][j] > 0.7 else "w")  # readable on the light (viridis) end
        if trained and trained[-1] < len(fm) - 1:
            ax.axvline(trained[-1] + 0.5, color="w", ls="--", lw=1)
        ax.set_xticks(range(len(fm)), [str(x) for x in fm])
        ax.set_yticks(range(len(pm)), [str(x) for x in pm])
        ax.set_xlabel("context length (dashed: end of trained)", fontsize=8)
        ax.set_ylabel("facts in the context")
        ax.set_title(f"{label(v)} ({results['variants'][v]['params']:,} params)", fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="accuracy (mean over seeds)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_accuracy_vs_difficulty(results: RetrievalResults, path) -> Path:
    """Accuracy per condition (ordered by sequence length), mean +- seed sd, chance dashed."""
    conds = sorted(results["conditions"], key=lambda c: (c["context"], c["pairs"], c["name"]))
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(conds)), 3.6))
    bars = []
    for k, v in enumerate(results["variants"]):
        ms = [_acc(results, v, c["name"]) for c in conds]
        bars += ms
        ax.errorbar([i + 0.08 * (k - 1) for i in range(len(conds))], [m for m, _ in ms], yerr=[s for _, s in ms],
                    marker="o", capsize=3, label=label(v), color=color(v))
    ax.axhline(results["chance"], ls="--", color="k", lw=0.8, label="chance")
    ax.set_xticks(range(len(conds)), [c["name"] for c in conds], rotation=45, fontsize=8)
    ax.set_ylabel("accuracy")
    _accuracy_axis(ax, bars)
    ax.set_title(f"key-value retrieval; primary endpoint: {results['primary_endpoint']['condition']}", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_attention_shares(results: RetrievalResults, path, condition: str | None = None) -> Path:
    """Table 3 style, per layer: the answering query's scale-free answer share, the best head's (the attention
    endpoint averages these over layers) and the head mean, mean +- seed sd, tuned lr."""
    cond = condition or results["primary_endpoint"]["condition"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    n_layers = 1
    for k, v in enumerate(results["variants"]):
        runs = results["variants"][v]["runs"]
        n_layers = len(runs[0]["conditions"][cond]["attention"])
        series = ([[r["conditions"][cond]["best_head_share_per_layer"][i] for r in runs] for i in range(n_layers)],
                  [[r["conditions"][cond]["attention"][i]["answer_share"] for r in runs] for i in range(n_layers)])
        for ax, per_layer in zip(axes, series):
            ms = [_ms(x) for x in per_layer]
            ax.errorbar([i + 0.08 * (k - 1) for i in range(n_layers)], [m for m, _ in ms], yerr=[s for _, s in ms],
                        marker="o", capsize=3, label=label(v), color=color(v))
    for ax, t in zip(axes, ("best head's answer share (the endpoint, per layer)", "head-mean answer share")):
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("layer")
        ax.set_xticks(range(n_layers))
        ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
    axes[0].legend(fontsize=8)
    fig.suptitle(f"attention of the answering query at {cond} (signed share of sum |row| on the context)", fontsize=9)
    return _save(fig, path)


def plot_quantization(results: RetrievalResults, path) -> Path:
    """Fig. 8 style: accuracy vs attention-logit bits (full precision first) at the primary condition."""
    cond = results["primary_endpoint"]["condition"]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    rows: list = []
    bars = []
    for v in results["variants"]:
        runs = results["variants"][v]["runs"]
        rows = runs[0]["quantized"][cond]
        ms = [_ms(r["quantized"][cond][i]["accuracy"] for r in runs) for i in range(len(rows))]
        bars += ms
        ax.errorbar(range(len(rows)), [m for m, _ in ms], yerr=[s for _, s in ms], marker="o", capsize=3,
                    label=label(v), color=color(v))
    ax.set_xticks(range(len(rows)), ["full" if r["bits"] is None else f"{r['bits']}b" for r in rows])
    ax.axhline(results["chance"], ls="--", color="k", lw=0.8, label="chance")
    _accuracy_axis(ax, bars)
    ax.set_title(f"quantised attention logits, {cond}", fontsize=9)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=8)
    return _save(fig, path)


def retrieval_layer(results: RetrievalResults, variant: str) -> int:
    """The layer whose mean answer share (first seed, primary condition) is highest: where the lookup happens."""
    att = results["variants"][variant]["runs"][0]["conditions"][results["primary_endpoint"]["condition"]]["attention"]
    return max(range(len(att)), key=lambda l: att[l]["answer_share"])  # noqa: E741


def plot_attention_row(results: RetrievalResults, path, layer: int | None = None) -> Path:
    """Fig. 1 style: one query's head-mean attention row per variant (first seed), in ``layer`` or, by default,
    in each variant's retrieval layer (``retrieval_layer``), at the primary condition."""
    vs = list(results["variants"])
    fig, axes = plt.subplots(len(vs), 1, figsize=(9, 1.9 * len(vs)), squeeze=False)
    for ax, v in zip(axes[:, 0], vs):
        ex = results["variants"][v]["runs"][0]["example_row"]
        shown = retrieval_layer(results, v) if layer is None else layer
        row = ex["rows"][shown]
        distract = set(ex.get("distractor_fact_pos", []))
        colors = ["tab:red" if i == ex["answer_pos"] else "tab:orange" if i in distract else
                  ("tab:gray" if i < ex["context_end"] else "tab:olive") for i in range(len(row))]
        ax.bar(range(len(row)), row, color=colors, width=1.0)
        ax.axhline(0, color="k", lw=0.5)
        verdict = ("answered right" if ex["correct"] else "answered wrong") if "correct" in ex else ""
        ax.set_title(f"{label(v)}, layer {shown % len(ex['rows'])} (head mean), {verdict}: answer red, other "
                     f"facts orange, filler gray, earlier questions olive", fontsize=8)
        ax.set_ylabel("attention")
    axes[-1, 0].set_xlabel("key position")
    return _save(fig, path)


def plot_accuracy_vs_lr(results: RetrievalResults, path) -> Path:
    """The learning-rate robustness endpoint's picture: test accuracy at the primary condition against the lr,
    per variant, seed mean +- sd over every test seed (widened values included, marked by the grid); the chosen lr
    circled; the training-distribution accuracy dashed."""
    prim = results["config"]["primary"]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    bars = []
    for v, x in results["variants"].items():
        lrs = sorted({r["lr"] for r in x["grid_runs"]})
        acc = [_ms(r["conditions"][prim]["accuracy"] for r in x["grid_runs"] if r["lr"] == lr) for lr in lrs]
        bars += acc
        dist = [_ms(r["training_distribution"]["accuracy"] for r in x["grid_runs"] if r["lr"] == lr)[0] for lr in lrs]
        ax.errorbar(lrs, [m for m, _ in acc], yerr=[sd for _, sd in acc], marker="o", capsize=3, color=color(v),
                    label=f"{label(v)} at {prim}")
        ax.plot(lrs, dist, ls="--", lw=0.8, color=color(v))
        ax.scatter([x["tuned_lr"]], [acc[lrs.index(x["tuned_lr"])][0]], s=140, facecolors="none", edgecolors=color(v))
    ax.axhline(results["chance"], color="k", ls=":", lw=0.8, label="chance")
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("test accuracy (seed mean +- sd)")
    _accuracy_axis(ax, bars)
    ax.set_title("accuracy vs lr (dashed: training distribution; circle: chosen lr)", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_all(results: RetrievalResults, out_dir) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [plot_accuracy_heatmap(results, out / ACCURACY_HEATMAP_PNG),
            plot_accuracy_vs_difficulty(results, out / ACCURACY_VS_DIFFICULTY_PNG),
            plot_attention_shares(results, out / ATTENTION_SHARES_PNG),
            plot_quantization(results, out / QUANTIZATION_PNG),
            plot_attention_row(results, out / ATTENTION_ROW_PNG),
            plot_accuracy_vs_lr(results, out / ACCURACY_VS_LR_PNG)]
