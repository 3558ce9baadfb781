# Relay: `make run` starts Relay on its embedded defaults; `make test` runs every test; `make check` runs lint,
# types and the fast test tiers (docs/pages/contributing/tests.md). Each sets up first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)
# Python caches what it compiles (and pytest the test modules it rewrites) even where the environment says not to:
# every pytest process imports some 430 modules, and would compile them all again, seconds per process.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-sdk client-check check lint openapi reference docs bench clean system-deps lock

$(PY):
	python3 -m venv $(VENV)

# uv installs what pip would (the same versions, compared), in 7 s where pip takes 45 s on a clean clone; pip
# still does where uv cannot (an index only pip is configured for).
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet 'uv>=0.5'
	$(VENV)/bin/uv pip install --python $(PY) --quiet -e '.[dev,test]' || $(PY) -m pip install --quiet -e '.[dev,test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/relay dev

# libfaketime (Debian package faketime): the clock-jump test runs Relay under a skewed wall clock.
# Debian's postgresql: the database-outage tests run a private cluster (initdb, postgres) and stop it mid-test.
# Debian's chromium: tests/e2e/test_browser.py looks at /docs and the Temporal UI in it, headless (nothing else is
# downloaded: it is driven over the DevTools protocol by tests/browser.py).
# Debian's haproxy and openssl: the shipped load-balancer configuration is checked and run in front of two gateways,
# and a TLS-terminating proxy with a private CA stands in for a secured Temporal.
system-deps:
	@ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || \
	  { $(SUDO) apt-get install -y -q faketime || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q faketime; }; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { $(SUDO) apt-get install -y -q postgresql || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q postgresql; }; }
	@[ -x /usr/sbin/haproxy ] || \
	  { $(SUDO) apt-get install -y -q haproxy || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q haproxy; }; }
	@[ -x /usr/bin/openssl ] || \
	  { $(SUDO) apt-get install -y -q openssl || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q openssl; }; }
	@[ -x /usr/bin/chromium ] || \
	  { $(SUDO) apt-get install -y -q chromium || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium; }; }

# The TypeScript executor of the end-to-end tests (@dbos-inc/dbos-sdk, pinned in its package-lock.json), installed
# once from the npm registry; Node >= 20 and npm must be on PATH.
TS_EXECUTOR := tests/executors/typescript
TS_STAMP := $(TS_EXECUTOR)/node_modules/.installed

$(TS_STAMP): $(TS_EXECUTOR)/package.json $(TS_EXECUTOR)/package-lock.json
	cd $(TS_EXECUTOR) && npm ci --no-audit --no-fund
	touch $(TS_STAMP)

# The Go executor of the end-to-end tests (github.com/dbos-inc/dbos-transact-golang, pinned in its go.mod/go.sum),
# built once from the Go module proxy; Go >= 1.25 must be on PATH.
GO_EXECUTOR := tests/executors/go
GO_BIN := $(GO_EXECUTOR)/bin/executor

$(GO_BIN): $(GO_EXECUTOR)/main.go $(GO_EXECUTOR)/go.mod $(GO_EXECUTOR)/go.sum
	cd $(GO_EXECUTOR) && GOFLAGS=-mod=readonly GOTOOLCHAIN=local go build -o bin/executor .

# The Java executor of the end-to-end tests (dev.dbos:transact, pinned in its pom.xml with every plugin), built once
# from Maven Central into one self-contained jar (java -jar $(JAVA_JAR)); JDK >= 17 and Maven must be on PATH.
JAVA_EXECUTOR := tests/executors/java
JAVA_JAR := $(JAVA_EXECUTOR)/target/executor.jar

