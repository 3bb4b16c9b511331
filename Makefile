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

.PHONY: setup browser local test lint bench load clean

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

# The google and archive provider schemas (the Terraform CDK's prebuilt providers, from npm) for the schema test.
$(TFSCHEMA): infra/tfschema/package.json infra/tfschema/package-lock.json
	@mkdir -p .venv-tfschema && cp infra/tfschema/package.json infra/tfschema/package-lock.json .venv-tfschema/
	cd .venv-tfschema && npm ci --ignore-scripts --legacy-peer-deps --no-audit --no-fund --loglevel=error
	@touch $(TFSCHEMA)

setup: $(STAMP) $(CHECKOV) $(TFSCHEMA)

# Headless Chromium (Debian's package) for the job report's browser test (tests/integration/test_local_monitoring.py).
# A system package: run as root, or with sudo, once per machine; .ci/run does.
browser:
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium; }

local: $(STAMP)
	$(BIN)/respawn local run examples/quickstart.yaml --preempt-at-step 250,550 $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

test: setup lint
	RESPAWN_CHECKOV=$(CURDIR)/$(CHECKOV) RESPAWN_TFSCHEMA=$(CURDIR)/.venv-tfschema/node_modules $(BIN)/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

load: $(STAMP)
	$(BIN)/python bench/load_test.py

clean:
	rm -rf $(VENV) .venv-checkov .venv-tfschema .pytest_cache .mypy_cache .ruff_cache .respawn
