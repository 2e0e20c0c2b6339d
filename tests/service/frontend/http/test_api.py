"""The REST API over real HTTP against a real uvicorn process: every endpoint, every architecture, every error."""

from __future__ import annotations

import gzip
import zlib

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import RERANK_MODEL, TINY_CELLS

ERROR_KEYS = {"error", "error_type", "field"}


def test_probes_and_model_list(tiny_server) -> None:
    with tiny_server.client() as client:
        assert client.get("/livez").json() == {"status": "alive"}
        assert client.get("/readyz").status_code == 200
        models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert set(models) == {f"{arch}-{task}" for arch, task in TINY_CELLS} | {RERANK_MODEL}
    cross_encoder = models.pop(RERANK_MODEL)
    assert cross_encoder["rerank"] is True and cross_encoder["task"] == "classification"
    assert cross_encoder["status"] == "ready"
    assert cross_encoder["labels"] == ["LABEL_0"] and cross_encoder["problem_type"] == "regression"
    for name, info in models.items():
        assert info["rerank"] is False
        assert info["status"] == "ready" and info["provider"] == "CPUExecutionProvider" and info["variant"] == "fp32"
        assert info["demo"] is False and info["max_length"] == 64
        assert info["limits"]["max_inputs_per_request"] == 64
        assert info["task"] == name.split("-")[1]
    assert models["bert-ner"]["labels"][0] == "O"


@pytest.mark.parametrize(("arch", "task"), TINY_CELLS)
def test_every_architecture_and_task_answers(tiny_server, arch: str, task: str) -> None:
    name = f"{arch}-{task}"
    payload = {
        "classification": {
            "inputs": ["a gorgeous movie", {"text": "who won?", "text_pair": "Japan won."}],
            "top_k": None,
        },
        "ner": {"inputs": ["Peter Blackburn met Maria Lopez in Brussels.", "nothing here"]},
        "qa": {"inputs": [{"question": "Who met in Brussels?", "context": "Peter Blackburn met Maria in Brussels."}]},
    }[task]
    endpoint = {"classification": "classify", "ner": "ner", "qa": "qa"}[task]
    with tiny_server.client() as client:
        response = client.post(f"/v1/models/{name}/{endpoint}", json=payload)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == name
    assert len(body["results"]) == len(payload["inputs"])
    for header in ("x-total-time-ms", "x-tokenization-time-ms", "x-queue-time-ms", "x-inference-time-ms"):
        assert float(response.headers[header]) >= 0
    assert int(response.headers["x-inference-calls"]) >= 1
    if task == "classification":
        for labels in body["results"]:
            assert [x["label"] for x in labels] and len(labels) == 3
            assert abs(sum(x["score"] for x in labels) - 1) < 1e-5
            assert [x["score"] for x in labels] == sorted((x["score"] for x in labels), reverse=True)
    elif task == "qa":
        answer = body["results"][0][0]
        context = payload["inputs"][0]["context"]
        assert context[answer["start"] : answer["end"]] == answer["answer"]
    else:
        for text, entities in zip(payload["inputs"], body["results"], strict=True):
            for entity in entities:
                assert 0 <= entity["start"] < entity["end"] <= len(text)


def test_top_k_and_single_input(tiny_server) -> None:
    with tiny_server.client() as client:
        body = client.post("/v1/models/bert-classification/classify", json={"inputs": "fine", "top_k": 2}).json()
    assert len(body["results"]) == 1 and len(body["results"][0]) == 2


