"""Where a model runs, and no silent fall-back to the CPU: --device cuda is CUDA or the model fails; --device auto
says why it is on the CPU; graphs that fail are dropped, never CUDA; every provider of the session is checked.

No GPU exists here. The onnxruntime here is a CPU build: `--device cuda` meets a real onnxruntime without the CUDA
provider, and asking it for the provider anyway gives a real session that fell back to the CPU with a warning (what
onnxruntime-gpu does on a host without a GPU). Where a test needs a session that did start on CUDA, the two calls
into onnxruntime that the runtime makes for it (`available_providers`, `open_session`) are replaced, and nowhere
else: the session is a real CPU session that reports the CUDA provider and CUDA nodes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bertcore.model_config import ModelConfig
from bertcore.rows import Row
from service.engine import runtime
from service.engine.core import EngineCore
from service.engine.runtime import CPU, CUDA, CUDA_UNUSABLE, NO_CUDA_PROVIDER, ModelRuntime, PlacementError
from service.metrics import Metrics
from service.settings import Settings
from service.wire.model_status import ModelStatus
from tests.service.conftest import wait_for

GPU_LIKE = {"shape_buckets": "on", "max_batch_size": 4, "max_batch_tokens": 256, "bucket_width_step": 32}


def open_runtime(entry: Path, **settings: Any) -> ModelRuntime:
    return ModelRuntime(entry, ModelConfig.read(entry), Settings(threads=1, **settings))


class _Subgraph:
    def __init__(self, ep_name: str, nodes: list[Any]) -> None:
        self.ep_name = ep_name
        self._nodes = nodes

    def get_nodes(self) -> list[Any]:
        return self._nodes


class StartedOnCuda:
    """A real CPU session as onnxruntime-gpu would report one that started on CUDA: the CUDA provider listed, and
    every node on CUDA but those of `on_cpu` op types (onnxruntime puts some small ops on the CPU)."""

    def __init__(self, session: Any, on_cpu: tuple[str, ...] = (), providers: tuple[str, ...] = (CUDA, CPU)) -> None:
        self._session = session
        self._on_cpu = on_cpu
        self._providers = list(providers)

    def get_providers(self) -> list[str]:
        return self._providers

    def get_provider_graph_assignment_info(self) -> list[_Subgraph]:
        subgraphs = []
        for subgraph in self._session.get_provider_graph_assignment_info():
            for node in subgraph.get_nodes():
                subgraphs.append(_Subgraph(CPU if node.op_type in self._on_cpu else self._providers[0], [node]))
        return subgraphs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def cuda_machine(
    monkeypatch: pytest.MonkeyPatch,
    *,
    graphs_fail: bool = False,
    cuda_fails: bool = False,
    wrap: Callable[[Any], Any] = StartedOnCuda,
) -> list[dict]:
    """onnxruntime-gpu on a machine with a GPU, at the boundary: the CUDA provider is listed, and a session asked
    for it comes back as `wrap` of a real CPU session, or raises where `graphs_fail` (enable_cuda_graph asked for)
    or `cuda_fails`. Returns the CUDA options of every session asked for."""
    asked: list[dict] = []
    real_open = runtime.open_session

    def open_session(path: Path, options: Any, providers: list[Any]) -> Any:
        cuda = [p for p in providers if isinstance(p, tuple) and p[0] == CUDA]
        if not cuda:
            return real_open(path, options, providers)
        asked.append(dict(cuda[0][1]))
        if cuda_fails:
            raise RuntimeError("CUDA failure 100: no CUDA-capable device is detected")
        if graphs_fail and cuda[0][1].get("enable_cuda_graph") == "1":
            raise RuntimeError("CUDA graph capture is not supported with this provider configuration")
        return wrap(real_open(path, options, [CPU]))

    monkeypatch.setattr(runtime, "available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(runtime, "open_session", open_session)
    return asked


def test_device_cuda_without_the_cuda_provider_fails_the_model_with_the_reason(tiny_repository: Path) -> None:
    """This onnxruntime is a CPU build: --device cuda is refused, not served on the CPU."""
    with pytest.raises(PlacementError, match="--device cuda: this onnxruntime has no CUDAExecutionProvider"):
        open_runtime(tiny_repository / "bert-classification", device="cuda")
    core = EngineCore(
        Settings(device="cuda", threads=1, repository=tiny_repository, models=["bert-classification"]), Metrics()
    )
    core.load()
    model = core.models["bert-classification"]
    assert model.status == ModelStatus.FAILED and model.runtime is None
    assert model.error is not None and "no CUDAExecutionProvider" in model.error


def test_device_cuda_where_onnxruntime_falls_back_to_the_cpu_fails_the_model(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime-gpu on a host without a usable GPU lists the provider, then opens the session on the CPU with a
    warning: a real session asked for CUDA on this CPU build does exactly that."""
    monkeypatch.setattr(runtime, "available_providers", lambda: [CUDA, CPU])
    with pytest.raises(PlacementError) as failure:
        open_runtime(tiny_repository / "bert-ner", device="cuda")
    assert "CUDAExecutionProvider could not start" in str(failure.value)
    assert "opened the session on CPUExecutionProvider alone" in str(failure.value)
    assert "not served on the CPU" in str(failure.value)


