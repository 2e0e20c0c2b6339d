"""OpenTelemetry traces (issue 39), from real server processes to a real OTLP receiver (the opentelemetry-proto
messages over HTTP and gRPC): the tree of one request in each engine mode, a client's trace continued, a batch's
links, the logs that name the trace, the sampling ratio, and a collector that fails (requests unaffected, the lost
spans counted)."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.harness.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.harness.serving import free_port
from tests.service.conftest import wait_for

CLASSIFIER, QA = "bert-classification", "bert-qa"
MODELS = f"{CLASSIFIER},{QA}"


def client_trace() -> tuple[str, str, str]:
    """A client's trace id, span id and sampled `traceparent`."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def one(spans: list[ReceivedSpan], name: str, **where: str | None) -> ReceivedSpan:
    found = [s for s in spans if s.name == name and all(getattr(s, k) == v for k, v in where.items())]
    assert len(found) == 1, f"{len(found)} spans {name} {where} among {[s.name for s in spans]}"
    return found[0]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> dict[str, list[ReceivedSpan]]:
    named: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        if span.trace_id == parent.trace_id and span.parent_span_id == parent.span_id:
            named.setdefault(span.name, []).append(span)
    return named


def request_tree_complete(trace_id: str) -> object:
    """The predicate: the trace holds its engine's queue and inference spans (the last to arrive) and the server
    span has ended (exported)."""

    def complete(spans: list[ReceivedSpan]) -> bool:
        names = {s.name for s in spans if s.trace_id == trace_id}
        return {"queue", "inference", "engine"} <= names and any(
            s.kind == "SERVER" for s in spans if s.trace_id == trace_id
        )

    return complete


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver("http") as live:
        yield live


@pytest.fixture(scope="module")
def traced_server(tiny_repository: Path, server_factory, receiver: OtlpReceiver):
    """In-process mode, every trace recorded, gRPC on, JSON access lines."""
    grpc_port = free_port()
    server = server_factory(
        tiny_repository,
        "--models",
        MODELS,
        "--engine-mode",
        "in-process",
        "--grpc-port",
        str(grpc_port),
        "--otlp-endpoint",
        receiver.endpoint,
        "--otlp-service-name",
        "bertserve-test",
        "--access-log",
        "json",
    )
    server.grpc_port = grpc_port
    return server


def test_a_client_trace_is_continued_through_the_whole_request(traced_server, receiver: OtlpReceiver) -> None:
    trace_id, client_span, parent = client_trace()
    with traced_server.client() as client:
        answer = client.post(
            f"/v1/models/{CLASSIFIER}/classify",
            json={"inputs": ["a traced sentence"]},
            headers={"traceparent": parent, "tracestate": "vendor=opaque-1,other=2"},
        )
    assert answer.status_code == 200
    sent = answer.headers["traceparent"]
    assert re.fullmatch(rf"00-{trace_id}-[0-9a-f]{{16}}-01", sent), sent

    spans = receiver.wait_for(request_tree_complete(trace_id))
    server = one(spans, "POST /v1/models/{name}/classify", trace_id=trace_id)
    assert server.kind == "SERVER" and server.parent_span_id == client_span
    assert sent.split("-")[2] == server.span_id  # the response names the server span
    assert server.resource["service.name"] == "bertserve-test"
    assert server.resource["bertserve.process"] == "server"
    attributes = server.attributes
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/v1/models/{name}/classify"
    assert attributes["url.path"] == f"/v1/models/{CLASSIFIER}/classify"
    assert attributes["http.response.status_code"] == 200
    assert attributes["client.address"] == "127.0.0.1"
    assert server.status_code == "UNSET"
    # the client's tracestate, on its request's every span (it was dropped: W3C asks a participant to carry it)
    assert {span.trace_state for span in spans if span.trace_id == trace_id} == {"vendor=opaque-1,other=2"}

    steps = children(spans, server)
    assert {"admission", "tokenize", "engine", "postprocess"} <= set(steps), steps.keys()
    assert steps["admission"][0].attributes["bertserve.admitted"] is True
    engine = steps["engine"][0]
    assert engine.attributes["bertserve.model"] == CLASSIFIER and engine.attributes["bertserve.rows"] == 1
    in_engine = children(spans, engine)
    queue, inference = in_engine["queue"][0], in_engine["inference"][0]
    assert engine.start_ns <= queue.start_ns <= queue.end_ns <= inference.start_ns <= inference.end_ns
    assert inference.end_ns <= engine.end_ns <= server.end_ns
    # the batch: a span of its own trace, linked to the request it served, and linked from its share
    (to_batch,) = inference.links
    batch = one(spans, "batch", span_id=to_batch.span_id)
    assert batch.trace_id == to_batch.trace_id != trace_id and batch.parent_span_id is None
    assert (trace_id, engine.span_id) in {(link.trace_id, link.span_id) for link in batch.links}
    assert batch.attributes["bertserve.model"] == CLASSIFIER
    assert batch.attributes["bertserve.provider"] == "CPUExecutionProvider"
    assert batch.attributes["bertserve.batch.rows"] >= 1 and batch.attributes["bertserve.batch.tokens"] >= 3
    assert batch.attributes["bertserve.batch.padded_tokens"] >= batch.attributes["bertserve.batch.tokens"]
    assert batch.attributes["bertserve.model.version"]

    # the access line names the trace and the server span
    def logged() -> list[dict]:
        lines = [json.loads(line) for line in traced_server.log().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("trace_id") == trace_id]

    assert wait_for(lambda: bool(logged()), timeout=10)
    assert logged()[0]["span_id"] == server.span_id


