"""The Open Inference Protocol v2 over REST, with the real client (tritonclient.http) against a real server: every
task, its answers the native API's, JSON and Triton's binary tensor data, and bad input with the protocol's error."""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

TEXTS = ["a gorgeous movie", "dull and far too long"]
NER_TEXTS = ["Peter Blackburn met Maria Lopez in Brussels.", "nothing here"]
QA = [("Who met in Brussels?", "Peter Blackburn met Maria in Brussels."), ("Where?", "It was in Paris.")]


def texts(name: str, values: list[str], binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=object), binary_data=binary)
    return tensor


def outputs(*names: str, binary: bool) -> list[httpclient.InferRequestedOutput]:
    return [httpclient.InferRequestedOutput(name, binary_data=binary) for name in names]


def native(server, path: str, payload: dict) -> list:
    response = httpx.post(f"{server.http.url}{path}", json=payload, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["results"]


def test_server_and_model_metadata_and_health(oip_server) -> None:
    client = httpclient.InferenceServerClient(url=oip_server.http_url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("bert-classification")
    assert not client.is_model_ready("broken")
    metadata = client.get_server_metadata()
    assert metadata["name"] == "bertserve" and "binary_tensor_data" in metadata["extensions"]
    model = client.get_model_metadata("bert-classification")
    assert [(t["name"], t["datatype"]) for t in model["inputs"]] == [("text", "BYTES"), ("text_pair", "BYTES")]
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["outputs"]] == [
        ("label", "BYTES", [-1, -1]),
        ("score", "FP32", [-1, -1]),
    ]
    assert [t["name"] for t in client.get_model_metadata("bert-qa")["inputs"]] == ["question", "context"]
    assert [t["name"] for t in client.get_model_metadata("bert-ner")["outputs"]] == ["entities"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_classification_answers_as_the_native_api(oip_server, binary: bool) -> None:
    client = httpclient.InferenceServerClient(url=oip_server.http_url)
    pairs = ["who won?", "Japan won."]
    result = client.infer(
        "bert-classification",
        [texts("text", TEXTS, binary), texts("text_pair", pairs, binary)],
        outputs=outputs("label", "score", binary=binary),
        parameters={"top_k": 2},
    )
    labels, scores = result.as_numpy("label"), result.as_numpy("score")
    assert labels.shape == scores.shape == (2, 2) and scores.dtype == np.float32
    expected = native(
        oip_server,
        "/v1/models/bert-classification/classify",
        {"inputs": [{"text": t, "text_pair": p} for t, p in zip(TEXTS, pairs, strict=True)], "top_k": 2},
    )
    for row, want in enumerate(expected):
        got_labels = [label.decode() if isinstance(label, bytes) else label for label in labels[row]]
        assert got_labels == [item["label"] for item in want]
        assert np.allclose(scores[row], [item["score"] for item in want], atol=1e-6)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclients_compressed_requests_are_answered_as_plain_ones(oip_server, algorithm: str) -> None:
    """tritonclient's request_compression_algorithm (Content-Encoding: gzip or deflate; binary tensor data, whose
    header length counts the JSON before compression): the plain request's answer. It was a 415."""
    client = httpclient.InferenceServerClient(url=oip_server.http_url)

    def infer(**compression: str) -> tuple[np.ndarray, np.ndarray]:
        result = client.infer(
            "bert-classification", [texts("text", TEXTS, binary=True)], parameters={"top_k": 2}, **compression
        )
        return result.as_numpy("label"), result.as_numpy("score")

    plain_labels, plain_scores = infer()
    labels, scores = infer(request_compression_algorithm=algorithm, response_compression_algorithm=algorithm)
    assert labels.tolist() == plain_labels.tolist() and scores.tolist() == plain_scores.tolist()


def test_classification_default_outputs_are_the_best_label(oip_server) -> None:
    """No outputs named: tritonclient asks for every output in binary; top_k defaults to 1."""
    client = httpclient.InferenceServerClient(url=oip_server.http_url)
    result = client.infer("bert-classification", [texts("text", TEXTS, binary=True)])
    assert result.as_numpy("label").shape == (2, 1) and result.as_numpy("score").shape == (2, 1)


def test_ner_and_qa_answer_json_per_input_as_the_native_api(oip_server) -> None:
    client = httpclient.InferenceServerClient(url=oip_server.http_url)
    ner = client.infer(
        "bert-ner",
        [texts("text", NER_TEXTS, binary=False)],
        outputs=outputs("entities", binary=False),
        parameters={"aggregation_strategy": "none"},
    )
    entities = [json.loads(value) for value in ner.as_numpy("entities")]
    assert entities == native(
        oip_server, "/v1/models/bert-ner/ner", {"inputs": NER_TEXTS, "aggregation_strategy": "none"}
    )
    questions, contexts = [q for q, _ in QA], [c for _, c in QA]
    qa = client.infer(
        "bert-qa",
        [texts("question", questions, binary=True), texts("context", contexts, binary=True)],
        outputs=outputs("answers", binary=True),
        parameters={"top_k": 2, "max_answer_len": 8},
    )
    answers = [json.loads(value) for value in qa.as_numpy("answers")]
    payload = {"inputs": [{"question": q, "context": c} for q, c in QA], "top_k": 2, "max_answer_len": 8}
    assert answers == native(oip_server, "/v1/models/bert-qa/qa", payload)
    assert all(len(per_input) == 2 for per_input in answers)


def test_the_native_layers_apply(oip_server) -> None:
    """Request id, timing headers, metrics, as a native inference request gets them."""
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["fine"]}]}
    with oip_server.http.client() as client:
        response = client.post("/v2/models/bert-classification/infer", json=body, headers={"x-request-id": "oip-1"})
        assert response.status_code == 200, response.text
        assert response.headers["x-request-id"] == "oip-1" and float(response.headers["x-total-time-ms"]) > 0
        assert response.json()["outputs"][0] == {
            "name": "label",
            "datatype": "BYTES",
            "shape": [1, 1],
            "data": [response.json()["outputs"][0]["data"][0]],
        }
        metrics = client.get("/metrics").text
    assert 'bertserve_requests_total{endpoint="v2-infer",model="bert-classification",status="200"}' in metrics


