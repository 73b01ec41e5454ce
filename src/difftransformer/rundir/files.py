"""Where each file of a run directory is: its names, spelled here once, and the paths built from them.

The model directory's own names (``config.json``, ``model.safetensors``, ``tokenizer.json``, ``manifest.json``)
are ``model.pretrained``'s; a checkpoint is one such directory, and the run keeps a copy of the tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

from ..model.pretrained import CONFIG_NAME, MANIFEST_NAME, TOKENIZER_NAME, WEIGHTS_NAME

PathLike = Union[str, os.PathLike]  # what Path() takes, as model.pretrained's

RUN_CONFIG_NAME = "run_config.json"
METRICS_NAME = "metrics.jsonl"
DATA_DIR = "data"
TENSORBOARD_DIR = "tb"
CHECKPOINTS_DIR = "checkpoints"
STEP_PREFIX = "step_"
# Beside the model files of each checkpoint: what resuming needs (written and read by ``train.checkpoint``).
STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"
LOCK_NAME = "run.lock"
# A LoRA run (``train.lora_rank`` > 0): the newest checkpoint's adapters in PEFT's format (``train.lora``).
ADAPTER_DIR = "adapter"
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
# Its base for peft's AutoPeftModelForCausalLM, unless train.lora_base names one: the remote-code export of the
# frozen source, written once beside the adapter.
ADAPTER_BASE_DIR = "adapter_base"
# The model card (``interop.model_card``) of RUN/adapter, RUN/adapter_base and every ``convert --to-hf`` export.
MODEL_CARD_NAME = "README.md"
# A sweep's output directory (``retrieval.sweep``, ``lmsweep.sweep``): its results (read by the report and the demo).
SWEEP_RESULTS_NAME = "sweep.json"
# A study's output directory: the retrieval benchmark's results (and the report's), the rounding check of either
# study (``studies.cli.write_rounding``), and each study's job journal (``jobs.Journal``).
RESULTS_NAME = "results.json"
ROUNDING_NAME = "rounding.json"
DIAGNOSTIC_RESULTS_NAME = "diagnostic.json"  # a study's diagnostic (retrieval's, lm-sweep's V1 and V2)
RETRIEVAL_JOURNAL = "jobs.jsonl"
WIDTH_SWEEP_JOURNAL = "sweep-jobs.jsonl"
LM_SWEEP_JOURNAL = "lm-jobs.jsonl"
# The retrieval benchmark's plots beside its results.json (``retrieval.plots`` writes them, the report shows them)
ACCURACY_HEATMAP_PNG = "accuracy_heatmap.png"
ACCURACY_VS_DIFFICULTY_PNG = "accuracy_vs_difficulty.png"
ATTENTION_SHARES_PNG = "attention_shares.png"
QUANTIZATION_PNG = "quantization.png"
ACCURACY_VS_LR_PNG = "accuracy_vs_lr.png"
ATTENTION_ROW_PNG = "attention_row.png"
RETRIEVAL_PLOTS = (ACCURACY_HEATMAP_PNG, ACCURACY_VS_DIFFICULTY_PNG, ATTENTION_SHARES_PNG, QUANTIZATION_PNG,
                   ACCURACY_VS_LR_PNG, ATTENTION_ROW_PNG)
WIDTH_SWEEP_PNG = "sweep.png"  # the retrieval width sweep's plot beside its sweep.json
# The language-model sweep's plots beside its sweep.json (``lmsweep.sweep`` writes them, the report shows them)
LM_SWEEP_PARAMS_PNG = "lm-sweep-params.png"
LM_SWEEP_TOKENS_PNG = "lm-sweep-tokens.png"
LM_SWEEP_LR_PNG = "lm-sweep-lr.png"

__all__ = ["PathLike", "RUN_CONFIG_NAME", "METRICS_NAME", "DATA_DIR", "TENSORBOARD_DIR", "CHECKPOINTS_DIR",
           "STEP_PREFIX", "STATE_TENSORS", "STATE_JSON", "LOCK_NAME", "ADAPTER_DIR", "ADAPTER_CONFIG_NAME",
           "ADAPTER_WEIGHTS_NAME", "ADAPTER_BASE_DIR", "MODEL_CARD_NAME", "SWEEP_RESULTS_NAME", "RESULTS_NAME",
           "ROUNDING_NAME", "DIAGNOSTIC_RESULTS_NAME", "RETRIEVAL_JOURNAL", "WIDTH_SWEEP_JOURNAL", "LM_SWEEP_JOURNAL",
           "ACCURACY_HEATMAP_PNG", "ACCURACY_VS_DIFFICULTY_PNG", "ATTENTION_SHARES_PNG", "QUANTIZATION_PNG",
           "ACCURACY_VS_LR_PNG", "ATTENTION_ROW_PNG", "RETRIEVAL_PLOTS", "WIDTH_SWEEP_PNG", "LM_SWEEP_PARAMS_PNG",
           "LM_SWEEP_TOKENS_PNG", "LM_SWEEP_LR_PNG",
           "CONFIG_NAME",
           "WEIGHTS_NAME", "MANIFEST_NAME", "TOKENIZER_NAME", "run_config_path", "tokenizer_path", "data_dir",
           "metrics_path", "tensorboard_dir", "checkpoints_dir", "step_dir", "adapter_dir", "adapter_base_dir"]


def run_config_path(run_dir: PathLike) -> Path:
    return Path(run_dir) / RUN_CONFIG_NAME


def tokenizer_path(run_dir: PathLike) -> Path:
    return Path(run_dir) / TOKENIZER_NAME


def data_dir(run_dir: PathLike) -> Path:
    return Path(run_dir) / DATA_DIR


def metrics_path(run_dir: PathLike) -> Path:
    return Path(run_dir) / METRICS_NAME


def tensorboard_dir(run_dir: PathLike) -> Path:
    return Path(run_dir) / TENSORBOARD_DIR


def checkpoints_dir(run_dir: PathLike) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def step_dir(run_dir: PathLike, step: int) -> Path:
    """``RUN_DIR/checkpoints/step_XXXXXXXX``: zero-padded so names sort as steps do."""
    return checkpoints_dir(run_dir) / f"{STEP_PREFIX}{step:08d}"


def adapter_dir(run_dir: PathLike) -> Path:
    """``RUN_DIR/adapter``: a LoRA run's adapters (``adapter_config.json``, ``adapter_model.safetensors``)."""
    return Path(run_dir) / ADAPTER_DIR


def adapter_base_dir(run_dir: PathLike) -> Path:
    """``RUN_DIR/adapter_base``: the remote-code export of a LoRA run's frozen source, the adapter's base."""
    return Path(run_dir) / ADAPTER_BASE_DIR
