"""grpc.health.v1.Health on the gRPC port against a real server, with grpcio-health-checking's own client (as
grpc_health_probe and Kubernetes' gRPC probes call it): SERVING for the server and each ready model, NOT_SERVING for
a failed model, NOT_FOUND for a name it does not know, no key needed, and NOT_SERVING once a drain begins, pushed to a
Watch stream that then ends with the server rather than holding its drain."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.harness.serving import ServiceProcess, free_port
from tests.service.lifecycle import publish

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
INFERENCE_SERVICE = "inference.GRPCInferenceService"
LIVENESS = "bertserve.Liveness"  # what KServe's v2 variant's liveness probe asks (deploy/kubernetes/kserve-v2)


def check(channel: grpc.Channel, service: str) -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    return health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status


def test_the_server_and_each_ready_model_are_serving_a_failed_one_is_not(oip_server) -> None:
    with grpc.insecure_channel(oip_server.grpc_url) as channel:
        for service in ("", INFERENCE_SERVICE, LIVENESS, "bert-classification", "bert-ner", "bert-qa"):
            assert check(channel, service) == SERVING, service
        assert check(channel, "broken") == NOT_SERVING  # its ONNX file is corrupt: it failed to load
        with pytest.raises(grpc.RpcError) as error:
            check(channel, "nope")
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        assert "unknown service 'nope'" in (error.value.details() or "")


def test_a_watch_says_the_status_at_once_and_an_unknown_name_is_service_unknown(oip_server) -> None:
    with grpc.insecure_channel(oip_server.grpc_url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service, first in (("", SERVING), ("bert-qa", SERVING), ("broken", NOT_SERVING), ("nope", SERVICE_UNKNOWN)):
            stream = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=30)
            assert next(stream).status == first, service
            stream.cancel()  # the protocol keeps the stream open, an unknown name's too: it may become known


def test_health_needs_no_key_on_a_server_that_needs_one(strict_oip_server) -> None:
    with grpc.insecure_channel(strict_oip_server.grpc_url) as channel:
        assert check(channel, "") == SERVING
        assert check(channel, "bert-qa") == SERVING
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert next(stream).status == SERVING
        stream.cancel()


@contextmanager
def request_in_flight(server: ServiceProcess) -> Iterator[socket.socket]:
    """A classify request whose body never comes, open until the block ends: a drain waits for it. `Expect:
    100-continue` makes the server say when the request is in the app and waiting for its body."""
    body = json.dumps({"inputs": ["held"]}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = (
            "POST /v1/models/bert-classification/classify HTTP/1.1\r\n"
            f"host: {host}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "expect: 100-continue\r\n\r\n"
        )
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(1024)  # bounded by the socket's timeout
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 100"), answer
        yield sock


def test_a_drain_is_not_serving_at_once_and_a_watch_stream_does_not_hold_it(oip_repository, server_factory) -> None:
    """SIGTERM with a request in flight: until it is over, the gRPC port still answers, and everything it serves is
    NOT_SERVING but liveness (a watcher hears it at once); once it is over, the server stops within seconds though a
    Watch stream is open and --drain-timeout-s is a minute (grpc's stop waits for the calls in flight: a stream that
    never ends would hold it that long)."""
    port = free_port()
    flags = ("--grpc-port", str(port), "--models", "bert-classification", "--drain-timeout-s", "60")
    server = server_factory(oip_repository, *flags)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        assert next(stream).status == SERVING
        assert check(channel, "bert-classification") == SERVING
        with request_in_flight(server):
            server.process.send_signal(signal.SIGTERM)
            assert next(stream).status == NOT_SERVING  # bounded by the call's timeout
            for service in ("", INFERENCE_SERVICE, "bert-classification"):
                assert check(channel, service) == NOT_SERVING, service
            assert check(channel, LIVENESS) == SERVING  # a draining server is alive: no restart mid-drain
        ended = time.monotonic()
        assert list(stream) == []  # the stream ends (OK) when the server stops: NOT_SERVING was its last word
        assert server.process.wait(30) in (0, -signal.SIGTERM), server.log()
        assert time.monotonic() - ended < 20, server.log()
    assert "Traceback" not in server.log()


def test_a_models_watch_follows_it_as_it_is_loaded_and_unloaded(tiny_repository, tmp_path, server_factory) -> None:
    """--model-control explicit: a Watch on a model not loaded yet says SERVICE_UNKNOWN, then SERVING once an admin
    loads it, then, once unloaded, no longer SERVING; one stream, pushed each change as it happens."""
    repository = tmp_path / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification")
    publish(repository, "b", tiny_repository / "bert-ner")
    admin_keys = tmp_path / "admin.keys"
    admin_keys.write_text("admin-key-0123456789abcdef\n")
    admin_keys.chmod(0o600)
    grpc_port = free_port()
    server = server_factory(
        repository,
        *("--engine-mode", "in-process", "--grpc-port", str(grpc_port)),
        *("--model-control", "explicit", "--model", "a", "--admin-api-key-file", str(admin_keys)),
    )
    admin = {"Authorization": "Bearer admin-key-0123456789abcdef"}
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="b"), timeout=60)
        assert next(stream).status == SERVICE_UNKNOWN
        with server.client(headers=admin, timeout=60) as client:
            assert client.post("/v2/repository/models/b/load").status_code == 200
            seen = []
            while not seen or seen[-1] != SERVING:  # it may say NOT_SERVING while it loads and self-tests
                seen.append(next(stream).status)
            assert client.post("/v2/repository/models/b/unload").status_code == 200
            assert next(stream).status in (NOT_SERVING, SERVICE_UNKNOWN)
        stream.cancel()
