# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Pinned: a plain `torch` could pull a multi-GB CUDA build; 2.13.0 is the CPU wheel on disk.
TORCH := torch==2.13.0

.PHONY: install demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m difftransformer demo $(if $(QUICK),--quick,)

test: install
	$(PY) -m pytest -q tests

bench: install
	$(PY) -m difftransformer bench attention

clean:
	rm -rf $(VENV) runs
