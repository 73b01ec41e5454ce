"""The built-in studies, in the order the report page shows them: the one place that lists them. A new study is its
folder (with its ``study.py``: ``studies.registry.Study``) plus one line here; the command line (``cli.py``), the
report (its ``--NAME DIR`` flags, its runner, its page) and ``make docs`` iterate ``studies.registry.STUDIES``."""

from __future__ import annotations

from ..lmsweep.study import STUDY as LM_SWEEP
from ..retrieval.protocol4_study import STUDY as RETRIEVAL_V4
from ..retrieval.study import STUDY as RETRIEVAL
from ..studies import registry

# the lead (the paper's central claim) first, its protocol version 4 (speed and capability), then the sweep (Fig. 3)
for _study in (RETRIEVAL, RETRIEVAL_V4, LM_SWEEP):
    if _study not in registry.STUDIES:
        registry.add(_study)

STUDIES = registry.STUDIES
