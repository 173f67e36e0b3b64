# Two commands do everything on a fresh machine with Python 3.11:
#   make run    environment, Dagster UI + daemon, then a month of real flights and 3 synthetic days
#               landed and run through them (the days fill in while you watch)
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
# One .venv, synced two ways: the platform's dependencies alone (`make run`), and those plus the
# dev group, the test, lint, type-check and browser-test tools (`make test`, `make env`).
RUN_STAMP := .venv/.synced-run
DEV_STAMP := .venv/.synced-dev

MLFLOW_PORT ?= 5000

.PHONY: run serve mlflow-ui instance test test-fast env lint system-packages clean

env: $(DEV_STAMP)

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet uv==$(UV_VERSION)

# Each environment is synced again only when the lock or the project changes. Bytecode is
# compiled at install: every run, test and service is a new Python process, and where
# PYTHONDONTWRITEBYTECODE is set each of them would otherwise compile Great Expectations,
# Dagster and scikit-learn from source again (about 10 s a process). `--inexact` leaves the dev
# tools of an earlier `make test` in place (removing them would only make the next `make test`
# reinstall them); a fresh clone's `make run` installs none of them. The dev sync is exact and
# holds every package the platform needs, so it stands for the run sync too.
$(RUN_STAMP): uv.lock pyproject.toml | $(UV)
	$(UV) sync --frozen --no-dev --inexact --compile-bytecode
	touch $@

$(DEV_STAMP): uv.lock pyproject.toml | $(UV)
	$(UV) sync --frozen --compile-bytecode
	touch $@ $(RUN_STAMP)

# The instance directory: Dagster reads its dagster.yaml there, and the dev server, which runs
# there, reads the .env beside it.
instance:
	mkdir -p "$(DAGSTER_HOME)"
	ln -sf "$(CURDIR)/dagster.yaml" "$(DAGSTER_HOME)/dagster.yaml"
	if [ -f .env ]; then ln -sf "$(CURDIR)/.env" "$(DAGSTER_HOME)/.env"; fi

# The UI first: the demo days are landed and launched beside it, through its webserver, once it
# answers, and a person watches them fill in (Runs, Catalog). A day already done is skipped, so a
# second `make run` launches nothing. Ctrl-C stops the UI and the command, which terminates the
# run of the day it was on; a command stopped by a signal (exit 128 + N) starts no other, while a
# flights day that failed or was rejected still lets the synthetic days run. The command launches through the webserver `make serve` starts here,
# whatever ML_PLATFORM_DAGSTER_URL the caller's environment names.
run: $(RUN_STAMP) instance
	( export ML_PLATFORM_DAGSTER_URL=http://$(HOST):$(PORT); \
	  .venv/bin/ml-platform land --dataset flights --start $(START) --days $(DAYS) \
	  && .venv/bin/ml-platform land --dataset synthetic --start $(SYNTHETIC_START) --days $(SYNTHETIC_DAYS) \
	  && .venv/bin/ml-platform materialize --dataset flights --start $(START) --days $(DAYS) --wait 300; \
	  stopped=$$?; [ $$stopped -ge 128 ] \
	  || .venv/bin/ml-platform materialize --dataset synthetic --start $(SYNTHETIC_START) \
	    --days $(SYNTHETIC_DAYS) --wait 300 ) &
	$(MAKE) --no-print-directory serve

# The UI, the daemon and the code location over the instance as it is. The dev server runs in
# DAGSTER_HOME: Dagster warns that a dagster.yaml in its working directory other than
# DAGSTER_HOME is not used, and the repository root holds the one we link. Every pool's limit is
# stored before the daemon starts (ml_platform/platform/pools.py says why).
serve: instance
	cd "$(DAGSTER_HOME)" && "$(CURDIR)/.venv/bin/ml-platform" pools
	@echo "Dagster UI on http://$(HOST):$(PORT) (Ctrl-C stops it)"
	@echo "Models and trainings in MLflow's UI: run 'make mlflow-ui' beside it, then open http://$(HOST):$(MLFLOW_PORT)"
	cd "$(DAGSTER_HOME)" && exec "$(CURDIR)/.venv/bin/dg" dev -h $(HOST) -p $(PORT) \
	  -w "$(CURDIR)/workspace.yaml"

