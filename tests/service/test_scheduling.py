"""Batching, overload, deadlines and draining, through real HTTP against real server processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import sleeping_session
from benchmarks.frontend_cost import SLEEP_VARIABLE, SLEEPING_SITECUSTOMIZE
from tests.harness.serving import ROOT
from tests.service.conftest import wait_for

SENTENCES = [f"sentence number {i} is {'great' if i % 2 else 'awful'} and {'long ' * (i % 9)}" for i in range(48)]


def metric(server, name: str, **labels: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_concurrent_clients_get_their_own_answers_with_fewer_inference_calls(tiny_repository, server_factory):
    server = server_factory(tiny_repository, "--max-wait-ms", "20", "--models", "bert-classification")
    with server.client() as client:  # one by one: the reference answers
        expected = [
            client.post("/v1/models/bert-classification/classify", json={"inputs": [s]}).json() for s in SENTENCES
        ]
    batches_before = metric(server, "bertserve_batch_size_count", model="bert-classification")

    def ask(sentence: str) -> dict:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            return client.post("/v1/models/bert-classification/classify", json={"inputs": [sentence]}).json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, SENTENCES))
    batches = metric(server, "bertserve_batch_size_count", model="bert-classification") - batches_before
    for got, want in zip(answers, expected, strict=True):
        assert got["results"][0][0]["label"] == want["results"][0][0]["label"]
        assert abs(got["results"][0][0]["score"] - want["results"][0][0]["score"]) < 1e-5
    assert batches < len(SENTENCES), f"{batches} inference calls for {len(SENTENCES)} requests"


def test_one_request_with_many_inputs_is_spread_over_batches_in_order(tiny_repository, server_factory):
    server = server_factory(tiny_repository, "--max-batch-size", "4", "--models", "roberta-classification")
    with server.client() as client:
        together = client.post("/v1/models/roberta-classification/classify", json={"inputs": SENTENCES[:20]})
        alone = [
            client.post("/v1/models/roberta-classification/classify", json={"inputs": [s]}).json()
            for s in SENTENCES[:20]
        ]
    assert int(together.headers["x-inference-calls"]) >= 5
    for got, want in zip(together.json()["results"], alone, strict=True):
        assert got[0]["label"] == want["results"][0][0]["label"]
        assert abs(got[0]["score"] - want["results"][0][0]["score"]) < 1e-5


def test_full_queue_answers_429_with_retry_after(tiny_repository, server_factory):
    flags = ("--max-queue-rows", "8", "--max-inputs-per-request", "8", "--max-batch-size", "1")
    server = server_factory(tiny_repository, *flags, "--models", "bert-ner")
    text = "Peter Blackburn met Maria Lopez in Brussels on Tuesday. " * 3
    statuses: list[int] = []
    retry_after: list[str] = []
    lock = threading.Lock()
    # all at once: 12 x 4 rows against a queue of 8. Threads that started one by one on a busy machine (the whole
    # suite's idle servers around) once arrived so far apart that the queue never filled and no 429 came.
    together = threading.Barrier(12)

    def ask(_: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            client.get("/livez")  # connected before the barrier: the requests leave together
            together.wait(30)
            response = client.post("/v1/models/bert-ner/ner", json={"inputs": [text] * 4})
        with lock:
            statuses.append(response.status_code)
            if response.status_code == 429:
                retry_after.append(response.headers.get("retry-after", ""))
                assert response.json()["error_type"] == "overloaded"

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(ask, range(24)))
    assert set(statuses) <= {200, 429}
    assert statuses.count(429) > 0 and statuses.count(200) > 0
    assert all(value.isdigit() for value in retry_after)
    assert httpx.get(server.url + "/readyz").status_code == 200


def test_deadline_answers_504_and_the_server_goes_on(tiny_repository, server_factory):
    server = server_factory(
        tiny_repository, "--request-timeout-s", "0.05", "--max-batch-size", "1", "--models", "albert-ner"
    )
    long_text = "Peter Blackburn met Maria Lopez in Brussels on Tuesday to talk about trade. " * 40
    with server.client() as client:
        response = client.post("/v1/models/albert-ner/ner", json={"inputs": [long_text] * 64})
        assert response.status_code == 504, response.text
        assert response.json()["error_type"] == "timeout"
        assert client.post("/v1/models/albert-ner/ner", json={"inputs": ["short"]}).status_code == 200


@dataclass
class BurstOutcome:
    sent_s: float  # when the request left, relative to the SIGTERM (negative: before it)
    status: int | str  # the HTTP status, or why no answer came (the listener had closed)
    error: str | None = None  # the error body's message, for a non-200
    request_id: str = ""  # sent as x-request-id: the server's access line for it, if the app ever saw it


def sigterm_during_burst(server, model: str, stop: Callable[[], None] | None = None) -> list[BurstOutcome]:
    """16 QA requests of 8 long inputs from 8 clients; SIGTERM once the first answer is in (so that the burst is
    surely in the server, however slowly this machine runs the clients) and at least 0.3 s in (`stop`: another
    signal, sent its own way). Each request's outcome and when it left."""
    context = "Peter Blackburn met Maria Lopez in Brussels on Tuesday to talk about trade and lamb. " * 6
    body = {"inputs": [{"question": "Who met?", "context": context}] * 8}
    sent: list[BurstOutcome] = []
    lock = threading.Lock()
    first_answer = threading.Event()
    # Made before the burst: a client's set-up (its TLS context) takes tens of ms of the GIL on a loaded machine.
    clients = [httpx.Client(base_url=server.url, timeout=30) for _ in range(8)]

    def ask(index: int) -> None:
        left = time.perf_counter()
        error, request_id = None, f"burst-{index}-{left:.6f}"
        try:
            response = clients[index % 8].post(
                f"/v1/models/{model}/qa", json=body, headers={"x-request-id": request_id}
            )
            outcome: int | str = response.status_code
            if response.status_code != 200:
                error = response.json().get("error")
            first_answer.set()
        except httpx.TransportError as exc:  # refused: arrived after the listener closed
            outcome = type(exc).__name__
        with lock:
            sent.append(BurstOutcome(left, outcome, error, request_id))

    try:
        with ThreadPoolExecutor(8) as pool:
            started = time.perf_counter()
            futures = [pool.submit(ask, i) for i in range(16)]
            first_answer.wait(30)
            time.sleep(max(0.0, 0.3 - (time.perf_counter() - started)))
            signalled = time.perf_counter()
            if stop is None:
                server.process.send_signal(signal.SIGTERM)
            else:
                stop()
            for future in futures:
                future.result()
    finally:
        for client in clients:
            client.close()
    for outcome in sent:
        outcome.sent_s -= signalled
    return sent


