"""``difftransformer lm-sweep``: the pre-registered language-model sweep (PROTOCOL.md beside this file).

Writes OUT/sweep.json, OUT/lm-sweep-{params,tokens,lr}.png and OUT/lm-jobs.jsonl (the job journal: run the same
command again to resume), and prints the per-width table, the verdict table and the sensitivity rows. A failed job
or ``--time-limit`` ends it with one line and its own exit code (``jobs.outcome``), no sweep.json.
"""

from __future__ import annotations

import argparse

from ..jobs import Incomplete
from ..jobs import cli as jobs_cli
from ..jobs.codepath import CODE_PATHS
from ..jobs.outcome import EXIT_CODES_HELP
from ..model import variants as registry
from ..studies.cli import floats, ints, write_rounding
from .config import SCALES, LMSweepConfig, quick_config

HELP = ("language-model sweep, pre-registered (PROTOCOL.md, version 2): baseline vs DIFF V1/V2 at 3 (cpu) or 4 (gpu) "
        "widths with 4 baseline heads, an lr grid per variant and width on 5 (cpu) or 6 (gpu) paired seeds; final "
        "loss, Fig. 3a (parameters) and 3b (tokens) ratios where their premise holds (else 'not measurable at this "
        "scale'), activation outliers, lr robustness; plots; resumable (OUT/lm-jobs.jsonl); --scale cpu: 99 minutes "
        "on 2 CPU cores (measured once, 160 jobs)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory: sweep.json, the plots, the job journal, data/")
    p.add_argument("--scale", choices=tuple(SCALES), default="cpu",
                   help="the pre-registered scale whose values the other flags start from: 'cpu' (default; widths "
                        "32,64,96, 300 steps of 16x128 tokens, 5 seeds; 99 minutes on 2 cores, measured once) or 'gpu' "
                        "(widths 32,64,96,128, 600 steps of 64x128 tokens, 6 seeds; for one GPU with --device cuda, "
                        "about 6-7 minutes projected, unmeasured)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run (a few minutes): widths 16,32, 40 steps, 2 lrs, 2 seeds; not a measurement")
    p.add_argument("--widths", help="comma-separated d_model values, each divisible by 2 x the heads (default: the "
                                    "scale's, cpu 32,64,96, gpu 32,64,96,128); PROTOCOL.md fixes them")
    p.add_argument("--n-layers", type=int, help="layers at every width (default 4)")
    p.add_argument("--n-heads", type=int, help="the baseline's heads at every width, even (default 4: DIFF V1 has 2 "
                                               "differential heads; head_dim = d_model / n_heads)")
    p.add_argument("--preset", help="the preset whose [data] (tokens, tokenizer) and other [model] options are used "
                                    "(default demo)")
    p.add_argument("--seq-len", type=int, help="training and validation window, tokens (default 128)")
    p.add_argument("--batch", type=int, help="windows per optimizer step (default cpu 16, gpu 64)")
    p.add_argument("--steps", type=int, help="optimizer steps per run (default cpu 300, gpu 600)")
    p.add_argument("--warmup-steps", type=int, help="linear warmup steps (default cpu 30, gpu 60)")
    p.add_argument("--lr-grid", help="comma-separated peak learning rates, each run on every seed at every width "
                                     "(default 4e-3,8e-3,16e-3)")
    p.add_argument("--lr-widen", type=int, help="the most times a grid grows past a chosen edge, per width; a choice "
                                                "still at an edge is reported as an unresolved edge (default 2)")
    p.add_argument("--seeds", type=int, help="paired seeds (default cpu 5, gpu 6)")
    p.add_argument("--seed-base", type=int, help="the first seed: SEED_BASE..SEED_BASE+N-1 (default 5000)")
    p.add_argument("--eval-every", type=int, help="steps between points of the loss curve (default cpu 25, gpu 50)")
    p.add_argument("--variants", help=f"comma-separated subset of {', '.join(registry.names())}; the reference "
                                      f"{registry.reference().name!r} is added when not named (every verdict compares "
                                      "with it)")
    p.add_argument("--cpu-code-path", choices=CODE_PATHS,
                   help="the CPU kernels every job runs: 'machine' (default) or a pinned instruction set; rerun under "
                        "another to check that the verdicts survive its rounding")
    p.add_argument("--rounding-of", metavar="DIR",
                   help="the rounding check: DIR is a finished sweep of the same configuration under another "
                        "--cpu-code-path; after this run, print both verdict tables and what differs "
                        "(OUT/rounding.json)")
    p.add_argument("--rounding-partial", metavar="REF_DIR",
                   help="train nothing: compare OUT's journal (a sweep under another --cpu-code-path, finished or "
                        "not) with REF_DIR's on the widths both have finished; prints the verdicts side by side "
                        "(all but the Fig. 3a ratio) and how many job losses are bitwise equal")
    p.add_argument("--rounding-scope", choices=("all", "chosen"), default="all",
                   help="with --rounding-of or --rounding-partial: 'all' (default) reruns the whole sweep under the "
                        "other code path; 'chosen' only the jobs at the reference's chosen lrs (every width, variant "
                        "and seed) and the largest width's lr grid (about half the jobs), decided at the reference's "
                        "lr choices (not replayed: a choice that rounding would move is not checked); the same "
                        "journal, so a later run with 'all' completes the whole check")
    p.add_argument("--diagnostic", choices=("v1", "v2"),
                   help="instead of the sweep, a diagnostic at the reference's largest width, each arm with its lr "
                        "grid on every seed and the baseline and the variant rerun at the reference's chosen lrs; "
                        "needs --reference; writes OUT/diagnostic.json, OUT/diag-jobs.jsonl (resumable). 'v1': the "
                        "DIFF V1 loss diagnostic (DIAGNOSTIC.md beside PROTOCOL.md; four one-change arms of DIFF V1; "
                        "also OUT/diagnostic-curves.png; about 70 jobs of 1-2 CPU-minutes at the cpu scale). 'v2': "
                        "the retrieval diagnostic's cross-study check (retrieval/DIAGNOSTIC.md; the DIFF V2 arms named "
                        "by --arms; about 25 jobs per arm)")
    p.add_argument("--arms", metavar="ARM,...",
                   help="with --diagnostic v2: the DIFF V2 arms to run, of v2_headwise_norm, v2_lambda_scalar, "
                        "v2_separate_keys, v2_headwise_norm_after_first (default v2_headwise_norm)")
    p.add_argument("--rounding-check", metavar="CODE_PATH", choices=CODE_PATHS,
                   help="with --diagnostic: OUT holds the finished diagnostic; its reruns and arms at their chosen lrs "
                        "(every seed) run again under this CPU code path into OUT/rounding-CODE_PATH, and every D, C "
                        "and reading is printed under both and written to OUT/rounding.json (lr choices not "
                        "replayed)")
    p.add_argument("--reference", metavar="DIR",
                   help="with --diagnostic: a finished protocol-version-2 sweep (its lm-jobs.jsonl) whose "
                        "configuration, data and lr choices the diagnostic uses, e.g. docs/results/lm-sweep-v2")
    jobs_cli.add_arguments(p)  # --workers, --executor, --ray-address, --cpus-per-job, --gpus-per-job, --device,
    # --time-limit
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args) -> LMSweepConfig:
    cfg = quick_config().replace(scale=args.scale) if args.quick else SCALES[args.scale]()
    ch: dict = {}
    for flag in ("n_layers", "n_heads", "preset", "seq_len", "batch", "steps", "warmup_steps", "lr_widen", "seeds",
                 "seed_base", "eval_every", "cpu_code_path"):
        if getattr(args, flag) is not None:
            ch[flag] = getattr(args, flag)
    if args.widths is not None:
        ch["widths"] = ints(args.widths, "--widths")
    if args.lr_grid is not None:
        ch["lr_grid"] = floats(args.lr_grid, "--lr-grid")
    if args.variants is not None:
        named = tuple(v.strip() for v in args.variants.split(",") if v.strip())
        ref = registry.reference().name
        ch["variants"] = named if ref in named else (ref, *named)
    return cfg.replace(**ch) if ch else cfg