BAD = [
    # (model, body, status, words in the error)
    ("nope", {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}, 404, "no model"),
    (
        "bert-classification",
        {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["x"]}]},
        400,
        "shape [2] says 2 elements",
    ),
    (
        "bert-classification",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x", "y"]}]},
        400,
        "shape [1] says 1 element, the data holds 2",
    ),
    (
        "bert-classification",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
        400,
        "it takes BYTES",
    ),
    (
        "bert-classification",
        {"inputs": [{"name": "txt", "shape": [1], "datatype": "BYTES", "data": ["x"]}]},
        400,
        "the model takes text, text_pair",
    ),
    (
        "bert-classification",
        {
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}],
            "parameters": {"temperature": 2},
        },
        400,
        "'temperature' is not one this model takes (it takes: top_k, binary_data_output, priority, timeout)",
    ),
    (
        "bert-classification",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [3]}]},
        400,
        "element 0: a number; BYTES elements are text",
    ),
    (
        "bert-classification",
        {
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}],
            "outputs": [{"name": "label"}, {"name": "score"}, {"name": "label"}],
        },
        400,
        "output 'label' is requested twice",
    ),
    (  # a name cut short is marked so
        "bert-classification",
        {"inputs": [{"name": "t" * 300, "shape": [1], "datatype": "BYTES", "data": ["x"]}]},
        400,
        f"input '{'t' * 98}...: the model takes",
    ),
    *(  # as JSON names them, not Python ("a NoneType")
        (
            "bert-classification",
            {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["x", value]}]},
            400,
            f"element 1: {kind}; BYTES",
        )
        for value, kind in ((None, "null"), (True, "a boolean"), ({}, "an object"))
    ),
    (
        "bert-classification",
        {"inputs": [{"name": "text", "shape": [100], "datatype": "BYTES", "data": [""] * 100}]},
        422,
        "the limit is 64",
    ),
    (
        "bert-qa",
        {"inputs": [{"name": "question", "shape": [1], "datatype": "BYTES", "data": ["q"]}]},
        400,
        "input context is missing",
    ),
    ("bert-classification", {"inputs": []}, 400, "inputs"),
    *(  # a shape is int64s: pydantic's lax mode read "1", " 1 ", true and 1.0 as 1
        (
            "bert-classification",
            {"inputs": [{"name": "text", "shape": [dim], "datatype": "BYTES", "data": ["x"]}]},
            400,
            "shape",
        )
        for dim in ("1", " 1 ", True, 1.0)
    ),
    *(  # the native schema's bounds: OIP's parameters took any size (top_k 2**62 was answered)
        (
            "bert-qa",
            {
                "inputs": [
                    {"name": "question", "shape": [1], "datatype": "BYTES", "data": ["q"]},
                    {"name": "context", "shape": [1], "datatype": "BYTES", "data": ["c"]},
                ],
                "parameters": {name: value},
            },
            422,
            f"{name} must be {words}",
        )
        for name, value, words in (
            ("top_k", 101, "<= 100"),
            ("max_answer_len", 513, "<= 512"),
            ("max_seq_len", 7, ">= 8"),
        )
    ),
    (  # the native routes refuse an empty list; in process mode this was a 500 (no rows make no engine frame)
        "bert-classification",
        {"inputs": [{"name": "text", "shape": [0], "datatype": "BYTES", "data": []}]},
        422,
        "input text: no texts (shape [0])",
    ),
    ("broken", {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}, 503, "failed to load"),
]


