"""Each model's own gate (service.frontend.admission.ModelGates) in a whole front-end: a model whose gate is full is
refused (429, with the model's name and Retry-After) on every route that reaches it, whether the door knew the model
(a path's name) or only the pipeline did (Cohere's rerank names its model in the body), while the other models are
answered; a self-test is never refused."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from service.frontend.admission import Admission
from service.frontend.http.app import create_app
from service.settings import Settings
from tests.service.conftest import RERANK_MODEL, wait_for

CLASSIFIER = "bert-classification"
OTHER = "bert-ner"


def fill(settings: Settings, gate) -> list[Admission]:
    """Hold a cold gate's floor: as many requests as it admits before it knows a rate, each of a batch's tokens."""
    held = [gate.try_enter(settings.admission_floor_tokens) for _ in range(settings.admission_cold_requests)]
    assert all(share is not None for share in held)
    assert gate.try_enter(1) is None
    return held


def test_a_full_model_gate_refuses_that_models_requests_on_every_route_and_no_others(tiny_repository: Path) -> None:
    settings = Settings(repository=tiny_repository, models=[CLASSIFIER, OTHER, RERANK_MODEL])
    app = create_app(settings)
    with TestClient(app) as client:
        assert wait_for(lambda: client.get("/readyz").status_code == 200)
        gates = app.state.server.pipeline.model_gates
        held = fill(settings, gates.gate(CLASSIFIER)) + fill(settings, gates.gate(RERANK_MODEL))
        native = client.post(f"/v1/models/{CLASSIFIER}/classify", json={"inputs": ["a fine film"]})
        task_api = client.post(f"/v1/models/{CLASSIFIER}", json={"inputs": "a fine film"})
        oip = client.post(
            f"/v2/models/{CLASSIFIER}/infer",
            json={"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a fine film"]}]},
        )
        rerank = client.post("/v1/rerank", json={"model": RERANK_MODEL, "query": "q", "documents": ["d1", "d2"]})
        for refused, model in ((native, CLASSIFIER), (task_api, CLASSIFIER), (oip, CLASSIFIER), (rerank, RERANK_MODEL)):
            assert refused.status_code == 429, refused.text
            assert f"model {model} is at capacity" in refused.text and "retry shortly" in refused.text
            assert int(refused.headers["retry-after"]) >= 1
        assert client.post(f"/v1/models/{OTHER}/ner", json={"inputs": ["Paris is nice"]}).status_code == 200
        assert app.state.server.admission.in_flight == 0  # the refused requests left the front-end's gate too
        for share in held:
            share.leave(completed=False)
        assert client.post(f"/v1/models/{CLASSIFIER}/classify", json={"inputs": ["a fine film"]}).status_code == 200
        assert (
            client.post("/v1/rerank", json={"model": RERANK_MODEL, "query": "q", "documents": ["d"]}).status_code == 200
        )
        metrics = client.get("/metrics").text
        assert f'bertserve_model_admission_share{{model="{CLASSIFIER}"}} 1.0' in metrics
        assert f'bertserve_model_admission_share{{model="{OTHER}"}} 1.0' in metrics


def test_a_self_test_passes_a_full_model_gate(tiny_repository: Path) -> None:
    """A version must be tested to serve whatever the load on the one before: a reload's self-test meets no gate."""
    settings = Settings(repository=tiny_repository, models=[CLASSIFIER])
    app = create_app(settings)
    with TestClient(app) as client:
        assert wait_for(lambda: client.get("/readyz").status_code == 200)
        state = app.state.server
        fill(settings, state.pipeline.model_gates.gate(CLASSIFIER))
        model = state.registry.get(CLASSIFIER)
        client.portal.call(state.pipeline.self_test, model)  # raises if the gate refused it
