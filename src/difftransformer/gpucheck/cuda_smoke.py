"""gpu-check's ``cuda-smoke`` step (``python -m difftransformer.gpucheck.cuda_smoke``): every command that takes a
device, at toy size, on ``--device`` (cuda on the GPU machine), one after the other in this one process (one
interpreter start and one CUDA context for all), each named ``ok``, ``failed`` or ``skipped``.

Issue 48: the first GPU job of the language-model sweep died on a CPU tensor concatenated with the model's values,
a path no CPU run takes. This step runs each command once on the device, at a size where it takes seconds, before
the measurements: training (baseline, DIFF V1, DIFF V2: 2 steps of a toy preset on a small generated corpus written
beside them, so that no corpus package is needed), ``generate`` (eager, and on CUDA ``--decode cuda-graph``), the
seven analyses of ``eval`` on the V1 run (``attnmap`` over the baseline's and V1's), the retrieval benchmark and its
``--sweep-width``, ``lm-sweep``, ``demo`` (the toy preset), ``bench ops``, and last ``report`` on the V2 run (the
longest: every analysis again, the page and its plots). Each gets ``--device`` (``--train.device`` for train)
where its parser has the flag; one without it runs where the command itself puts it (printed as ``(no --device
flag)``).

One ``# cuda-smoke: STATUS NAME (S s, cpu C s): reason`` line per command as it ends, with its data line ``# cuda-smoke
row: {json}`` under it (``gpucheck/gpu_readers.py`` reads those, and the ``setup`` and ``end`` lines around them; a step
stopped by its time limit keeps the lines it printed): ``failed`` with the command's error line or the
exception, the last lines of its output under it; ``skipped`` where an optional package is missing on this machine
(the command's own ``pip install 'difftransformer[...]'`` refusal: not a device check). The exit status is 1 where
one failed. ``--only NAME ...`` runs a subset (with the trainings they read). On 2 loaded CPU cores here the 17
commands took 32-51 s of CPU (``--device cpu``; ``report`` 10-16 s of it): CPU-bound at this size.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Optional

LINE = "# cuda-smoke: "
MISSING_EXTRA = "pip install 'difftransformer["
VARIANTS = {"base": "baseline", "v1": "diff_v1", "v2": "diff_v2"}
ANALYSES = {  # eval ANALYSIS: its toy flags (one or two samples of each grid, sequences of the training length)
    "needles": ("--lengths", "1", "--depths", "0.5", "--samples", "1", "--needles", "2", "--queries", "1"),
    "noise": ("--samples", "1", "--needles", "2", "--queries", "1"),
    "outliers": ("--sequences", "1"),
    "quantized": ("--bits", "8", "--sequences", "1", "--samples", "1", "--needles", "2", "--queries", "1"),
    "positions": ("--sequences", "2", "--factor", "1.5"),
    "icl": ("--classes", "2", "--samples", "2", "--orders", "1", "--words", "6"),
    "attnmap": ("--needles", "2", "--queries", "1"),
}
WORDS = ["the", "light", "water", "stone", "river", "king", "house", "field", "bread", "word", "night", "morning",
         "city", "tree", "fire", "voice", "land", "people", "went", "came", "saw", "gave", "took", "spoke", "heard",
         "found", "made", "kept", "under", "over", "into", "upon", "before", "after", "because", "and", "but", "then",
         "again", "seven", "three", "many", "every", "great", "small", "old", "new"]


def corpus_text(paragraphs: int = 400, seed: int = 0) -> str:
    """A small generated corpus (about 80k characters): paragraphs of sentences drawn from ``WORDS``."""
    rng = random.Random(seed)
    paras = []
    for _ in range(paragraphs):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "."
                     for _ in range(rng.randint(2, 4))]
        paras.append(" ".join(sentences))
    return "\n\n".join(paras) + "\n"


def preset(corpus: Path) -> str:
    """The toy preset every command trains from (a TOML file the step writes): the ``tiny`` preset's model (32 wide,
    2 layers) on the generated corpus, 128-token windows in a 256-position model (room for a needle and its
    question), 2 steps."""
    return f"""\
[model]
attention = "diff_v1"
backend = "sdpa"
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
max_seq_len = 256

[data]
sources = [{str(corpus)!r}]
vocab_size = 512
seq_len = 128
max_chars = 80000
val_fraction = 0.05

