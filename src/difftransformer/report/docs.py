"""``make docs``: the blocks of the README and docs/ that are tables of committed results, generated from
``docs/results/`` by the code that formats them, so that every such number is written by the code once.

A block is the text between ``<!-- generated: NAME (make docs) -->`` and ``<!-- end generated: NAME -->``; ``BLOCKS``
says what fills each NAME. ``python -m difftransformer.report.docs`` rewrites every block in place (``--check``:
writes nothing, exits 1 naming each stale block); ``tests/test_docs_generated.py`` fails when a block is stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # src/difftransformer/report/ -> the repository root
RESULTS = ROOT / "docs" / "results"
OPEN = "<!-- generated: {name} (make docs) -->"
CLOSE = "<!-- end generated: {name} -->"
PATTERN = re.compile(r"<!-- generated: ([\w-]+) \(make docs\) -->\n(.*?)<!-- end generated: \1 -->", re.DOTALL)


def _json(*parts: str) -> dict:
    from ..fileio import read_json
    path = RESULTS.joinpath(*parts)
    data = read_json(path)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path.relative_to(ROOT)} holds {type(data).__name__} {str(data)[:20]}, not a study's "
                         "results (a JSON object)")
    return data


def answer_table() -> str:
    from . import answer
    return answer.markdown()


def retrieval_diagnostic() -> str:
    from ..retrieval import diagnostic as dg
    return dg.markdown_table(_json("retrieval-diagnostic", dg.RESULTS))


def retrieval_dynamics() -> str:
    from ..retrieval import diagnostic as dg
    return dg.dynamics_table(_json("retrieval-diagnostic", dg.RESULTS))


def lm_v2_diagnostic() -> str:
    from ..lmsweep import diagnostic as dg
    from ..lmsweep.diagnostic_text import v2_markdown_table
    return v2_markdown_table(_json("v2-diagnostic", dg.RESULTS))


def retrieval_longer() -> str:
    from ..retrieval import longer
    return longer.markdown_table(longer.rebuild(RESULTS / "retrieval-diagnostic", RESULTS / "retrieval-longer"))


def speed_or_capability() -> str:
    from ..retrieval import longer
    return longer.classing_table(longer.rebuild(RESULTS / "retrieval-diagnostic", RESULTS / "retrieval-longer"))


def lm_longer() -> str:
    from ..lmsweep import longer
    return longer.classing_table(RESULTS, RESULTS / "lm-longer")


def retrieval_mechanism() -> str:
    from ..retrieval import mechanism
    return mechanism.markdown_table(mechanism.rebuild(RESULTS / "retrieval-diagnostic",
                                                      RESULTS / "retrieval-mechanism"))


def retrieval_mechanism_rounding() -> str:
    from ..rundir.files import ROUNDING_NAME
    from ..rundir.studies import read_checked, validate_readings
    from ..studies.rounding import format_readings
    check = read_checked(RESULTS / "retrieval-mechanism" / ROUNDING_NAME, validate_readings)
    return "```\n" + format_readings(check, check["study"]) + "\n```"


def retrieval_mechanism_longer() -> str:
    from ..retrieval import mechanism
    return mechanism.markdown_table(mechanism.rebuild_longer(RESULTS / "retrieval-diagnostic",
                                                             RESULTS / "retrieval-longer",
                                                             RESULTS / "retrieval-mechanism"))


def lm_mechanism() -> str:
    from ..lmsweep import mechanism
    return mechanism.markdown_table(mechanism.rebuild(RESULTS / "lm-sweep-v2", RESULTS, RESULTS / "lm-mechanism"))


def retrieval_v4() -> str:
    from ..retrieval import protocol4, protocol4_text
    return protocol4_text.markdown_table(protocol4.rebuild(RESULTS / "retrieval-v4"))


def lm_sweep_lrs() -> str:
    from ..lmsweep import sweep
    from ..rundir.files import SWEEP_RESULTS_NAME
    return sweep.markdown_lr_table(_json("lm-sweep-v2", SWEEP_RESULTS_NAME))


def lm_sweep_verdicts() -> str:
    from ..lmsweep import sweep
    from ..rundir.files import SWEEP_RESULTS_NAME
    return sweep.markdown_verdicts(_json("lm-sweep-v2", SWEEP_RESULTS_NAME))


BLOCKS: dict[str, Callable[[], str]] = {
    "lm-longer": lm_longer,
    "speed-or-capability": speed_or_capability,
    "answer-table": answer_table,
    "retrieval-diagnostic": retrieval_diagnostic,
    "retrieval-dynamics": retrieval_dynamics,
    "lm-v2-diagnostic": lm_v2_diagnostic,
    "retrieval-longer": retrieval_longer,
    "retrieval-mechanism": retrieval_mechanism,
    "retrieval-mechanism-longer": retrieval_mechanism_longer,
    "retrieval-mechanism-rounding": retrieval_mechanism_rounding,
    "lm-mechanism": lm_mechanism,
    "retrieval-v4": retrieval_v4,
    "lm-sweep-lrs": lm_sweep_lrs,
    "lm-sweep-verdicts": lm_sweep_verdicts,
}


def render(text: str, where: str, cache: dict[str, str]) -> str:
    """``text`` with every generated block filled anew; a block of an unknown name is a ValueError naming it."""
    def fill(m: re.Match) -> str:
        name = m.group(1)
        if name not in BLOCKS:
            raise ValueError(f"{where}: unknown generated block {name!r}; known: {', '.join(BLOCKS)}")
        if name not in cache:
            try:
                cache[name] = BLOCKS[name]().rstrip("\n")
            except ValueError as e:
                raise ValueError(f"{where}: block {name!r}: {e}") from None
            except (OSError, KeyError, IndexError, TypeError, AttributeError) as e:  # missing, or of another shape
                raise ValueError(f"{where}: block {name!r} cannot be made from docs/results/: "
                                 f"{type(e).__name__}: {e}") from None
        return f"{OPEN.format(name=name)}\n{cache[name]}\n{CLOSE.format(name=name)}"
    return PATTERN.sub(fill, text)


def files(root: Path = ROOT) -> list[str]:
    """The Markdown files at the root and in docs/ that hold a generated block (relative paths)."""
    paths = sorted(root.glob("*.md")) + sorted((root / "docs").glob("*.md"))
    return [p.relative_to(root).as_posix() for p in paths if "<!-- generated: " in p.read_text(encoding="utf-8")]


def stale(root: Path = ROOT) -> dict[str, str]:
    """{file: its text with the blocks generated} for every file of ``files`` whose blocks are not what the results
    give now."""
    cache: dict[str, str] = {}
    out = {}
    for rel in files(root):
        text = (root / rel).read_text(encoding="utf-8")
        new = render(text, rel, cache)
        if new != text:
            out[rel] = new
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m difftransformer.report.docs", description=__doc__)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each file with a stale block")
    args = p.parse_args(argv)
    from ..fileio import atomic_write
    try:
        changed = stale()
    except ValueError as e:
        print(f"make docs: error: {e}", file=sys.stderr)
        return 2
    for rel, text in changed.items():
        if args.check:
            print(f"stale: {rel} (run make docs)")
        else:
            atomic_write(ROOT / rel, text)
            print(f"wrote {rel}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["BLOCKS", "files", "main", "render", "stale"]
