"""The retrieval benchmark as the package's study registry sees it (``studies.registry.Study``): its command, its
results.json and reader, its section of the report page, its verdict rows, and the ``make docs`` blocks drawn from
its committed results (``docs/results/retrieval-*``). Each block imports its module when ``make docs`` asks for it."""

from __future__ import annotations

from pathlib import Path

from ..rundir.files import RESULTS_NAME, ROUNDING_NAME
from ..studies.registry import Study, read_object
from ..studies.schema import read_checked, validate_readings
from . import cli, page
from .schema import read_results


def diagnostic(results: Path) -> str:
    from . import diagnostic as dg
    return dg.markdown_table(read_object(results / "retrieval-diagnostic" / dg.RESULTS))


def dynamics(results: Path) -> str:
    from . import diagnostic as dg
    return dg.dynamics_table(read_object(results / "retrieval-diagnostic" / dg.RESULTS))


def longer(results: Path) -> str:
    from . import longer
    return longer.markdown_table(longer.rebuild(results / "retrieval-diagnostic", results / "retrieval-longer"))


def speed_or_capability(results: Path) -> str:
    from . import longer
    return longer.classing_table(longer.rebuild(results / "retrieval-diagnostic", results / "retrieval-longer"))


def mechanism(results: Path) -> str:
    from . import mechanism
    return mechanism.markdown_table(mechanism.rebuild(results / "retrieval-diagnostic",
                                                      results / "retrieval-mechanism"))


def mechanism_rounding(results: Path) -> str:
    from ..studies.rounding import format_readings
    check = read_checked(results / "retrieval-mechanism" / ROUNDING_NAME, validate_readings)
    return "```\n" + format_readings(check, check["study"]) + "\n```"


def mechanism_longer(results: Path) -> str:
    from . import mechanism
    return mechanism.markdown_table(mechanism.rebuild_longer(results / "retrieval-diagnostic",
                                                             results / "retrieval-longer",
                                                             results / "retrieval-mechanism"))


def protocol4(results: Path) -> str:
    from . import protocol4, protocol4_text
    return protocol4_text.markdown_table(protocol4.rebuild(results / "retrieval-v4"))


STUDY = Study(
    name="retrieval", what="the retrieval benchmark", results=RESULTS_NAME, read=read_results,
    register=cli.register, section=page.section, verdicts=page.retrieval_verdicts,
    docs={"retrieval-diagnostic": diagnostic, "retrieval-dynamics": dynamics, "retrieval-longer": longer,
          "speed-or-capability": speed_or_capability, "retrieval-mechanism": mechanism,
          "retrieval-mechanism-rounding": mechanism_rounding, "retrieval-mechanism-longer": mechanism_longer,
          "retrieval-v4": protocol4})
