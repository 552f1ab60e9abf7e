# Two commands set everything up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The runtime alone (no dev extras): what `make demo` needs.
RUNTIME := $(VENV)/.runtime

.PHONY: demo test test-fast lint bench diagrams clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(RUNTIME)

demo: $(RUNTIME)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check fisk_sm tests bench examples
	$(BIN)/ruff format --check fisk_sm tests bench examples
	$(BIN)/mypy --strict fisk_sm

# A wheel of each transitions release pyproject.toml allows, for tests/test_transitions_contract.py
# (downloaded once; again when pyproject.toml or the install changes).
TRANSITIONS_WHEELS := $(VENV)/transitions-wheels/.fetched

$(TRANSITIONS_WHEELS): pyproject.toml $(STAMP) tests/transitionskit.py
	$(BIN)/python tests/transitionskit.py $(VENV)/transitions-wheels
	touch $@

test test-fast: $(TRANSITIONS_WHEELS)

# pytest-xdist workers (one per core; `make test TEST_WORKERS=0` runs in one process).
TEST_WORKERS ?= auto

test: lint
	$(BIN)/pytest -q -n $(TEST_WORKERS)

# Everything but the long scenarios (marked slow) and the benchmark smoke runs (marked bench):
# for the edit-test loop; no lint. `make test` runs them all, the benchmarks once at a small N.
test-fast: $(STAMP)
	$(BIN)/pytest -q -n $(TEST_WORKERS) -m "not slow and not bench"

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python bench/loop_overhead.py
	$(BIN)/python bench/journal.py

diagrams: $(STAMP)
	$(BIN)/fisk-sm diagram --format mermaid -o diagrams/agent_loop.mmd
	$(BIN)/fisk-sm diagram --format svg -o diagrams/agent_loop.svg

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
