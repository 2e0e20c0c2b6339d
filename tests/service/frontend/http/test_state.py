"""/readyz says why a server is not ready: each model that holds it back, by status, a failed one with its reason,
on the main port and the probe port alike (it said "not ready; loading: none" with every model failed)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from service.engine.runtime import ModelRuntime
from service.frontend.http.app import create_app
from service.settings import Settings
from tests.harness.serving import free_port
from tests.service.conftest import wait_for

NO_CUDA = "--device cuda: this onnxruntime has no CUDAExecutionProvider"


def readyz(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url + "/readyz", timeout=10)
    except httpx.TransportError:  # not listening yet
        return None


def test_every_model_failed_names_each_with_its_reason_on_both_ports(tiny_repository: Path, server_factory) -> None:
    probe_port = free_port()
    models = "bert-classification,bert-ner"
    flags = ("--device", "cuda", "--models", models, "--probe-port", str(probe_port))
    server = server_factory(tiny_repository, *flags, wait_ready=False)

    def both_failed() -> bool:
        answer = readyz(server.url)
        return answer is not None and answer.json().get("error", "").count(NO_CUDA) == 2

    assert wait_for(both_failed, timeout=60), server.log()
    answer = readyz(server.url)
    assert answer is not None and answer.status_code == 503
    body = answer.json()
    message = body["error"]
    assert message.startswith("not ready; failed: bert-classification ("), message
    assert "), bert-ner (" in message and "loading" not in message, message
    assert body["error_type"] == "unavailable" and body["field"] is None  # the error shape, added to
    assert set(body["not_ready"]) == {"bert-classification", "bert-ner"}
    for model in body["not_ready"].values():
        assert model["status"] == "failed" and NO_CUDA in model["error"], model
        assert f"({model['error']})" in message
    probe = f"http://127.0.0.1:{probe_port}"
    assert wait_for(lambda: (got := readyz(probe)) is not None and got.json() == body, timeout=10), readyz(probe)
    assert readyz(probe).status_code == 503


@pytest.fixture
def held_warm_up(monkeypatch) -> Iterator[threading.Event]:
    """Warm-up (ModelRuntime.warm_up, on each model's batch thread) waits until the event is set: a model that
    takes its time to load."""
    release = threading.Event()
    warm_up = ModelRuntime.warm_up

    def held(runtime: ModelRuntime) -> int:
        release.wait(60)
        return warm_up(runtime)

    monkeypatch.setattr(ModelRuntime, "warm_up", held)
    yield release
    release.set()


def test_a_loading_model_and_a_failed_one_are_named_on_both_ports(oip_repository: Path, held_warm_up) -> None:
    """While one model loads and the other failed (a corrupt ONNX file), /readyz names both; once the first is
    ready, it is 200 with the failed one listed."""
    probe_port = free_port()
    settings = Settings(repository=oip_repository, models=["bert-classification", "broken"], probe_port=probe_port)
    probe = f"http://127.0.0.1:{probe_port}"
    with TestClient(create_app(settings)) as client:
        try:
            answer = client.get("/readyz")
            assert answer.status_code == 503
            body = answer.json()
            message = body["error"]
            assert message.startswith("not ready; failed: broken (") and message.endswith(
                ", loading: bert-classification"
            )
            assert body["not_ready"]["bert-classification"] == {"status": "loading", "error": None}
            assert body["not_ready"]["broken"]["status"] == "failed" and body["not_ready"]["broken"]["error"], body
            assert f"broken ({body['not_ready']['broken']['error']})" in message
            assert wait_for(lambda: (got := readyz(probe)) is not None and got.json() == body, timeout=10)
        finally:
            held_warm_up.set()  # the warm-up goes on (and the server can stop) whatever was found
        assert wait_for(lambda: client.get("/readyz").status_code == 200, timeout=60)
        assert client.get("/readyz").json() == {
            "status": "ready",
            "models": ["bert-classification"],
            "failed": ["broken"],
        }
        assert wait_for(lambda: (got := readyz(probe)) is not None and got.status_code == 200, timeout=10)
