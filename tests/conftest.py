"""Fixtures shared by the whole suite."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and a shared, loaded machine punishes spinning OpenMP workers."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_config():
    """A factory of ``tiny``-flavour model configs: ``tiny_config("diff_v2", max_seq_len=32)``."""
    from suite_helpers import tiny_model_config

    return tiny_model_config


@pytest.fixture
def assert_cli_error(capsys):
    """``assert_cli_error(argv, *expected)``: the one-error-line, exit-2 check of ``suite_helpers.cli_fails``."""
    from suite_helpers import cli_fails

    return lambda argv, *expected, **kw: cli_fails(capsys, argv, *expected, **kw)
