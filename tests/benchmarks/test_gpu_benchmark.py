"""The GPU benchmark's own checks, on the CPU."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks import gpu_benchmark


def test_a_missing_serving_package_is_named_instead_of_a_server_that_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU machine prepared by gpu_prep.sh lacked fastapi-offline: every server exited at start, and the table
    said only 'server exited with 1' for each, after their start-ups had used the run's budget."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *rest: None if name == "fastapi_offline" else real(name, *rest)
    )
    args = gpu_benchmark.parse_args(["--device", "cpu"])
    served = gpu_benchmark.serve(None, [], args, gpu_benchmark.Budget(0), [], 0)  # type: ignore[arg-type]
    assert served == {"error": "not served: missing fastapi_offline"}


def test_a_server_that_did_not_serve_on_cuda_is_refused(tiny_checkpoint, tmp_path) -> None:
    """Issue 29: the served part measured whatever served; a GPU server that came up on the CPU was measured as one.
    Here a real server with --device auto on this CPU build serves on the CPU, and the benchmark says so."""
    from export.pipeline import export_checkpoint
    from tests.harness.serving import start_service

    export_checkpoint(str(tiny_checkpoint("bert", "classification")), "tiny", tmp_path / "models", variants="fp32")
    server = start_service(tmp_path / "models", "--device", "auto", log_path=tmp_path / "server.log")
    try:
        refused = gpu_benchmark.not_on_cuda(server.url)
    finally:
        server.stop()
    assert refused == (
        "refused: not served on CUDA: tiny on CPUExecutionProvider (--device auto: this onnxruntime has no "
        "CUDAExecutionProvider)"
    )
