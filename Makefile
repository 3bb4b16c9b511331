# The two commands a new machine needs:
#   make local   runs the quickstart job on the local cloud, through real preemptions
#   make test    runs the whole test suite (lint, types, unit, emulator, infra checks)
# Both create .venv and install what they need first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHECKOV := .venv-checkov/bin/checkov
TFSCHEMA := .venv-tfschema/node_modules/.installed

.PHONY: setup system-packages local test lint bench load clean

$(STAMP): requirements.txt functions/requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

# checkov pins its own dependency tree, so it lives in a venv of its own.
$(CHECKOV): infra/requirements-checkov.txt
	@test -x .venv-checkov/bin/python || $(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/python -m pip install --quiet --upgrade pip
	.venv-checkov/bin/python -m pip install --quiet -r infra/requirements-checkov.txt
	@touch $(CHECKOV)

# The google, archive and time provider schemas (the Terraform CDK's prebuilt providers, from npm) for the schema test.
$(TFSCHEMA): infra/tfschema/package.json infra/tfschema/package-lock.json
	@mkdir -p .venv-tfschema && cp infra/tfschema/package.json infra/tfschema/package-lock.json .venv-tfschema/
	cd .venv-tfschema && npm ci --ignore-scripts --legacy-peer-deps --no-audit --no-fund --loglevel=error
	@touch $(TFSCHEMA)

# Debian's packages the tests need: shellcheck (0.9.0 on bookworm) for the machine's scripts
# (tests/unit/test_machine_scripts.py) and headless Chromium for the job report's page
# (tests/integration/test_local_monitoring.py). Their tests skip without them, and fail without them in CI.
# apt-get as root, or through sudo that asks no password; where neither works, say what to install.
SYSTEM_PACKAGES := shellcheck chromium
system-packages:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do command -v $$p >/dev/null 2>&1 || echo $$p; done); \
	[ -n "$$missing" ] || exit 0; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make setup: $$missing missing and apt-get is not here to install it: install it by hand" \
	    "(Debian's packages), or its tests skip (and fail in CI)" >&2; exit 0; \
	fi; \
	sudo=; [ "$$(id -u)" = 0 ] || sudo="sudo -n"; \
	export DEBIAN_FRONTEND=noninteractive; \
	$$sudo apt-get install -y -q --no-install-recommends $$missing \
	  || { $$sudo apt-get update -q && $$sudo apt-get install -y -q --no-install-recommends $$missing; } \
	  || echo "make setup: apt-get could not install $$missing (not root, and no sudo without a password?):" \
	    "install it by hand, or its tests skip (and fail in CI)" >&2

setup: $(STAMP) $(CHECKOV) $(TFSCHEMA) system-packages

local: $(STAMP)
	$(BIN)/respawn local run examples/quickstart.yaml --preempt-at-step 150,300 $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

# One pytest worker per core (pytest-xdist), each test file whole on one worker, so that a module's fixtures (a
# compilation cache) are made once; the files with the most slow tests go first (tests/conftest.py), and every local
# run shares one reference cache. The slowest tests are listed at the end.
TEST_WORKERS ?= auto
test: setup lint
	RESPAWN_CHECKOV=$(CURDIR)/$(CHECKOV) RESPAWN_TFSCHEMA=$(CURDIR)/.venv-tfschema/node_modules \
	  $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --durations=20 $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/run_all.py $(if $(BENCH_ONLY),--only $(BENCH_ONLY))

load: $(STAMP)
	$(BIN)/python bench/load_test.py

clean:
	rm -rf $(VENV) .venv-checkov .venv-tfschema .pytest_cache .mypy_cache .ruff_cache .respawn
