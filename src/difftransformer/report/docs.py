"""``make docs``: the blocks of the README and docs/ that are tables of committed results, generated from
``docs/results/`` by the code that formats them, so that every such number is written by the code once.

A block is the text between ``<!-- generated: NAME (make docs) -->`` and ``<!-- end generated: NAME -->``;
``blocks()`` says what fills each NAME: the answer table, and each study's own blocks (``Study.docs``, in its
``study.py``). ``python -m difftransformer.report.docs`` rewrites every block in place (``--check``: writes nothing,
exits 1 naming each stale block); ``tests/test_docs_generated.py`` fails when a block is stale.
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


def answer_table(results: Path) -> str:
    from . import answer
    return answer.markdown()


def blocks() -> dict[str, Callable[[Path], str]]:
    """Every block ``make docs`` fills: the answer table (over both studies) and each registered study's own
    (``Study.docs``), each a function of the committed results' folder."""
    from .studies import STUDIES
    return {"answer-table": answer_table, **{name: make for s in STUDIES for name, make in s.docs.items()}}


def render(text: str, where: str, cache: dict[str, str]) -> str:
    """``text`` with every generated block filled anew; a block of an unknown name is a ValueError naming it."""
    known = blocks()

    def fill(m: re.Match) -> str:
        name = m.group(1)
        if name not in known:
            raise ValueError(f"{where}: unknown generated block {name!r}; known: {', '.join(known)}")
        if name not in cache:
            try:
                cache[name] = known[name](RESULTS).rstrip("\n")
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


__all__ = ["blocks", "files", "main", "render", "stale"]