BAD_REQUESTS = [
    # (method, path, kwargs, status, error_type, field)
    (
        "POST",
        "/v1/models/bert-classification/classify",
        {"content": b'{"inputs": ["unclosed"'},
        400,
        "bad_request",
        None,
    ),
    (
        "POST",
        "/v1/models/bert-classification/classify",
        {"content": b'{"inputs": ["\xff\xfe bad utf-8"]}'},
        400,
        "bad_request",
        None,
    ),
    ("POST", "/v1/models/bert-classification/classify", {"json": {"inputs": 42}}, 422, "validation", "inputs"),
    ("POST", "/v1/models/bert-classification/classify", {"json": {"inputs": []}}, 422, "validation", "inputs"),
    (
        "POST",
        "/v1/models/bert-classification/classify",
        {"json": {"inputs": ["x"], "top_k": 0}},
        422,
        "validation",
        "top_k",
    ),
    ("POST", "/v1/models/bert-classification/classify", {"json": {"text": "x"}}, 422, "validation", "inputs"),
    (
        "POST",
        "/v1/models/bert-ner/ner",
        {"json": {"inputs": ["x"], "aggregation_strategy": "best"}},
        422,
        "validation",
        "aggregation_strategy",
    ),
    ("POST", "/v1/models/bert-qa/qa", {"json": {"inputs": [{"question": "q"}]}}, 422, "validation", "inputs.0.context"),
    # words (is_split_into_words): lists of strings, with the flag; not a text, not a mix, no empty list
    *[
        ("POST", "/v1/models/bert-ner/ner", {"json": body}, 422, "validation", field)
        for body, field in [
            ({"inputs": [["Peter", "Blackburn"]]}, "inputs"),
            ({"inputs": "Peter Blackburn", "is_split_into_words": True}, "inputs"),
            ({"inputs": [["Peter"], "Blackburn"], "is_split_into_words": True}, "inputs"),
            ({"inputs": [["Peter"], []], "is_split_into_words": True}, "inputs.1"),
            ({"inputs": [["Peter", 7]], "is_split_into_words": True}, "inputs.0.1"),
            ({"inputs": ["Peter"], "is_split_into_words": "yes"}, "is_split_into_words"),
        ]
    ],
    # empty question or context: declared in the schema (minLength 1), a validation error naming the field
    *[
        ("POST", "/v1/models/bert-qa/qa", {"json": {"inputs": [pair]}}, 422, "validation", f"inputs.0.{empty}")
        for empty, pair in [
            ("question", {"question": "", "context": "c"}),
            ("context", {"question": "q", "context": ""}),
        ]
    ],
    # a single input (not in a list) is input 0, in the schema's errors as in the server's own checks
    *[
        ("POST", path, {"json": {"inputs": single}}, 422, "validation", field)
        for path, single, field in [
            ("/v1/models/bert-qa/qa", {"question": "", "context": "c"}, "inputs.0.question"),
            ("/v1/models/bert-qa/qa", {"question": "q"}, "inputs.0.context"),
            ("/v1/models/bert-classification/classify", {"text": "a", "text_pair": 3}, "inputs.0.text_pair"),
        ]
    ],
    ("POST", "/v1/models/no-such-model/classify", {"json": {"inputs": ["x"]}}, 404, "not_found", None),
    ("GET", "/v1/models/no-such-model", {}, 404, "not_found", None),
    ("POST", "/v1/models/bert-ner/classify", {"json": {"inputs": ["x"]}}, 400, "wrong_task", None),
    ("POST", "/v1/models/bert-qa/ner", {"json": {"inputs": ["x"]}}, 400, "wrong_task", None),
    ("GET", "/v1/models/bert-classification/classify", {}, 405, "method_not_allowed", None),
    ("GET", "/v2/nothing", {}, 404, "not_found", None),
    ("POST", "/v1/models/bert-ner/ner", {"json": {"inputs": ["x" * 100_000]}}, 422, "validation", "inputs.0"),
    ("POST", "/v1/models/bert-classification/classify", {"json": {"inputs": ["x"] * 65}}, 422, "validation", "inputs"),
    # a lone surrogate is valid JSON but no Unicode character: every endpoint refuses it by field (was a 500)
    *[
        ("POST", path, {"content": body.encode()}, 422, "validation", field)
        for path, body, field in [
            ("/v1/models/bert-classification/classify", '{"inputs": ["ok", "bad \\ud800 text"]}', "inputs.1"),
            (
                "/v1/models/bert-classification/classify",
                '{"inputs": {"text": "fine", "text_pair": "\\udfff"}}',
                "inputs.0.text_pair",
            ),
            ("/v1/models/bert-ner/ner", '{"inputs": "\\ud800"}', "inputs.0"),
            (
                "/v1/models/bert-ner/ner",
                '{"inputs": [["ok"], ["fine", "b\\udc00d"]], "is_split_into_words": true}',
                "inputs.1.1",
            ),
            ("/v1/models/bert-qa/qa", '{"inputs": {"question": "q\\ud83d", "context": "c"}}', "inputs.0.question"),
        ]
    ],
    (
        "POST",
        "/v1/models/bert-classification/classify",
        {"content": b'{"inputs": ["' + b"a" * 3_000_000 + b'"]}'},
        413,
        "payload_too_large",
        None,
    ),
    # the same body sent chunked (no Content-Length): 413 too, not "not valid JSON"
    (
        "POST",
        "/v1/models/bert-classification/classify",
        {"content": [b'{"inputs": ["', *[b"a" * 65_536] * 46, b'"]}']},
        413,
        "payload_too_large",
        None,
    ),
    # unknown keys and empty bodies name their field; a boolean is no number; bodies that are not JSON
    *[
        ("POST", path, {"content": body}, 422, "validation", field)
        for path, body, field in [
            ("/v1/models/bert-classification/classify", b'{"inputs": ["x"], "bogus": 1}', "bogus"),
            (
                "/v1/models/bert-classification/classify",
                b'{"inputs": {"text": "a", "text_pair": "b", "x": 1}}',
                "inputs.0.x",
            ),
            ("/v1/models/bert-classification/classify", b"", "body"),
            ("/v1/models/bert-classification/classify", b"null", None),  # JSON, but not an object
            ("/v1/models/bert-ner/ner", b'["not", "an", "object"]', None),
            ("/v1/models/bert-classification/classify", b'{"inputs": ["x"], "top_k": true}', "top_k"),
            ("/v1/models/bert-qa/qa", b'{"inputs": {"question": "q", "context": "c"}, "top_k": "2"}', "top_k"),
        ]
    ],
    # a number past a double's range is no number JSON can carry back (read as infinity, an echoed one failed the
    # answer), refused where JSON is read, as NaN and Infinity are
    (
        "POST",
        "/v1/models/bert-qa/qa",
        {"content": b'{"inputs": {"question": "q", "context": "c"}, "max_seq_len": 1e400}'},
        400,
        "bad_request",
        None,
    ),
    (
        "POST",
        "/v1/models/bert-classification/classify",
        {"content": b'{"inputs": ["x"]}', "headers": {"content-type": "application/x-www-form-urlencoded"}},
        415,
        "unsupported_media_type",
        None,
    ),
    # a content coding: one not taken is a 415 (a gzip body was once "not valid JSON"); gzip or deflate data that
    # are not, or stop short, or have bytes after them, a 400; a plain body that says gzip is not served as it is
    *[
        (
            "POST",
            "/v1/models/bert-classification/classify",
            {"content": body, "headers": {"content-type": "application/json", "content-encoding": coding}},
            status,
            error_type,
            None,
        )
        for body, coding, status, error_type in (
            (b'{"inputs": ["x"]}', "br", 415, "unsupported_media_type"),
            (b'{"inputs": ["x"]}', "gzip, gzip", 415, "unsupported_media_type"),
            (b'{"inputs": ["x"]}', "gzip", 400, "bad_request"),
            (gzip.compress(b'{"inputs": ["x"]}')[:-6], "gzip", 400, "bad_request"),
            (zlib.compress(b'{"inputs": ["x"]}') + b"junk", "deflate", 400, "bad_request"),
            (gzip.compress(b'{"inputs": ["x"]}') + b"junk", "gzip", 400, "bad_request"),
            (gzip.compress(b'{"inputs": ["x"]}'), "deflate", 400, "bad_request"),
        )
    ],
    ("POST", "/v1/models/bert-classification/classify", {"content": b"[" * 100_000}, 400, "bad_request", None),
    # 3 KB of gzip that decode past the body limit: a 413, not 3 MB in memory
    (
        "POST",
        "/v1/models/bert-classification/classify",
        {
            "content": gzip.compress(b'{"inputs": ["' + b"a" * 3_000_000 + b'"]}'),
            "headers": {"content-type": "application/json", "content-encoding": "gzip"},
        },
        413,
        "payload_too_large",
        None,
    ),
]


