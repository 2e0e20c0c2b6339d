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

MODEL_FOR = {
    "classify": "bert-classification",
    "ner": "bert-ner",
    "qa": "distilbert-qa",
    "infer": "bert-classification",
}
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]
EXAMPLES_PER_OPERATION = 300  # x 4 operations with a body or a path parameter: >= 1,000 cases
# The Open Inference Protocol's operations: its infer body is one more shape of the same pipeline's input (tested
# with the real clients in test_open_inference.py); fewer examples keep the run's time in bounds.
EXAMPLES_PER_V2_OPERATION = 100


def test_generated_requests_get_documented_answers_and_never_a_5xx(tiny_server) -> None:
    live = schemathesis.openapi.from_url(tiny_server.url + "/openapi.json")
    cases: Counter[str] = Counter()
    for result in live.get_all_operations():
        operation = result.ok()

        @settings(
            max_examples=EXAMPLES_PER_V2_OPERATION if operation.path.startswith("/v2") else EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=st.one_of(operation.as_strategy(mode) for mode in GenerationMode))
        def call(case) -> None:
            endpoint = case.path.rsplit("/", 1)[-1]
            if endpoint in MODEL_FOR:
                case.path_parameters = {"name": MODEL_FOR[endpoint]}
            response = case.call(base_url=tiny_server.url, timeout=60)
            cases[f"{case.method} {case.path}"] += 1
            case.validate_response(response, checks=CHECKS)

        call()
    assert sum(cases.values()) >= 1000, cases
    assert {"POST /v1/models/{name}/classify", "POST /v1/models/{name}/ner", "POST /v1/models/{name}/qa"} <= set(cases)
    assert {"POST /v2/models/{name}/infer", "GET /v2/models/{name}", "GET /v2/health/ready"} <= set(cases)
    with tiny_server.client() as client:  # and the server still serves
        assert client.post("/v1/models/bert-classification/classify", json={"inputs": ["fine"]}).status_code == 200
    assert "Traceback" not in tiny_server.log()
