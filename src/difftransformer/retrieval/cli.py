"""``difftransformer retrieval``: the token-level key-value retrieval benchmark (paper Fig. 1, Table 2/3, Fig. 5/8).

Writes DIR/results.json and DIR/*.png and prints, per variant: parameters, chosen lr, accuracy at each condition
(mean +- seed sd, with the number of seeds) and the layer-mean attention shares at the primary endpoint. A failed job
or ``--time-limit`` ends it with one line and its own exit code (``jobs.outcome``), no results.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..jobs import Incomplete
from ..jobs import cli as jobs_cli
from ..jobs.codepath import CODE_PATHS
from ..jobs.outcome import EXIT_CODES_HELP
from ..model import variants as registry
from ..studies.cli import floats, ints, write_rounding
from .config import RetrievalConfig, quick_config

HELP = ("token-level key-value retrieval benchmark, pre-registered (PROTOCOL.md, version 3): baseline vs DIFF V1/V2, "
        "the lr grid on 12 paired test seeds, tuned and matched learning rates, lr robustness, attention share, "
        "quantisation, plots; resumable (OUT/jobs.jsonl); --rounding-check: the verdicts under another CPU code "
        "path; --sweep-width: accuracy vs parameters")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory for results.json and the plots")
    p.add_argument("--quick", action="store_true",
                   help="smoke run (about two minutes): 150 steps, a 2-value lr grid, 2 test seeds, 16 contexts per "
                        "condition; its numbers are not a measurement and the report gives no verdicts")
    p.add_argument("--seeds", type=int, help="test seeds per variant, paired across variants (default 12)")
    p.add_argument("--seed-base", type=int, help="the first test seed: seeds SEED_BASE..SEED_BASE+N-1 (default 3000)")
    p.add_argument("--steps", type=int, help="training steps per model (default 600)")
    p.add_argument("--batch", type=int, help="contexts per training step (default 32)")
    p.add_argument("--lr-grid",
                   help="comma-separated learning rates, each run on every test seed; each variant's lr is chosen on "
                        "the validation split (default 1e-3,2e-3,4e-3)")
    p.add_argument("--lr-widen", type=int, help="times a grid grows past an edge that was chosen (default 1)")
    p.add_argument("--train-pairs", help="LO,HI facts per training context, drawn per example (default 8,24)")
    p.add_argument("--train-context", help="LO,HI training context length (facts + filler), drawn per batch "
                                           "(default 24,48)")
    p.add_argument("--queries", type=int, help="keys asked per context, training and test (default 8)")
    p.add_argument("--n-keys", type=int, help="key vocabulary size (default 64)")
    p.add_argument("--distractors", help="training distractor kind: random | near")
    p.add_argument("--d-model", type=int, help="model width (all variants; parameters matched by the library)")
    p.add_argument("--n-layers", type=int, help="transformer layers")
    p.add_argument("--variants", help=f"comma-separated subset of {', '.join(registry.names())}")
    p.add_argument("--eval-contexts", type=int, help="test contexts per condition, and validation contexts for the "
                                                     "lr choice (default 128)")
    p.add_argument("--primary", help="primary endpoint condition, inside the trained lengths (default p48c48); "
                                     "PROTOCOL.md fixes it: changing it is a deviation to report")
    p.add_argument("--extrapolation", help="length-extrapolation endpoint condition, longer than any trained "
                                           "(default p48c96)")
    p.add_argument("--sweep-width", metavar="W1,W2,...",
                   help="instead of the benchmark: the scaling sweep (paper Fig. 3) at these widths, every variant x "
                        "test seed x lr of the grid, each variant at its lr per width (chosen on validation); accuracy "
                        "at the primary condition against parameters, and the parameter ratio DIFF/baseline at the "
                        "baseline's default-width accuracy, bootstrapped; resumable (OUT/sweep-jobs.jsonl)")
    p.add_argument("--reuse-jobs", metavar="JOURNAL",
                   help="with --sweep-width: read finished jobs from another run's journal (e.g. the benchmark's "
                        "OUT/jobs.jsonl: its jobs are the sweep's at the default width) where everything that "
                        "determines a job is the same (its key); they are copied, not run")
    p.add_argument("--cpu-code-path", choices=CODE_PATHS,
                   help="the CPU kernels every job runs: 'machine' lets each library pick them for this CPU; "
                        "'avx2'/'avx512' pin PyTorch's, MKL's and oneDNN's instruction set (default machine: pinning "
                        "did not make numbers equal across CPUs; PROTOCOL.md, 'Reproducibility')")
    p.add_argument("--rounding-check", metavar="CODE_PATH", choices=CODE_PATHS,
                   help="after the benchmark, rerun every job under this CPU code path into OUT/rounding-CODE_PATH and "
                        "print both verdict tables and the verdicts that differ (written to OUT/rounding.json); with "
                        "--diagnostic: OUT holds the finished diagnostic, and its jobs at the chosen lrs (baseline, "
                        "DIFF V1, DIFF V2 and every arm, every test seed: 96 jobs) run again under CODE_PATH and "
                        "every D, C and reading is printed under both (lr choices not replayed)")
    p.add_argument("--diagnostic", action="store_true",
                   help="instead of the benchmark, the retrieval diagnostic (DIAGNOSTIC.md beside PROTOCOL.md): four "
                        "one-change arms of DIFF V1 and V2 (V1 without its head-wise norm; V2 with it, with V1's "
                        "scalar lambda, with separate keys), each with the lr grid on the 12 test seeds, read against "
                        "the baseline and its own variant; needs --reference; takes its configuration from there; "
                        "writes OUT/diagnostic.json, OUT/diagnostic-lr.png, OUT/diag-jobs.jsonl (resumable); about "
                        "150 jobs of 20-30 CPU-seconds")
    p.add_argument("--reference", metavar="DIR",
                   help="with --diagnostic: a finished benchmark run ON THIS MACHINE (its jobs.jsonl), whose "
                        "configuration, lr choices and baseline, DIFF V1 and DIFF V2 runs the diagnostic reads")
    jobs_cli.add_arguments(p)  # --workers, --executor, --ray-address, --cpus-per-job, --gpus-per-job, --device,
    # --time-limit
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args) -> RetrievalConfig:
    cfg = quick_config() if args.quick else RetrievalConfig()
    ch: dict[str, Any] = {}
    for flag, key in (("seeds", "seeds"), ("steps", "steps"), ("batch", "batch"), ("lr_widen", "lr_widen"),
                      ("queries", "queries"), ("n_keys", "n_keys"), ("distractors", "distractors"),
                      ("d_model", "d_model"), ("n_layers", "n_layers"), ("eval_contexts", "eval_contexts"),
                      ("primary", "primary"), ("extrapolation", "extrapolation")):
        if getattr(args, flag) is not None:
            ch[key] = getattr(args, flag)
    if args.eval_contexts is not None:
        ch["val_contexts"] = args.eval_contexts
    if args.lr_grid is not None:
        ch["lr_grid"] = floats(args.lr_grid, "--lr-grid")
    if args.seed_base is not None:
        ch["seed_base"] = args.seed_base
    if args.cpu_code_path is not None:
        ch["cpu_code_path"] = args.cpu_code_path
    if args.train_pairs is not None:
        ch["train_pairs"] = ints(args.train_pairs, "--train-pairs", 2)
    if args.train_context is not None:
        ch["train_context"] = ints(args.train_context, "--train-context", 2)
    if args.variants is not None:
        ch["variants"] = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    return cfg.replace(**ch) if ch else cfg


def format_table(results: dict[str, Any]) -> str:
    from .benchmark import mean_spread, seed_values
    conds = [c["name"] for c in results["conditions"]]
    prim = results["primary_endpoint"]["condition"]
    extra = results["config"].get("extrapolation")
    lines = []
    if results.get("quick"):
        lines.append("QUICK SMOKE RUN: too few steps and contexts to measure anything; run without --quick.")
    lines.append(f"key-value retrieval, accuracy mean +- seed sd (chance {results['chance']:.3f}); primary endpoint "
                 f"{prim} (*), length extrapolation {extra} (+); 'fail' = runs below the floor on the training "
                 "distribution")
    for policy, key in (("tuned lr (primary analysis)", "runs"), (f"matched lr {results['matched_lr']:g} "
                                                                   "(sensitivity)", "matched_runs")):
        lines.append(f"-- {policy}")
        lines.append(f"{'variant':<9} {'params':>8} {'lr':>7} {'seeds':>5} {'fail':>4} {'train dist':>11} " +
                     " ".join(f"{(c + ('*' if c == prim else '+' if c == extra else '')):>12}" for c in conds))
        for v, d in results["variants"].items():
            runs = d[key]
            cells = [f"{m:.3f}+-{sd:.3f}".rjust(12)
                     for m, sd in (mean_spread(seed_values(results, v, c, policy=key)) for c in conds)]
            td = mean_spread([r["training_distribution"]["accuracy"] for r in runs])
            lines.append(f"{v:<9} {d['params']:>8,} {runs[0]['lr']:>7.2g} {len(runs):>5} "
                         f"{sum(r['failed'] for r in runs):>4} {td[0]:>6.3f}+-{td[1]:.2f} " + " ".join(cells))
    lines.append(f"attention endpoint at {prim}: per query the best head's answer share per layer, layer mean "
                 "(scale-free), seed mean +- sd:")
    for v, d in results["variants"].items():
        tm = mean_spread([r["conditions"][prim]["attention_endpoint"] for r in d["runs"]])
        mm = mean_spread([r["conditions"][prim]["attention_endpoint"] for r in d["matched_runs"]])
        lines.append(f"  {v:<9} tuned {tm[0]:.3f}+-{tm[1]:.3f}   matched {mm[0]:.3f}+-{mm[1]:.3f}")
    n = len(next(iter(results["variants"].values()))["runs"])
    lines.append(f"lr grid on every test seed (mean over {n} seeds of the validation split at {prim}: accuracy / "
                 "answer loss / runs passing the floor; chosen on the accuracy):")
    for v, d in results["variants"].items():
        note = (f"  (widened: {', '.join(f'{x:g}' for x in d['widened'])})" if d["widened"] else "") + \
            ("  STILL AT AN EDGE" if d["at_edge"] else "")
        lines.append(f"  {v:<9} " + ", ".join(f"{g['lr']:g}: {g['val_accuracy']:.3f} / {g['val_loss']:.4f} / "
                                              f"{g['passed_floor']}" for g in d["lr_grid"])
                     + f"  -> {d['tuned_lr']:g}{note}")
    grid = ", ".join(f"{x:g}" for x in results["config"]["lr_grid"])
    lines.append(f"lr robustness: test accuracy at {prim}, mean over the grid ({grid}) per seed, seed mean +- sd; "
                 "share of the grid's runs passing the floor:")
    for v, d in results["variants"].items():
        m = mean_spread([r["conditions"][prim]["accuracy"] for r in d["lr_robustness"]])
        lines.append(f"  {v:<9} {m[0]:.3f}+-{m[1]:.3f}   floor passed {d['floor_pass_share']:.0%}")
    t = results["timings"]
    lines.append(f"wall {t['wall_s']:.0f} s, {t['jobs']} jobs ({t['jobs_run']} run now, the rest read back from "
                 f"jobs.jsonl) on {_where(t)}; CPU code path {results['cpu']['code_path']} (torch kernels "
                 f"{', '.join(results['cpu']['torch_kernels'])}); load average before {t['loadavg_before']}, after "
                 f"{t['loadavg_after']}")
    return "\n".join(lines)


def _where(t: dict[str, Any]) -> str:
    """Where the jobs ran, from results.json's timings (older files name the workers only)."""
    if t.get("executor") == "ray":
        return (f"Ray ({t.get('ray_address') or 'a local instance'}, {t['cpus_per_job']:g} CPU + "
                f"{t['gpus_per_job']:g} GPU per job, device {t['device']})")
    return f"{t['workers']} workers" + (f", device {t['device']}" if t.get("device", "cpu") != "cpu" else "")


