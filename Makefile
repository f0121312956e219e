# The two fresh-machine commands: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: setup run test lint bench clean

$(BIN)/moerag: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: the CPU build lies on the machine's disk; an open range pulls CUDA.
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

setup: $(BIN)/moerag

run: setup
	HF_HUB_OFFLINE=1 $(BIN)/moerag serve --sample --host $(HOST) --port $(PORT)

test: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/ingest.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
