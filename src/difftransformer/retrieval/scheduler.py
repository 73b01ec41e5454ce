"""The retrieval benchmark's names for the job runner, which lives in ``difftransformer.jobs`` (journal, resume, CPU
code path, executors): the journal's file name and the CPU code paths (``config.py`` validates against them)."""

from __future__ import annotations

from ..jobs.codepath import CODE_PATHS

JOURNAL = "jobs.jsonl"

__all__ = ["CODE_PATHS", "JOURNAL"]
