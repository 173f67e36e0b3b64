# Two commands do everything on a fresh machine with Python 3.11:
#   make run    environment, a month of real flights and 3 synthetic days landed and materialised, Dagster UI + daemon
#   make test   environment, lint, type check, the whole test suite (what CI runs)
SHELL := /bin/bash
PYTHON ?= python3.11
UV_VERSION := 0.13.9
HOST ?= 127.0.0.1
PORT ?= 3000
START ?= 2013-01-01
DAYS ?= 30
# The synthetic dataset, served beside flights: a few generated days.
SYNTHETIC_START ?= 2024-01-01
SYNTHETIC_DAYS ?= 3

export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export ML_PLATFORM_LANDING_DIR ?= $(CURDIR)/data/landing
export ML_PLATFORM_LAKE_DIR ?= $(CURDIR)/data/lake
export UV_PYTHON := $(PYTHON)

UV := .tools/bin/uv
VENV_STAMP := .venv/.synced

.PHONY: run test test-fast env lint system-packages clean

env: $(VENV_STAMP)

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet uv==$(UV_VERSION)

# The environment is rebuilt only when the lock or the project changes. Bytecode is compiled at
# install: every run, test and service is a new Python process, and where
# PYTHONDONTWRITEBYTECODE is set each of them would otherwise compile Great Expectations,
# Dagster and scikit-learn from source again (about 10 s a process).
$(VENV_STAMP): uv.lock pyproject.toml | $(UV)
	$(UV) sync --frozen --compile-bytecode
	touch $@

run: env
	mkdir -p "$(DAGSTER_HOME)"
	ln -sf "$(CURDIR)/dagster.yaml" "$(DAGSTER_HOME)/dagster.yaml"
	.venv/bin/ml-platform land --dataset flights --start $(START) --days $(DAYS)
	.venv/bin/ml-platform land --dataset synthetic --start $(SYNTHETIC_START) --days $(SYNTHETIC_DAYS)
	@# A failed day (bad data, say) must not keep the UI from showing it.
	-.venv/bin/ml-platform materialize --dataset flights --start $(START) --days $(DAYS)
	-.venv/bin/ml-platform materialize --dataset synthetic --start $(SYNTHETIC_START) --days $(SYNTHETIC_DAYS)
	@echo "Dagster UI on http://$(HOST):$(PORT) (Ctrl-C stops it)"
	exec .venv/bin/dagster dev -h $(HOST) -p $(PORT) -w workspace.yaml

lint: env
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# Services the integration tests start themselves: a PostgreSQL server (production instance
# storage) and Chromium (what a person sees in the UI). Installed only when missing.
SYSTEM_PACKAGES := postgresql chromium fonts-dejavu-core

system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

test: lint system-packages
	.venv/bin/pytest -ra --durations=15

# The unit layer, for the edit-test loop (about 2 minutes): pure functions, sensors and schedules
# ticked in-process, S3 against moto's server. Modules that run days of the real graph or start
# processes are marked `slow` or `integration` and run only in `make test`.
test-fast: env
	.venv/bin/pytest -ra -m "not integration and not slow"

clean:
	rm -rf .venv .tools .dagster_home data
