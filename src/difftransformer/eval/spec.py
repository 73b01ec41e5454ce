"""The one shape every analysis of `difftransformer eval` and of the report is declared in.

An analysis module (needles, noise, ...) exports ``SPEC = AnalysisSpec(...)``; ``analyses.ANALYSES`` lists the
imported specs. The command line (``eval/cli.py``) and the report (``report/``) read these fields and nothing
else, so adding an analysis means writing its module and adding its spec to that list (plus its flags in the CLI).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

# run(ev, settings, seed, progress) -> a JSON-ready result dict. ``ev`` is one EvalModel, or for a multi-run
# analysis (attnmap) a sequence of them; ``settings`` is the module's own typed settings dataclass.
RunFn = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class AnalysisSpec:
    name: str  # the subcommand of `difftransformer eval` and the key of its results in results.json
    title: str  # the report's section heading, before the paper reference
    paper: str  # the paper's table or figure it reproduces, e.g. "Table 3"
    help: str  # one line for `difftransformer eval --help`
    doc: str  # the module docstring: `difftransformer eval NAME --help` shows it
    quick: Any  # settings of the report's quick mode (and the CLI's defaults)
    full: Any  # settings of `difftransformer report --full`
    run: RunFn
    format: Callable[[dict[str, Any]], str]  # one result as the text the CLI prints
    plot: Optional[Callable[..., None]] = None  # plot(results, path): every model's results in one PNG
    claims: tuple[str, ...] = ()  # titles of the claims judged from its results (report/verdicts.py)
    multi_run: bool = False  # run() takes several models at once (attnmap)

    @property
    def heading(self) -> str:
        return f"{self.title} ({self.paper})"

    def settings(self, quick: bool) -> Any:
        return self.quick if quick else self.full


def check_positive(**values: Optional[int]) -> None:
    """ValueError naming the first flag whose value is below 1 (None means "not given" and passes)."""
    for name, v in values.items():
        if v is not None and v < 1:
            raise ValueError(f"--{name} must be >= 1, got {v}")


def by_name(specs: Sequence[AnalysisSpec], name: str) -> AnalysisSpec:
    for s in specs:
        if s.name == name:
            return s
    raise ValueError(f"unknown analysis {name!r}; choose one of {', '.join(s.name for s in specs)}")
