# Relay: `make run` starts Relay on its embedded defaults; `make test` runs every test. Both set up first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint openapi bench clean

$(PY):
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/relay dev

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .

bench: $(STAMP)
	$(PY) -m tests.bench

openapi: $(STAMP)
	$(PY) -m gateway.openapi > api/spec/openapi.json

clean:
	rm -rf $(VENV) .relay
