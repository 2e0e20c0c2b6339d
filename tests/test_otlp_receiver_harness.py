"""tests/harness/otlp_receiver.py against the real OpenTelemetry SDK and its OTLP exporters, over both protocols:
what the SDK sends is what the receiver reports (names, ids, parents, links, attributes, resource, status), and a
receiver made to fail makes the exporter report a failure."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tests.harness.otlp_receiver import OtlpReceiver, ReceivedLink, children, render_tree, trace_of


def exporter_for(receiver: OtlpReceiver) -> SpanExporter:
    if receiver.protocol == "http":  # gzip, as the exporter sends it with OTEL_EXPORTER_OTLP_COMPRESSION=gzip
        return HttpExporter(endpoint=receiver.endpoint, timeout=2, compression=Compression.Gzip)
    return GrpcExporter(endpoint=receiver.endpoint, timeout=2)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_receives_the_sdks_spans(protocol) -> None:
    with OtlpReceiver(protocol) as receiver:
        provider = TracerProvider(resource=Resource.create({"service.name": "receiver-test"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter_for(receiver)))
        tracer = provider.get_tracer("tests.otlp")
        attributes: dict[str, Any] = {"http.route": "/v1/x", "rows": 3, "ratio": 0.5, "cached": False, "tags": ["a"]}
        with tracer.start_as_current_span("request", kind=SpanKind.SERVER, attributes=attributes) as request:
            with tracer.start_as_current_span("tokenize") as tokenize:
                tokenize.add_event("truncated", {"tokens": 512})
            with tracer.start_as_current_span("infer", kind=SpanKind.CLIENT) as infer:
                infer.set_status(Status(StatusCode.ERROR, "engine down"))
        parent = request.get_span_context()
        batch = tracer.start_span(
            "batch", context=trace.set_span_in_context(trace.INVALID_SPAN), links=[Link(parent, {"row": 0})]
        )
        batch.end()
        provider.shutdown()

        spans = receiver.wait_for(lambda spans: len(spans) >= 4, timeout=5)
        assert receiver.exports >= 1
        by_name = {span.name: span for span in spans}
        assert sorted(by_name) == ["batch", "infer", "request", "tokenize"]
        root = by_name["request"]
        assert root.trace_id == f"{parent.trace_id:032x}" and root.span_id == f"{parent.span_id:016x}"
        assert root.parent_span_id is None and root.kind == "SERVER" and root.status_code == "UNSET"
        assert root.attributes == attributes
        assert root.resource["service.name"] == "receiver-test" and root.scope == "tests.otlp"
        assert root.end_ns > root.start_ns > 0 and root.duration_ms > 0
        assert [child.name for child in children(spans, root)] == ["tokenize", "infer"]
        assert by_name["tokenize"].parent_span_id == root.span_id and by_name["tokenize"].kind == "INTERNAL"
        assert by_name["tokenize"].events == (("truncated", {"tokens": 512}),)
        failed = by_name["infer"]
        assert (failed.kind, failed.status_code, failed.status_message) == ("CLIENT", "ERROR", "engine down")
        linked = by_name["batch"]
        assert linked.trace_id != root.trace_id and linked.parent_span_id is None
        assert linked.links == (ReceivedLink(root.trace_id, root.span_id, {"row": 0}),)
        assert [span.name for span in trace_of(spans, root.trace_id)] == ["request", "tokenize", "infer"]

        tree = render_tree(spans, root.trace_id, attributes=["http.route", "rows"]).splitlines()
        assert [line.split("  [")[0] for line in tree] == ["request", "  tokenize", "  infer"]
        assert "[receiver-test]" in tree[0] and " ms  http.route=/v1/x rows=3" in tree[0]
        assert tree[2].endswith("status=ERROR: engine down")
        assert render_tree(spans, linked.trace_id).startswith("batch  [receiver-test]  ")

        receiver.clear()
        assert receiver.spans() == [] and receiver.exports == 0
        with pytest.raises(AssertionError, match="0 spans received"):
            receiver.wait_for(lambda spans: bool(spans), timeout=0.2)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_failing_receiver_fails_the_export(protocol) -> None:
    with OtlpReceiver(protocol, fail=True) as receiver:
        span = TracerProvider().get_tracer("tests.otlp").start_span("lost")
        span.end()
        exporter = exporter_for(receiver)
        assert exporter.export([span]) is SpanExportResult.FAILURE  # type: ignore[list-item]
        exporter.shutdown()
        assert receiver.exports >= 1 and receiver.spans() == []


def test_http_answers_only_protobuf_on_its_path() -> None:
    with OtlpReceiver("http") as receiver:
        assert receiver.endpoint == f"http://127.0.0.1:{receiver.port}/v1/traces"
        base = receiver.endpoint.removesuffix("/v1/traces")
        protobuf = {"Content-Type": "application/x-protobuf"}
        assert httpx.post(base + "/v1/metrics", content=b"", headers=protobuf).status_code == 404
        assert httpx.post(receiver.endpoint, json={}).status_code == 415
        empty = httpx.post(receiver.endpoint, content=b"", headers=protobuf)
        assert (empty.status_code, empty.headers["content-type"]) == (200, "application/x-protobuf")
        assert receiver.exports == 1 and receiver.spans() == []
