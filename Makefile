# chronolog — developer commands. `make run` starts a node; `make test` proves it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs into .venv:
# * runtime: the project, editable (src/ is imported in place: an edit needs no reinstall),
#   and its runtime dependencies (`make run`, `make schemas`, ...); redone when
#   pyproject.toml changes;
# * test: the project's `test` extra on top (pytest, pytest-xdist, hypothesis, schemathesis,
#   ruff, mypy, import-linter, ...: `make test`, `make test-unit`, `make lint`).
# setuptools prints a notice about editable installs once, at install. The wheel users get is
# built and checked by tests/unit/test_packaging.py; a non-editable install that differs from
# src/ is refused by tests/conftest.py.
RUNTIME := $(VENV)/.installed-runtime
TESTING := $(VENV)/.installed-test
# test processes: the tests wait on brokers, databases and subprocesses more than they
# compute, so more processes than cores. On two cores, 6 kept them busy (the parallel phase
# took 574 s against 729-795 s with 4); the pure tests (test-unit) wait on forked workers
# and subprocesses too: 51 s with 4 processes, 57 s with 3, 72 s with 2.
JOBS ?= 6
UNIT_JOBS ?= 4
# Python keeps compiled modules (__pycache__/*.pyc; ignored by git): the suite starts
# hundreds of chronolog processes, and without the cache each compiles src/ again (~0.2 s of
# CPU each). An environment that turns the cache off (PYTHONDONTWRITEBYTECODE) is overridden
# for the commands here.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: install test test-unit schemas run kafka-up kafka-down bench clean lint chaos

$(RUNTIME): pyproject.toml
	test -x $(BIN)/python || { $(PY) -m venv $(VENV) && $(BIN)/pip install -q --upgrade pip; }
	rm -rf build
	$(BIN)/pip install -q -e .
	touch $(RUNTIME)

$(TESTING): pyproject.toml | $(RUNTIME)
	$(BIN)/pip install -q -e '.[test]'
	touch $(TESTING)

install: $(RUNTIME)

## the whole suite, with every service it needs started and stopped here (Kafka, PostgreSQL):
## JOBS processes share the services; the tests marked `serial` (they load the machine or own
## private servers and ports) run afterwards, alone
## The suite's brokers (the shared one and those tests start: up to three at once on two
## cores) run the serial collector and the C1 compiler alone: a three-broker chaos run took
## 144 s of broker CPU instead of 219 s (G1 and C2), and 182 s instead of 232 s.
## The default (scripts/kafka.sh) stays G1 and C2 for long runs and benchmarks.
test: export KAFKA_JVM_OPTS ?= -XX:+UseSerialGC -XX:TieredStopAtLevel=1
## Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE): the
## suite starts about 850 chronolog processes (each CLI call is one) and each compiled every
## module of src/ again — 0.07 s of a CLI call's 0.45 s CPU — and each pytest worker every
## test module it collects.
test test-unit: export PYTHONDONTWRITEBYTECODE =
test: $(RUNTIME) $(TESTING)
	$(BIN)/python scripts/with_services.py -- $(BIN)/python scripts/run_suite.py --jobs $(JOBS) \
		-- $(PYTEST_ARGS)

## only the pure tests (no services; promtool is installed if missing: scripts/with_services.py)
## but the exhaustive searches (tens of CPU seconds each), which `make test` runs with the rest
test-unit: $(RUNTIME) $(TESTING)
	$(BIN)/python scripts/with_services.py --no-kafka --no-postgres --no-browser -- \
		$(BIN)/python -m pytest tests/unit -n $(UNIT_JOBS) --dist worksteal -m "not exhaustive" \
		$(PYTEST_ARGS)

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