def run_cli(args) -> int:
    try:
        return _run_cli(args)
    except Incomplete as e:  # the finished jobs are journaled: the same command resumes
        return jobs_cli.incomplete(e, "lm-sweep")


def _run_cli(args) -> int:
    options = jobs_cli.options_from_args(args)
    from .sweep import format_sweep, run_lm_sweep
    if args.rounding_check is not None and args.diagnostic is None:
        raise ValueError("--rounding-check goes with --diagnostic (the sweep's rounding check: --cpu-code-path with "
                         "--rounding-of DIR)")
    if args.diagnostic is not None or args.reference is not None or args.arms is not None:
        if args.diagnostic is None or args.reference is None:
            raise ValueError("--diagnostic v1|v2 and --reference DIR go together")
        from . import diagnostic as dg
        if args.rounding_check is not None:
            if args.arms is not None:
                raise ValueError("--rounding-check reruns the arms the diagnostic in OUT ran: drop --arms")
            from ..studies.rounding import format_readings
            check = dg.rounding_check(args.reference, args.out, args.rounding_check, options)
            write_rounding(args.out, check, format_readings(check, check["study"]))
            return 0
        if args.diagnostic == "v1":
            if args.arms is not None:
                raise ValueError("--arms goes with --diagnostic v2 (the V1 diagnostic runs its four arms)")
            print(dg.format_diagnostic(dg.run_diagnostic(args.reference, args.out, options, spec=dg.V1_SPEC)))
            return 0
        spec = dg.v2_spec(tuple(a.strip() for a in (args.arms or "v2_headwise_norm").split(",") if a.strip()))
        print(dg.format_v2_diagnostic(dg.run_diagnostic(args.reference, args.out, options, spec=spec)))
        return 0
    if args.rounding_partial is not None:
        from .rounding import format_partial_rounding, partial_rounding
        print(format_partial_rounding(partial_rounding(args.rounding_partial, args.out, args.rounding_scope)))
        return 0
    cfg = config_from_args(args)
    if args.rounding_scope != "all" and args.rounding_of is None:
        raise ValueError("--rounding-scope needs --rounding-of DIR or --rounding-partial REF_DIR")
    other = choices = None
    if args.rounding_of is not None:
        from ..rundir.studies import read_study
        other = read_study(args.rounding_of, "lm-sweep", "--rounding-of")  # a finished sweep's sweep.json
        mine = {k: v for k, v in cfg.to_dict().items() if k != "cpu_code_path"}
        if {k: v for k, v in other.get("config", {}).items() if k != "cpu_code_path"} != mine:
            raise ValueError(f"--rounding-of {args.rounding_of}: that sweep ran another configuration (only "
                             "--cpu-code-path may differ)")
        if other["config"].get("cpu_code_path") == cfg.cpu_code_path:
            raise ValueError(f"--rounding-of: that sweep ran the same CPU code path ({cfg.cpu_code_path}); pass "
                             "another --cpu-code-path")
        if args.rounding_scope == "chosen":
            from .rounding import reference_choices
            choices = reference_choices(args.rounding_of)
    res = run_lm_sweep(cfg, args.out, options=options, choices=choices)
    if args.quick:
        print("QUICK SMOKE RUN: far too little training to measure anything; run without --quick.")
    print(format_sweep(res))
    print(f"wrote {args.out}/sweep.json and lm-sweep-params.png, lm-sweep-tokens.png, lm-sweep-lr.png")
    if other is not None:
        from .rounding import compare, format_partial_rounding, format_rounding, partial_rounding
        if choices is None:
            check = compare(other, res)
            text = format_rounding(check)
        else:
            check = partial_rounding(args.rounding_of, args.out, "chosen")
            text = format_partial_rounding(check)
        write_rounding(args.out, check, text)
    return 0


def register(sub) -> None:
    p = sub.add_parser("lm-sweep", help=HELP, description=HELP, epilog=EXIT_CODES_HELP, allow_abbrev=False)
    add_arguments(p)
    p.set_defaults(func=run_cli)