@pytest.mark.parametrize(
    ("coding", "compress"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("GZip", lambda data: gzip.compress(data[:9]) + gzip.compress(data[9:])),  # two members: one body
        ("deflate", zlib.compress),
        ("identity", lambda data: data),
    ],
)
def test_a_compressed_body_is_answered_as_the_plain_one(tiny_server, coding: str, compress) -> None:
    """Content-Encoding gzip or deflate (as Triton takes them), on the native and the Hugging Face task routes."""
    requests = [
        ("/v1/models/bert-classification/classify", b'{"inputs": ["a gorgeous movie", "dull"], "top_k": 2}'),
        ("/v1/models/bert-ner", b'{"inputs": "Peter met Maria in Paris."}'),
    ]
    with tiny_server.client() as client:
        for path, body in requests:
            plain = client.post(path, content=body, headers={"content-type": "application/json"})
            coded = client.post(
                path, content=compress(body), headers={"content-type": "application/json", "content-encoding": coding}
            )
            assert plain.status_code == coded.status_code == 200, coded.text
            assert coded.json() == plain.json()


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "error_type", "field"), BAD_REQUESTS)
def test_bad_requests_get_the_right_status_and_one_error_shape(
    tiny_server, method, path, kwargs, status, error_type, field
) -> None:
    kwargs = dict(kwargs)
    headers = kwargs.pop("headers", None) or ({"content-type": "application/json"} if "content" in kwargs else {})
    with tiny_server.client() as client:
        response = client.request(method, path, headers=headers, **kwargs)
        assert response.status_code == status, response.text
        body = response.json()
        assert set(body) == ERROR_KEYS
        assert body["error_type"] == error_type
        assert body["field"] == field
        assert body["error"] and "Traceback" not in body["error"] and "/work/" not in body["error"]
        # the server keeps serving
        assert client.get("/readyz").status_code == 200
        ok = client.post("/v1/models/bert-classification/classify", json={"inputs": ["still fine"]})
        assert ok.status_code == 200


