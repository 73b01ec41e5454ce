"""A study's output directory as every reader takes it (the report, ``demo --lm-sweep``, ``lm-sweep --rounding-of``):
the file, the "benchmark" it names and the keys the readers need with their JSON types, checked before any long
work, in one line that names the flag, the file and what it lacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..fileio import read_json
from .files import RESULTS_NAME, SWEEP_RESULTS_NAME

# What the report reads of each study's output (the file in its directory, the "benchmark" it says, the keys and
# their JSON types), checked before any long work (``read_study``)
STUDIES: dict[str, tuple[str, str, dict[str, type]]] = {
    "retrieval": (RESULTS_NAME, "kv_retrieval", {"config": dict, "variants": dict, "conditions": list}),
    "lm-sweep": (SWEEP_RESULTS_NAME, "lm_sweep", {"config": dict, "table": dict, "diverged_runs": dict}),
}


def read_study(directory: str | Path, kind: str, flag: str) -> dict[str, Any]:
    """A study's output as the report reads it: ``kind`` "retrieval" (``difftransformer retrieval``'s results.json)
    or "lm-sweep" (``difftransformer lm-sweep``'s sweep.json) in ``directory``. A missing file, bad JSON, or JSON of
    another shape is one ValueError naming ``flag``, the file and what it lacks."""
    name, benchmark, keys = STUDIES[kind]
    path = Path(directory) / name
    if not path.is_file():
        raise ValueError(f"{flag} {directory}: holds no {name} (run `difftransformer {kind} --out {directory}` "
                         "first)")
    res = read_json(path)
    if not isinstance(res, dict):
        raise ValueError(f"{flag}: {path} is not a {kind} result: a JSON {type(res).__name__}, not an object")
    if res.get("benchmark") != benchmark:
        raise ValueError(f"{flag}: {path} is not a {kind} result: its \"benchmark\" is {res.get('benchmark')!r}, "
                         f"not {benchmark!r}")
    for key, kind_of in keys.items():
        if not isinstance(res.get(key), kind_of):
            what = "lacks" if key not in res else f"has a {type(res[key]).__name__} for"
            raise ValueError(f"{flag}: {path} is not a {kind} result: it {what} \"{key}\" (a JSON "
                             f"{'object' if kind_of is dict else 'list'})")
    return res
