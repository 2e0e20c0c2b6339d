"""The committed OpenAPI schema is the one the server serves."""

from __future__ import annotations

from service.frontend.http.openapi import DEFAULT_PATH, schema_text


def test_committed_openapi_schema_is_current() -> None:
    assert DEFAULT_PATH.read_text(encoding="utf-8") == schema_text(), "run: python -m service.frontend.http.openapi"


def test_schema_documents_every_endpoint_and_the_error_body() -> None:
    import json

    schema = json.loads(schema_text())
    assert {
        "/v1/models",
        "/v1/models/{name}",
        "/v1/models/{name}/classify",
        "/v1/models/{name}/ner",
        "/v1/models/{name}/qa",
        "/livez",
        "/readyz",
        "/metrics",
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/{name}",
        "/v2/models/{name}/ready",
        "/v2/models/{name}/infer",
    } <= set(schema["paths"])
    responses = schema["paths"]["/v1/models/{name}/qa"]["post"]["responses"]
    assert {"200", "404", "422", "429", "504"} <= set(responses)
    assert "ErrorBody" in schema["components"]["schemas"]
