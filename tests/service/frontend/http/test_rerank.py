"""Rerank (POST /v1/rerank, /v2/rerank) against a real server process: the cohere SDK's own clients, the scores the
cross-encoder gives the pairs through classify, and the errors of the native API."""

from __future__ import annotations

import math

import cohere
import pytest

from service.frontend.http.rerank import search_units
from tests.harness.hf_client import call_hf_client
from tests.service.conftest import RERANK_MODEL, Server
from tests.service.frontend.http.test_api import counted

QUERY = "Where did Peter meet Maria?"
DOCUMENTS = [
    "Peter Blackburn met Maria Lopez in Brussels on Tuesday.",
    "The river flows through London before it reaches the North Sea.",
    "What a dull, clumsy and forgettable waste of two hours.",
    "Scientists in Tokyo and Berlin reported faster trains.",
    "Peter Blackburn met Maria Lopez in Brussels on Tuesday.",  # equal scores keep the documents' order
]


def classify_scores(server: Server, query: str, documents: list[str]) -> list[float]:
    """The cross-encoder's logit of each (query, document) pair, through the native classify endpoint (a
    regression head: the pipeline applies no function)."""
    with server.client() as client:
        response = client.post(
            f"/v1/models/{RERANK_MODEL}/classify",
            json={"inputs": [{"text": query, "text_pair": document} for document in documents]},
        )
    assert response.status_code == 200, response.text
    return [labels[0]["score"] for labels in response.json()["results"]]


def expected_ranking(server: Server) -> list[tuple[int, float]]:
    scores = [1 / (1 + math.exp(-logit)) for logit in classify_scores(server, QUERY, DOCUMENTS)]
    return sorted(enumerate(scores), key=lambda item: -item[1])


def test_cohere_v1_client_reranks_by_the_cross_encoders_sigmoid(tiny_server: Server) -> None:
    client = cohere.Client(api_key="unused", base_url=tiny_server.url, timeout=30)
    response = client.rerank(model=RERANK_MODEL, query=QUERY, documents=DOCUMENTS, top_n=3, return_documents=True)
    expected = expected_ranking(tiny_server)[:3]
    assert [result.index for result in response.results] == [index for index, _ in expected]
    for result, (index, score) in zip(response.results, expected, strict=True):
        assert abs(result.relevance_score - score) < 1e-6 and 0 <= result.relevance_score <= 1
        assert result.document is not None and result.document.text == DOCUMENTS[index]
    assert response.id and response.meta is not None and response.meta.api_version.version == "1"
    # No model named: the one rerank model served; documents as objects come back as given.
    objects = [{"text": text, "source": f"doc-{i}"} for i, text in enumerate(DOCUMENTS)]
    whole = client.rerank(query=QUERY, documents=objects, return_documents=True)
    assert [r.index for r in whole.results] == [index for index, _ in expected_ranking(tiny_server)]
    assert whole.results[0].document.dict()["source"] == f"doc-{whole.results[0].index}"


def test_cohere_v2_client_reranks_alike(tiny_server: Server) -> None:
    client = cohere.ClientV2(api_key="unused", base_url=tiny_server.url, timeout=30)
    response = client.rerank(model=RERANK_MODEL, query=QUERY, documents=DOCUMENTS)
    expected = expected_ranking(tiny_server)
    assert [(r.index, round(r.relevance_score, 6)) for r in response.results] == [
        (index, round(score, 6)) for index, score in expected
    ]
    assert response.meta.api_version.version == "2"
    # max_tokens_per_doc: each document cut to its first tokens before it is paired with the query.
    cut = client.rerank(model=RERANK_MODEL, query=QUERY, documents=DOCUMENTS, top_n=2, max_tokens_per_doc=3)
    first_words = [" ".join(document.split()[:3]) for document in DOCUMENTS]  # 3 tokens: 3 words, here
    want = sorted(enumerate(classify_scores(tiny_server, QUERY, first_words)), key=lambda item: -item[1])[:2]
    assert [r.index for r in cut.results] == [index for index, _ in want]


