"""A model built on the meta device (``from_state_dict`` before the weights are assigned, the trainer's parameter
count) draws nothing: torch's meta ``normal_`` imports ``torch._dynamo``, about a second of CPU at the start of
every command that loads a model or trains. Checked in a fresh interpreter (this one may have imported it already),
with the meta-built model's parameters the same names, shapes, dtypes and trainability as the CPU-built one's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")

SCRIPT = r"""
import json, sys
import torch
from difftransformer.model import DiffTransformerLM, ModelConfig
from difftransformer.train.trainer import estimated_parameters
cases = [("baseline", {}), ("diff_v1", {}), ("diff_v1", {"v1_layout": "per_head"}), ("diff_v2", {}),
         ("diff_v2", {"v2_lambda": "scalar"}), ("diff_v2", {"tie_embeddings": True})]
layouts, counts = [], []
for attention, kw in cases:
    cfg = ModelConfig.from_flavour("tiny", attention=attention, **kw)
    with torch.device("meta"):
        model = DiffTransformerLM(cfg)
    layouts.append([[n, list(p.shape), str(p.dtype), p.requires_grad, p.is_meta] for n, p in model.named_parameters()])
    counts.append(estimated_parameters(cfg))
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "layouts": layouts, "counts": counts}))
"""


def test_building_on_meta_draws_nothing_and_matches_the_cpu_model():
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["dynamo"] is False, "building a model on the meta device imported torch._dynamo"

    import torch

    from difftransformer.model import DiffTransformerLM, ModelConfig
    cases = [("baseline", {}), ("diff_v1", {}), ("diff_v1", {"v1_layout": "per_head"}), ("diff_v2", {}),
             ("diff_v2", {"v2_lambda": "scalar"}), ("diff_v2", {"tie_embeddings": True})]
    for (attention, kw), layout, count in zip(cases, got["layouts"], got["counts"]):
        model = DiffTransformerLM(ModelConfig.from_flavour("tiny", attention=attention, **kw))
        want = [[n, list(p.shape), str(p.dtype), p.requires_grad, True] for n, p in model.named_parameters()]
        assert layout == want, (attention, kw)
        assert count == model.num_parameters(), (attention, kw)
    assert torch.get_default_device().type == "cpu"