def test_every_batch_links_the_traced_requests_it_served(traced_server, receiver: OtlpReceiver) -> None:
    traces = [client_trace() for _ in range(6)]

    def send(parent: str) -> int:
        with traced_server.client() as client:
            inputs = {"inputs": ["one", "two", "three"]}
            return client.post(
                f"/v1/models/{CLASSIFIER}/classify", json=inputs, headers={"traceparent": parent}
            ).status_code

    with ThreadPoolExecutor(6) as pool:  # at once: several requests' rows may share a batch
        assert list(pool.map(send, [parent for _, _, parent in traces])) == [200] * 6
    spans = receiver.wait_for(lambda s: all(request_tree_complete(t)(s) for t, _, _ in traces))
    for trace_id, _, _ in traces:
        engine = one(spans, "engine", trace_id=trace_id)
        inferences = children(spans, engine)["inference"]
        assert sum(s.attributes["bertserve.rows"] for s in inferences) == 3  # each row in exactly one batch
        for inference in inferences:
            batch = one(spans, "batch", span_id=inference.links[0].span_id)
            assert (trace_id, engine.span_id) in {(link.trace_id, link.span_id) for link in batch.links}
            assert batch.attributes["bertserve.batch.rows"] >= inference.attributes["bertserve.rows"]


def test_errors_are_visible_as_such(traced_server, receiver: OtlpReceiver) -> None:
    trace_id, _, parent = client_trace()
    with traced_server.client() as client:
        answer = client.post(f"/v1/models/{CLASSIFIER}/classify", json={"inputs": []}, headers={"traceparent": parent})
        missing = client.post(
            "/v1/models/no-such-model/classify", json={"inputs": ["x"]}, headers={"traceparent": parent}
        )
        nowhere = client.get("/no/such/route", headers={"traceparent": parent})
        hf_invalid = client.post(f"/v1/models/{CLASSIFIER}", json={"inputs": 5}, headers={"traceparent": parent})
    assert answer.status_code == 422 and missing.status_code == 404 and nowhere.status_code == 404
    assert hf_invalid.status_code == 422, hf_invalid.text
    spans = receiver.wait_for(lambda s: sum(x.trace_id == trace_id and x.kind == "SERVER" for x in s) == 4)
    statuses = {
        (s.attributes["http.response.status_code"], s.attributes["url.path"]): s
        for s in spans
        if s.trace_id == trace_id and s.kind == "SERVER"
    }
    assert statuses[404, "/v1/models/no-such-model/classify"].attributes["error.type"] == "ModelNotFound"
    # the domain's names, whichever layer answered: the framework's class names ("HTTPException",
    # "RequestValidationError") had been there for an unknown path and a body its schema refused
    assert statuses[404, "/no/such/route"].attributes["error.type"] == "404"
    assert statuses[422, f"/v1/models/{CLASSIFIER}/classify"].attributes["error.type"] == "InvalidInput"
    assert statuses[422, f"/v1/models/{CLASSIFIER}"].attributes["error.type"] == "InvalidInput"
    assert all(s.status_code == "UNSET" for s in statuses.values())  # a 4xx is the client's, not the server's


def test_other_routes_are_traced_by_their_route_and_probes_are_not(traced_server, receiver: OtlpReceiver) -> None:
    trace_id, _, parent = client_trace()
    with traced_server.client() as client:
        info = client.get(f"/v1/models/{QA}", headers={"traceparent": parent})
        probe = client.get("/readyz", headers={"traceparent": parent})
    assert info.status_code == 200 and info.headers["traceparent"].split("-")[1] == trace_id
    assert probe.status_code == 200 and "traceparent" not in probe.headers
    spans = receiver.wait_for(lambda s: any(x.trace_id == trace_id for x in s))
    (span,) = [s for s in spans if s.trace_id == trace_id]
    assert span.name == "GET /v1/models/{name}" and span.attributes["http.route"] == "/v1/models/{name}"