def test_a_rerank_request_is_one_requests_rows(tiny_server: Server) -> None:
    """The pairs go through the batcher as one request's rows, timed and counted as a native request."""
    with tiny_server.client() as client:
        response = client.post("/v1/rerank", json={"model": RERANK_MODEL, "query": QUERY, "documents": DOCUMENTS})
        metrics = client.get("/metrics").text
    assert response.status_code == 200
    assert response.headers["x-rows"] == str(len(DOCUMENTS)) and "x-queue-time-ms" in response.headers
    assert response.json()["id"] == response.headers["x-request-id"]
    assert response.json()["usage"]["total_tokens"] > len(DOCUMENTS) * 5
    assert response.json()["meta"]["billed_units"] == {"search_units": 1}
    assert counted(metrics, RERANK_MODEL, "rerank") >= 1


@pytest.mark.parametrize(("documents", "units"), [(1, 1), (100, 1), (101, 2), (250, 3)])
def test_a_search_unit_is_a_query_of_up_to_100_documents(documents: int, units: int) -> None:
    assert search_units(documents) == units


def test_a_refused_body_is_counted_under_the_model_it_names(tiny_server: Server) -> None:
    """A 422 on a route whose body names the model was counted under `unknown`, though that model is served."""
    bad = {"query": "q", "documents": ["d"], "top_n": 0}
    with tiny_server.client() as client:
        before = client.get("/metrics").text
        for path in ("/v1/rerank", "/v2/rerank"):
            assert client.post(path, json={"model": RERANK_MODEL, **bad}).status_code == 422
        assert client.post("/v2/rerank", json={"model": "no-such-model", **bad}).status_code == 422
        after = client.get("/metrics").text
    assert counted(after, RERANK_MODEL, "rerank", "422") - counted(before, RERANK_MODEL, "rerank", "422") == 2
    assert counted(after, "unknown", "rerank", "422") - counted(before, "unknown", "rerank", "422") == 1  # bounded


BAD_REQUESTS = [
    # (path, body, status, error_type, field)
    ("/v1/rerank", {"model": "bert-classification", "query": "q", "documents": ["d"]}, 400, "wrong_task", None),
    ("/v1/rerank", {"model": "bert-ner", "query": "q", "documents": ["d"]}, 400, "wrong_task", None),
    ("/v2/rerank", {"model": "no-such-model", "query": "q", "documents": ["d"]}, 404, "not_found", None),
    ("/v2/rerank", {"query": "q", "documents": ["d"]}, 422, "validation", "model"),
    ("/v1/rerank", {"model": RERANK_MODEL, "query": "q", "documents": []}, 422, "validation", "documents"),
    (
        "/v1/rerank",
        {"model": RERANK_MODEL, "query": "q", "documents": ["d"], "rank_fields": ["title"]},
        422,
        "validation",
        "rank_fields",
    ),
    (
        "/v2/rerank",
        {"model": RERANK_MODEL, "query": "q", "documents": ["d"], "priority": 1},
        422,
        "validation",
        "priority",
    ),
    ("/v1/rerank", {"model": RERANK_MODEL, "query": "q", "documents": ["d"], "top_n": 0}, 422, "validation", "top_n"),
    ("/v1/rerank", {"model": RERANK_MODEL, "query": "q", "documents": ["d"] * 65}, 422, "validation", "documents"),
    (
        "/v1/rerank",
        {"model": RERANK_MODEL, "query": "q", "documents": ["d", "x" * 20_001]},
        422,
        "validation",
        "documents.1",
    ),
    ("/v1/rerank", {"model": RERANK_MODEL, "query": "", "documents": ["d"]}, 422, "validation", "query"),
    # Jina's multimodal document: it said only "documents.0.text: Field required"
    (
        "/v1/rerank",
        {"model": RERANK_MODEL, "query": "q", "documents": [{"image": "u"}]},
        422,
        "validation",
        "documents.0",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "error_type", "field"), BAD_REQUESTS)
def test_bad_requests_get_the_native_error_body(
    tiny_server: Server, path: str, body: dict, status: int, error_type: str, field: str | None
) -> None:
    with tiny_server.client() as client:
        response = client.post(path, json=body)
        ok = client.post("/v2/rerank", json={"model": RERANK_MODEL, "query": "q", "documents": ["still serving"]})
    assert ok.status_code == 200
    assert response.status_code == status, response.text
    assert response.json()["error_type"] == error_type and response.json()["field"] == field, response.json()
    if error_type == "wrong_task":
        assert "cross-encoder" in response.json()["error"]
    if body["documents"] == [{"image": "u"}]:
        assert "multimodal reranking is not served" in response.json()["error"], response.json()


