# Set-up is two commands on a fresh machine: `make run` and `make test`. Both create the environment if missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
REPOSITORY ?= models
DEMO_MODELS := demo-sentiment demo-ner demo-qa
INSTALLED := $(VENV)/.installed
# Every package installed is pinned here (make install and the Docker images); `make lock` rewrites it.
LOCK := constraints.txt
# Where pip finds the torch CPU build the lock pins (torch==X+cpu), if not in its configuration already.
TORCH_INDEX_URL ?=

export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install run demo test lint format openapi clean lock

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Exactly the versions of the lock; torch is its CPU build (+cpu); onnxruntime comes from the cpu extra.
$(INSTALLED): pyproject.toml $(LOCK) | $(VENV)/bin/python
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(LOCK) $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL)) \
		-e '.[cpu,export,dev,loadtest]'
	touch $@

install: $(INSTALLED)

# Re-resolves every dependency (the newest versions pyproject.toml allows) into the lock; LOCK_ARGS=--keep keeps
# the current pins where they still apply. Then `make install test` and, for the images, `make test-container`.
lock: | $(VENV)/bin/python
	$(PY) tools/lock.py $(LOCK_ARGS)

# Builds the demo repository (one small random-weight model per task) unless every demo entry is there.
demo: $(INSTALLED)
	@missing=0; for m in $(DEMO_MODELS); do [ -f $(REPOSITORY)/$$m/model.json ] || missing=1; done; \
	if [ $$missing = 1 ]; then $(PY) -m export demo --repository $(REPOSITORY); \
	else echo "demo repository present in $(REPOSITORY)/ ($(DEMO_MODELS))"; fi

# Serves every entry of the repository on 127.0.0.1:8000 (HOST=0.0.0.0 PORT=... to change); ARGS for more settings.
HOST ?= 127.0.0.1
PORT ?= 8000
run: demo
	$(PY) -m service --repository $(REPOSITORY) --host $(HOST) --port $(PORT) $(ARGS)

test: $(INSTALLED)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest

# The GPU suite (tests/gpu, marker gpu: fp16 on CUDA against fp32 on the CPU on the shared data, CUDA graphs, buckets,
# process mode on CUDA), which `make test` skips where onnxruntime has no CUDA provider. Here a missing provider, GPU or
# shared data fails it. On a lent GPU machine prepared by ../shared/tools/gpu_prep.sh and tests/gpu/pack_shared.sh:
# `BERTSERVE_SHARED=/tmp/shared make test-gpu GPU_PYTHON=python3` (docs/gpu.md).
GPU_PYTHON ?= $(PY)
.PHONY: test-gpu
test-gpu:
	BERTSERVE_REQUIRE_GPU=1 $(GPU_PYTHON) -m pytest -m gpu tests/gpu -v -rs -p no:cacheprovider

lint: $(INSTALLED)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

format: $(INSTALLED)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# Headless Locust load test of the server at URL (loopback only unless ARGS has --allow-remote); report folder in
# LOADTEST_REPORT; ARGS for the load (e.g. ARGS='--shape step --step-users 4 --max-users 32 --max-seconds 90').
URL ?= http://127.0.0.1:8000
LOADTEST_REPORT ?= reports/loadtest
.PHONY: loadtest
loadtest: $(INSTALLED)
	$(PY) -m loadtests --url $(URL) --report $(LOADTEST_REPORT) $(ARGS)

# Builds the cpu, demo, gpu and export images and checks them in running containers (tests/container/): every
# endpoint, /metrics, non-root, SIGTERM during a burst, export of a real checkpoint, the gpu image's CPU fallback,
# docker compose. Not part of `make test`. Where `docker` does not work, ../shared/container/setup.sh provides it
# (podman). ARGS for the script (e.g. ARGS=--skip-gpu); TORCH_WHEELS=DIR hands the export stage a local torch wheel.
CONTAINER_SETUP ?= ../shared/container/setup.sh
CONTAINER_PATH := $(abspath $(dir $(CONTAINER_SETUP))bin):$(PATH)
.PHONY: test-container
test-container:
	@PATH="$(CONTAINER_PATH)" docker info >/dev/null 2>&1 || bash $(CONTAINER_SETUP)
	PATH="$(CONTAINER_PATH)" $(PYTHON) tests/container/check_container.py $(ARGS)

openapi: $(INSTALLED)
	$(PY) -m service.frontend.http.openapi

clean:
	rm -rf $(VENV) $(REPOSITORY)/demo-* .pytest_cache .ruff_cache
