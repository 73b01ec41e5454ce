"""`make gpu-check`: the GPU verification, which runs the package's own commands (``gpu_check.py``: the steps under
their time limits and the summary; ``cuda_smoke.py``: every command that takes a device, at toy size). It stands
above the command line it runs; the measurements it calls (``bench/``: the tables, the plan, the readers, the
summary) stand below it."""
