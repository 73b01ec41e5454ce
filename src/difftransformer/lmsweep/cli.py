"""``difftransformer lm-sweep``: the pre-registered language-model sweep (PROTOCOL.md beside this file).

Writes OUT/sweep.json, OUT/lm-sweep-{params,tokens,lr}.png and OUT/lm-jobs.jsonl (the job journal: run the same
command again to resume), and prints the per-width table, the verdict table and the sensitivity rows. A failed job
or ``--time-limit`` ends it with one line and its own exit code (``jobs.outcome``), no sweep.json.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional, cast

from ..fileio import check_out_dir as check_out
from ..jobs import Incomplete
from ..jobs import cli as jobs_cli
from ..jobs.codepath import CODE_PATHS
from ..jobs.outcome import EXIT_CODES_HELP
from ..model import variants as registry
from ..studies.cli import Mode, Modes, add_config_flags, config_changes, write_rounding
from .config import SCALES, LMSweepConfig, quick_config

HELP = ("language-model sweep, pre-registered (PROTOCOL.md, version 2): baseline vs DIFF V1/V2 at 3 (cpu) or 4 (gpu) "
        "widths with 4 baseline heads, an lr grid per variant and width on 5 (cpu) or 6 (gpu) paired seeds; final "
        "loss, Fig. 3a (parameters) and 3b (tokens) ratios where their premise holds (else 'not measurable at this "
        "scale'), activation outliers, lr robustness; plots; resumable (OUT/lm-jobs.jsonl); --scale cpu: 99 minutes "
        "on 2 CPU cores (measured once, 160 jobs)")


REFERENCE_NOTE = " (it takes its configuration from --reference DIR)"
# What the command does, picked by its flags (the first that matches), and the flags each takes ("config": every
# LMSweepConfig field's flag, "jobs": where the jobs run); any other flag given is refused in one line
MODES = (
    Mode("--diagnostic --rounding-check", ("diagnostic", "rounding_check"), ("jobs",), ("reference",),
         " (it reruns the arms the diagnostic in OUT ran)"),
    Mode("--diagnostic v1", ("diagnostic=v1",), ("jobs",), ("reference",), REFERENCE_NOTE),
    Mode("--diagnostic v2", ("diagnostic=v2",), ("arms", "jobs"), ("reference",), REFERENCE_NOTE),
    Mode("--longer", ("longer",), ("jobs",), ("reference",), REFERENCE_NOTE),
    Mode("--mechanism --rounding-check", ("mechanism", "rounding_check"), ("jobs",), ("reference", "diagnostics"),
         " (it reruns the arms in OUT)"),
    Mode("--mechanism", ("mechanism",), ("jobs",), ("reference", "diagnostics"), REFERENCE_NOTE),
    Mode("--rounding-partial", ("rounding_partial",), ("rounding_scope",), (), " (it trains nothing)"),
    Mode("--rounding-of", ("rounding_of",), ("config", "quick", "rounding_scope", "jobs")),
    Mode("the sweep", (), ("config", "quick", "jobs")),
)


def add_arguments(p: argparse.ArgumentParser) -> Modes:
    p.add_argument("--out", required=True, help="output directory: sweep.json, the plots, the job journal, data/")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    m = p.add_argument_group("modes (default: the sweep)")
    m.add_argument("--quick", action="store_true",
                   help="the sweep as a smoke run (minutes): widths 16,32, 40 steps, 2 lrs, 2 seeds; no verdicts")
    m.add_argument("--rounding-of", metavar="DIR",
                   help="the sweep's rounding check: DIR is a finished sweep of the same configuration under another "
                        "--cpu-code-path; after this run, both verdict tables and what differs (OUT/rounding.json)")
    m.add_argument("--rounding-partial", metavar="REF_DIR",
                   help="train nothing: compare OUT's journal (another --cpu-code-path, finished or not) with "
                        "REF_DIR's on the widths both finished (every verdict but Fig. 3a; bitwise-equal losses)")
    m.add_argument("--rounding-scope", choices=("all", "chosen"), default="all",
                   help="with --rounding-of/--rounding-partial: 'all' (default) the whole sweep; 'chosen' only the "
                        "jobs at the reference's chosen lrs and the largest width's grid (about half; lr choices not "
                        "replayed; a later 'all' completes it)")
    m.add_argument("--diagnostic", choices=("v1", "v2"),
                   help="instead of the sweep, a diagnostic at the reference's largest width (OUT/diagnostic.json, "
                        "OUT/diag-jobs.jsonl, resumable): 'v1' DIFF V1's four one-change arms (DIAGNOSTIC.md beside "
                        "PROTOCOL.md; about 70 jobs), 'v2' the DIFF V2 arms of --arms (retrieval/DIAGNOSTIC.md; "
                        "about 25 jobs per arm); needs --reference")
    m.add_argument("--longer", action="store_true",
                   help="instead of the sweep, the answer table's names at 2x the tokens (retrieval/LONGER.md): "
                        "the largest width, 1x lrs (OUT/lm-longer.json); needs --reference")
    m.add_argument("--mechanism", action="store_true",
                   help="the norm's mechanism arms (retrieval/LONGER.md; about 45 jobs); needs --diagnostics")
    m.add_argument("--diagnostics", metavar="DIR", help="with --mechanism: holds v1-diagnostic/, v2-diagnostic/")
    m.add_argument("--reference", metavar="DIR",
                   help="with --diagnostic, --longer or --mechanism: a finished protocol-version-2 sweep (its "
                        "lm-jobs.jsonl) whose configuration, data and lr choices it uses")
    m.add_argument("--arms", metavar="ARM,...",
                   help="with --diagnostic v2: of v2_headwise_norm (default), v2_lambda_scalar, v2_separate_keys, "
                        "v2_headwise_norm_after_first")
    m.add_argument("--rounding-check", metavar="CODE_PATH", choices=CODE_PATHS,
                   help="with --diagnostic: OUT holds the finished diagnostic; its jobs at the chosen lrs run again "
                        "under CODE_PATH into OUT/rounding-CODE_PATH, every D, C and reading under both "
                        "(OUT/rounding.json)")
    config = add_config_flags(p, LMSweepConfig, "configuration (the sweep and --rounding-of; PROTOCOL.md fixes it; "
                                                "defaults: the cpu scale, --quick's or --scale gpu's)")
    before = {a.dest for a in p._actions}
    jobs_cli.add_arguments(cast(argparse.ArgumentParser, p.add_argument_group("where the jobs run")))
    jobs = [a.dest for a in p._actions if a.dest not in before]
    return Modes(p, MODES, {"config": config, "jobs": jobs})


def config_from_args(args) -> LMSweepConfig:
    ch = config_changes(args, LMSweepConfig)
    cfg = quick_config().replace(scale=ch.get("scale", "cpu")) if args.quick else SCALES[ch.get("scale", "cpu")]()
    if "variants" in ch:  # the reference, every ratio's, is added when not named
        ref = registry.reference().name
        ch["variants"] = ch["variants"] if ref in ch["variants"] else (ref, *ch["variants"])
    return cfg.replace(**ch) if ch else cfg


def _check_preset(preset: str) -> None:
    """The preset the jobs read their [data] and [model] from: a missing one refused before OUT is touched."""
    from ..train.config import load_config
    try:
        load_config(preset)  # a missing file or preset, TOML that does not parse or a config it refuses
    except (ValueError, OSError) as e:
        raise ValueError(str(e).replace(f"--config {preset}", f"--preset {preset}", 1)) from None


def run_cli(args) -> int:
    try:
        return _run_cli(args)
    except Incomplete as e:  # the finished jobs are journaled: the same command resumes
        return jobs_cli.incomplete(e, "lm-sweep")


def _run_cli(args) -> int:
    mode = args.modes.select(args)  # a flag this mode does not take, or one it needs missing: one line, no work
    options = jobs_cli.options_from_args(args)
    check_out(args.out)
    from .sweep import format_sweep, run_lm_sweep
    if mode.name.startswith("--diagnostic"):
        from pathlib import Path

        from . import diagnostic as dg
        from . import diagnostic_rounding, diagnostic_text
        from .schema import read_sweep
        dg.reference(Path(args.reference))  # its journal: a protocol-version-2 sweep
        read_sweep(args.reference, "--reference")  # and finished (its sweep.json), before OUT is made
        if args.rounding_check is not None:
            from ..studies.rounding import format_readings
            check = diagnostic_rounding.rounding_check(args.reference, args.out, args.rounding_check, options)
            write_rounding(args.out, check, format_readings(check, check["study"]))
        elif args.diagnostic == "v1":
            res = dg.run_diagnostic(args.reference, args.out, options, spec=dg.V1_SPEC)
            print(diagnostic_text.format_diagnostic(res))
        else:
            spec = dg.v2_spec(tuple(a.strip() for a in (args.arms or "v2_headwise_norm").split(",") if a.strip()))
            print(diagnostic_text.format_v2_diagnostic(dg.run_diagnostic(args.reference, args.out, options, spec=spec)))
        return 0
    if mode.name == "--mechanism --rounding-check":
        from ..studies.rounding import format_readings
        from . import mechanism_rounding
        mechanism_rounding.second_runs(args.reference, args.diagnostics, args.rounding_check)
        check = mechanism_rounding.rounding_check(args.reference, args.diagnostics, args.out, args.rounding_check,
                                                  options)
        write_rounding(args.out, check, format_readings(check, "language-model mechanism arms"))
        return 0
    if mode.name == "--mechanism":
        from pathlib import Path

        from . import diagnostic as dg
        from . import mechanism
        from .schema import read_sweep
        cfg, _, _ = dg.reference(Path(args.reference))
        read_sweep(args.reference, "--reference")  # finished, before OUT is made
        mechanism.comparison_runs(args.diagnostics, cfg, cfg.largest)
        print(mechanism.format_mechanism(mechanism.run_mechanism(args.reference, args.diagnostics, args.out,
                                                                 options)))
        print(f"wrote {args.out}/{mechanism.RESULTS}")
        return 0
    if mode.name == "--longer":
        from pathlib import Path

        from . import diagnostic as dg
        from . import longer
        from .schema import read_sweep
        dg.reference(Path(args.reference))
        read_sweep(args.reference, "--reference")  # finished, before OUT is made
        print(longer.format_longer(longer.run_longer(args.reference, args.out, options)))
        print(f"wrote {args.out}/{longer.RESULTS}")
        return 0
    if args.rounding_partial is not None:
        from .rounding import format_partial_rounding, partial_rounding
        print(format_partial_rounding(partial_rounding(args.rounding_partial, args.out, args.rounding_scope)))
        return 0
    cfg = config_from_args(args)
    _check_preset(cfg.preset)
    other: Optional[dict[str, Any]] = None
    choices = None
    if args.rounding_of is not None:
        from .schema import read_sweep
        other = dict(read_sweep(args.rounding_of, "--rounding-of"))  # a finished sweep's sweep.json
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


USAGE = """%(prog)s --out DIR [--quick] [configuration] [where the jobs run]
       %(prog)s --out DIR --rounding-of DIR --cpu-code-path PATH [--rounding-scope all|chosen] [...]
       %(prog)s --out DIR --rounding-partial REF_DIR [--rounding-scope all|chosen]
       %(prog)s --out DIR --diagnostic v1|v2 --reference DIR [--arms ARM,...] [where the jobs run]
       %(prog)s --out DIR --diagnostic v1|v2 --reference DIR --rounding-check CODE_PATH [where the jobs run]
       %(prog)s --out DIR --longer --reference DIR [where the jobs run]
       %(prog)s --out DIR --mechanism --reference DIR --diagnostics DIR [where the jobs run]"""


def register(sub) -> None:
    p = sub.add_parser("lm-sweep", help=HELP, description=HELP, epilog=EXIT_CODES_HELP, allow_abbrev=False,
                       usage=USAGE)
    p.set_defaults(func=run_cli, modes=add_arguments(p))
