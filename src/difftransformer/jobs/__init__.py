"""Running declared jobs, apart from any study: the journal, resuming, the CPU code path, one thread per job, the
local and Ray executors, progress, failed jobs and the time limit (``Incomplete``). A study (the retrieval
benchmark, its width sweep, the language-model sweep) declares its jobs as a ``JobSpec`` and calls ``run_jobs``;
nothing here imports a study."""

from .codepath import CODE_PATHS, DEVICES, check_code_path, code_path_env, device_key, in_code_path, one_thread
from .journal import Journal, job_key, parse, read_journal
from .outcome import EXIT_FAILED, EXIT_TIME_LIMIT, Incomplete, JobError
from .runner import EXECUTORS, JobSpec, RunOptions, open_executor, run_jobs, run_jobs_into

__all__ = ["CODE_PATHS", "DEVICES", "EXECUTORS", "EXIT_FAILED", "EXIT_TIME_LIMIT", "Incomplete", "JobError",
           "JobSpec", "Journal", "RunOptions", "check_code_path", "code_path_env", "device_key", "in_code_path",
           "job_key", "one_thread", "open_executor", "parse", "read_journal", "run_jobs", "run_jobs_into"]
