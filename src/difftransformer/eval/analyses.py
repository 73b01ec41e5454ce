"""Every analysis of `difftransformer eval` and of the report, as imported specs (see ``spec.py``).

The order is the order of the paper's claims; attnmap, which takes several runs at once, comes last.
"""

from __future__ import annotations

from . import attnmap, icl, needles, noise, outliers, positions, quantized
from .spec import AnalysisSpec

ANALYSES: tuple[AnalysisSpec, ...] = (needles.SPEC, noise.SPEC, outliers.SPEC, quantized.SPEC, positions.SPEC,
                                      icl.SPEC, attnmap.SPEC)
# The report runs these on every model; the multi-run ones (attnmap) once over one model per variant.
PER_RUN: tuple[AnalysisSpec, ...] = tuple(s for s in ANALYSES if not s.multi_run)
MULTI_RUN: tuple[AnalysisSpec, ...] = tuple(s for s in ANALYSES if s.multi_run)
