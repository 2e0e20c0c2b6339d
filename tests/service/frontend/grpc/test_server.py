"""The Open Inference Protocol v2 over gRPC against a real server: tritonclient.grpc for every task (answers as the
native API's), and hostile calls with raw grpcio stubs, each answered with a clear status while the server keeps
serving; process mode's front-ends all serve it on one port."""

from __future__ import annotations

import json
import logging
import re
import socket
import struct
import time

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from service.errors import Unauthorized
from service.frontend.grpc.server import Call
from service.frontend.http.auth import ApiKeys
from tests.harness.serving import free_port
from tests.service.conftest import run_service, wait_for
from tests.service.frontend.conftest import API_KEY

TEXTS = ["a gorgeous movie", "dull and far too long"]
AUTH = (("authorization", f"Bearer {API_KEY}"),)
AUTH_HEADERS = dict(AUTH)


def texts(name: str, values: list[str]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=object))
    return tensor


def native(server, path: str, payload: dict, headers: dict | None = None) -> list:
    response = httpx.post(f"{server.http.url}{path}", json=payload, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["results"]


def test_tritonclient_every_task(oip_server) -> None:
    client = grpcclient.InferenceServerClient(url=oip_server.grpc_url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("bert-qa")
    # Triton's contract: a model not served is not ready (an answer, not NOT_FOUND: is_model_ready raised)
    assert not client.is_model_ready("no-such-model") and not client.is_model_ready("bert-qa", model_version="2")
    assert client.get_server_metadata().name == "bertserve"
    metadata = client.get_model_metadata("bert-classification")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("label", "BYTES", [-1, -1]),
        ("score", "FP32", [-1, -1]),
    ]

    result = client.infer("bert-classification", [texts("text", TEXTS)], parameters={"top_k": 3}, request_id="grpc-1")
    assert result.get_response().id == "grpc-1"
    labels, scores = result.as_numpy("label"), result.as_numpy("score")
    for algorithm in ("gzip", "deflate"):  # tritonclient's compression_algorithm: grpcio decodes the message
        compressed = client.infer(
            "bert-classification", [texts("text", TEXTS)], parameters={"top_k": 3}, compression_algorithm=algorithm
        )
        assert compressed.as_numpy("label").tolist() == labels.tolist()
        assert compressed.as_numpy("score").tolist() == scores.tolist()
    assert labels.shape == scores.shape == (2, 3)
    expected = native(oip_server, "/v1/models/bert-classification/classify", {"inputs": TEXTS, "top_k": 3})
    for row, want in enumerate(expected):
        assert [label.decode() for label in labels[row]] == [item["label"] for item in want]
        assert np.allclose(scores[row], [item["score"] for item in want], atol=1e-6)

    ner_texts = ["Peter Blackburn met Maria Lopez in Brussels.", "nothing here"]
    ner = client.infer("bert-ner", [texts("text", ner_texts)], outputs=[grpcclient.InferRequestedOutput("entities")])
    got = [json.loads(value) for value in ner.as_numpy("entities")]
    assert got == native(oip_server, "/v1/models/bert-ner/ner", {"inputs": ner_texts})

    qa = client.infer(
        "bert-qa",
        [texts("question", ["Who met in Brussels?"]), texts("context", ["Peter Blackburn met Maria in Brussels."])],
        parameters={"top_k": 2, "handle_impossible_answer": True},
    )
    payload = {
        "inputs": [{"question": "Who met in Brussels?", "context": "Peter Blackburn met Maria in Brussels."}],
        "top_k": 2,
        "handle_impossible_answer": True,
    }
    assert [json.loads(value) for value in qa.as_numpy("answers")] == native(
        oip_server, "/v1/models/bert-qa/qa", payload
    )


def test_typed_contents_are_answered_in_typed_contents(oip_server) -> None:
    """A client that sends `contents` (not raw bytes) gets `contents` back."""
    with grpc.insecure_channel(oip_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="bert-classification")
        tensor = request.inputs.add(name="text", datatype="BYTES", shape=[2])
        tensor.contents.bytes_contents.extend(text.encode() for text in TEXTS)
        response, call = stub.ModelInfer.with_call(request, metadata=(("x-request-id", "typed-1"),), timeout=30)
    assert dict(call.initial_metadata())["x-request-id"] == "typed-1"
    assert not response.raw_output_contents
    label, score = response.outputs
    assert list(label.shape) == [2, 1] and len(label.contents.bytes_contents) == 2
    assert len(score.contents.fp32_contents) == 2 and 0 < score.contents.fp32_contents[0] <= 1
    metrics = httpx.get(f"{oip_server.http.url}/metrics", timeout=10).text
    assert 'bertserve_requests_total{endpoint="grpc-infer",model="bert-classification",status="200"}' in metrics
    assert '"POST /inference.GRPCInferenceService/ModelInfer" 200' in oip_server.http.log()


def raw_request(model: str, name: str, elements: list[bytes], shape: list[int] | None = None, datatype: str = "BYTES"):
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype=datatype, shape=shape if shape is not None else [len(elements)])
    request.raw_input_contents.append(b"".join(struct.pack("<I", len(e)) + e for e in elements))
    return request


