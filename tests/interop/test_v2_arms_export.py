"""The retrieval diagnostic's DIFF V2 switches have no remote code: an export is refused in one line, not dropped."""

from __future__ import annotations

import pytest
import torch

from difftransformer.interop.remote_code import config_to_remote
from difftransformer.model import ModelConfig


@pytest.mark.parametrize("opts, named", [({"v2_keys": "separate"}, "v2_keys"), ({"v2_lambda": "scalar"}, "v2_lambda"),
                                         ({"v2_headwise_norm": True}, "v2_headwise_norm")])
def test_export_refuses_the_v2_arms(opts, named):
    cfg = ModelConfig.from_flavour("tiny", attention="diff_v2", **opts)
    with pytest.raises(ValueError, match=named):
        config_to_remote(cfg, torch.float32)
    assert config_to_remote(ModelConfig.from_flavour("tiny", attention="diff_v2"), torch.float32)["v2_lambda"] == "sigmoid"


def test_export_keeps_fields_the_remote_config_does_not_carry():
    """Only the diagnostic switches are refused: a backend (not part of the remote config) exports as before."""
    cfg = ModelConfig.from_flavour("tiny", attention="diff_v2", backend="sdpa")
    assert config_to_remote(cfg, torch.float32)["attention"] == "diff_v2"
