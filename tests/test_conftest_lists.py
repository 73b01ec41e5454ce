"""``conftest.py``'s lists name files and tests that exist (issue 70 item 6): a renamed file or test must fail here,
not quietly shrink ``make test-fast``, drop a test from the serial pass or reorder the parallel one."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# tests/conftest.py by its path: ``import conftest`` may find another folder's conftest module first
_spec = importlib.util.spec_from_file_location("tests_conftest_lists", ROOT / "tests" / "conftest.py")
assert _spec is not None and _spec.loader is not None
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_listed_file_exists():
    for name in ("FAST_FILES", "SERIAL_FILES", "LONG_FILES"):
        missing = [f for f in getattr(conftest, name) if not (ROOT / f).is_file()]
        assert not missing, f"conftest.{name} names files that do not exist: {missing}"


def test_every_listed_test_exists():
    for name in ("FAST_TESTS", "SERIAL_TESTS"):
        for t in getattr(conftest, name):
            path, _, test = t.partition("::")
            assert (ROOT / path).is_file(), f"conftest.{name}: {path} does not exist"
            assert test.split("[")[0] in _functions(ROOT / path), f"conftest.{name}: no {test} in {path}"
    path, _, test = conftest.FUZZ.partition("::")
    assert test in _functions(ROOT / path), f"conftest.FUZZ: no {test} in {path}"
