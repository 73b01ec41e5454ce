"""The training run directory: the one package that names its files and reads them back.

A run directory holds

* ``run_config.json``: the full ``TrainConfig`` of the run (``run_config``);
* ``tokenizer.json``: the run's tokenizer (also inside every checkpoint; ``tokenizer``);
* ``data/``: the prepared memmap shards (``data.shards``);
* ``metrics.jsonl``: one JSON object per line (``MetricsRecord``), appended as training goes (``metrics``);
* ``tb/``: TensorBoard event files;
* ``checkpoints/step_XXXXXXXX/``: one model directory per checkpoint (``model.pretrained`` format: config,
  weights, tokenizer, manifest) plus the training state to resume (``training_state.*``, ``train.checkpoint``);
  listed and chosen by ``checkpoints``;
* ``run.lock``: the writer's lock (``lock``), holding the PID of the process that holds it;
* a LoRA run's ``adapter/`` (the newest checkpoint's adapters in PEFT's format, with a model card) and
  ``adapter_base/`` (the remote-code export of the frozen source they adapt, unless ``train.lora_base`` names one).

Every file but metrics.jsonl is replaced atomically (``fileio.atomic_write``); metrics.jsonl is only appended to.
Each module has one job: ``files`` (the names, spelled once, and the paths), ``run_config``, ``metrics``,
``checkpoints``, ``tokenizer``, ``lock`` and ``kinds`` (what kind of directory a path is). Their public names are
re-exported here, so ``from difftransformer import rundir; rundir.step_dir(...)`` reads as before.

It sits above ``model`` and ``data`` (it may import them, never the reverse) and below ``train``, ``eval``,
``inference`` and ``interop``, which all find a run's files through it.
"""

from __future__ import annotations

from .checkpoints import (
    leftover_temp_checkpoints,
    list_checkpoints,
    newest_complete_checkpoint,
    resolve_checkpoint,
    run_of_checkpoint,
)
from .files import (
    ADAPTER_BASE_DIR,
    ADAPTER_CONFIG_NAME,
    ADAPTER_DIR,
    ADAPTER_WEIGHTS_NAME,
    CHECKPOINTS_DIR,
    CONFIG_NAME,
    DATA_DIR,
    LM_SWEEP_JOURNAL,
    LOCK_NAME,
    MANIFEST_NAME,
    METRICS_NAME,
    MODEL_CARD_NAME,
    RESULTS_NAME,
    RETRIEVAL_JOURNAL,
    ROUNDING_NAME,
    RUN_CONFIG_NAME,
    STATE_JSON,
    STATE_TENSORS,
    STEP_PREFIX,
    SWEEP_RESULTS_NAME,
    TENSORBOARD_DIR,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    WIDTH_SWEEP_JOURNAL,
    PathLike,
    adapter_base_dir,
    adapter_dir,
    checkpoints_dir,
    data_dir,
    metrics_path,
    run_config_path,
    step_dir,
    tensorboard_dir,
    tokenizer_path,
)
from .kinds import DIR_KINDS, DirKind, dir_kind, is_run_dir
from .lock import RunLocked, lock_run
from .metrics import (
    LAMBDA_KEYS,
    LAMBDA_V1,
    LAMBDA_V2,
    RESUMED_KEY,
    MetricsCurves,
    MetricsRecord,
    append_metrics,
    lambda_keys,
    parse_metrics,
    read_metric_records,
    read_metrics,
    truncate_metrics_after,
)
from .run_config import read_run_config, write_run_config
from .tokenizer import check_tokenizer, find_tokenizer, read_tokenizer

__all__ = ["RUN_CONFIG_NAME", "METRICS_NAME", "DATA_DIR", "TENSORBOARD_DIR", "CHECKPOINTS_DIR", "STEP_PREFIX",
           "TOKENIZER_NAME", "STATE_TENSORS", "STATE_JSON", "LOCK_NAME", "RESUMED_KEY", "RunLocked", "lock_run",
           "CONFIG_NAME", "WEIGHTS_NAME", "MANIFEST_NAME", "LAMBDA_V1", "LAMBDA_V2", "LAMBDA_KEYS", "PathLike",
           "MetricsRecord", "MetricsCurves", "run_config_path", "tokenizer_path", "data_dir", "metrics_path",
           "tensorboard_dir", "checkpoints_dir", "step_dir", "DirKind", "DIR_KINDS", "is_run_dir", "dir_kind",
           "list_checkpoints", "leftover_temp_checkpoints", "newest_complete_checkpoint", "resolve_checkpoint",
           "run_of_checkpoint", "read_run_config", "write_run_config", "parse_metrics", "read_metric_records",
           "append_metrics", "truncate_metrics_after", "read_metrics", "lambda_keys", "find_tokenizer",
           "check_tokenizer", "read_tokenizer", "ADAPTER_DIR", "ADAPTER_CONFIG_NAME", "ADAPTER_WEIGHTS_NAME",
           "adapter_dir", "ADAPTER_BASE_DIR", "MODEL_CARD_NAME", "adapter_base_dir",
           "SWEEP_RESULTS_NAME", "RESULTS_NAME", "ROUNDING_NAME", "RETRIEVAL_JOURNAL", "WIDTH_SWEEP_JOURNAL",
           "LM_SWEEP_JOURNAL"]