@pytest.mark.parametrize("arch", ["bert", "roberta", "albert", "distilbert"])
@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_words_given_split_are_tagged_as_those_words(tiny_server, arch: str, strategy: str) -> None:
    """Each text's words joined by one space are the text; each entity names the words it covers, and the word
    strategies never cut a word: an entity starts at a word's start and ends at a word's end."""
    sentences = [
        ["S.", "Fleming", "met", "Maria", "Lopez", "in", "Al-Ain", "and", "New York", "(", "U.S.", ")", "."],
        ["Peter"],
        ["nothing", "here"],
    ]
    path = f"/v1/models/{arch}-ner/ner"
    with tiny_server.client() as client:
        by_words = client.post(
            path, json={"inputs": sentences, "is_split_into_words": True, "aggregation_strategy": strategy}
        )
        one = client.post(
            path, json={"inputs": sentences[0], "is_split_into_words": True, "aggregation_strategy": strategy}
        )
        as_text = client.post(
            path, json={"inputs": [" ".join(words) for words in sentences], "aggregation_strategy": strategy}
        )
    assert by_words.status_code == 200, by_words.text
    results = by_words.json()["results"]
    assert len(results) == len(sentences)
    assert one.json()["results"] == results[:1]  # one list of words is one text
    found = 0
    for words, entities in zip(sentences, results, strict=True):
        text = " ".join(words)
        starts = [len(" ".join(words[:i])) + (i > 0) for i in range(len(words))]
        for entity in entities:
            first, last = entity["first_word"], entity["last_word"]
            assert 0 <= first <= last < len(words), entity
            # What the entity covers, but for the spaces around words that SentencePiece's "▁" and byte-level BPE's
            # "Ġ" pieces count in (a "Ġ" of its own may cover no character: start == end).
            covered = text[entity["start"] : entity["end"]]
            start = entity["start"] + len(covered) - len(covered.lstrip(" "))
            end = entity["end"] - len(covered) + len(covered.rstrip(" "))
            assert starts[first] <= start and end <= starts[last] + len(words[last]), entity
            if strategy in ("first", "average", "max"):
                assert text[entity["start"] : entity["end"]].strip() == " ".join(words[first : last + 1]), entity
            found += 1
    assert found > 0, "the tiny model tagged nothing: nothing was checked"
    if strategy in ("none", "simple"):  # token strategies: the words change nothing but the added indices
        stripped = [
            [{k: v for k, v in e.items() if k not in ("first_word", "last_word")} for e in entities]
            for entities in results
        ]
        assert stripped == as_text.json()["results"]
    else:
        assert all("first_word" not in e for entities in as_text.json()["results"] for e in entities)


