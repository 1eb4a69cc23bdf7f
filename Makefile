# chronolog — developer commands. `make run` starts a node; `make test` proves it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-unit schemas run kafka-up kafka-down bench clean lint chaos

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## the whole suite, with every service it needs started and stopped here (Kafka, PostgreSQL)
test: $(STAMP)
	$(BIN)/python scripts/with_services.py -- $(BIN)/python -m pytest $(PYTEST_ARGS)

## only the pure tests (no services)
test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

schemas: $(STAMP)
	$(BIN)/python -m chronolog.schemagen schemas

run: $(STAMP)
	$(BIN)/chronolog dev $(ARGS)

kafka-up: $(STAMP)
	scripts/kafka.sh up

kafka-down:
	scripts/kafka.sh down

## ruff (rules in pyproject.toml), mypy (strict on the pure core) and the import contracts
## (`lint-imports`: the layering). mypy reads src/ as the package chronolog through a link.
lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	mkdir -p $(VENV)/mypy-path && ln -sfn ../../src $(VENV)/mypy-path/chronolog
	MYPYPATH=$(VENV)/mypy-path $(BIN)/mypy -p chronolog
	$(BIN)/lint-imports --no-logo

## faults under load on private services (broker, PostgreSQL, kill -9, full disk), checked
## after each: `make chaos ARGS="--short --scenario kill-processes"` (scripts/chaos.py)
chaos: $(STAMP)
	$(BIN)/python scripts/chaos.py $(ARGS)

bench: $(STAMP)
	$(BIN)/python bench/decider.py

clean:
	rm -rf $(VENV) .chronolog .pytest_cache .hypothesis
