# chronolog — developer commands. `make run` starts a node; `make test` proves it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs into .venv, each a regular (not editable) install of the project built from
# the working tree, redone whenever pyproject.toml or a file of src/ changes:
# * runtime: the project and its runtime dependencies only (`make run`, `make schemas`, ...);
# * test: the project's `test` extra on top (pytest, hypothesis, schemathesis, ruff, mypy,
#   import-linter, ...: `make test`, `make test-unit`, `make lint`).
# (An editable install of this layout — package chronolog in src/ — makes setuptools print a
# notice on every install; a regular one prints nothing. pytest refuses to run on an
# installed copy that differs from src/: tests/conftest.py.)
RUNTIME := $(VENV)/.installed-runtime
TESTING := $(VENV)/.installed-test
SOURCES := $(shell find src -name '*.py' -o -name '*.sql' -o -name '*.html' -o -name '*.css' \
	-o -name '*.js' -o -name '*.txt')

.PHONY: install test test-unit schemas run kafka-up kafka-down bench clean lint chaos

$(RUNTIME): pyproject.toml $(SOURCES)
	test -x $(BIN)/python || { $(PY) -m venv $(VENV) && $(BIN)/pip install -q --upgrade pip; }
	rm -rf build
	$(BIN)/pip install -q .
	touch $(RUNTIME)

$(TESTING): pyproject.toml | $(RUNTIME)
	$(BIN)/pip install -q '.[test]'
	touch $(TESTING)

install: $(RUNTIME)

## the whole suite, with every service it needs started and stopped here (Kafka, PostgreSQL)
test: $(RUNTIME) $(TESTING)
	$(BIN)/python scripts/with_services.py -- $(BIN)/python -m pytest $(PYTEST_ARGS)

## only the pure tests (no services; promtool is installed if missing: scripts/with_services.py)
test-unit: $(RUNTIME) $(TESTING)
	$(BIN)/python scripts/with_services.py --no-kafka --no-postgres --no-browser -- \
		$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

schemas: $(RUNTIME)
	$(BIN)/python -m chronolog.schemagen schemas

run: $(RUNTIME)
	$(BIN)/chronolog dev $(ARGS)

kafka-up: $(RUNTIME)
	scripts/kafka.sh up

kafka-down:
	scripts/kafka.sh down

## ruff (rules in pyproject.toml), mypy (strict on the pure core) and the import contracts
## (`lint-imports`: the layering). mypy reads src/ as the package chronolog through a link.
lint: $(RUNTIME) $(TESTING)
	$(BIN)/ruff check src tests bench
	mkdir -p $(VENV)/mypy-path && ln -sfn ../../src $(VENV)/mypy-path/chronolog
	MYPYPATH=$(VENV)/mypy-path $(BIN)/mypy -p chronolog
	$(BIN)/lint-imports --no-logo

## faults under load on private services (broker, PostgreSQL, kill -9, full disk), checked
## after each: `make chaos ARGS="--short --scenario kill-processes"` (scripts/chaos.py)
chaos: $(RUNTIME)
	$(BIN)/python scripts/chaos.py $(ARGS)

bench: $(RUNTIME)
	$(BIN)/python bench/decider.py

clean:
	rm -rf $(VENV) .chronolog .pytest_cache .hypothesis build chronolog.egg-info