def test_a_null_return_documents_is_its_default(tiny_server: Server) -> None:
    """null was a 422 ("Input should be a valid boolean") where top_n's null is its default."""
    body = {"model": RERANK_MODEL, "query": "q", "documents": ["a", "b"], "return_documents": None}
    with tiny_server.client() as client:
        response = client.post("/v1/rerank", json=body)
    assert response.status_code == 200, response.text
    assert all("document" not in result for result in response.json()["results"])


@pytest.fixture(scope="module")
def refusing_server(tiny_repository, server_factory) -> Server:
    return server_factory(tiny_repository, "--models", RERANK_MODEL, "--token-overflow", "error")


def test_a_pair_over_the_window_is_named_as_the_request_names_it(refusing_server: Server) -> None:
    """--token-overflow error: a long document is documents.N (it said inputs.N, a field rerank has not); a query
    that leaves no document room is the query's fault (it blamed document 0)."""
    long = "word " * 700
    with refusing_server.client() as client:
        document = client.post("/v1/rerank", json={"model": RERANK_MODEL, "query": "q", "documents": ["d", long]})
        query = client.post("/v2/rerank", json={"model": RERANK_MODEL, "query": long, "documents": ["d", "e"]})
        fine = client.post("/v2/rerank", json={"model": RERANK_MODEL, "query": "q", "documents": ["d", "e"]})
    assert fine.status_code == 200
    assert document.status_code == 422 and document.json()["field"] == "documents.1", document.text
    assert document.json()["error"].startswith("documents.1 is ")
    assert "(query 1 tokens, document " in document.json()["error"]  # the pair's length, by its parts
    assert query.status_code == 422 and query.json()["field"] == "query", query.text
    assert query.json()["error"].startswith("the query is ")


def test_the_cohere_client_sees_the_error(tiny_server: Server) -> None:
    client = cohere.ClientV2(api_key="unused", base_url=tiny_server.url, timeout=30)
    with pytest.raises(cohere.core.ApiError) as raised:
        client.rerank(model="bert-classification", query=QUERY, documents=DOCUMENTS)
    assert raised.value.status_code == 400 and "cross-encoder" in str(raised.value.body)


KEY = "client-key-0123456789abcdef"


@pytest.fixture(scope="module")
def keyed_server(tiny_repository, server_factory) -> Server:
    return server_factory(
        tiny_repository, "--models", f"bert-classification,{RERANK_MODEL}", env={"BERTSERVE_API_KEYS": KEY}
    )


def test_the_clients_send_the_servers_api_key(keyed_server: Server) -> None:
    """The clients' own key settings (cohere's api_key, huggingface_hub's token) are the server's bearer keys."""
    reranked = cohere.ClientV2(api_key=KEY, base_url=keyed_server.url, timeout=30).rerank(
        model=RERANK_MODEL, query=QUERY, documents=DOCUMENTS
    )
    assert len(reranked.results) == len(DOCUMENTS)
    with pytest.raises(cohere.core.ApiError) as refused:
        cohere.Client(api_key="not-the-key", base_url=keyed_server.url, timeout=30).rerank(
            model=RERANK_MODEL, query=QUERY, documents=DOCUMENTS
        )
    assert refused.value.status_code == 401
    url = f"{keyed_server.url}/v1/models/bert-classification"
    with_key, without = [
        call_hf_client(url, [("text_classification", ["a gorgeous movie"], {})], token=token)[0]
        for token in (KEY, None)
    ]
    assert [entry["label"] for entry in with_key["result"]] and without["status"] == 401


@pytest.mark.parametrize("value", [b"NaN", b"-Infinity", b"1e999"])
def test_numbers_json_has_not_are_a_400_not_an_echo_that_fails(tiny_server: Server, value: bytes) -> None:
    """Python's parser takes NaN and Infinity and reads 1e999 as infinity; a document's own fields are echoed with
    return_documents, and writing the answer failed (500)."""
    body = b'{"query": "q", "return_documents": true, "documents": [{"text": "x", "meta": ' + value + b"}]}"
    with tiny_server.client() as client:
        response = client.post("/v1/rerank", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("the request body is not valid JSON (UTF-8): ")
    assert value.decode().lstrip("-") in response.json()["error"]


def test_a_documents_lone_surrogate_comes_back_as_it_was_sent(tiny_server: Server) -> None:
    body = b'{"query": "q", "return_documents": true, "documents": [{"text": "x", "meta": "\\ud800"}]}'
    with tiny_server.client() as client:
        response = client.post("/v1/rerank", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["document"] == {"text": "x", "meta": "\ud800"}
