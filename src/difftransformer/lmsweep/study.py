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

SWEEP, AVX2 = "lm-sweep-v2", "lm-sweep-v2-avx2"  # the committed sweep and its rounding check, in docs/results/


def _sweep(results: Path, where: str = SWEEP) -> dict:
    return read_object(results / where / SWEEP_RESULTS_NAME)


def _diagnostic(results: Path, which: str) -> dict:
    from .diagnostic import RESULTS
    return read_object(results / f"{which}-diagnostic" / RESULTS)


def _diagnostic_rounding(results: Path, which: str) -> str:
    from ..rundir.files import ROUNDING_NAME
    from .diagnostic_text import rounding_text
    return rounding_text(read_object(results / f"{which}-diagnostic" / ROUNDING_NAME))


def v1_diagnostic(results: Path) -> str:
    from . import diagnostic_text as dt
    res = _diagnostic(results, "v1")
    return "\n\n".join([dt.markdown_table(res, dt.V1), dt.rerun_line(res, _sweep(results), dt.V1),
                        dt.reference_line(res)])


def v1_scales(results: Path) -> str:
    from .diagnostic_text import scales_table
    return scales_table(_diagnostic(results, "v1"))


def v1_rounding(results: Path) -> str:
    return _diagnostic_rounding(results, "v1")


def v2_diagnostic(results: Path) -> str:
    from . import diagnostic_text as dt
    res = _diagnostic(results, "v2")
    return dt.v2_markdown_table(res) + "\n\n" + dt.rerun_line(res, _sweep(results), dt.V2)


def v2_rounding(results: Path) -> str:
    return _diagnostic_rounding(results, "v2")


def longer(results: Path) -> str:
    from . import longer
    return longer.classing_table(results, results / "lm-longer")


def mechanism(results: Path) -> str:
    from . import mechanism
    return mechanism.markdown_table(mechanism.rebuild(results / SWEEP, results, results / "lm-mechanism"))


def mechanism_rounding(results: Path) -> str:
    from ..rundir.files import ROUNDING_NAME
    from ..studies.rounding import format_readings
    from ..studies.schema import read_checked, validate_readings
    check = read_checked(results / "lm-mechanism" / ROUNDING_NAME, validate_readings)
    return "```\n" + format_readings(check, check["study"]) + "\n```"


def lrs(results: Path) -> str:
    from .sweep_text import markdown_lr_table
    return markdown_lr_table(_sweep(results))


def applicability(results: Path) -> str:
    from .sweep_text import markdown_applicability
    return markdown_applicability(_sweep(results))


def verdicts(results: Path) -> str:
    from .sweep_text import markdown_verdicts
    return markdown_verdicts(_sweep(results))


def grid(results: Path) -> str:
    from .sweep_text import markdown_grid
    return markdown_grid(_sweep(results))


def sensitivity(results: Path) -> str:
    from .sweep_text import markdown_sensitivity
    return markdown_sensitivity(_sweep(results))


def rounding(results: Path) -> str:
    from ..rundir.files import ROUNDING_NAME
    from .sweep_text import markdown_rounding, rounding_jobs
    table = markdown_rounding(read_object(results / AVX2 / ROUNDING_NAME), _sweep(results), _sweep(results, AVX2))
    return table + "\n\n" + rounding_jobs(results / SWEEP, results / AVX2)


STUDY = Study(
    name="lm-sweep", what="the language-model sweep", results=SWEEP_RESULTS_NAME, read=read_sweep,
    register=cli.register, section=page.section,
    docs={"lm-sweep-lrs": lrs, "lm-sweep-applicability": applicability, "lm-sweep-verdicts": verdicts,
          "lm-sweep-grid": grid, "lm-sweep-sensitivity": sensitivity, "lm-sweep-rounding": rounding,
          "lm-v1-diagnostic": v1_diagnostic, "lm-v1-scales": v1_scales, "lm-v1-diagnostic-rounding": v1_rounding,
          "lm-v2-diagnostic": v2_diagnostic, "lm-v2-diagnostic-rounding": v2_rounding, "lm-longer": longer,
          "lm-mechanism": mechanism, "lm-mechanism-rounding": mechanism_rounding})
