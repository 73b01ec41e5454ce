"""``difftransformer retrieval``: the token-level key-value retrieval benchmark (paper Fig. 1, Table 2/3, Fig. 5/8).

Writes DIR/results.json and DIR/*.png and prints, per variant: parameters, chosen lr, accuracy at each condition
(mean +- seed sd, with the number of seeds) and the layer-mean attention shares at the primary endpoint. A failed job
or ``--time-limit`` ends it with one line and its own exit code (``jobs.outcome``), no results.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, cast

from ..fileio import check_out_dir as check_out
from ..jobs import Incomplete
from ..jobs import cli as jobs_cli
from ..jobs.codepath import CODE_PATHS
from ..jobs.outcome import EXIT_CODES_HELP
from ..studies.cli import Mode, Modes, add_config_flags, check_pin, config_changes, ints, write_rounding
from .config import RetrievalConfig, quick_config

HELP = ("token-level key-value retrieval benchmark, pre-registered (PROTOCOL.md, version 3): baseline vs DIFF V1/V2, "
        "the lr grid on 12 paired test seeds, tuned and matched learning rates, lr robustness, attention share, "
        "quantisation, plots; resumable (OUT/jobs.jsonl); --rounding-check: the verdicts under another CPU code "
        "path; --sweep-width: accuracy vs parameters")


REFERENCE_NOTE = " (it takes its configuration from --reference DIR)"
# What the command does, picked by its flags (the first that matches), and the flags each takes ("config": every
# RetrievalConfig field's flag, "jobs": where the jobs run); any other flag given is refused in one line
MODES = (
    Mode("--protocol 4 --rounding-check", ("protocol", "rounding_check"), ("jobs",), (),
         " (it reruns the finished protocol in OUT)"),
    Mode("--protocol 4", ("protocol",), ("quick", "jobs")),
    Mode("--mechanism --longer", ("mechanism", "longer"), ("jobs",), ("reference", "longer_reference"),
         REFERENCE_NOTE),
    Mode("--longer --rounding-check", ("longer", "rounding_check"), ("jobs",), ("reference",),
         " (it reruns the re-reading in OUT)"),
    Mode("--longer", ("longer",), ("jobs",), ("reference",), REFERENCE_NOTE),
    Mode("--mechanism --rounding-check", ("mechanism", "rounding_check"), ("jobs",), ("reference",),
         " (it reruns the arms in OUT)"),
    Mode("--mechanism", ("mechanism",), ("jobs",), ("reference",), REFERENCE_NOTE),
    Mode("--diagnostic", ("diagnostic",), ("rounding_check", "jobs"), ("reference",),
         " (it takes its configuration from --reference DIR)"),
    Mode("--sweep-width", ("sweep_width",), ("config", "quick", "reuse_jobs", "jobs")),
    Mode("the benchmark", (), ("config", "quick", "rounding_check", "jobs")),
)


def add_arguments(p: argparse.ArgumentParser) -> Modes:
    p.add_argument("--out", required=True, help="output directory for results.json and the plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    m = p.add_argument_group("modes (default: the benchmark)")
    m.add_argument("--quick", action="store_true",
                   help="a smoke run (about two minutes): 150 steps, a 2-value lr grid, 2 test seeds, 16 contexts per "
                        "condition; its numbers are not a measurement and the report gives no verdicts")
    m.add_argument("--rounding-check", metavar="CODE_PATH", choices=CODE_PATHS,
                   help="after the benchmark, every job again under this CPU code path into OUT/rounding-CODE_PATH, "
                        "both verdict tables and the verdicts that differ (OUT/rounding.json); with --diagnostic: OUT "
                        "holds the finished diagnostic, its jobs at the chosen lrs (96) run again and every D, C and "
                        "reading is printed under both (lr choices not replayed)")
    m.add_argument("--sweep-width", metavar="W1,W2,...",
                   help="instead of the benchmark, the scaling sweep (paper Fig. 3) at these widths: every variant x "
                        "test seed x lr, each variant's lr per width chosen on validation; accuracy against "
                        "parameters and the bootstrapped parameter ratio DIFF/baseline (OUT/sweep-jobs.jsonl)")
    m.add_argument("--reuse-jobs", metavar="JOURNAL",
                   help="with --sweep-width: copy the finished jobs of another run's journal (e.g. the benchmark's "
                        "OUT/jobs.jsonl: the sweep's jobs at the default width) whose key is the same")
    m.add_argument("--diagnostic", action="store_true",
                   help="instead of the benchmark, the retrieval diagnostic (DIAGNOSTIC.md beside PROTOCOL.md): "
                        "one-change arms of DIFF V1 and V2, each with the lr grid on the test seeds, read against the "
                        "baseline and its own variant (OUT/diagnostic.json, OUT/diagnostic-lr.png, "
                        "OUT/diag-jobs.jsonl; about 150 jobs of 20-30 CPU-seconds); needs --reference")
    m.add_argument("--longer", metavar="STEPS[,STEPS]",
                   help="the re-reading at longer training (LONGER.md): the answer table's names at their "
                        "600-step lrs, 1200 and/or 2400 steps")
    m.add_argument("--mechanism", action="store_true",
                   help="the norm's mechanism arms (LONGER.md); --longer 2400: at 2,400 steps; --rounding-check: "
                        "OUT's arms again")
    m.add_argument("--protocol", type=int, choices=(4,), metavar="4",
                   help="retrieval protocol version 4 (PROTOCOL4.md): speed at 600 steps, capability at a length "
                        "chosen on validation seeds; 8 names, about 750 jobs (10-30 CPU-hours), resumable "
                        "(OUT/v4-jobs.jsonl, OUT/protocol4.json); --quick: its smoke form; --rounding-check: its test "
                        "jobs again")
    m.add_argument("--longer-reference", metavar="DIR",
                   help="with --mechanism --longer 2400: the finished re-reading (retrieval --longer's OUT)")
    m.add_argument("--reference", metavar="DIR",
                   help="--diagnostic: a finished benchmark run ON THIS MACHINE, whose configuration, lrs and runs "
                        "it reads; --longer, --mechanism: a finished diagnostic")
    config = add_config_flags(p, RetrievalConfig, "configuration (the benchmark and --sweep-width; PROTOCOL.md fixes "
                                                  "it; defaults: the protocol's, --quick's smaller)")
    before = {a.dest for a in p._actions}
    jobs_cli.add_arguments(cast(argparse.ArgumentParser, p.add_argument_group("where the jobs run")))
    jobs = [a.dest for a in p._actions if a.dest not in before]
    return Modes(p, MODES, {"config": config, "jobs": jobs})


def config_from_args(args) -> RetrievalConfig:
    ch = config_changes(args, RetrievalConfig)
    cfg = quick_config() if args.quick else RetrievalConfig()
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
    mode = args.modes.select(args)  # a flag this mode does not take, or one it needs missing: one line, no work
    options = jobs_cli.options_from_args(args)
    cfg = config_from_args(args)
    check_out(args.out)
    if args.rounding_check is not None and mode.name == "the benchmark":  # its second stage, checked before the first
        if args.rounding_check == cfg.cpu_code_path:
            raise ValueError(f"--rounding-check {args.rounding_check}: the benchmark runs that CPU code path itself "
                             "(--cpu-code-path); name another")
        check_pin(args.rounding_check, options, "--rounding-check")
    if mode.name == "--protocol 4 --rounding-check":
        from . import protocol4_rounding as p4r
        check_pin(args.rounding_check, options, "--rounding-check")
        check = p4r.rounding_check(args.out, args.rounding_check, options)
        print(p4r.format_rounding(check))
        print(f"wrote {Path(args.out) / p4r.ROUNDING.format(code_path=args.rounding_check) / p4r.STUDY.results}")
        return 0
    if mode.name == "--protocol 4":
        from . import protocol4, protocol4_text
        plan = protocol4.quick_plan() if args.quick else protocol4.Plan()
        res = protocol4.run_protocol4(args.out, plan, options)
        print(protocol4_text.format_protocol4(res))
        print(f"wrote {args.out}/{protocol4.RESULTS}")
        return 0
    if mode.name == "--mechanism --longer":
        from . import longer, mechanism
        if ints(args.longer, "--longer") != (mechanism.LONGEST,):
            raise ValueError(f"--mechanism --longer: the arms are read at {mechanism.LONGEST} steps (LONGER.md's "
                             f"addition of 17:10: the longest length read), got --longer {args.longer}")
        longer.first_reading(args.reference)  # before any job: every reference is read first
        mechanism._longer_row(args.reference, args.longer_reference, mechanism.LONGEST)
        mechanism.chosen_lrs(args.reference, args.out)
        print(mechanism.format_mechanism(mechanism.run_mechanism_longer(args.reference, args.longer_reference,
                                                                        args.out, options)))
        print(f"wrote {args.out}/{mechanism.LONGER_RESULTS}")
        return 0
    if mode.name == "--longer --rounding-check":
        from ..fileio import atomic_json
        from . import longer, longer_rounding
        if longer.check_steps(ints(args.longer, "--longer")) != longer.STEPS:
            raise ValueError("--longer --rounding-check: the check reruns every length: --longer "
                             + ",".join(map(str, longer.STEPS)))
        check_pin(args.rounding_check, options, "--rounding-check")
        longer.first_reading(args.reference)
        check = longer_rounding.rounding_check(args.reference, args.out, args.rounding_check, options)
        lr_ = longer_rounding
        where = Path(args.out) / lr_.ROUNDING.format(code_path=args.rounding_check) / lr_.ROUNDING_RESULTS
        atomic_json(where, check)
        print(longer_rounding.format_rounding(check))
        print(f"wrote {where}")
        return 0
    if mode.name == "--longer":
        from . import longer
        steps = longer.check_steps(ints(args.longer, "--longer"))
        longer.first_reading(args.reference)  # before OUT is made
        print(longer.format_longer(longer.run_longer(args.reference, args.out, steps, options)))
        print(f"wrote {args.out}/{longer.RESULTS}")
        return 0
    if mode.name == "--mechanism --rounding-check":
        from ..studies.rounding import format_readings
        from . import longer, mechanism_rounding
        check_pin(args.rounding_check, options, "--rounding-check")
        longer.first_reading(args.reference)
        mechanism_rounding.diagnostic_second_runs(args.reference, args.rounding_check)
        check = mechanism_rounding.rounding_check(args.reference, args.out, args.rounding_check, options)
        write_rounding(args.out, check, format_readings(check, "retrieval mechanism arms"))
        return 0
    if mode.name == "--mechanism":
        from . import longer, mechanism
        longer.first_reading(args.reference)  # before OUT is made
        print(mechanism.format_mechanism(mechanism.run_mechanism(args.reference, args.out, options)))
        print(f"wrote {args.out}/{mechanism.RESULTS}")
        return 0
    if mode.name == "--diagnostic":
        from . import diagnostic as dg
        from .schema import read_results
        dg.reference(Path(args.reference))  # its journal: a protocol-version-3 benchmark, not a smoke run
        read_results(args.reference, "--reference")  # and finished (its results.json), before OUT is made
        if args.rounding_check is not None:
            from ..studies.rounding import format_readings
            from . import diagnostic_rounding
            check = diagnostic_rounding.rounding_check(args.reference, args.out, args.rounding_check, options)
            write_rounding(args.out, check, format_readings(check, "retrieval diagnostic"))
            return 0
        print(dg.format_diagnostic(dg.run_diagnostic(args.reference, args.out, options)))
        print(f"wrote {args.out}/diagnostic.json and diagnostic-lr.png")
        return 0
    if args.reuse_jobs is not None and not Path(args.reuse_jobs).is_file():
        raise ValueError(f"--reuse-jobs {args.reuse_jobs}: not a journal file")
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
        bench_check = rounding_check(results, cfg.replace(cpu_code_path=args.rounding_check), args.out,
                                     quick=args.quick, options=options)
        write_rounding(args.out, bench_check, format_rounding(bench_check))
    return 0


USAGE = """%(prog)s --out DIR [--quick] [--rounding-check CODE_PATH] [configuration] [where the jobs run]
       %(prog)s --out DIR --protocol 4 [--quick] [where the jobs run]
       %(prog)s --out DIR --sweep-width W1,W2,... [--reuse-jobs JOURNAL] [--quick] [configuration] [...]
       %(prog)s --out DIR --diagnostic --reference DIR [--rounding-check CODE_PATH] [where the jobs run]
       %(prog)s --out DIR --longer 1200,2400 | --mechanism --reference DIAGNOSTIC_DIR [where the jobs run]
       %(prog)s --out MECHANISM_DIR --mechanism --longer 2400 --reference DIAGNOSTIC_DIR --longer-reference DIR [...]"""


def register(sub) -> None:
    p = sub.add_parser("retrieval", help=HELP, description=HELP, epilog=EXIT_CODES_HELP, allow_abbrev=False,
                       usage=USAGE)
    p.set_defaults(func=run_cli, modes=add_arguments(p))
