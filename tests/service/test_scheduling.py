"""Batching, overload, deadlines and draining, through real HTTP against real server processes."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families

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
    server = server_factory(tiny_repository, "--max-queue-rows", "8", "--max-batch-size", "1", "--models", "bert-ner")
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


def sigterm_during_burst(server, model: str) -> list[int | str]:
    """16 QA requests of 8 long inputs from 8 clients; SIGTERM 0.3 s in. Each one's status, or why it failed."""
    context = "Peter Blackburn met Maria Lopez in Brussels on Tuesday to talk about trade and lamb. " * 6
    body = {"inputs": [{"question": "Who met?", "context": context}] * 8}
    results: list[int | str] = []
    lock = threading.Lock()

    def ask(_: int) -> None:
        try:
            outcome: int | str = httpx.post(f"{server.url}/v1/models/{model}/qa", json=body, timeout=30).status_code
        except httpx.TransportError as exc:  # refused: arrived after the listener closed
            outcome = type(exc).__name__
        with lock:
            results.append(outcome)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, i) for i in range(16)]
        time.sleep(0.3)
        server.process.send_signal(signal.SIGTERM)
        for future in futures:
            future.result()
    return results


def test_sigterm_finishes_admitted_work_then_exits(tiny_repository, server_factory):
    server = server_factory(
        tiny_repository, "--max-batch-size", "2", "--max-queue-s", "25", "--models", "distilbert-qa"
    )
    results = sigterm_during_burst(server, "distilbert-qa")
    # a drained stop is a clean exit (uvicorn would raise the signal again and die of it: 143)
    assert server.process.wait(30) == 0
    answered = [r for r in results if isinstance(r, int)]
    assert answered and all(status in (200, 503) for status in answered), results
    assert results.count(200) >= 1
    assert "Application shutdown complete" in server.log()
