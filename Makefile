# llm-batch-operator — developer entry points.
#   make demo   the main job (see README)
#   make test   lint + verify + the whole test suite (what .ci/run runs)
# Feature areas add their own targets in hack/mk/*.mk and append to TEST_PREREQS.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
UV := $(BIN)/uv
CACHE := $(CURDIR)/.cache
# Caches shared between clones of the repo on one machine (CI clones afresh each run).
SHARED_CACHE ?= $(HOME)/.cache/llmbatch
export PATH := $(CACHE)/bin:$(BIN):$(PATH)
export LLMBATCH_CACHE := $(SHARED_CACHE)

TEST_PREREQS := venv
PYTEST_ARGS ?=

-include hack/mk/*.mk

.PHONY: help venv lock lint fmt verify gen test test-unit demo clean
help:
	@echo "make demo      run the main job (README)"
	@echo "make test      lint, verify and run every test tier"
	@echo "make lint      ruff, mypy --strict, import-linter, deptry"
	@echo "make verify    fail when generated files (CRDs, chart, schema) drift"
	@echo "make gen       regenerate CRDs, chart CRD templates and values schema"
	@echo "make lock      re-resolve hack/requirements-dev.lock (the dev venv's versions)"

# The dev venv gets the versions of hack/requirements-dev.lock (a fresh machine resolves what the
# tests last passed with, not what the index published today); `make lock` refreshes it.
venv: $(VENV)/.stamp-base
$(VENV)/.stamp-base: pyproject.toml hack/requirements-dev.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "uv==$(UV_VERSION)"
	$(UV) pip install -q --python $(BIN)/python -e '.[dev]' -c hack/requirements-dev.lock
	touch $@

# Re-resolve pyproject's dependencies (runtime + dev) into hack/requirements-dev.lock, keeping
# the versions it already pins and agreeing with the engine stack's exact pins (which
# hack/install-vllm.sh installs with --no-deps on top). LOCK_UPGRADE=1 takes the newest instead.
lock: | $(VENV)/.stamp-base
	$(UV) pip compile -q pyproject.toml --extra dev -c hack/requirements-vllm.txt \
		--python-version 3.11 --custom-compile-command "make lock" \
		$(if $(LOCK_UPGRADE),--upgrade) -o hack/requirements-dev.lock

lint: venv
	$(BIN)/ruff check operator tests hack benchmarks
	$(BIN)/ruff format --check operator tests hack benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/deptry operator

fmt: venv
	$(BIN)/ruff format operator tests hack benchmarks
	$(BIN)/ruff check --fix operator tests hack benchmarks

gen: venv
	$(BIN)/python hack/gen_crds.py
	$(BIN)/python hack/gen_chart.py
	$(BIN)/python hack/grafana/gen_dashboard.py
	$(BIN)/python hack/gen_metrics_doc.py

verify: venv
	$(BIN)/python hack/gen_crds.py --check
	$(BIN)/python hack/gen_chart.py --check
	$(BIN)/python hack/grafana/gen_dashboard.py --check
	$(BIN)/python hack/gen_metrics_doc.py --check

test-unit: venv
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

test: $(TEST_PREREQS)
	$(MAKE) lint
	$(MAKE) verify
	$(BIN)/pytest tests --ignore=tests/faults $(PYTEST_ARGS)
	# The fault suite owns its cluster and operator: its own session (hack/mk/faults.mk).
	$(BIN)/pytest tests/faults $(PYTEST_ARGS)

demo: venv vllm models testcluster kubectl
	hack/demo.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
