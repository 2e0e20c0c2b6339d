"""The GPU suite (`make test-gpu`): tests marked `gpu` run on onnxruntime's CUDA provider, and are skipped with the
reason where this onnxruntime has none (every CPU machine, CI included). `make test-gpu` sets
BERTSERVE_REQUIRE_GPU=1: there a missing provider, GPU or shared data fails the run instead of skipping it."""

from __future__ import annotations

import os

import pytest

CUDA = "CUDAExecutionProvider"
REQUIRED = os.environ.get("BERTSERVE_REQUIRE_GPU") == "1"


def cuda_problem() -> str | None:
    """Why the CUDA provider cannot be used here, or None."""
    try:
        import onnxruntime
    except ImportError:
        return "onnxruntime is not installed"
    providers = onnxruntime.get_available_providers()
    if CUDA not in providers:
        return (
            f"no {CUDA} in this onnxruntime (providers: {', '.join(providers)}): the GPU suite runs on a GPU "
            "machine with onnxruntime-gpu, `make test-gpu` (docs/gpu.md)"
        )
    return None


PROBLEM = cuda_problem()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if PROBLEM is None:
        return
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason=PROBLEM))


def pytest_sessionstart(session: pytest.Session) -> None:
    if REQUIRED and PROBLEM is not None:
        raise pytest.UsageError(f"BERTSERVE_REQUIRE_GPU=1: {PROBLEM}")