@pytest.mark.parametrize(
    ("model", "tensors", "field"),
    [
        ("bert-classification", {"text": ["fine", "x" * 20_001]}, "text.1"),
        ("bert-ner", {"text": ["fine", "x" * 20_001]}, "text.1"),
        ("bert-qa", {"question": ["q", "q"], "context": ["c", "x" * 20_001]}, "context.1"),
    ],
)
def test_a_text_over_the_limit_is_named_as_the_protocol_names_it(oip_server, model, tensors, field) -> None:
    """A v2 text over --max-chars-per-input was "inputs.1 has 20001 characters" (the native API's path), which in a
    v2 body names a second tensor: it is the tensor's element."""
    inputs = [{"name": name, "shape": [len(data)], "datatype": "BYTES", "data": data} for name, data in tensors.items()]
    with oip_server.http.client() as client:
        response = client.post(f"/v2/models/{model}/infer", json={"inputs": inputs})
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert response.json()["error"].startswith(f"{field} has 20001 characters; the limit is 20000")


@pytest.mark.parametrize(("model", "body", "status", "words"), BAD)
def test_bad_input_gets_the_protocol_error(oip_server, model: str, body: dict, status: int, words: str) -> None:
    with oip_server.http.client() as client:
        response = client.post(f"/v2/models/{model}/infer", json=body)
        assert response.status_code == status, response.text
        assert words in response.json()["error"]
        assert client.get("/v2/health/ready").status_code == 200  # and it keeps serving


def test_tritonclient_reports_the_error(oip_server) -> None:
    client = httpclient.InferenceServerClient(url=oip_server.http_url)
    with pytest.raises(InferenceServerException, match="not one this model takes"):
        client.infer("bert-ner", [texts("text", ["x"], binary=True)], parameters={"top_k": 1})


def test_tritonclients_class_count_is_refused_not_ignored(oip_server) -> None:
    """Triton's classification extension (class_count) is not served: the plain score tensor came back as if it
    had been; any other output parameter but binary_data is refused too."""
    client = httpclient.InferenceServerClient(url=oip_server.http_url)
    asked = [httpclient.InferRequestedOutput("score", binary_data=False, class_count=2)]
    with pytest.raises(InferenceServerException, match=r"'classification' .*class_count.* is not taken") as refused:
        client.infer("bert-classification", [texts("text", ["x"], binary=True)], outputs=asked)
    assert refused.value.status() == "400"
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
    odd = {**body, "outputs": [{"name": "score", "parameters": {"foo": 1}}]}
    answer = httpx.post(f"{oip_server.http.url}/v2/models/bert-classification/infer", json=odd, timeout=30)
    assert answer.status_code == 400 and "parameter 'foo' is not one an output takes" in answer.json()["error"]
    plain = [httpclient.InferRequestedOutput("score", binary_data=True)]  # binary_data alone: served as ever
    assert (
        client.infer("bert-classification", [texts("text", ["x"], binary=True)], outputs=plain).as_numpy("score").size
    )


def test_a_tensor_sent_both_as_data_and_as_binary_data_is_refused(oip_server) -> None:
    """Two payloads for one tensor: the binary one was served and the JSON data dropped unread."""
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["from the JSON"]}
    tensor["parameters"] = {"binary_data_size": 4 + len(b"from the bytes")}
    head = json.dumps({"inputs": [tensor]}).encode()
    body = head + struct.pack("<I", len(b"from the bytes")) + b"from the bytes"
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))}
    with oip_server.http.client() as client:
        response = client.post("/v2/models/bert-classification/infer", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "input text: both data and binary_data_size; send its texts one way"


@pytest.mark.parametrize(("size", "words"), [(-1, "binary_data_size -1 is not a size in bytes"), (5, "needs the")])
def test_a_binary_data_size_that_is_no_size_or_has_no_header_is_named_so(oip_server, size: int, words: str) -> None:
    """A negative size was told to send the header it had sent."""
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": size}}
    head = json.dumps({"inputs": [tensor]}).encode()
    framed = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))}
    headers = framed if size < 0 else {"content-type": "application/json"}
    body = head + struct.pack("<I", 1) + b"x" if size < 0 else head
    with oip_server.http.client() as client:
        response = client.post("/v2/models/bert-classification/infer", content=body, headers=headers)
    assert response.status_code == 400 and words in response.json()["error"], response.text