def test_grpc_calls_have_server_spans(traced_server, receiver: OtlpReceiver) -> None:
    trace_id, client_span, parent = client_trace()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{traced_server.grpc_port}")
    text = grpcclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a traced call"], dtype=object))
    result = client.infer(CLASSIFIER, [text], headers={"traceparent": parent, "tracestate": "vendor=grpc-1"})
    assert result.as_numpy("label") is not None
    assert client.is_server_ready(headers={"traceparent": parent})  # a probe: not traced
    spans = receiver.wait_for(request_tree_complete(trace_id))
    server = one(spans, "inference.GRPCInferenceService/ModelInfer", trace_id=trace_id)
    assert server.kind == "SERVER" and server.parent_span_id == client_span and server.trace_state == "vendor=grpc-1"
    assert server.attributes["rpc.system"] == "grpc" and server.attributes["rpc.method"] == "ModelInfer"
    assert server.attributes["rpc.grpc.status_code"] == 0
    steps = children(spans, server)
    assert {"admission", "tokenize", "engine"} <= set(steps), steps.keys()  # admission: as over HTTP
    assert steps["admission"][0].attributes["bertserve.admitted"] is True
    assert not [s for s in spans if s.trace_id == trace_id and s.name.endswith("/ServerReady")]


def test_the_lost_spans_counter_has_its_series_before_any_loss(traced_server) -> None:
    """Without a loss there was no series at all: a rate() over it read no data, not 0, and an alert on its
    increase missed the first loss (the restart counter is made at 0 for that reason too)."""
    with traced_server.client() as client:
        text = client.get("/metrics").text
    for reason in ("queue_full", "export_failed"):
        assert f'bertserve_trace_spans_dropped_total{{reason="{reason}"}} 0.0' in text, reason


def test_two_traceparents_are_no_parent(traced_server, receiver: OtlpReceiver) -> None:
    """W3C trace context's test suite: a request with two traceparent headers starts a trace of its own."""
    first, second = client_trace(), client_trace()
    headers = [("traceparent", first[2]), ("traceparent", second[2])]
    with traced_server.client() as client:
        answer = client.post(f"/v1/models/{CLASSIFIER}/classify", json={"inputs": ["two parents"]}, headers=headers)
    assert answer.status_code == 200
    trace_id = answer.headers["traceparent"].split("-")[1]
    assert trace_id not in (first[0], second[0])
    spans = receiver.wait_for(request_tree_complete(trace_id))
    assert one(spans, "POST /v1/models/{name}/classify", trace_id=trace_id).parent_span_id is None


def test_process_mode_carries_the_trace_across_the_engine_socket(
    tiny_repository: Path, server_factory, receiver: OtlpReceiver
) -> None:
    server = server_factory(
        tiny_repository,
        "--models",
        QA,
        "--engine-mode",
        "process",
        "--frontends",
        "1",
        "--otlp-endpoint",
        receiver.endpoint,
    )
    trace_id, _, parent = client_trace()
    with server.client() as client:
        answer = client.post(
            f"/v1/models/{QA}/qa",
            json={"inputs": [{"question": "Who runs?", "context": "The engine runs in a process of its own."}]},
            headers={"traceparent": parent},
        )
    assert answer.status_code == 200, answer.text
    spans = receiver.wait_for(request_tree_complete(trace_id))
    root = one(spans, "POST /v1/models/{name}/qa", trace_id=trace_id)
    assert root.resource["bertserve.process"] == "frontend"
    engine = children(spans, root)["engine"][0]
    in_engine = children(spans, engine)
    assert {span.resource["bertserve.process"] for group in in_engine.values() for span in group} == {"engine"}
    batch = one(spans, "batch", span_id=in_engine["inference"][0].links[0].span_id)
    assert batch.resource["bertserve.process"] == "engine"
    assert (trace_id, engine.span_id) in {(link.trace_id, link.span_id) for link in batch.links}
    assert root.resource["service.instance.id"] != batch.resource["service.instance.id"]


def test_ratio_zero_and_a_failing_collector(tiny_repository: Path, server_factory) -> None:
    """At ratio 0 a request that starts its own trace is not recorded (no traceparent answered), a client's sampled
    trace still is; a collector that refuses every export costs no request, and the lost spans are counted."""
    with OtlpReceiver("grpc", fail=True) as failing:
        server = server_factory(
            tiny_repository,
            "--models",
            CLASSIFIER,
            "--otlp-endpoint",
            failing.endpoint,
            "--trace-sample-ratio",
            "0",
            "--otlp-timeout-s",
            "1",
        )
        with server.client() as client:
            untraced = client.post(f"/v1/models/{CLASSIFIER}/classify", json={"inputs": ["not sampled"]})
            assert untraced.status_code == 200 and "traceparent" not in untraced.headers
            for _ in range(5):
                trace_id, _, parent = client_trace()
                traced = client.post(
                    f"/v1/models/{CLASSIFIER}/classify", json={"inputs": ["sampled"]}, headers={"traceparent": parent}
                )
                assert traced.status_code == 200 and traced.headers["traceparent"].split("-")[1] == trace_id

            def dropped() -> float:
                text = client.get("/metrics").text
                found = re.search(r'bertserve_trace_spans_dropped_total\{reason="export_failed"\} (\S+)', text)
                return float(found.group(1)) if found else 0.0

            assert wait_for(lambda: dropped() >= 5 * 6, timeout=20), dropped()
            assert failing.exports >= 1
            assert failing.spans() == []
            again = client.post(f"/v1/models/{CLASSIFIER}/classify", json={"inputs": ["still served"]})
            assert again.status_code == 200
