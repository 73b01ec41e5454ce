"""The retrieval benchmark as the package's study registry sees it (``studies.registry.Study``): its command, its
results.json and reader, its section of the report page, its verdict rows, and the ``make docs`` blocks drawn from
its committed results (``docs/results/retrieval-*``). Each block imports its module when ``make docs`` asks for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..rundir.files import RESULTS_NAME, ROUNDING_NAME
from ..studies.registry import Study, read_object
from ..studies.schema import read_checked, validate_readings
from . import cli, page
from .schema import read_results


def _v3(results: Path) -> Any:
    return read_object(results / "retrieval-v3" / RESULTS_NAME)


def v3_lr(results: Path) -> str:
    from . import benchmark_text
    return benchmark_text.lr_markdown(_v3(results))


def v3_accuracy(results: Path) -> str:
    from . import benchmark_text
    return benchmark_text.accuracy_markdown(_v3(results))


def v3_verdicts(results: Path) -> str:
    from . import benchmark_text
    return benchmark_text.verdicts_markdown(_v3(results))


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


def _rounding(folder: Path) -> str:
    """A follow-up's committed rounding check (its rounding.json) as its text, in a code block."""
    from ..studies.rounding import format_readings
    check = read_checked(folder / ROUNDING_NAME, validate_readings)
    return "```\n" + format_readings(check, check["study"]) + "\n```"


def diagnostic_rounding(results: Path) -> str:
    return _rounding(results / "retrieval-diagnostic")


def mechanism_rounding(results: Path) -> str:
    return _rounding(results / "retrieval-mechanism")


def longer_rounding(results: Path) -> str:
    """The longer re-reading's committed AVX2 rerun (its rounding.json) as its text, in a code block."""
    from . import longer_rounding as LR
    check = read_object(results / "retrieval-longer" / LR.ROUNDING.format(code_path="avx2") / LR.ROUNDING_RESULTS)
    return "```\n" + LR.format_rounding(check) + "\n```"


def mechanism_longer(results: Path) -> str:
    from . import mechanism
    return mechanism.markdown_table(mechanism.rebuild_longer(results / "retrieval-diagnostic",
                                                             results / "retrieval-longer",
                                                             results / "retrieval-mechanism"))


def protocol4(results: Path) -> str:
    from . import protocol4, protocol4_text
    return protocol4_text.markdown_table(protocol4.rebuild(results / "retrieval-v4"))


def protocol4_rounding(results: Path) -> str:
    """Version 4's AVX2 rounding check: its readings (rounding.json, in a code block) once finished; until then how
    many of its reruns the committed journal holds."""
    from . import protocol4_rounding as R
    where = results / "retrieval-v4" / R.ROUNDING.format(code_path="avx2")
    if (where / ROUNDING_NAME).is_file():
        return "```\n" + R.format_rounding(read_checked(where / ROUNDING_NAME, R.validate_protocol4_rounding)) + "\n```"
    try:
        done, asked = R.progress(results / "retrieval-v4", "avx2")
    except R.NotFinished:
        return "Not started: it reruns the test jobs of the finished protocol."
    if not (where / R.JOURNAL).is_file():
        return f"Not started: it reruns the {asked} test jobs that ran under other kernels than AVX2."
    return (f"Running: {done} of the {asked} test jobs it reruns under AVX2 are in the committed journal "
            "([results/retrieval-v4/rounding-avx2/](results/retrieval-v4/rounding-avx2/)).")


STUDY = Study(
    name="retrieval", what="the retrieval benchmark", results=RESULTS_NAME, read=read_results,
    register=cli.register, section=page.section, verdicts=page.retrieval_verdicts,
    docs={"retrieval-v3-lr": v3_lr, "retrieval-v3-accuracy": v3_accuracy, "retrieval-v3-verdicts": v3_verdicts,
          "retrieval-diagnostic": diagnostic, "retrieval-diagnostic-rounding": diagnostic_rounding,
          "retrieval-dynamics": dynamics, "retrieval-longer": longer,
          "speed-or-capability": speed_or_capability, "retrieval-longer-rounding": longer_rounding,
          "retrieval-mechanism": mechanism,
          "retrieval-mechanism-rounding": mechanism_rounding, "retrieval-mechanism-longer": mechanism_longer,
          "retrieval-v4": protocol4, "retrieval-v4-rounding": protocol4_rounding})