def test_device_cuda_where_the_provider_raises_fails_the_model(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = cuda_machine(monkeypatch, cuda_fails=True)
    with pytest.raises(PlacementError, match="no CUDA-capable device is detected"):
        open_runtime(tiny_repository / "bert-qa", device="cuda:1", cuda_graphs="on", **GPU_LIKE)
    # graphs first, then CUDA without them; never the CPU; on the device asked for
    assert asked == [{"device_id": "1", "enable_cuda_graph": "1"}, {"device_id": "1"}]


def test_device_auto_where_cuda_cannot_start_serves_on_the_cpu_and_says_why(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "available_providers", lambda: [CUDA, CPU])
    model = open_runtime(tiny_repository / "bert-qa", device="auto")
    assert model.provider == CPU and model.placement.reason == CUDA_UNUSABLE
    report = model.placement_report()
    assert report["requested"] == "auto" and report["reason"] == CUDA_UNUSABLE
    assert report["why"].startswith("--device auto: CUDAExecutionProvider could not start (RuntimeError: ")
    assert report["nodes"] == {CPU: sum(report["nodes"].values())} and report["nodes"][CPU] > 10
    rows = [Row(np.array([2, 7, 9, 3], dtype=np.int64), np.zeros(4, dtype=np.int64))]
    assert model.run(rows)[0]["start_logits"].shape == (4,)


def test_device_auto_on_a_cpu_build_says_so(tiny_repository: Path) -> None:
    model = open_runtime(tiny_repository / "bert-classification", device="auto")
    assert (model.provider, model.placement.reason, model.placement.note) == (CPU, NO_CUDA_PROVIDER, None)
    assert model.placement_report()["why"] == "--device auto: this onnxruntime has no CUDAExecutionProvider"


def test_a_session_that_lists_cuda_but_runs_no_node_there_is_refused(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only the first provider listed: the graph's nodes must run on CUDA."""

    def wrap(session: Any) -> StartedOnCuda:
        every_op = {node.op_type for sub in session.get_provider_graph_assignment_info() for node in sub.get_nodes()}
        return StartedOnCuda(session, on_cpu=tuple(every_op))

    cuda_machine(monkeypatch, wrap=wrap)
    with pytest.raises(PlacementError, match="placed no node of the graph on CUDAExecutionProvider"):
        open_runtime(tiny_repository / "bert-classification", device="cuda")


def test_nodes_placed_on_the_cpu_are_reported_at_load(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cuda_machine(monkeypatch, wrap=lambda session: StartedOnCuda(session, on_cpu=("Cast", "Gather")))
    with caplog.at_level(logging.WARNING, logger="service.engine.runtime"):
        model = open_runtime(tiny_repository / "bert-classification", device="cuda")
    report = model.placement_report()
    assert model.provider == CUDA and report["reason"] == "requested" and report["device_id"] == 0
    assert set(report["cpu_nodes"]) == {"Cast", "Gather"} and report["nodes"][CPU] == sum(report["cpu_nodes"].values())
    assert report["nodes"][CUDA] > 10
    (line,) = [r.getMessage() for r in caplog.records if "run on the CPU, not CUDA" in r.getMessage()]
    assert re.fullmatch(r"bert-classification: \d+ of \d+ nodes run on the CPU, not CUDA: Cast x\d+, Gather x\d+", line)


def test_graphs_that_cannot_start_are_dropped_and_cuda_kept(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception from enable_cuda_graph: CUDA again without graphs (--device auto, where the CPU was allowed)."""
    asked = cuda_machine(monkeypatch, graphs_fail=True)
    model = open_runtime(tiny_repository / "bert-ner", device="auto", cuda_graphs="on", **GPU_LIKE)
    assert asked == [{"device_id": "0", "enable_cuda_graph": "1"}, {"device_id": "0"}]
    assert model.provider == CUDA and model.graphs is None and model.placement.note is None
    report = model.placement_report()
    assert report["cuda_graphs"] is False
    assert report["cuda_graphs_note"].startswith("CUDA graphs could not start (RuntimeError: CUDA graph capture")
    assert model.warm_up() == len(model.warm_up_shapes())


def test_a_graph_capture_that_fails_at_warm_up_retries_cuda_without_graphs(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session opens with graphs; the capture (binding device buffers, which this CPU build cannot make) fails on
    the first warm-up batch: the model is warmed and served on a CUDA session without graphs."""
    asked = cuda_machine(monkeypatch)
    entry = tiny_repository / "bert-classification"
    model = open_runtime(entry, device="auto", cuda_graphs="on", **GPU_LIKE)
    assert model.graphs is not None
    assert model.warm_up() == len(model.warm_up_shapes())
    assert asked == [{"device_id": "0", "enable_cuda_graph": "1"}, {"device_id": "0"}]
    assert model.provider == CUDA and model.graphs is None
    assert model.placement_report()["cuda_graphs_note"].startswith("CUDA graph capture failed (")
    rows = [Row(np.array([2, 7, 9], dtype=np.int64), np.zeros(3, dtype=np.int64))]
    reference = open_runtime(entry, device="cpu")
    np.testing.assert_allclose(model.run(rows)[0]["logits"], reference.run(rows)[0]["logits"], atol=1e-5)


def test_the_placement_is_in_the_models_state_and_a_metric(tiny_repository: Path) -> None:
    metrics = Metrics()
    core = EngineCore(Settings(threads=1, repository=tiny_repository, models=["bert-qa"]), metrics)
    core.load()
    state = core.model_reports()["bert-qa"]
    assert state["placement"]["reason"] == NO_CUDA_PROVIDER and state["placement"]["provider"] == CPU
    exposition = metrics.exposition().decode()
    assert (
        'bertserve_model_placement{model="bert-qa",provider="CPUExecutionProvider",reason="no_cuda_provider",'
        'requested="auto"} 1.0'
    ) in exposition


def test_a_server_with_device_cuda_and_no_gpu_is_not_ready_and_says_why(tiny_repository: Path, server_factory) -> None:
    server = server_factory(tiny_repository, "--device", "cuda", "--models", "bert-classification", wait_ready=False)
    with server.client() as client:

        def loaded() -> bool:
            try:
                models = client.get("/v1/models")
            except httpx.TransportError:  # not listening yet
                return False
            return models.status_code == 200 and models.json()["models"][0]["status"] != "loading"

        assert wait_for(loaded, timeout=60)
        (model,) = client.get("/v1/models").json()["models"]
        assert model["status"] == "failed" and model["provider"] is None
        assert "--device cuda: this onnxruntime has no CUDAExecutionProvider" in model["error"]
        ready = client.get("/readyz")
        assert ready.status_code == 503
        answer = client.post("/v1/models/bert-classification/classify", json={"inputs": ["x"]})
        assert answer.status_code == 503 and "no CUDAExecutionProvider" in answer.json()["error"]
