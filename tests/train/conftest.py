"""Fixtures of the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory) -> str:
    """One tokenisation of the tiny preset's data shared by the tests' runs (``data.prepared_dir``)."""
    return str(tmp_path_factory.mktemp("prepared"))


