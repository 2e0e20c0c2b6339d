# Set-up is two commands on a fresh machine: `make run` and `make test`. Both create the environment if missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
REPOSITORY ?= models
DEMO_MODELS := demo-sentiment demo-ner demo-qa
INSTALLED := $(VENV)/.installed
# Every package installed is pinned here (make install and the Docker images), each pin a release PyPI serves
# (`make test` checks it there); `make lock` rewrites it.
LOCK := constraints.txt
# The PyTorch CPU index's URL, to install the CPU build of torch (see install below); empty: PyPI's build.
TORCH_INDEX_URL ?=

export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install run demo test lint format openapi clean lock

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Exactly the versions of the lock; onnxruntime comes from the cpu extra. torch: the lock pins PyPI's version
# (torch==2.13.0), which a CPU build (2.13.0+cpu) matches too, and pip takes that build wherever one is offered:
#   make install TORCH_INDEX_URL=<the PyTorch CPU index>   the CPU build, one 192 MB wheel
#   make install                                           PyPI alone: its CUDA build (it runs on a CPU as well),
#                                                          527 MB plus 2.2 GB of nvidia-* and other CUDA wheels
# A machine whose pip configuration has the CPU wheel in a find-links folder gets the CPU build either way.
$(INSTALLED): pyproject.toml $(LOCK) | $(VENV)/bin/python
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(LOCK) $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL)) \
		-e '.[cpu,export,dev,loadtest]'
	touch $@

install: $(INSTALLED)

# Re-resolves every dependency (the newest versions pyproject.toml allows) into the lock, against PyPI alone (this
# machine's pip configuration ignored, so no local build enters it); LOCK_ARGS=--keep keeps the current pins where
# they still apply. Then `make install test` and, for the images, `make test-container`.
lock: | $(VENV)/bin/python
	$(PY) tools/lock.py $(LOCK_ARGS)

# Builds the demo repository unless every demo entry is there: one model per task, the hub's small fine-tuned
# checkpoints (export/demo_hub.py) where it is reachable, else random weights, said in one line. This file's
# HF_HUB_OFFLINE=1 (tests, everything else) is dropped for it; one you set (environment or command line) is kept.
# DEMO_SOURCE=hub|random|auto (default auto); DEMO_CHECKPOINTS='demo-ner=OWNER/REPO[@REV],...' to pick others.
# To swap a random demo for the hub's: rm -r $(REPOSITORY)/demo-*, then make run.
DEMO_SOURCE ?= auto
DEMO_CHECKPOINTS ?=
DEMO_ENV = $(if $(filter file,$(origin HF_HUB_OFFLINE)),env -u HF_HUB_OFFLINE)
demo: $(INSTALLED)
	@missing=0; for m in $(DEMO_MODELS); do [ -f $(REPOSITORY)/$$m/model.json ] || missing=1; done; \
	if [ $$missing = 1 ]; then $(DEMO_ENV) $(PY) -m export demo --repository $(REPOSITORY) --source $(DEMO_SOURCE) \
		$(if $(DEMO_CHECKPOINTS),--checkpoints '$(DEMO_CHECKPOINTS)'); \
	else echo "demo repository present in $(REPOSITORY)/ ($(DEMO_MODELS))"; fi

# Builds the demo if an entry is missing (above), then serves every entry of the repository on 127.0.0.1:8000
# (make run HOST=0.0.0.0 PORT=...; else BERTSERVE_HOST and BERTSERVE_PORT where set, as for every setting); ARGS for
# more settings. A HOST from the environment is not read: tcsh and some images set it to the machine's name.
ifneq ($(origin HOST),command line)
HOST := $(or $(BERTSERVE_HOST),127.0.0.1)
endif
PORT ?= $(or $(BERTSERVE_PORT),8000)
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
# shared data fails it. For a lent GPU machine, tests/gpu/device_pack.sh packs what it lacks and prints the runs to
# make; the last, tests/gpu/device_run.sh, runs this suite there and then the NER/QA benchmark (docs/gpu.md).
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