$(JAVA_JAR): $(JAVA_EXECUTOR)/pom.xml $(wildcard $(JAVA_EXECUTOR)/src/main/java/relay/executor/*.java) \
		$(wildcard $(JAVA_EXECUTOR)/src/main/resources/*)
	cd $(JAVA_EXECUTOR) && mvn -q -B package -DskipTests

# The current TypeScript SDK's executor of the end-to-end tests (@dbos-inc/dbos-sdk 5.3.0, pinned in its
# package-lock.json) and Relay's own client for it (clients/typescript, built with its pinned tsc, then installed into
# the executor as a copy, as a user's `npm install` of the package would: a link would load a second SDK).
TS_CLIENT := clients/typescript
TS_CURRENT := tests/executors/typescript-current
TS_CURRENT_STAMP := $(TS_CURRENT)/node_modules/.installed

$(TS_CURRENT_STAMP): $(TS_CURRENT)/package.json $(TS_CURRENT)/package-lock.json $(TS_CLIENT)/package.json \
		$(TS_CLIENT)/package-lock.json $(TS_CLIENT)/tsconfig.json $(wildcard $(TS_CLIENT)/src/*.ts)
	cd $(TS_CLIENT) && npm ci --no-audit --no-fund && npm run build
	cd $(TS_CURRENT) && npm ci --no-audit --no-fund --install-links
	touch $(TS_CURRENT_STAMP)

# The current Go SDK's executor of the end-to-end tests (dbos-transact-golang v1.9.0, pinned in its go.mod/go.sum)
# with Relay's own client for it (clients/go, by a replace directive), built once from the Go module proxy; Go >= 1.26.
GO_CLIENT := clients/go
GO_CURRENT := tests/executors/go-current
GO_CURRENT_BIN := $(GO_CURRENT)/bin/executor

$(GO_CURRENT_BIN): $(GO_CURRENT)/main.go $(GO_CURRENT)/go.mod $(GO_CURRENT)/go.sum $(GO_CLIENT)/go.mod \
		$(GO_CLIENT)/go.sum $(wildcard $(GO_CLIENT)/*.go)
	cd $(GO_CURRENT) && GOFLAGS=-mod=readonly GOTOOLCHAIN=local go build -o bin/executor .

# The current Python SDK's executor of the end-to-end tests (dbos 3.4.0, pinned in its requirements.txt) and Relay's
# own client for it (clients/python, installed from the checkout as a user would: not editable, so its sources are
# prerequisites), in a venv of their own: the suite's venv keeps dbos 3.2.0, whose conductor client is built in.
PY_EXECUTOR := tests/executors/python
PY_CURRENT := $(PY_EXECUTOR)/.venv/bin/python
PY_STAMP := $(PY_EXECUTOR)/.venv/.installed
CLIENT := clients/python

$(PY_STAMP): $(PY_EXECUTOR)/requirements.txt $(CLIENT)/pyproject.toml $(wildcard $(CLIENT)/relay_dbos/*) | $(STAMP)
	$(VENV)/bin/uv venv --quiet --allow-existing --python $(PY) $(PY_EXECUTOR)/.venv
	$(VENV)/bin/uv pip install --python $(PY_CURRENT) --quiet --reinstall-package relay-dbos \
	  -r $(PY_EXECUTOR)/requirements.txt './$(CLIENT)[test]'
	touch $(PY_STAMP)

# Every SDK's executor of the end-to-end tests, built.
EXECUTORS_BUILT := $(TS_STAMP) $(GO_BIN) $(JAVA_JAR) $(PY_STAMP) $(TS_CURRENT_STAMP) $(GO_CURRENT_BIN)

# The clients' own checks: Python's in its venv (the suite's has another dbos), its types and its unit tests;
# TypeScript's types (its build) and unit tests; Go's vet and unit tests.
client-check: $(PY_STAMP) $(TS_CURRENT_STAMP) $(GO_CURRENT_BIN)
	cd $(CLIENT) && ../../$(PY_EXECUTOR)/.venv/bin/mypy --strict relay_dbos tests
	$(PY_CURRENT) -m pytest -q -p no:cacheprovider $(CLIENT)/tests
	cd $(TS_CLIENT) && npm test
	cd $(GO_CLIENT) && GOFLAGS=-mod=readonly GOTOOLCHAIN=local go vet ./... && \
	  GOFLAGS=-mod=readonly GOTOOLCHAIN=local go test -count=1 ./...

# ruff, then tests/tiers.py: mypy beside the tiers without real processes (over every core, as in `make check`), in a
# low-weight CPU cgroup; then the e2e tests one at a time (their timings are real) and, beside them in that group,
# those marked `concurrent` (they assert no timing) two at a time, a module per worker. RELAY_TEST_TIERS=apart: the
# concurrent tier first; RELAY_TEST_TIERS=sequential: everything one after the other, no cgroup. Every test, once.
test: $(STAMP) system-deps $(EXECUTORS_BUILT)
	$(VENV)/bin/ruff check .
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory client-check
	$(PY) -m tests.tiers

# One SDK's end-to-end tests alone: `make test-sdk SDK=typescript|go|java|python|python-current|typescript-current|
# go-current` (tests/e2e/test_sdks.py for that SDK; for python, dbos==3.2.0, also its own recovery and liveness
# end-to-end tests; for a current release through Relay's client, also that client's end-to-end tests).
SDK ?= python
SDK_TESTS = tests/e2e/test_sdks.py $(if $(filter python,$(SDK)),tests/e2e/test_recovery.py tests/e2e/test_liveness.py) \
	$(if $(filter %-current,$(SDK)),tests/e2e/test_relay_client.py)
test-sdk: $(STAMP) system-deps $(EXECUTORS_BUILT)
	$(PY) -m pytest -q -s --sdk=$(SDK) $(SDK_TESTS)

# Lint, types, and every test tier but e2e (tests/unit, tests/workflows, tests/api): no real processes, no
# system packages, the tests spread over every core. The one-minute loop: property tests draw a tenth of their
# examples (RELAY_TESTS=quick, tests/quick.py); `make test` runs the same tiers whole. worksteal: tests/tiers.py, FAST.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .
	RELAY_TESTS=quick $(PY) -m pytest -q -m "not e2e" -n auto --dist worksteal tests/unit tests/workflows tests/api

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .

# `make bench PARTS="rest scale"`: only those parts (docs/pages/benchmarks.md); `scale` runs only when named.
PARTS ?=
bench: $(STAMP)
	$(PY) -m tests.bench $(PARTS)

openapi: $(STAMP)
	$(PY) -m api.openapi > api/spec/openapi.json

# The documentation's reference pages (settings, CLI, metrics, audit events, REST API), generated from the code;
# tests/unit/test_docs_reference.py fails when one drifts from it.
reference: $(STAMP)
	$(PY) docs/reference.py

# The documentation site, into .relay/site: strict (docs/mkdocs.yml), so a broken link or anchor, a page left out
# of the nav, or any other warning fails it. It loads nothing from elsewhere: read it air-gapped with
# `python3 -m http.server -d .relay/site` (search included), or `.venv/bin/mkdocs serve -f docs/mkdocs.yml` while editing.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --quiet -f docs/mkdocs.yml

# The image's dependencies (Dockerfile): requirements.lock holds every runtime package of relay[postgres], pinned
# with hashes, for the image's interpreter and platform whatever this machine is (CPython 3.11, as the venv and
# python:3.11-slim, on x86_64 glibc); requirements-build.lock holds the build backend that turns Relay into a wheel
# there. uv is installed here for this alone: it is no dependency of Relay.
LOCK_TARGET := --python-version 3.11 --python-platform x86_64-manylinux_2_28
lock: | $(PY)
	$(PY) -m pip install --quiet 'uv>=0.5'
	$(VENV)/bin/uv pip compile --quiet --generate-hashes $(LOCK_TARGET) --custom-compile-command 'make lock' \
	  --extra postgres pyproject.toml -o requirements.lock
	$(PY) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], sep='\n')" | \
	  $(VENV)/bin/uv pip compile --quiet --generate-hashes $(LOCK_TARGET) --custom-compile-command 'make lock' \
	  - -o requirements-build.lock

clean:
	rm -rf $(VENV) .relay