UNION_ERRORS = [
    # (body, field, in the message, not in the message): a union's alternatives whose type the value is not (a
    # string, a pair object, where a list came) are not what is wrong with it
    ({"inputs": []}, "inputs", "at least 1 item", "valid string"),
    ({"inputs": [{"text_pair": "b"}], "top_k": 0}, "inputs.0.text", "(also: top_k)", "valid string"),
    ({"inputs": ["a", {"text": "b", "text_pair": 3}]}, "inputs.1.text_pair", "valid string", "(also"),
    # where no alternative's type fits, they all are
    ({"inputs": True}, "inputs", "valid string", None),
]


@pytest.mark.parametrize(("body", "field", "said", "unsaid"), UNION_ERRORS)
def test_a_validation_error_says_what_is_wrong_not_which_alternatives_the_value_is_not(
    tiny_server, body, field, said, unsaid
) -> None:
    with tiny_server.client() as client:
        response = client.post("/v1/models/bert-classification/classify", json=body)
    assert response.status_code == 422
    error = response.json()
    assert error["field"] == field
    assert said in error["error"]
    assert unsaid is None or unsaid not in error["error"], error["error"]


@pytest.mark.parametrize("count", [65, 10_001])
def test_a_list_over_the_limit_is_told_the_limit_whether_or_not_past_the_schemas_ceiling(tiny_server, count) -> None:
    """The schema bounds a list at 10,000 items (the parse's own bound), the server at --max-inputs-per-request: a
    list past the first said "List should have at most 10000 items", a number that is no limit of this server."""
    with tiny_server.client() as client:
        limit = client.get("/v1/models/bert-classification").json()["limits"]["max_inputs_per_request"]
        response = client.post("/v1/models/bert-classification/classify", json={"inputs": ["a"] * count})
    assert response.status_code == 422
    assert response.json()["field"] == "inputs"
    assert response.json()["error"] == f"{count} inputs in one request; the limit is {limit}"


def test_the_first_of_many_bad_inputs_is_the_field_named(tiny_server) -> None:
    """Eleven bad inputs named input 10 as the field at fault (the longest path, as a string), the others listed
    in text order (input 1, input 10, input 2, ...)."""
    with tiny_server.client() as client:
        response = client.post("/v1/models/bert-classification/classify", json={"inputs": [None] * 11})
    assert response.status_code == 422
    error = response.json()
    assert error["field"] == "inputs.0"
    assert "inputs.1, inputs.2, inputs.3" in error["error"], error["error"]


NOT_JSON = [
    # (body, in the message): each a 400 saying why and where, so a client can find the fault in what it sent
    (b'{"inputs": ["unclosed"', "Expecting ',' delimiter at line 1, column 23"),
    (b'{\n  "inputs": ["a",]\n}', "Expecting value at line 2, column 18"),
    (b'{"inputs": ["\xff\xfe bad utf-8"]}', "byte 13 is not UTF-8"),
    (b"[" * 100_000, "nested too deeply"),
    (b'{"inputs": ["a"], "top_k": ' + b"9" * 5_000 + b"}", "a number has more digits than the parser takes"),
    (b'{"inputs": ["a\tb"]}', "Invalid control character at line 1, column 15"),  # it said "at at line"
]


