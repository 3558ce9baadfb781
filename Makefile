# Relay: `make run` starts Relay on its embedded defaults; `make test` runs every test; `make check` runs lint,
# types and the fast test tiers (README, "Tests"). Each sets up first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

.PHONY: run test check lint openapi bench clean system-deps

$(PY):
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/relay dev

# libfaketime (Debian package faketime): the clock-jump test runs Relay under a skewed wall clock.
# Debian's postgresql: the database-outage tests run a private cluster (initdb, postgres) and stop it mid-test.
system-deps:
	@ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || \
	  { $(SUDO) apt-get install -y -q faketime || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q faketime; }; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { $(SUDO) apt-get install -y -q postgresql || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q postgresql; }; }

test: $(STAMP) system-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .
	$(PY) -m pytest -q

# Lint, types, and every test tier but e2e (tests/unit, tests/workflows, tests/api): no real processes, no
# system packages, the tests spread over every core.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .
	$(PY) -m pytest -q -m "not e2e" -n auto tests/unit tests/workflows tests/api

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .

bench: $(STAMP)
	$(PY) -m tests.bench

openapi: $(STAMP)
	$(PY) -m api.openapi > api/spec/openapi.json

clean:
	rm -rf $(VENV) .relay
