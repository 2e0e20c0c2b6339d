"""Schemathesis against the live OpenAPI of a real server process: generated requests, valid by the schema and
not (positive and negative generation), to every operation; no 5xx, every status and body as documented.

Inference requests go to real models of the right task (a random model name would only ever test the 404), so
the generated bodies reach tokenization, batching and the ONNX sessions."""

from __future__ import annotations

from collections import Counter

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode, checks

from tests.service.conftest import RERANK_MODEL

MODEL_FOR = {
    "classify": "bert-classification",
    "ner": "bert-ner",
    "qa": "distilbert-qa",
    "infer": "bert-classification",
}
# The Hugging Face task API's one path serves every task: its requests go to a model of each task in turn.
TASK_MODELS = ("bert-classification", "bert-ner", "distilbert-qa")
RERANK_PATHS = ("/v1/rerank", "/v2/rerank")
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]
EXAMPLES_PER_OPERATION = 300  # x 4 operations with a body or a path parameter: >= 1,000 cases
# The other protocols' operations (the task API, rerank, the Open Inference Protocol): other shapes of the same
# pipeline's input (tested with their real clients elsewhere); fewer examples keep the run's time in bounds.
ADAPTER_EXAMPLES = 100


def test_generated_requests_get_documented_answers_and_never_a_5xx(tiny_server) -> None:
    live = schemathesis.openapi.from_url(tiny_server.url + "/openapi.json")
    cases: Counter[str] = Counter()
    for result in live.get_all_operations():
        operation = result.ok()
        adapter = (
            operation.path in RERANK_PATHS
            or operation.path.startswith("/v2/")
            or (operation.path, operation.method.upper()) == ("/v1/models/{name}", "POST")
        )

        @settings(
            max_examples=ADAPTER_EXAMPLES if adapter else EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=st.one_of(operation.as_strategy(mode) for mode in GenerationMode))
        def call(case) -> None:
            endpoint = case.path.rsplit("/", 1)[-1]
            if endpoint in MODEL_FOR:
                case.path_parameters = {"name": MODEL_FOR[endpoint]}
            elif case.path == "/v1/models/{name}" and case.method.upper() == "POST":
                case.path_parameters = {"name": TASK_MODELS[sum(cases.values()) % len(TASK_MODELS)]}
            elif case.path in RERANK_PATHS and isinstance(case.body, dict) and "model" in case.body:
                case.body["model"] = RERANK_MODEL
            response = case.call(base_url=tiny_server.url, timeout=60)
            cases[f"{case.method} {case.path}"] += 1
            case.validate_response(response, checks=CHECKS)

        call()
    assert sum(cases.values()) >= 1000, cases
    assert {
        "POST /v1/models/{name}/classify",
        "POST /v1/models/{name}/ner",
        "POST /v1/models/{name}/qa",
        "POST /v1/models/{name}",
        "POST /v1/rerank",
        "POST /v2/rerank",
        "POST /v2/models/{name}/infer",
        "GET /v2/models/{name}",
        "GET /v2/health/ready",
    } <= set(cases)
    with tiny_server.client() as client:  # and the server still serves
        assert client.post("/v1/models/bert-classification/classify", json={"inputs": ["fine"]}).status_code == 200
    # a traceback's own first line: the generated paths are in the access log, and one CI run generated the model
    # name "Traceback" (GET /v1/models/Traceback 404)
    assert "Traceback (most recent call last)" not in tiny_server.log()
