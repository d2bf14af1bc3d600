# One entry point for set-up, demo and tests. `make demo` and `make test` set up
# a local virtualenv on first use (torch first, pinned, so pip never pulls a
# multi-GB CUDA build onto a CPU machine; see docs/RAY.md §0).
PY      ?= python3
VENV    ?= .venv
FAISS   ?= cpu
TORCH   ?= torch==2.13.0
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(FAISS)
PYTEST_ARGS ?= --durations=0 --durations-min=20
# the unit tests run in this many processes (pytest-xdist; 0 = in pytest's own): each process has its own
# session fixtures, export cache, staging and temporary folder (tests/conftest.py). The integration tests run in
# three, each with its own local Ray (tests/integration/conftest.py shares them out; TEST_WORKERS_INTEGRATION=0 runs
# them in pytest's own process): on 2 cores three keep the machine ~96 % busy where one keeps it 65-82 %. A simulated
# cluster whose node missed Ray's fixed 30 s registration window is started once more (tests/subprocs.py,
# docs/performance.md, "Tests").
TEST_WORKERS ?= 2
TEST_WORKERS_INTEGRATION ?= 3

export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test test-unit test-unit-all test-integration test-stress bench clean docs docs-serve

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	@if [ "$(FAISS)" = gpu ]; then $(BIN)/pip uninstall -y -q faiss-cpu || true; fi
	@if [ "$(FAISS)" = cpu ]; then $(BIN)/pip uninstall -y -q faiss-gpu || true; fi
	$(BIN)/pip install -q -c constraints.txt -e ".[$(FAISS),dev,docs]"
	rm -f $(VENV)/.installed-*
	touch $@

demo: setup
	$(BIN)/pipeline demo $(DEMO_ARGS)

# every test: the unit tests in TEST_WORKERS processes, then the integration tests (both run, whatever the first gave)
test: setup
	@rc=0; $(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests/unit $(PYTEST_ARGS) || rc=$$?; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS_INTEGRATION) --dist loadgroup tests/integration $(PYTEST_ARGS) \
	  || rc=$$?; exit $$rc

# the quick loop: the unit tests but those marked slow (each over 2 s: a process, a model conversion, a training
# run, a memory measurement); `make test` runs every test, those included
test-unit: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow" tests/unit

test-unit-all: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests/unit

test-integration: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS_INTEGRATION) --dist loadgroup tests/integration

# the manual as a site (properdocs.yml): built into site/ with warnings as errors, or served with live reload
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/properdocs build --strict

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/properdocs serve -a 127.0.0.1:8000

# The integration tests 3 times back to back while one core is kept busy (scripts/test_stress.py)
test-stress: setup
	$(BIN)/python scripts/test_stress.py $(STRESS_ARGS)

bench: setup
	$(BIN)/python bench/encode.py

clean:
	rm -rf runs .ray_tmp .pytest_cache .stress site