GOOD = raw_request("bert-classification", "text", [b"still serving"])


def hostile_calls() -> list[tuple[str, pb.ModelInferRequest, grpc.StatusCode, str]]:
    ok = "bert-classification"
    million = pb.ModelInferRequest(model_name=ok)
    million.inputs.add(name="text", datatype="BYTES", shape=[1_000_000])
    million.raw_input_contents.append(b"\x00\x00\x00\x00" * 1_000_000)
    typed_million = pb.ModelInferRequest(model_name=ok)
    typed_million.inputs.add(name="text", datatype="BYTES", shape=[1_000_000]).contents.bytes_contents.extend(
        [b""] * 1_000_000
    )
    overrun = raw_request(ok, "text", [b"abc"])
    overrun.raw_input_contents[0] = struct.pack("<I", 1000) + b"abc"
    fp32 = pb.ModelInferRequest(model_name=ok)
    fp32.inputs.add(name="text", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    numbers = pb.ModelInferRequest(model_name=ok)  # read as no data: "shape [2] says 2 elements, the data holds 0"
    numbers.inputs.add(name="text", datatype="BYTES", shape=[2]).contents.int64_contents.extend([1, 2])
    long_value = raw_request(ok, "text", [b"a"])
    long_value.parameters["top_k"].string_param = "x" * 20_000  # echoed whole, its trailer outgrew the client's limit
    both = raw_request(ok, "text", [b"from the raw bytes"])
    both.inputs[0].contents.bytes_contents.append(b"from the contents")
    return [
        ("oversize", raw_request(ok, "text", [b"x" * (9 * 1024 * 1024)]), grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
        (
            "shape and data disagree",
            raw_request(ok, "text", [b"a", b"b"], shape=[3]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "fewer elements than its shape",
        ),
        (
            "more data than shape",
            raw_request(ok, "text", [b"a", b"b"], shape=[1]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "more than the 1 elements",
        ),
        ("length past the end", overrun, grpc.StatusCode.INVALID_ARGUMENT, "runs past the end"),
        (
            "negative shape",
            raw_request(ok, "text", [b"a"], shape=[-1]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "expected [N] or [N, 1]",
        ),
        ("wrong datatype", fp32, grpc.StatusCode.INVALID_ARGUMENT, "it takes BYTES"),
        (
            "wrong datatype, raw",
            raw_request(ok, "text", [b"a"], datatype="INT64"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "it takes BYTES",
        ),
        ("not UTF-8", raw_request(ok, "text", [b"caf\xe9"]), grpc.StatusCode.INVALID_ARGUMENT, "byte 3 is not UTF-8"),
        ("no texts", raw_request(ok, "text", [], shape=[0]), grpc.StatusCode.INVALID_ARGUMENT, "no texts (shape [0])"),
        ("a parameter of 20,000 characters", long_value, grpc.StatusCode.INVALID_ARGUMENT, "top_k must be a whole"),
        (
            "a shape of 5,000 dimensions",
            raw_request(ok, "text", [b"a"], shape=[1] * 5000),
            grpc.StatusCode.INVALID_ARGUMENT,
            "expected [N] or [N, 1]",
        ),
        ("contents and raw contents", both, grpc.StatusCode.INVALID_ARGUMENT, "both contents and raw_input_contents"),
        ("texts as numbers", numbers, grpc.StatusCode.INVALID_ARGUMENT, "datatype BYTES, its data in int64_contents"),
        ("a million empty strings", million, grpc.StatusCode.INVALID_ARGUMENT, "1000000 inputs in one request"),
        ("a million empty strings, typed", typed_million, grpc.StatusCode.INVALID_ARGUMENT, "1000000 inputs"),
        ("unknown model", raw_request("nope", "text", [b"a"]), grpc.StatusCode.NOT_FOUND, "no model named 'nope'"),
        ("a version", pb.ModelInferRequest(model_name=ok, model_version="7"), grpc.StatusCode.NOT_FOUND, "unversioned"),
        ("a failed model", raw_request("broken", "text", [b"a"]), grpc.StatusCode.UNAVAILABLE, "failed to load"),
    ]


@pytest.mark.parametrize("case", range(len(hostile_calls())), ids=[c[0] for c in hostile_calls()])
def test_hostile_calls_get_a_clear_status_and_the_server_keeps_serving(strict_oip_server, case: int) -> None:
    _, request, code, words = hostile_calls()[case]
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(strict_oip_server.grpc_url, options=options) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(request, metadata=AUTH, timeout=30)
        assert error.value.code() == code, error.value.details()
        assert words in (error.value.details() or "")
        assert len(error.value.details() or "") < 500  # what the client sent is quoted cut short, if at all
        assert stub.ModelInfer(GOOD, metadata=AUTH, timeout=30).outputs[0].name == "label"
    assert "Traceback" not in strict_oip_server.http.log()


def test_bytes_that_are_no_message_are_invalid_argument_counted_and_logged_without_a_traceback(oip_server) -> None:
    """grpcio's own reading of the message answered UNKNOWN, with Python's exception class in the message, a
    traceback in the log for each call, and no access line or count."""
    with grpc.insecure_channel(oip_server.grpc_url) as channel:
        for method in ("ModelInfer", "ModelMetadata"):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")  # bytes in, bytes out
            with pytest.raises(grpc.RpcError) as error:
                call(b"\xff\xff\xff\xff not protobuf", timeout=10)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
            assert error.value.details() == f"the request's bytes do not read as a protobuf inference.{method}Request"
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelInfer(GOOD, timeout=30).outputs[0].name == "label"
    log = oip_server.http.log()
    assert "Traceback" not in log and "DecodeError" not in log
    assert '"POST /inference.GRPCInferenceService/ModelInfer" 400' in log
    with oip_server.http.client() as client:
        metrics = client.get("/metrics").text
    assert 'bertserve_requests_total{endpoint="grpc-infer",model="unknown",status="400"}' in metrics


def test_keys_are_required_but_not_by_the_probes(strict_oip_server) -> None:
    with grpc.insecure_channel(strict_oip_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        for metadata in ((), (("authorization", "Bearer not-the-key-at-all-000"),), (("authorization", "Basic x"),)):
            for call, request in (
                (stub.ModelInfer, GOOD),
                (stub.ModelMetadata, pb.ModelMetadataRequest(name="bert-qa")),
            ):
                with pytest.raises(grpc.RpcError) as error:
                    call(request, metadata=metadata, timeout=10)
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stub.ModelMetadata(pb.ModelMetadataRequest(name="bert-qa"), metadata=AUTH, timeout=10).name == "bert-qa"
        # two authorization entries are no key, whichever comes first (the last one counted: a wrong key then the
        # right one was served), as over HTTP
        wrong = ("authorization", "Bearer not-the-key-at-all-000")
        for metadata in ((wrong, *AUTH), (*AUTH, wrong), (*AUTH, *AUTH)):
            with pytest.raises(grpc.RpcError) as error:
                stub.ModelInfer(GOOD, metadata=metadata, timeout=10)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # the key before the message: an anonymous client's bytes are not parsed (they were: INVALID_ARGUMENT)
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        with pytest.raises(grpc.RpcError) as error:
            call(b"\xff\xff not protobuf", timeout=10)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with strict_oip_server.http.client() as client:
        assert client.get("/v2/health/ready").status_code == 200
        assert client.get("/v2/models/bert-qa").status_code == 401
        assert client.get("/v2/models/bert-qa", headers={"authorization": f"Bearer {API_KEY}"}).status_code == 200


def test_the_calls_about_a_model_are_counted_as_rests_are(strict_oip_server) -> None:
    """ModelMetadata and ModelReady were counted nowhere, a 401 or a 404 included, where REST counts GET
    /v2/models/{name} (endpoint info): after a key's rotation, the gRPC clients left on the old key did not show.
    A call refused for its key is the unknown model's (its message is not read), as ModelInfer's is."""

    def counted(model: str, status: str) -> float:
        labels = f'model="{model}"', f'status="{status}"'
        return requests_total(strict_oip_server, *labels, endpoint="grpc-info", headers=AUTH_HEADERS)

    before = counted("bert-qa", "200"), counted("unknown", "401"), counted("unknown", "404")
    with grpc.insecure_channel(strict_oip_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelMetadata(pb.ModelMetadataRequest(name="bert-qa"), metadata=AUTH, timeout=10).name == "bert-qa"
        assert stub.ModelReady(pb.ModelReadyRequest(name="bert-qa"), metadata=AUTH, timeout=10).ready
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="bert-qa"), timeout=10)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="no-such-model"), metadata=AUTH, timeout=10)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
    after = counted("bert-qa", "200"), counted("unknown", "401"), counted("unknown", "404")
    assert [b - a for a, b in zip(before, after, strict=True)] == [2, 1, 1]


def test_a_passed_deadline_is_deadline_exceeded(oip_server) -> None:
    # within --max-qa-windows (1,536 windows a request), and far more than 50 ms of work
    long = raw_request("bert-qa", "question", [b"Where is it?"] * 16)
    long.inputs.add(name="context", datatype="BYTES", shape=[16])
    long.raw_input_contents.append(b"".join(struct.pack("<I", 2000) + b"word " * 400 for _ in range(16)))
    with grpc.insecure_channel(oip_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(long, timeout=0.05)
        assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # A deadline of a few ms may pass before the server's own: grpc cancels the call, and the server had logged
        # a client's cancel (499) from "-" (the peer of a cancelled call reads empty), 1 in 3 at 10 ms
        for number, timeout in enumerate([0.005, 0.01, 0.01, 0.01, 0.015, 0.02] * 2):
            with pytest.raises(grpc.RpcError) as error:
                stub.ModelInfer(long, timeout=timeout, metadata=(("x-request-id", f"deadline-{number}"),))
            # or the door's refusal of so much work while a cancelled call's estimate is still in flight
            assert error.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
        # A deadline of 1-4 ms can end the call before its handler sends its initial metadata: grpc's
        # ExecuteBatchError, whose traceback was logged (CI, under load); it is a 504 line of its own now, its client
        # unknown (grpc gives no peer for a call already ended)
        for number, timeout in enumerate([0.001, 0.002, 0.003, 0.004] * 5):
            with pytest.raises(grpc.RpcError) as error:
                stub.ModelInfer(long, timeout=timeout, metadata=(("x-request-id", f"early-{number}"),))
            assert error.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert stub.ModelInfer(GOOD, timeout=30).outputs[0].name == "label"
    # Every call left the door: one whose deadline had passed before its ticket was made held its work in flight for
    # good, and the server answered every later large request 429 ("1 requests in flight, about 77.6 s of work")
    head = b"[" * 100_000  # refused by the parser (400) once admitted
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))}
    give_up = time.monotonic() + 20  # the cancelled calls' rows leave at the engine's next batch
    with oip_server.http.client() as client:
        while (
            response := client.post("/v2/models/bert-classification/infer", content=head + b"\0" * 4, headers=headers)
        ).status_code == 429:
            assert time.monotonic() < give_up, response.text
            time.sleep(0.5)
    assert response.status_code == 400, response.text
    log = oip_server.http.log()
    assert "Traceback" not in log, log[log.find("Traceback") - 300 : log.find("Traceback") + 2000]
    # No call past its deadline reads as a client's cancel (499), and one cancelled in its handler names its client
    # (read at the start: "-" once grpc has cancelled it). One that ended before its handler could send its initial
    # metadata has no client to name (grpc gives no peer then), so "-" can stand there, under load at 5 ms too.
    logged = re.findall(
        r"\[(?:deadline|early)-\d+\]: (\S+) \"POST /inference.GRPCInferenceService/ModelInfer\" (\d+)", log
    )
    assert {status for _, status in logged} <= {"504", "429"}, log[-3000:]
    assert any(peer.startswith("127.0.0.1:") and status == "504" for peer, status in logged), log[-3000:]


def requests_total(server, *series: str, endpoint: str = "grpc-infer", headers: dict[str, str] | None = None) -> float:
    """The sum of an endpoint's request counts, or of those whose labels hold every one of `series`."""
    text = httpx.get(f"{server.http.url}/metrics", headers=headers, timeout=10).text
    prefix = f'bertserve_requests_total{{endpoint="{endpoint}"'
    lines = [line for line in text.splitlines() if line.startswith(prefix) and all(s in line for s in series)]
    return sum(float(line.split()[-1]) for line in lines)


def access_lines(server, request_ids: list[str], timeout: float = 10) -> dict[str, list[str]]:
    """The status of each ModelInfer access line of these request ids, once each id has one (or the timeout)."""
    pattern = re.compile(r'\[([\w-]+)\]: \S+ "POST /inference.GRPCInferenceService/ModelInfer" (\d+)')
    give_up = time.monotonic() + timeout
    while True:
        found: dict[str, list[str]] = {rid: [] for rid in request_ids}
        for rid, status in pattern.findall(server.http.log()):
            if rid in found:
                found[rid].append(status)
        if all(found.values()) or time.monotonic() > give_up:
            return found
        time.sleep(0.2)


def test_every_call_ended_by_its_deadline_is_counted_and_logged(oip_server) -> None:
    """grpc skips a unary method's handler where the call ended before its message was read, and under load most
    calls ended by a deadline of a few ms were neither counted nor logged (15 calls at once, 2 ms: the client saw
    15 DEADLINE_EXCEEDED, the 504s counted 3): the alert on the 504 rate read a third of them. The methods are
    stream-unary now, which grpc runs before the message is read: every call has its line and its count."""
    long = raw_request("bert-classification", "text", [b"a long sentence about a movie " * 12] * 32)
    # the two together: the deadlines of the small ones pass while the server is busy with the large ones
    shapes = [long, GOOD] * 10
    # a call answered just as its deadline passed is the server's 200 and the client's DEADLINE_EXCEEDED
    statuses = {"DEADLINE_EXCEEDED": {"504", "200"}, "OK": {"200"}, "RESOURCE_EXHAUSTED": {"429"}}
    for round_number, timeout in enumerate((0.002, 0.02)):
        before = requests_total(oip_server)
        ids = [f"storm-{round_number}-{number}" for number in range(len(shapes))]
        with grpc.insecure_channel(oip_server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert stub.ModelInfer(GOOD, timeout=30).outputs[0].name == "label"  # the channel connected
            before += 1
            calls = [
                stub.ModelInfer.future(shape, timeout=timeout, metadata=(("x-request-id", rid),))
                for shape, rid in zip(shapes, ids, strict=True)
            ]
            for call in calls:
                call.exception()  # waits for its end
            codes = [call.code().name for call in calls]
        assert "DEADLINE_EXCEEDED" in codes, codes
        logged = access_lines(oip_server, ids)
        for rid, code in zip(ids, codes, strict=True):
            assert len(logged[rid]) == 1 and logged[rid][0] in statuses[code], (rid, code, logged)
        assert requests_total(oip_server) - before == len(shapes)
    assert "Traceback" not in oip_server.http.log()


def test_a_call_grpc_ended_before_its_message_was_read_is_counted_and_logged(oip_server) -> None:
    """grpc refuses a message past --max-body-bytes itself (RESOURCE_EXHAUSTED, its own words) and ends the call
    before the server reads it: it was neither counted nor logged. The server is not told why grpc ended a call (its
    client's cancel or reset reads the same: an outsider's probe found those counted as 413 when this said so), so it
    is a call its client ended, 499. A call that ends without a whole message (a streaming client's) is the
    client's error."""
    big = raw_request("bert-classification", "text", [b"x" * 1000] * 2200)  # 2.2 MB, past the 2 MiB default
    before = requests_total(oip_server, 'model="unknown"', 'status="499"')
    with grpc.insecure_channel(oip_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(big, timeout=30, metadata=(("x-request-id", "too-large"),))
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (error.value.details() or "")
        streamed = channel.stream_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        with pytest.raises(grpc.RpcError) as error:
            streamed(iter(()), timeout=30, metadata=(("x-request-id", "no-message"),))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details() == (
            "the call's stream ended without a whole request message: a unary call sends one"
        )
        assert stub.ModelInfer(GOOD, timeout=30).outputs[0].name == "label"
    assert access_lines(oip_server, ["too-large", "no-message"]) == {"too-large": ["499"], "no-message": ["400"]}
    assert requests_total(oip_server, 'model="unknown"', 'status="499"') - before == 1


def test_overload_is_resource_exhausted_with_a_retry_hint(strict_oip_server) -> None:
    """Admission's bound (--max-queue-s 0.02) leaves no room for a second large request while one is in flight, once
    the gate has measured a rate. Cold (nothing finished in the last 3 whole seconds: here, a slow machine between
    tests) it admits a batch of requests whatever they cost, and all 16 were answered: so an answer first, on the
    same connection (the same front-end), and a second boundary after it, where the gate's rate counts it."""
    heavy = raw_request("bert-classification", "text", [b"a long sentence about a movie " * 12] * 64)
    with grpc.insecure_channel(strict_oip_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelInfer(GOOD, metadata=AUTH, timeout=30).outputs[0].name == "label"
        time.sleep(1.1)
        calls = [stub.ModelInfer.future(heavy, metadata=AUTH, timeout=60) for _ in range(16)]
        codes, hints = [], []
        for call in calls:
            call.exception()  # waits for its end
            codes.append(call.code())
            hints += [value for key, value in call.trailing_metadata() or () if key == "retry-after"]
        assert grpc.StatusCode.OK in codes and grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert hints and all(int(hint) >= 1 for hint in hints)
        assert stub.ModelInfer(GOOD, metadata=AUTH, timeout=30).outputs[0].name == "label"


def test_a_cold_server_refuses_with_resource_exhausted_and_its_reason(oip_repository, server_factory) -> None:
    """Before the gate has measured a rate it admits `max(8, --max-batch-size)` requests whatever they cost; the
    next got INTERNAL ("internal server error"): the refusal's message formatted the unknown wait as a number."""
    port = free_port()
    server = server_factory(oip_repository, "--grpc-port", str(port), "--max-batch-size", "8")
    heavy = raw_request("bert-classification", "text", [b"a long sentence about a movie " * 12] * 64)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        calls = [stub.ModelInfer.future(heavy, timeout=60) for _ in range(24)]
        refused = []
        for call in calls:
            call.exception()
            assert call.code() in (grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED), call.details()
            if call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                refused.append(call.details())
        assert refused and all("the server is at capacity" in details for details in refused), refused
        assert stub.ModelInfer(GOOD, timeout=30).outputs[0].name == "label"
    assert "Traceback" not in server.log()


def test_tritonclients_class_count_is_invalid_argument_not_ignored(oip_server) -> None:
    client = grpcclient.InferenceServerClient(url=oip_server.grpc_url)
    asked = [grpcclient.InferRequestedOutput("score", class_count=2)]
    with pytest.raises(InferenceServerException, match="class_count") as error:
        client.infer("bert-classification", [texts("text", ["x"])], outputs=asked)
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_tritonclient_raises_the_status(oip_server) -> None:
    client = grpcclient.InferenceServerClient(url=oip_server.grpc_url)
    with pytest.raises(InferenceServerException, match="no model named") as error:
        client.infer("nope", [texts("text", ["x"])])
    assert error.value.status() == "StatusCode.NOT_FOUND"


def test_every_front_end_of_process_mode_serves_grpc(oip_repository, server_factory) -> None:
    port = free_port()
    server = server_factory(
        oip_repository,
        "--engine-mode",
        "process",
        "--frontends",
        "2",
        "--grpc-port",
        str(port),
        "--models",
        "bert-classification",
    )
    answered = 0
    for _ in range(12):  # new connections: the kernel spreads them over the front-ends' sockets (SO_REUSEPORT)
        client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}")
        answered += client.infer("bert-classification", [texts("text", ["fine"])]).as_numpy("label").shape == (1, 1)
        client.close()
    assert answered == 12
    # ready is one front-end's word: the other may still be starting on a loaded machine
    assert wait_for(lambda: server.log().count("gRPC (Open Inference Protocol v2) on") == 2), server.log()

    def every_connection_serving() -> bool:  # grpc.health.v1 from each front-end (a connection of its own each)
        statuses = set()
        for _ in range(12):
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
                health = health_pb2_grpc.HealthStub(channel)
                statuses.add(health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status)
        return statuses == {health_pb2.HealthCheckResponse.SERVING}

    assert wait_for(every_connection_serving, timeout=60), server.log()


def test_a_grpc_port_in_use_is_refused_at_start_with_the_reason(oip_repository) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_service("--repository", str(oip_repository), "--port", str(free_port()), "--grpc-port", str(port))
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "(gRPC)" in done.stderr


def test_tritonclients_priority_is_taken_and_its_timeout_bounds_the_request(oip_server) -> None:
    """tritonclient's `priority` and `timeout` arguments are Triton's request parameters; both were refused as
    parameters 'this model takes' not. A timeout (microseconds) shortens the deadline; 0 is none."""
    client = grpcclient.InferenceServerClient(url=oip_server.grpc_url)
    answered = client.infer("bert-classification", [texts("text", TEXTS)], priority=2, timeout=30_000_000)
    assert answered.as_numpy("label").shape == (2, 1)
    assert client.infer("bert-classification", [texts("text", TEXTS)], timeout=0).as_numpy("label").shape == (2, 1)
    long = [texts("question", ["Where is it?"] * 16), texts("context", ["word " * 400] * 16)]
    with pytest.raises(InferenceServerException) as error:
        client.infer("bert-qa", long, timeout=1)
    assert error.value.status() == "StatusCode.DEADLINE_EXCEEDED", error.value


def test_an_authorization_of_any_characters_is_unauthenticated_not_internal() -> None:
    """grpc hands a metadata value over as text where it reads as UTF-8: "Bearer €..." made the key's latin-1
    encoding raise (INTERNAL, a traceback in the log); as bytes where it does not (e-acute in latin-1)."""
    keys = ApiKeys([API_KEY])
    call = Call("ModelInfer", None, pb.ModelInferRequest, keys, None)  # type: ignore[arg-type]
    for value in (
        f"Bearer \u20ac{API_KEY}",
        f"Bearer {API_KEY}\u20ac",
        b"Bearer \xe9" + API_KEY.encode(),
        "Bearer \ud800",
    ):
        with pytest.raises(Unauthorized, match="the API key is not valid"):
            call._authorize([value])
    call._authorize([f"Bearer {API_KEY}"])
    call._authorize([f"Bearer {API_KEY}".encode()])


def test_metadata_that_is_not_utf8_leaves_no_traceback_in_the_log(caplog) -> None:
    """grpc logs "Invalid encoding on b'...'" with a traceback, at ERROR, for each read of such a value: a client
    could fill the log at will. The record is dropped; the value still reaches the server as bytes."""
    logger = logging.getLogger("grpc._cython.cygrpc")
    with caplog.at_level(logging.INFO):
        logger.error("Invalid encoding on %s", b"Bearer \xe9", exc_info=(ValueError, ValueError("x"), None))
        logger.error("another grpc error")
    assert [record.getMessage() for record in caplog.records] == ["another grpc error"]


def test_the_server_bounds_the_calls_on_one_connection(oip_server) -> None:
    """grpcio advertised no SETTINGS_MAX_CONCURRENT_STREAMS: a client opening streams whose messages never end held
    every one (20 connections x 200 streams: +58 MB, none answered, none refused)."""
    host, port = oip_server.grpc_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # empty SETTINGS
        received = b""
        while len(received) < 9 or len(received) < 9 + int.from_bytes(received[:3], "big"):
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    length, kind = int.from_bytes(received[:3], "big"), received[3]
    assert kind == 4  # the server's first frame: its SETTINGS
    payload = received[9 : 9 + length]
    settings = dict(struct.unpack(">HI", payload[i : i + 6]) for i in range(0, length, 6))
    assert settings.get(3) == 256, settings  # SETTINGS_MAX_CONCURRENT_STREAMS


def test_a_method_not_served_is_unimplemented_with_what_is_served(oip_server) -> None:
    """grpcio's own answer is "Method not found!": the message says which methods are served, for unary and
    streaming calls alike (tritonclient's stream_infer reads it from its callback), and the server keeps serving."""
    client = grpcclient.InferenceServerClient(url=oip_server.grpc_url)
    with pytest.raises(InferenceServerException, match="ModelConfig is not served here") as error:
        client.get_model_config("bert-classification")
    assert error.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer" in str(error.value) and "docs/serving.md" in str(error.value)

    results: list = []
    client.start_stream(callback=lambda result, error: results.append(error))
    client.async_stream_infer("bert-classification", [texts("text", ["x"])])
    wait_for(lambda: results, timeout=10)
    client.stop_stream()
    assert "ModelStreamInfer is not served here" in str(results[0])

    with grpc.insecure_channel(oip_server.grpc_url) as channel:
        call = channel.unary_unary("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        with pytest.raises(grpc.RpcError) as raw:
            call(b"")
    assert raw.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "grpc.reflection.v1alpha.ServerReflection' is not served here" in raw.value.details()

    answer = client.infer("bert-classification", [texts("text", ["x"])])
    assert answer.as_numpy("label").shape[0] == 1  # still serving