[train]
steps = 2
batch_size = 4
micro_batch_size = 4
warmup_steps = 1
eval_every = 2
eval_batches = 1
precision = "float32"

[checkpoint]
every = 2

[log]
tensorboard = false
progress = false
"""


def commands(out: Path, device: str) -> list[tuple[str, list[str]]]:
    """(name, argv) of every command, in the order they run (later ones read what the trainings wrote)."""
    toml = str(out / "smoke.toml")
    train = ["train", "--config", toml, "--data.prepared_dir", str(out / "prepared"), "--train.device", device,
             "--no-progress"]
    runs = {k: str(out / k) for k in VARIANTS}
    quick = ("--quick", "--steps", "5", "--seeds", "2", "--eval-contexts", "8", "--lr-grid", "2e-3", "--workers", "1",
             "--no-progress")
    cmds = [(f"train-{k}", [*train, "--model.attention", v, "--out", runs[k]]) for k, v in VARIANTS.items()]
    cmds.append(("generate", ["generate", "--run", runs["v2"], "--prompt", "The king", "--max-new-tokens", "8"]))
    if device == "cuda":
        cmds.append(("generate-cuda-graph", ["generate", "--run", runs["v1"], "--prompt", "The king",
                                             "--max-new-tokens", "8", "--decode", "cuda-graph"]))
    for name, flags in ANALYSES.items():
        where = ["--run", runs["base"], "--run", runs["v1"]] if name == "attnmap" else ["--run", runs["v1"]]
        cmds.append((f"eval-{name}", ["eval", name, *where, *flags,
                                      "--out", str(out / f"{name}.{'png' if name == 'attnmap' else 'json'}")]))
    cmds += [
        ("retrieval", ["retrieval", "--out", str(out / "kv"), *quick]),
        ("retrieval-sweep", ["retrieval", "--out", str(out / "sweep"), "--sweep-width", "16,32",
                             "--variants", "baseline,diff_v2", *quick]),
        ("lm-sweep", ["lm-sweep", "--out", str(out / "lm"), "--preset", toml, "--widths", "16,32", "--steps", "2",
                      "--warmup-steps", "1", "--eval-every", "2", "--seq-len", "32", "--batch", "4", "--seeds", "2",
                      "--lr-grid", "2e-3", "--workers", "1", "--no-progress"]),
        ("demo", ["demo", "--out", str(out / "demo"), "--config", toml, "--steps", "2", "--no-retrieval",
                  "--no-report", "--no-progress"]),
        ("bench-ops", ["bench", "ops", "--shape", "tiny", "--seq-len", "32", "--batch", "2", "--steps", "1",
                       "--warmup", "0", "--backends", "sdpa"]),
        # last: the longest (every analysis again, the page, its plots), and skipped where the corpus is missing
        ("report", ["report", runs["v2"], "--out", str(out / "report"), "--no-progress"]),  # one run: half the time
    ]
    return cmds


def selected(cmds: list[tuple[str, list[str]]], only: Optional[list[str]]) -> set[str]:
    """The names to run for ``--only``: those, and the trainings whose run directory their arguments name."""
    wanted = set(only or (n for n, _ in cmds))
    runs = {argv[argv.index("--out") + 1]: n for n, argv in cmds if n.startswith("train-")}
    return wanted | {n for run, n in runs.items() for m, argv in cmds if m in wanted and run in argv}


def _parser_of(argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser that parses the options of ``argv`` (``eval needles ...``: eval's needles parser)."""
    from ..cli import build_parser

    parser = build_parser()
    for token in argv:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or token not in sub.choices:
            break
        parser = sub.choices[token]
    return parser


def with_device(argv: list[str], device: str) -> tuple[list[str], bool]:
    """``argv`` with ``--device DEVICE`` appended where its parser has the flag (train: ``--train.device``, given
    by ``commands``); False where the command has no such flag."""
    if argv[0] == "train":
        return argv, True
    if "--device" in _parser_of(argv)._option_string_actions:
        return [*argv, "--device", device], True
    return argv, False