def assert_admitted_work_finished(outcomes: list[BurstOutcome], log: str) -> None:
    """Every request that was admitted is answered 200; the others were refused at the door, never dropped mid-work:
    503 "shutting down" after the SIGTERM, or 429 "at capacity" (admission). A request with no answer never reached
    the app (refused, or reset in the listener's backlog as it closed): the server's log has no access line for
    it, which it would have for anything the app answered."""
    assert any(o.status == 200 for o in outcomes), outcomes
    for outcome in outcomes:
        if outcome.status == 503:
            assert outcome.error and "shutting down" in outcome.error, outcome
        elif outcome.status == 429:
            assert outcome.error and "at capacity" in outcome.error, outcome
        elif isinstance(outcome.status, int):
            assert outcome.status == 200, outcome
        else:
            assert f"[{outcome.request_id}]" not in log, (outcome, "the app answered it, the client never heard")


def test_sigterm_finishes_admitted_work_then_exits(tiny_repository, server_factory):
    server = server_factory(
        tiny_repository, "--max-batch-size", "2", "--max-queue-s", "25", "--models", "distilbert-qa"
    )
    outcomes = sigterm_during_burst(server, "distilbert-qa")
    # a drained stop is a clean exit (uvicorn would raise the signal again and die of it: 143)
    assert server.process.wait(30) == 0
    assert_admitted_work_finished(outcomes, server.log())
    assert "Application shutdown complete" in server.log()


def test_a_client_that_leaves_a_long_request_frees_its_place_at_once(tiny_repository, server_factory, tmp_path):
    """A request of many batches whose client went away kept waiting for its rows that were dropped: answered (to
    nobody) at --request-timeout-s, counted a 504 (BertserveErrors) and holding its admission share all along (a
    light client got 429s meanwhile). It is over at the next batch now: 499, nothing failed. The engine's sessions
    sleep 50 ms a batch (benchmarks.sleeping_session): the request is surely in the middle when its client leaves."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLEEPING_SITECUSTOMIZE)
    sleeping_session.copy_beside(site)
    env = {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}", SLEEP_VARIABLE: "0.05,0"}
    flags = ("--models", "bert-ner", "--engine-mode", "process", "--max-batch-size", "2", "--access-log", "json")
    server = server_factory(tiny_repository, *flags, env=env)
    assert sleeping_session.MARK in server.log()
    host, port = server.url.removeprefix("http://").split(":")

    def leave_after(request_id: str, texts: int, seconds: float) -> None:
        body = json.dumps({"inputs": ["Peter Blackburn met Maria Lopez in Brussels."] * texts}).encode()
        with socket.create_connection((host, int(port))) as client:
            client.sendall(
                f"POST /v1/models/bert-ner/ner HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"x-request-id: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            time.sleep(seconds)

    def access_line(request_id: str) -> dict | None:
        rows = [json.loads(row) for row in server.log().splitlines() if row.startswith("{")]
        return next((row for row in rows if row.get("request_id") == request_id), None)

    leave_after("gone", 64, 0.5)  # 32 batches: 10 of them run, at most
    left = time.monotonic()
    assert wait_for(lambda: access_line("gone") is not None, timeout=20), server.log()[-2000:]
    assert time.monotonic() - left < 5  # at the next batch, not at the 30 s deadline
    assert access_line("gone")["status"] == 499, access_line("gone")  # type: ignore[index]
    with httpx.Client(base_url=server.url, timeout=30) as light:  # its place is free: a light request is answered
        assert light.post("/v1/models/bert-ner/ner", json={"inputs": ["Maria met Peter."]}).status_code == 200
    # Gone while its one batch (50 ms) runs: the rows ran, and the answer reaches nobody: 499 as well, not a 200
    # that counted a success nobody received
    leave_after("gone-running", 2, 0.03)
    assert wait_for(lambda: access_line("gone-running") is not None, timeout=20), server.log()[-2000:]
    assert access_line("gone-running")["status"] == 499, access_line("gone-running")  # type: ignore[index]