# MLflow's own UI over the lake's embedded store: the registered models (versions, tags, the
# champion and challenger aliases) and every training's run. A store of MLFLOW_TRACKING_URI
# (production) is served by its own `mlflow server`. Browsing needs no job runner (MLflow's
# GenAI jobs): without it the server is one process, not ten.
mlflow-ui: $(RUN_STAMP)
	mkdir -p "$(ML_PLATFORM_LAKE_DIR)/mlflow"
	MLFLOW_DISABLE_TELEMETRY=true MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false .venv/bin/mlflow server --host $(HOST) --port $(MLFLOW_PORT) --workers 1 \
	  --backend-store-uri "sqlite:///$(abspath $(ML_PLATFORM_LAKE_DIR))/mlflow/mlflow.db"

# `dg check defs` loads the code location as `dg dev` and the daemon do. VIRTUAL_ENV says .venv
# is the environment dg runs in, or dg warns that no environment is active. The type check and
# the code location's load (each one core for about 30 and 20 s) run side by side; lint fails
# if either does.
lint: env instance
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy & mypy=$$!; \
	VIRTUAL_ENV="$(CURDIR)/.venv" .venv/bin/dg check defs; defs=$$?; \
	wait $$mypy && exit $$defs

# Services the integration tests start themselves: a PostgreSQL server (production instance
# storage), Redis (the distributed engine's broker) and Chromium (what a person sees in the
# UI). Installed only when missing.
SYSTEM_PACKAGES := postgresql redis-server chromium fonts-dejavu-core

system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Everything but the integration tests runs on the machine's cores (pytest-xdist; each test has
# its own temporary instance and lake). The integration tests, which start servers, daemons and
# browsers, run beside them, three modules at a time (a module's tests share its webserver,
# daemon and code server; each module has its own instance, lake and free ports): much of their
# time is spent waiting on a daemon's tick or a run's start, which the other layers fill (on 2
# cores, three integration modules beside two unit workers, each taking modules whole: a fresh
# clone's `.ci/run` in about 17 minutes; three unit workers ended later). The tests see a DAGSTER_HOME of their own, not the working tree's
# instance directory: a process whose instance keeps Dagster's telemetry default writes its
# telemetry log under the DAGSTER_HOME of its environment, and a test checks that serving the
# code location leaves the working tree untouched. Their outputs follow the unit tests'; any
# layer failing fails the target, whatever the other gives. Each worker takes a module whole
# (`--dist loadfile`): a module's fixtures are set up once, not once on each worker that was
# handed one of its tests (with `--dist load` test_replay.py's replayed days ran on both). The
# modules are handed out longest first (`LONGEST_FIRST` in ml_platform_tests/conftest.py), not
# in pytest-xdist's order of most tests first, so no long module starts last. The system
# packages, which only the integration tests start, are installed at the head of their layer,
# while the unit tests already run.
PARALLEL := -n auto --maxprocesses=4 --dist loadfile --no-loadscope-reorder

test: lint
	status=0; log=$$(mktemp); export DAGSTER_HOME=$$(mktemp -d); \
	( $(MAKE) --no-print-directory system-packages \
	  && .venv/bin/pytest -ra --durations=15 -n 3 --dist loadfile --no-loadscope-reorder -m integration \
	) > $$log 2>&1 & integration=$$!; \
	.venv/bin/pytest -ra --durations=15 $(PARALLEL) -m "not integration" || status=$$?; \
	wait $$integration || status=$$?; \
	echo "--- integration tests"; cat $$log; rm -rf $$log "$$DAGSTER_HOME"; \
	exit $$status

# The unit layer, for the edit-test loop (about 2 minutes): pure functions, sensors and schedules
# ticked in-process, S3 against moto's server. Modules that run days of the real graph or start
# processes are marked `slow` or `integration` and run only in `make test`.
test-fast: env
	.venv/bin/pytest -ra $(PARALLEL) -m "not integration and not slow"

clean:
	rm -rf .venv .tools .dagster_home data