def run_one(name: str, argv: list[str]) -> dict[str, Any]:
    """Run ``difftransformer ARGV`` in this process, its output captured: {name, status, seconds, reason, tail}."""
    from ..cli import main

    buf = io.StringIO()
    t0, c0 = time.monotonic(), time.process_time()
    reason, tail = "", ""
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = main(argv)
    except SystemExit as e:  # argparse refusing a flag exits from inside the parser
        rc = e.code if isinstance(e.code, int) else 2
    except Exception as e:  # a bug the CLI does not turn into one line: the device bug this step looks for
        rc, reason, tail = 1, f"{type(e).__name__}: {e}".splitlines()[0][:300], traceback.format_exc(limit=8)
    text = buf.getvalue()
    if rc and not reason:
        errors = [ln for ln in text.splitlines() if ": error: " in ln]
        reason = (errors[-1] if errors else f"exit status {rc}")[:300]
    status = "ok" if rc == 0 else "skipped" if MISSING_EXTRA in reason else "failed"
    if status == "failed":
        tail = "\n".join(text.splitlines()[-15:]) + ("\n" + tail if tail else "")
    return {"name": name, "status": status, "seconds": time.monotonic() - t0, "cpu_s": time.process_time() - c0,
            "reason": reason, "tail": tail}


def format_line(r: dict[str, Any], device_flag: bool = True) -> str:
    """``# cuda-smoke: STATUS NAME (S s, cpu C s)[ (no --device flag)][: reason]``, its data line (``# cuda-smoke
    row: {json}``, what gpu-check reads), then the failure's output tail (each line behind ``#   ``)."""
    line = (f"{LINE}{r['status']} {r['name']} ({r['seconds']:.1f} s, cpu {r['cpu_s']:.1f} s)"
            + ("" if device_flag else " (no --device flag)") + (f": {r['reason']}" if r["reason"] else ""))
    row = {"name": r["name"], "status": r["status"], "seconds": float(f"{r['seconds']:.1f}"),
           "device_flag": device_flag, "reason": r["reason"]}
    return "\n".join([line, data_line("row", row), *("#   " + ln for ln in r["tail"].splitlines())])


def data_line(kind: str, record: dict[str, Any]) -> str:
    """``# cuda-smoke setup|row|end: {json}`` (this module imports no torch, so not ``bench.common.data_line``)."""
    return f"# cuda-smoke {kind}: " + json.dumps(record)


def head_lines(wanted: list[str], device: str, out: Path) -> str:
    """The first line (the commands, in order) and its data line."""
    return (f"{LINE}{len(wanted)} commands on {device} in {out}: " + " ".join(wanted) + "\n"
            + data_line("setup", {"device": device, "commands": wanted}))


def count_lines(counts: dict[str, int], seconds: float) -> str:
    """The last line (the counts) and its data line."""
    n = sum(counts.values())
    return (f"{LINE}{counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped of {n} "
            f"({seconds:.1f} s)\n" + data_line("end", counts))


def run(args: argparse.Namespace) -> int:
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("cuda_smoke: error: --device cuda requested but CUDA is not available", file=sys.stderr)
            return 2
    t0 = time.monotonic()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cuda-smoke-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.txt").write_text(corpus_text())
    (out / "smoke.toml").write_text(preset(out / "corpus.txt"))
    cmds = commands(out, args.device)
    names = [n for n, _ in cmds]
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        print(f"cuda_smoke: error: --only {' '.join(unknown)}: no such command; choose from {' '.join(names)}",
              file=sys.stderr)
        return 2
    wanted = selected(cmds, args.only)
    print(head_lines([n for n in names if n in wanted], args.device, out), flush=True)
    results = []
    for name, argv in cmds:
        if name not in wanted:
            continue
        argv, has = with_device(argv, args.device)
        r = run_one(name, argv)
        results.append(r)
        print(format_line(r, has), flush=True)
    counts = {s: sum(r["status"] == s for r in results) for s in ("ok", "failed", "skipped")}
    print(count_lines(counts, time.monotonic() - t0), flush=True)
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)
    return 1 if counts["failed"] else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m difftransformer.gpucheck.cuda_smoke", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda", help="device (default cuda)")
    p.add_argument("--out", default=None, help="where the runs and outputs go (default: a temporary directory, "
                                               "removed at the end)")
    p.add_argument("--only", nargs="+", metavar="NAME", default=None,
                   help="only these commands (and the trainings they read): e.g. generate eval-needles")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
