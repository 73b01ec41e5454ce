"""The language-model sweep as the package's study registry sees it (``studies.registry.Study``): its command, its
sweep.json and reader, its section of the report page, and the ``make docs`` blocks drawn from its committed results
(``docs/results/lm-*``, ``v2-diagnostic``). Its verdicts are its own family (Fig. 3's), not counted with the
retrieval benchmark's and the language models' (``verdicts`` None). Each block imports its module when asked."""

from __future__ import annotations

from pathlib import Path

from ..rundir.files import SWEEP_RESULTS_NAME
from ..studies.registry import Study, read_object
from . import cli, page
from .schema import read_sweep


def v2_diagnostic(results: Path) -> str:
    from .diagnostic import RESULTS
    from .diagnostic_text import v2_markdown_table
    return v2_markdown_table(read_object(results / "v2-diagnostic" / RESULTS))


def longer(results: Path) -> str:
    from . import longer
    return longer.classing_table(results, results / "lm-longer")


def mechanism(results: Path) -> str:
    from . import mechanism
    return mechanism.markdown_table(mechanism.rebuild(results / "lm-sweep-v2", results, results / "lm-mechanism"))


def mechanism_rounding(results: Path) -> str:
    from ..rundir.files import ROUNDING_NAME
    from ..studies.rounding import format_readings
    from ..studies.schema import read_checked, validate_readings
    check = read_checked(results / "lm-mechanism" / ROUNDING_NAME, validate_readings)
    return "```\n" + format_readings(check, check["study"]) + "\n```"


def lrs(results: Path) -> str:
    from . import sweep
    return sweep.markdown_lr_table(read_object(results / "lm-sweep-v2" / SWEEP_RESULTS_NAME))


def verdicts(results: Path) -> str:
    from . import sweep
    return sweep.markdown_verdicts(read_object(results / "lm-sweep-v2" / SWEEP_RESULTS_NAME))


STUDY = Study(
    name="lm-sweep", what="the language-model sweep", results=SWEEP_RESULTS_NAME, read=read_sweep,
    register=cli.register, section=page.section,
    docs={"lm-v2-diagnostic": v2_diagnostic, "lm-longer": longer, "lm-mechanism": mechanism,
          "lm-mechanism-rounding": mechanism_rounding, "lm-sweep-lrs": lrs,
          "lm-sweep-verdicts": verdicts})