@pytest.mark.parametrize("declared", [b"\xb2", b"9" * 5000], ids=["superscript-two", "5000-digits"])
def test_a_header_length_of_other_digits_than_ascii_or_too_many_is_a_400(oip_server, declared: bytes) -> None:
    """`"²".isdigit()` is true and `int("²")` raises; `int()` of 5,000 digits raises past Python's 4,300: each a 500
    with a traceback in the log it was."""
    body = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}).encode()
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": declared}  # latin-1
    with oip_server.http.client() as client:
        response = client.post("/v2/models/bert-classification/infer", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert "is not a length within the body" in response.json()["error"]


def test_two_header_lengths_are_refused_not_one_picked(oip_server) -> None:
    """Two Inference-Header-Content-Length headers: the first split the body, the other was ignored."""
    head = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}).encode()
    headers = [
        ("content-type", "application/octet-stream"),
        ("inference-header-content-length", str(len(head))),
        ("inference-header-content-length", "3"),
    ]
    with oip_server.http.client() as client:
        response = client.post("/v2/models/bert-classification/infer", content=head, headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "2 inference-header-content-length headers: send one"


def test_a_binary_requests_json_part_that_is_not_json_says_why(oip_server) -> None:
    """It said only "the first N bytes are not JSON", where a plain body's 400 says what and where."""
    head = b"[" * 100_000
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))}
    with oip_server.http.client() as client:
        response = client.post("/v2/models/bert-classification/infer", content=head + b"\0\0\0\0", headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == (
        "the first 100000 bytes (inference-header-content-length) are not JSON (UTF-8): it is nested too deeply"
    )


def test_an_id_of_a_lone_surrogate_comes_back_as_it_was_sent(oip_server) -> None:
    body = b'{"id": "\\ud800", "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}'
    with oip_server.http.client() as client:
        response = client.post(
            "/v2/models/bert-classification/infer", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 200, response.text
    assert response.json()["id"] == "\ud800"


def test_tritonclients_priority_and_timeout_are_taken(oip_server) -> None:
    client = httpclient.InferenceServerClient(url=oip_server.http_url)
    result = client.infer("bert-classification", [texts("text", TEXTS, binary=True)], priority=2, timeout=30_000_000)
    assert result.as_numpy("label").shape == (2, 1)
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}], "parameters": {}}
    body["parameters"]["timeout"] = "soon"  # tritonclient checks its own; another client may send anything
    with oip_server.http.client() as raw:
        response = raw.post("/v2/models/bert-classification/infer", json=body)
    assert response.status_code == 422
    assert response.json()["error"] == "parameter timeout must be a whole number of microseconds, not 'soon'"


def test_tritonclients_calls_of_what_is_not_served_say_so(oip_server) -> None:
    """Statistics read "no model named 'stats'" and a versioned call "no such endpoint": a 404 says what it is."""
    client = httpclient.InferenceServerClient(url=oip_server.http_url)
    for call, said in (
        (lambda: client.get_inference_statistics(), "statistics extension is not served: GET /metrics"),
        (lambda: client.get_inference_statistics("bert-classification"), "statistics extension is not served"),
        (lambda: client.get_model_config("bert-classification"), "model configuration is not served"),
        (
            lambda: client.get_model_metadata("bert-classification", model_version="1"),
            "model 'bert-classification' has no version '1': served models are unversioned",
        ),
        (
            lambda: client.infer("bert-classification", [texts("text", ["x"], binary=True)], model_version="2"),
            "has no version '2'",
        ),
    ):
        with pytest.raises(InferenceServerException) as refused:
            call()
        assert said in refused.value.message() and refused.value.status() == "404", refused.value.message()
    assert client.get_model_metadata("bert-classification")["name"] == "bert-classification"


def test_a_version_addressed_infer_is_counted_as_an_infer(oip_server) -> None:
    """/v2/models/{name}/versions/{v}/infer is a 404 (served models are unversioned), counted under endpoint
    "info": a dashboard of v2-infer's errors missed it."""
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
    series = [
        f'bertserve_requests_total{{endpoint="{endpoint}",model="bert-classification",status="404"}}'
        for endpoint in ("v2-infer", "info")
    ]

    def counts(client) -> list[float]:
        lines = client.get("/metrics").text.splitlines()
        return [sum(float(line.split()[-1]) for line in lines if line.startswith(name + " ")) for name in series]

    with oip_server.http.client() as client:
        before = counts(client)
        versioned = client.post("/v2/models/bert-classification/versions/1/infer", json=body)
        metadata = client.get("/v2/models/bert-classification/versions/1")  # stays info
        after = counts(client)
    assert versioned.status_code == 404 and "unversioned" in versioned.json()["error"], versioned.text
    assert metadata.status_code == 404
    assert [b - a for a, b in zip(before, after, strict=True)] == [1.0, 1.0]