def run_cli(args) -> int:
    try:
        return _run_cli(args)
    except Incomplete as e:  # the finished jobs are journaled: the same command resumes
        return jobs_cli.incomplete(e, "retrieval")


def _run_cli(args) -> int:
    options = jobs_cli.options_from_args(args)
    cfg = config_from_args(args)
    if args.diagnostic or args.reference is not None:
        if not (args.diagnostic and args.reference is not None):
            raise ValueError("--diagnostic and --reference DIR go together")
        others = [f for f, v in (("--sweep-width", args.sweep_width), ("--reuse-jobs", args.reuse_jobs),
                                 ("--quick", args.quick or None)) if v]
        if others or cfg != RetrievalConfig():
            raise ValueError("--diagnostic takes its configuration from --reference DIR: drop "
                             + (", ".join(others) if others else "the configuration flags"))
        if args.rounding_check is not None:
            from ..studies.rounding import format_readings
            from .diagnostic import rounding_check
            check = rounding_check(args.reference, args.out, args.rounding_check, options)
            write_rounding(args.out, check, format_readings(check, "retrieval diagnostic"))
            return 0
        from .diagnostic import format_diagnostic, run_diagnostic
        print(format_diagnostic(run_diagnostic(args.reference, args.out, options)))
        print(f"wrote {args.out}/diagnostic.json and diagnostic-lr.png")
        return 0
    if args.reuse_jobs is not None and (args.sweep_width is None or not Path(args.reuse_jobs).is_file()):
        raise ValueError(f"--reuse-jobs {args.reuse_jobs}: needs --sweep-width and an existing journal file")
    if args.sweep_width is not None:
        from .sweep import format_sweep, run_sweep
        widths = ints(args.sweep_width, "--sweep-width")
        res = run_sweep(cfg, widths, args.out, reuse=args.reuse_jobs, options=options)
        print(format_sweep(res))
        print(f"wrote {args.out}/sweep.json and sweep.png")
        return 0
    from .benchmark import run_benchmark
    results = run_benchmark(cfg, args.out, quick=args.quick, options=options)
    print(format_table(results))
    print(f"wrote {args.out}/results.json and plots")
    if args.rounding_check is not None:
        from .rounding import format_rounding, rounding_check
        check = rounding_check(results, cfg.replace(cpu_code_path=args.rounding_check), args.out, quick=args.quick,
                               options=options)
        write_rounding(args.out, check, format_rounding(check))
    return 0


def register(sub) -> None:
    p = sub.add_parser("retrieval", help=HELP, description=HELP, epilog=EXIT_CODES_HELP, allow_abbrev=False)
    add_arguments(p)
    p.set_defaults(func=run_cli)
