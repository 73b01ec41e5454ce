"""Fixtures of the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory) -> str:
    """One tokenisation of the tiny preset's data shared by the tests' runs (``data.prepared_dir``)."""
    return str(tmp_path_factory.mktemp("prepared"))


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and a shared, loaded machine punishes spinning OpenMP workers."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
