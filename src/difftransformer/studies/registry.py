"""What a study is to the rest of the package: ``Study``, the one record each study's folder fills in
(``retrieval/study.py``, ``lmsweep/study.py``), and ``STUDIES``, the registry the command line, the report (its
flags, its runner, its page) and ``make docs`` iterate. A new study is its folder plus one line in
``report/studies.py``, which fills the registry with the built-in studies (this module sits below them and imports
none); ``registered`` adds one for as long as a block runs (tests/studies/test_third_study.py).

What a study gives:

* ``name``: its command (``difftransformer NAME``) and the report's flag (``report --NAME DIR``);
* ``what``: the study in words ("the retrieval benchmark"), for help text and errors;
* ``results``: its result file in the command's ``--out`` directory, and ``read(directory, flag)``, which reads
  and validates it (one ValueError naming ``flag``, the file and the field);
* ``register(subparsers)``: its command;
* ``section(results, directory, provenance)``: the HTML of its section of the report page (``studies/page.py``
  has the pieces); ``provenance`` describes committed results shown instead of measured ones (None when measured);
* ``verdicts(results)``: the verdict rows (``eval.stats.verdict_row``'s dicts) the page counts in its multiplicity
  note, or None when the study's verdicts are its own family (the language-model sweep's);
* ``docs``: the ``make docs`` blocks it fills, each a name and a function of the committed results' folder
  (``docs/results``) that returns the block's Markdown;
* ``command``: where the study runs under another study's command (protocol version 4: ``retrieval --protocol
  4``), that command; ``register`` then adds none."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

Reader = Callable[[Any, str], Any]  # (directory, flag) -> the validated results
Section = Callable[[Any, Path, Optional[dict]], str]  # (results, directory, provenance) -> HTML
Block = Callable[[Path], str]  # (docs/results) -> Markdown


@dataclass(frozen=True)
class Study:
    name: str
    what: str
    results: str
    read: Reader
    register: Callable[[argparse._SubParsersAction], None]
    section: Section
    verdicts: Optional[Callable[[Any], list]] = None
    docs: Mapping[str, Block] = field(default_factory=dict)
    command: str = ""  # the command that writes ``results`` when it is not ``difftransformer NAME``

    @property
    def writer(self) -> str:
        """The command line that writes this study's results ("retrieval --protocol 4", or its name)."""
        return self.command or self.name

    @property
    def dest(self) -> str:
        """The report's argparse destination of ``--NAME`` ("lm-sweep" -> "lm_sweep")."""
        return self.name.replace("-", "_")


STUDIES: list[Study] = []  # filled by report/studies.py, in the order the page shows them


def add(study: Study) -> Study:
    """``study`` appended to the registry; a name (or a ``make docs`` block) taken already is a ValueError."""
    if not isinstance(study, Study):
        raise TypeError(f"studies.registry.add takes a Study, got {type(study).__name__}")
    if any(s.name == study.name for s in STUDIES):
        raise ValueError(f"a study named {study.name!r} is registered already")
    taken = {b for s in STUDIES for b in s.docs} & set(study.docs)
    if taken:
        raise ValueError(f"study {study.name!r}: the make docs block(s) {sorted(taken)} belong to another study")
    STUDIES.append(study)
    return study


@contextlib.contextmanager
def registered(study: Study) -> Iterator[Study]:
    """``study`` in the registry while the block runs (a test's toy study), taken out after."""
    add(study)
    try:
        yield study
    finally:
        STUDIES.remove(study)


def by_name(name: str) -> Study:
    for s in STUDIES:
        if s.name == name:
            return s
    raise ValueError(f"no study named {name!r}; the studies are {', '.join(repr(s.name) for s in STUDIES)}")


def read_object(path: Path) -> dict[str, Any]:
    """A committed results file a ``make docs`` block reads: a JSON object holding something, else one ValueError
    naming the file (a file holding ``[]`` is not read as a study that has not finished)."""
    from ..fileio import read_json
    data = read_json(path)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path.parent.name}/{path.name} holds {type(data).__name__} {str(data)[:20]}, not a "
                         "study's results (a JSON object)")
    return data


def result_reader(command: str, results: str, benchmark: str, check: Callable[[Any, str], Any]) -> Reader:
    """A study's ``read``: ``read(directory, flag)`` is ``directory``'s result file ``results`` (the one
    ``difftransformer command --out DIR`` writes), its ``"benchmark"`` equal to ``benchmark``, checked whole by
    ``check`` (its schema's validator). A missing file, bad JSON, or JSON of another shape is one ValueError naming
    ``flag``, the file and the field it lacks or mistypes, before any long work."""
    def read(directory: Any, flag: str) -> Any:
        from ..fileio import read_json
        path = Path(directory) / results
        if not path.is_file():
            raise ValueError(f"{flag} {directory}: holds no {results} (run `difftransformer {command} --out "
                             f"{directory}` first)")
        res = read_json(path)
        where = f"{flag}: {path} is not a {command} result"
        if not isinstance(res, dict):
            raise ValueError(f"{where}: a JSON {type(res).__name__}, not an object")
        if res.get("benchmark") != benchmark:
            raise ValueError(f"{where}: its \"benchmark\" is {res.get('benchmark')!r}, not {benchmark!r}")
        return check(res, where)
    return read
