"""`difftransformer eval <analysis> --run RUN_DIR` (one JSON result per analysis); `report` is ``report/cli.py``.

The analyses are the specs of ``analyses.ANALYSES``; their flags are declared here (the analysis modules take typed
settings, not argparse namespaces), with the options every analysis shares (``--run``, ``--out``, ``--seed``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..loading import DEVICE_WORDS, device_arg
from .analyses import ANALYSES
from .attnmap import AttnmapSettings
from .icl import BOOKS, IclSettings
from .loading import load_for_eval, write_json
from .needles import NeedlesSettings, TaskChoice
from .noise import NoiseSettings
from .outliers import OutliersSettings
from .positions import PositionsSettings
from .quantized import QuantizedSettings, quantize_logits
from .spec import AnalysisSpec, check_positive


# ---------------------------------------------------------------------------------------------- shared flags
def floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} expects comma-separated numbers, got {text!r}") from None
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"{flag} expects finite numbers, got {text!r}")
    return values


def add_task_args(p: argparse.ArgumentParser) -> None:
    """The needle-haystack shape, shared by needles, noise, quantized and attnmap."""
    p.add_argument("--needles", type=int,
                   help="needles per haystack (default: the run's data.retrieval_n_needles, else 4)")
    p.add_argument("--queries", type=int,
                   help="questions per haystack, the last one scored (default: the run's, else 2)")
    p.add_argument("--digits", type=int, help="digits of each pass number (default: the run's, else 2)")


def task_from_args(args: argparse.Namespace) -> TaskChoice:
    return TaskChoice(n_needles=args.needles, n_queries=args.queries, digits=args.digits)


def add_device_arg(p: argparse.ArgumentParser) -> None:
    """``--device`` of the commands that run a model here (eval, report; lm-eval has its own line): checked by
    ``loading.device_arg`` as ``train.device`` is, before any model is read."""
    p.add_argument("--device", default="cpu",
                   help=f"where the model runs: {DEVICE_WORDS} (default cpu; auto: cuda when a GPU is seen); a "
                        "device this machine does not have is refused before any model is read")


# ---------------------------------------------------------------------------------------------- per analysis
def _needles_flags(p, q: NeedlesSettings) -> None:
    p.add_argument("--lengths", default=",".join(map(str, q.lengths)),
                   help="context lengths as fractions of the training length, comma-separated")
    p.add_argument("--depths", default=",".join(map(str, q.depths)),
                   help="target needle depths in [0, 1] (0 = start of the context), comma-separated")
    p.add_argument("--samples", type=int, default=q.samples, help="haystacks per grid cell")
    add_task_args(p)


def _needles_settings(args) -> NeedlesSettings:
    lengths, depths = floats(args.lengths, "--lengths"), floats(args.depths, "--depths")
    if not lengths or any(f <= 0 for f in lengths):
        raise ValueError(f"--lengths must be positive fractions of the training length, got {args.lengths!r}")
    if not depths or any(not 0 <= d <= 1 for d in depths):
        raise ValueError(f"--depths must be numbers in [0, 1], got {args.depths!r}")
    check_positive(samples=args.samples)
    return NeedlesSettings(tuple(lengths), tuple(depths), args.samples, task_from_args(args))


def _noise_flags(p, q: NoiseSettings) -> None:
    p.add_argument("--samples", type=int, default=q.samples, help="needle haystacks to average over")
    p.add_argument("--length", type=int, help="haystack length in tokens (default: the training length)")
    add_task_args(p)


def _noise_settings(args) -> NoiseSettings:
    check_positive(samples=args.samples)
    return NoiseSettings(args.samples, args.length, task_from_args(args))


def _outliers_flags(p, q: OutliersSettings) -> None:
    p.add_argument("--sequences", type=int, default=q.sequences, help="held-out windows of the training length")


def _outliers_settings(args) -> OutliersSettings:
    check_positive(sequences=args.sequences)
    return OutliersSettings(args.sequences)


def _quantized_flags(p, q: QuantizedSettings) -> None:
    p.add_argument("--bits", default=",".join(map(str, q.widths)), help="comma-separated widths in bits")
    p.add_argument("--sequences", type=int, default=q.sequences, help="held-out windows for the loss")
    p.add_argument("--samples", type=int, default=q.samples, help="needle haystacks for the accuracy")
    add_task_args(p)


def _quantized_settings(args) -> QuantizedSettings:
    try:
        widths = [int(b) for b in args.bits.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--bits must be comma-separated integers, got {args.bits!r}") from None
    for b in widths:
        quantize_logits(b)  # validates
    if args.sequences < 1 or args.samples < 1:
        raise ValueError("--sequences and --samples must be >= 1")
    return QuantizedSettings(args.sequences, args.samples, tuple(widths), task_from_args(args))


def _positions_flags(p, q: PositionsSettings) -> None:
    p.add_argument("--factor", type=float, default=q.factor,
                   help="evaluate up to this multiple of the training length (clipped to max_seq_len, with a note)")
    p.add_argument("--length", type=int, help="positions to evaluate, in tokens (overrides --factor; at most "
                                              "max_seq_len)")
    p.add_argument("--sequences", type=int, default=q.sequences,
                   help="long untrained held-out texts to read, >= 2 (fewer when fewer are long enough; fewer than "
                        "2 found: nothing measured, with a note)")


def _positions_settings(args) -> PositionsSettings:
    if args.sequences < 2:
        raise ValueError(f"--sequences must be >= 2 (the interval is over documents), got {args.sequences}")
    if not args.factor > 0 or not math.isfinite(args.factor):
        raise ValueError(f"--factor must be a positive number, got {args.factor}")
    if args.length is not None and args.length < 2:
        raise ValueError(f"--length must be >= 2, got {args.length}")
    return PositionsSettings(args.factor, args.sequences, args.length)


def _icl_flags(p, q: IclSettings) -> None:
    p.add_argument("--classes", type=int, default=q.classes, help=f"books to tell apart, 2..{len(BOOKS)}")
    p.add_argument("--samples", type=int, default=q.samples, help="queries per shot count (balanced)")
    p.add_argument("--orders", type=int, default=q.orders, help="random orderings of the demonstrations")
    p.add_argument("--words", type=int, default=q.words, help="words of each verse snippet")
    p.add_argument("--context", type=int, help="prompt budget in tokens (default: the training length)")


def _icl_settings(args) -> IclSettings:
    if not 2 <= args.classes <= len(BOOKS):
        raise ValueError(f"--classes must be in [2, {len(BOOKS)}], got {args.classes}")
    check_positive(samples=args.samples, orders=args.orders, words=args.words)
    if args.context is not None and args.context < 2:
        raise ValueError(f"--context must be >= 2, got {args.context}")
    return IclSettings(args.classes, args.samples, args.orders, args.words, args.context)


def _attnmap_flags(p, q: AttnmapSettings) -> None:
    p.add_argument("--layer", type=int, help="one layer (negative: from the last); default: the mean over layers")
    p.add_argument("--length", type=int, help="haystack length in tokens (default: the shortest training length)")
    p.add_argument("--depth", type=float, default=q.depth,
                   help="target needle depth in [0, 1] (0 = start of the context)")
    add_task_args(p)


def _attnmap_settings(args) -> AttnmapSettings:
    if args.out and Path(args.out).suffix.lower() != ".png":
        raise ValueError(f"--out {args.out}: attnmap writes a figure; name a .png file (the JSON goes beside it)")
    return AttnmapSettings(args.layer, args.length, args.depth, task_from_args(args))


@dataclass(frozen=True)
class Flags:
    """One analysis's command line: its flags (defaults from the spec's quick settings), the settings they give
    (validated before any model is loaded), and whether a progress bar is shown."""

    add: Callable[[argparse.ArgumentParser, Any], None]
    settings: Callable[[argparse.Namespace], Any]
    progress: bool = True


# Keyed by spec name; test_eval_cli checks that this and analyses.ANALYSES name the same analyses.
FLAGS: dict[str, Flags] = {
    "needles": Flags(_needles_flags, _needles_settings),
    "noise": Flags(_noise_flags, _noise_settings),
    "outliers": Flags(_outliers_flags, _outliers_settings),
    "quantized": Flags(_quantized_flags, _quantized_settings),
    "positions": Flags(_positions_flags, _positions_settings, progress=False),
    "icl": Flags(_icl_flags, _icl_settings, progress=False),
    "attnmap": Flags(_attnmap_flags, _attnmap_settings),
}


def run_analysis(spec: AnalysisSpec, args: argparse.Namespace) -> int:
    flags = FLAGS[spec.name]
    settings = flags.settings(args)
    device = device_arg(args.device)  # before any model is read
    if spec.multi_run:
        r = spec.run([load_for_eval(d, device) for d in args.run], settings, args.seed, progress=flags.progress)
    else:
        r = spec.run(load_for_eval(args.run, device), settings, args.seed, progress=flags.progress)
    print(spec.format(r))
    if args.out and spec.multi_run:  # a figure, the JSON beside it
        png = Path(args.out)
        png.parent.mkdir(parents=True, exist_ok=True)
        if spec.plot is not None:  # every multi-run analysis has one (attnmap)
            spec.plot(r, png)
        write_json(r, png.with_suffix(".json"))
    elif args.out:
        write_json(r, args.out)
    return 0


def _add_analysis(esub, spec: AnalysisSpec) -> None:
    p = esub.add_parser(spec.name, allow_abbrev=False, help=spec.help, description=spec.doc,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    if spec.multi_run:
        p.add_argument("--run", action="append", required=True, metavar="RUN_DIR",
                       help="a run or model directory; repeat for several models (e.g. baseline, V1, V2)")
    else:
        p.add_argument("--run", required=True, metavar="RUN_DIR",
                       help="a run directory (its newest complete checkpoint) or a model directory")
    p.add_argument("--out", metavar="FILE", help="write the result here (JSON; attnmap: PNG) instead of only printing")
    p.add_argument("--seed", type=int, default=0, help="seed of the evaluation samples (not of the model)")
    add_device_arg(p)
    FLAGS[spec.name].add(p, spec.quick)
    p.set_defaults(func=lambda args: run_analysis(spec, args))


def register(sub) -> None:
    """`difftransformer eval ANALYSIS ...`."""
    p = sub.add_parser("eval", allow_abbrev=False,
                       help="re-measure one of the paper's claims on a trained run (JSON results)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    esub = p.add_subparsers(dest="analysis", metavar="ANALYSIS")
    esub.required = True
    for spec in ANALYSES:
        _add_analysis(esub, spec)
