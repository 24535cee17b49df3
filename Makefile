# The two commands of the README, and what they need.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## make demo: a round of six experiments on the embedded four-node twin cluster
demo: $(STAMP)
	$(BIN)/orchestrate round --budget 6

## make test: lint, types, the import contract, then the test suite
test: $(STAMP) lint
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check orchestrator agents knobs ledger cluster tests bench
	$(BIN)/ruff format --check orchestrator agents knobs ledger cluster tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) orchestrate.db mlflow.db mlartifacts results.tsv .orchestrate