@pytest.mark.parametrize(("body", "said"), NOT_JSON)
def test_a_body_that_is_not_json_says_why_and_where(tiny_server, body: bytes, said: str) -> None:
    with tiny_server.client() as client:
        response = client.post(
            "/v1/models/bert-classification/classify", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    error = response.json()
    assert error["error_type"] == "bad_request" and error["field"] is None
    assert error["error"].startswith("the request body is not valid JSON (UTF-8): ") and said in error["error"]


QA_CONTEXT = ("The committee will meet again in Geneva next week to review the budget and the new rules. " * 230)[
    :20_000
]
QA_LIMITS = [
    # (inputs, parameters, field, in the message): each refused, naming what to change, before windows are built
    ([("q", QA_CONTEXT)], {"max_seq_len": 9}, "max_seq_len", "a context may need at most"),  # the request
    ([("q", QA_CONTEXT)], {"max_seq_len": 32, "doc_stride": 28}, "doc_stride", "room left"),  # no advance at all
    ([("q", QA_CONTEXT)], {"max_seq_len": 32, "doc_stride": 27}, "doc_stride", "a context may need"),  # 1 a window
    ([("who " * 70, QA_CONTEXT)], {}, "inputs.0.question", "no room"),  # the question fills the default window
    ([("q", QA_CONTEXT)] * 64, {}, "inputs", "max_qa_windows"),  # 64 legal contexts: thousands of windows of 64
]


@pytest.mark.parametrize(("pairs", "params", "field", "message"), QA_LIMITS)
def test_qa_work_is_refused_before_it_is_done(tiny_server, pairs, params, field, message) -> None:
    inputs = [{"question": question, "context": context} for question, context in pairs]
    with tiny_server.client() as client:
        response = client.post("/v1/models/bert-qa/qa", json={"inputs": inputs, **params})
        assert response.status_code == 422, response.text
        body = response.json()
        assert (body["field"], body["error_type"]) == (field, "validation") and message in body["error"], body
        # The same contexts at the default windows (a legal maximum-size context each) are answered.
        ok = client.post("/v1/models/bert-qa/qa", json={"inputs": [{"question": "q", "context": QA_CONTEXT}] * 2})
    assert ok.status_code == 200, ok.text
    assert 100 < int(ok.headers["x-rows"]) <= 1536
    for (answer,) in ok.json()["results"]:
        assert QA_CONTEXT[answer["start"] : answer["end"]] == answer["answer"]


def test_metrics_are_gzipped_for_a_client_that_takes_gzip(tiny_server) -> None:
    """Prometheus asks for gzip at every scrape; a client that does not take it gets the exposition as it is."""
    with tiny_server.client() as client:
        plain = client.get("/metrics", headers={"accept-encoding": "identity"})
        refused = client.get("/metrics", headers={"accept-encoding": "gzip;q=0, deflate"})
        coded = client.stream("GET", "/metrics", headers={"accept-encoding": "gzip"})
        with coded as response:
            raw = b"".join(response.iter_raw())
            headers = response.headers
    assert "content-encoding" not in plain.headers and "content-encoding" not in refused.headers
    assert plain.headers["vary"] == headers["vary"] == "Accept-Encoding"
    assert headers["content-encoding"] == "gzip" and int(headers["content-length"]) == len(raw)
    assert len(raw) < len(plain.content) / 3
    names = {family.name for family in text_string_to_metric_families(gzip.decompress(raw).decode())}
    assert names == {family.name for family in text_string_to_metric_families(plain.text)}


def test_metrics_are_exposed_in_prometheus_format(tiny_server) -> None:
    with tiny_server.client() as client:
        client.post("/v1/models/bert-classification/classify", json={"inputs": ["count me"]})
        client.post("/v1/models/no-such/classify", json={"inputs": ["count me"]})
        text = client.get("/metrics").text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name in (
        "bertserve_requests",
        "bertserve_request_duration_seconds",
        "bertserve_queue_duration_seconds",
        "bertserve_tokenization_duration_seconds",
        "bertserve_inference_duration_seconds",
        "bertserve_batch_size",
        "bertserve_batch_tokens",
        "bertserve_batch_padding_ratio",
        "bertserve_queue_depth",
        "bertserve_admission_share",
        "bertserve_model_info",
        "bertserve_model_ready",
    ):
        assert name in families, name
    requests = {
        (s.labels["model"], s.labels["endpoint"], s.labels["status"]): s.value
        for s in families["bertserve_requests"].samples
        if s.name == "bertserve_requests_total"
    }
    assert requests[("bert-classification", "classify", "200")] >= 1
    assert requests[("unknown", "classify", "404")] >= 1
    info = [s for s in families["bertserve_model_info"].samples if s.labels["model"] == "bert-classification"]
    assert info[0].labels["provider"] == "CPUExecutionProvider" and info[0].labels["variant"] == "fp32"


def test_hostile_but_valid_inputs_are_answered(tiny_server) -> None:
    """Text that is odd but legal (NULs, controls, direction overrides, BOMs, astral and combining characters)
    and parameter bombs within the schema: answered, not a 5xx, and the server keeps serving."""
    odd = "a\x00b\x01\x1f \u202e\ufeff\U0001f600 e\u0301" * 50
    cases = [
        ("/v1/models/bert-classification/classify", {"inputs": [odd, {"text": odd, "text_pair": "\x00"}]}),
        ("/v1/models/bert-classification/classify", {"inputs": ["x"], "top_k": 10**30}),
        ("/v1/models/bert-ner/ner", {"inputs": [odd, "\x00" * 1000]}),
        (
            "/v1/models/bert-qa/qa",
            {"inputs": {"question": "who\x00?", "context": odd}, "top_k": 100, "max_answer_len": 512},
        ),
        ("/v1/models/roberta-classification/classify", {"inputs": ["\U0001f600" * 5_000] * 16}),
    ]
    with tiny_server.client(timeout=120) as client:
        for path, body in cases:
            response = client.post(path, json=body)
            assert response.status_code == 200, (path, response.text[:300])
            assert len(response.json()["results"]) == (len(body["inputs"]) if isinstance(body["inputs"], list) else 1)
        assert client.get("/readyz").status_code == 200


def test_an_unpaired_surrogate_is_named_alike_by_every_endpoint(tiny_server) -> None:
    """Classification and NER find it in the server's own check, QA's constrained fields in pydantic: one message."""
    cases = [
        ("/v1/models/bert-classification/classify", '{"inputs": ["a\\ud83d"]}', "inputs.0"),
        ("/v1/models/bert-ner/ner", '{"inputs": ["a\\ud83d"]}', "inputs.0"),
        ("/v1/models/bert-qa/qa", '{"inputs": {"question": "a\\ud83d", "context": "c"}}', "inputs.0.question"),
        ("/v1/models/bert-qa/qa", '{"inputs": [{"question": "q", "context": "a\\ud83d"}]}', "inputs.0.context"),
    ]
    with tiny_server.client() as client:
        answers = [
            (field, client.post(path, content=body.encode(), headers={"content-type": "application/json"}))
            for path, body, field in cases
        ]
    for field, response in answers:
        assert response.status_code == 422, (field, response.text)
        assert response.json() == {
            "error": f"{field} holds an unpaired surrogate (\\ud83d) at character 1: not a Unicode character",
            "error_type": "validation",
            "field": field,
        }


def counted(metrics: str, model: str, endpoint: str, status: str = "200") -> float:
    """bertserve_requests_total of one model, endpoint and status in a /metrics exposition."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "bertserve_requests_total"
        and sample.labels == {"model": model, "endpoint": endpoint, "status": status}
    )


def test_a_body_of_countless_bad_inputs_gets_a_short_error_at_once(tiny_server) -> None:
    """100,000 invalid inputs (600 KB) took pydantic 1.3 s of the event loop to report, one by one, in a 1.4 MB
    message; a megabyte-long unknown key came back twice. The lists end at the inputs setting's ceiling (checked
    before their items), a message names five other fields at most, and a key is quoted cut short."""
    many = {"inputs": [None] * 100_000}
    with tiny_server.client() as client:
        response = client.post("/v1/models/bert-classification/classify", json=many)
        assert response.status_code == 422, response.text
        assert response.json()["field"] == "inputs" and response.json()["error"].startswith(
            "100000 inputs in one request; the limit is "
        )
        assert len(response.content) < 1000
        some = client.post("/v1/models/bert-classification/classify", json={"inputs": [None] * 64})
        assert some.status_code == 422 and some.json()["error"].endswith(" and 59 more)"), some.text
        long_key = client.post("/v1/models/bert-classification/classify", json={"inputs": "a", "k" * 1_000_000: 1})
    assert long_key.status_code == 422 and long_key.json()["field"] == "k" * 100
    assert len(long_key.content) < 1000


def test_a_body_over_the_limit_is_counted_as_its_413_declared_or_chunked(tiny_server) -> None:
    """A chunked body found too large as it came was left out of bertserve_requests_total, and so was one whose
    Content-Length said so (refused before the body is read)."""

    def counted() -> float:
        with tiny_server.client() as client:
            text = client.get("/metrics").text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "bertserve_requests_total"
            and (sample.labels["model"], sample.labels["endpoint"], sample.labels["status"])
            == ("bert-classification", "classify", "413")
        )

    before = counted()
    with tiny_server.client() as client:
        chunks = [b'{"inputs": ["', *[b"a" * 65_536] * 46, b'"]}']  # no Content-Length: sent chunked
        response = client.post("/v1/models/bert-classification/classify", content=iter(chunks))
    assert response.status_code == 413, response.text
    assert counted() == before + 1
    with tiny_server.client() as client:
        declared = client.post("/v1/models/bert-classification/classify", content=b"{" + b" " * 3_000_000 + b"}")
    assert declared.status_code == 413, declared.text
    assert counted() == before + 2
