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
