"""The Hugging Face task API (POST /v1/models/{name}) against a real server process: huggingface_hub's own clients,
answers equal to transformers' pipelines (and to the question-answering pipeline's recorded answers), and the errors
of the native API."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest

from tests.bertcore.tasks.test_qa import answers_differ, load_golden
from tests.harness.hf_client import call_hf_client
from tests.service.conftest import Server
from tests.service.frontend.http.test_api import counted
from tests.service.test_parity import CLASSIFY_TEXTS, NER_TEXTS, assert_same_labels, classifier, tagger

LONG_TEXT = " ".join(NER_TEXTS * 3)  # past the tiny models' 64-token window: tagged in overlapping windows
QA_CONTEXT = "Peter Blackburn met Maria Lopez in Brussels on Tuesday. The river flows through London to the sea."


# every parameter of question answering, away from its defaults
QA_PARAMETERS = {
    "top_k": 3,
    "doc_stride": 8,
    "max_answer_len": 6,
    "max_seq_len": 24,
    "max_question_len": 16,
    "handle_impossible_answer": True,
    "align_to_words": False,
}


def entity_keys(strategy: str) -> tuple[str, ...]:
    return (
        ("entity", "index", "word", "start", "end") if strategy == "none" else ("entity_group", "word", "start", "end")
    )


@pytest.mark.parametrize("use_async", [False, True], ids=["InferenceClient", "AsyncInferenceClient"])
def test_the_hugging_face_clients_get_the_pipelines_answers(
    tiny_server: Server, tiny_checkpoint, use_async: bool
) -> None:
    """Every parameter the clients send, for the three tasks; the answers are transformers' pipelines'."""
    text = CLASSIFY_TEXTS[0]
    classified = call_hf_client(
        f"{tiny_server.url}/v1/models/bert-classification",
        [
            ("text_classification", [text], {}),
            ("text_classification", [text], {"top_k": 2, "function_to_apply": "sigmoid"}),
            ("text_classification", [text], {"function_to_apply": "none"}),
        ],
        use_async,
    )
    reference = classifier(str(tiny_checkpoint("bert", "classification")))
    assert_same_labels(classified[0]["result"], reference(text, top_k=None), ("label",))
    assert_same_labels(classified[1]["result"], reference(text, top_k=2, function_to_apply="sigmoid"), ("label",))
    assert_same_labels(classified[2]["result"], reference(text, top_k=None, function_to_apply="none"), ("label",))

    tagged = call_hf_client(
        f"{tiny_server.url}/v1/models/bert-ner",
        [
            ("token_classification", [NER_TEXTS[0]], {}),
            ("token_classification", [NER_TEXTS[0]], {"aggregation_strategy": "first", "ignore_labels": ["B-PER"]}),
            ("token_classification", [LONG_TEXT], {"aggregation_strategy": "simple", "stride": 16}),
        ],
        use_async,
    )
    checkpoint = str(tiny_checkpoint("bert", "ner"))
    wants = [
        tagger(checkpoint, "simple")(NER_TEXTS[0]),
        tagger(checkpoint, "first")(NER_TEXTS[0], ignore_labels=["B-PER"]),
        tagger(checkpoint, "simple")(LONG_TEXT, stride=16),
    ]
    for outcome, want in zip(tagged, wants, strict=True):
        got = [{k: v for k, v in entity.items() if v is not None} for entity in outcome["result"]]
        assert_same_labels(got, want, entity_keys("first"))
    assert all(entity["entity_group"] != "PER" or entity["word"] for entity in tagged[1]["result"])

    parameters = QA_PARAMETERS
    answered = call_hf_client(
        f"{tiny_server.url}/v1/models/distilbert-qa",
        [
            ("question_answering", [], {"question": "Who met Maria?", "context": QA_CONTEXT}),
            ("question_answering", [], {"question": "Who met Maria?", "context": QA_CONTEXT, **parameters}),
        ],
        use_async,
    )
    one, several = answered[0]["result"], answered[1]["result"]
    assert isinstance(one, dict) and QA_CONTEXT[one["start"] : one["end"]] == one["answer"]
    assert isinstance(several, list) and len(several) == 3
    assert [a["score"] for a in several] == sorted((a["score"] for a in several), reverse=True)
    for answer in several:
        assert QA_CONTEXT[answer["start"] : answer["end"]] == answer["answer"]
        assert answer["answer"] == "" or len(answer["answer"].split()) <= 6


def test_question_answering_gives_the_pipelines_recorded_answers(tiny_server: Server) -> None:
    """The question-answering pipeline's answers (transformers 4.57, tests/fixtures/qa), every parameter set it was
    recorded with, through the task API: the cases of one parameter set in one request."""
    golden = load_golden("tiny-distilbert")
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for case in golden.cases:
        if "error" not in case:
            groups[json.dumps(case["params"], sort_keys=True)].append(case)
    failures = []
    with tiny_server.client() as client:
        for params, cases in groups.items():
            inputs = [dict(zip(("question", "context"), golden.texts(case), strict=True)) for case in cases]
            response = client.post(
                "/v1/models/distilbert-qa", json={"inputs": inputs, "parameters": json.loads(params)}
            )
            assert response.status_code == 200, response.text
            top_k = json.loads(params).get("top_k", 1)
            for case, got, sent in zip(cases, response.json(), inputs, strict=True):
                answers = [got] if isinstance(got, dict) else got
                assert isinstance(got, dict) == (top_k == 1 and len(answers) == 1)
                if (difference := answers_differ(answers, case["answers"], sent["context"], top_k)) is not None:
                    failures.append(f"{params}: {difference}")
    assert sum(len(cases) for cases in groups.values()) > 200
    assert not failures, "\n".join(failures[:10])


def test_the_native_qa_route_takes_every_parameter_of_the_task_api_and_answers_alike(tiny_server: Server) -> None:
    """align_to_words was the task API's and OIP's, and a 422 on the native route."""
    parameters = QA_PARAMETERS
    inputs = [{"question": "Who met Maria?", "context": QA_CONTEXT}]
    with tiny_server.client() as client:
        native = client.post("/v1/models/distilbert-qa/qa", json={"inputs": inputs, **parameters})
        task_api = client.post("/v1/models/distilbert-qa", json={"inputs": inputs, "parameters": parameters})
        aligned = client.post(
            "/v1/models/distilbert-qa/qa", json={"inputs": inputs, **parameters, "align_to_words": True}
        )
    assert native.status_code == 200 and task_api.status_code == 200, native.text
    assert native.json()["results"] == task_api.json()
    assert aligned.status_code == 200 and aligned.json()["results"] != native.json()["results"]


def test_the_answer_shapes_follow_the_inputs(tiny_server: Server) -> None:
    with tiny_server.client() as client:
        pair = {"text": "who won?", "text_pair": "Japan won."}
        classified = client.post(
            "/v1/models/bert-classification", json={"inputs": ["fine", pair], "parameters": {"top_k": 1}}
        )
        tagged = client.post("/v1/models/bert-ner", json={"inputs": NER_TEXTS[:2]})
        answered = client.post(
            "/v1/models/distilbert-qa",
            json={"inputs": [{"question": "Who?", "context": QA_CONTEXT}] * 2, "parameters": {"top_k": 2}},
        )
        native = client.post("/v1/models/bert-classification/classify", json={"inputs": ["fine", pair]})
    assert classified.status_code == 200 and len(classified.json()) == 2
    assert classified.json() == native.json()["results"]  # the same pipeline: the same answers
    for header in ("x-request-id", "x-total-time-ms", "x-queue-time-ms", "x-inference-time-ms", "x-rows"):
        assert header in classified.headers
    assert [type(entities) for entities in tagged.json()] == [list, list]
    assert [len(answers) for answers in answered.json()] == [2, 2]


BAD_REQUESTS = [
    # (model, body, status, error_type, field)
    (
        "bert-classification",
        {"inputs": "x", "parameters": {"top_k": 1, "temperature": 0.5}},
        422,
        "validation",
        "parameters.temperature",
    ),
    # the Inference API's options are taken (below); another key among them is not
    ("bert-classification", {"inputs": "x", "options": {"use_gpu": True}}, 422, "validation", "options.use_gpu"),
    ("bert-ner", {"inputs": "x", "options": {"wait_for_model": "yes"}}, 422, "validation", "options.wait_for_model"),
    (
        "bert-classification",
        {"inputs": "x", "parameters": {"function_to_apply": "tanh"}},
        422,
        "validation",
        "parameters.function_to_apply",
    ),
    ("bert-classification", {"inputs": []}, 422, "validation", "inputs"),
    # the task's own checks name the parameter where the payload has it, as the schema's do (it said "stride")
    ("bert-ner", {"inputs": "x", "parameters": {"stride": 1000}}, 422, "validation", "parameters.stride"),
    (
        "bert-ner",
        {"inputs": "x", "parameters": {"aggregation_strategy": "mean"}},
        422,
        "validation",
        "parameters.aggregation_strategy",
    ),
    ("bert-ner", {"inputs": [["word", "lists"]]}, 422, "validation", "inputs.0"),
    ("distilbert-qa", {"inputs": {"question": "q"}}, 422, "validation", "inputs.0.context"),
    (
        "distilbert-qa",
        {"inputs": {"question": "q", "context": "c"}, "parameters": {"doc_stride": 1000, "max_seq_len": 16}},
        422,
        "validation",
        "parameters.doc_stride",
    ),
    ("distilbert-qa", {"inputs": "a text"}, 422, "validation", "inputs"),
    ("no-such-model", {"inputs": "x"}, 404, "not_found", None),
    ("bert-classification", {"inputs": ["x"] * 65}, 422, "validation", "inputs"),
    ("bert-classification", {"inputs": "x" * 20_001}, 422, "validation", "inputs.0"),
]


@pytest.mark.parametrize(("model", "body", "status", "error_type", "field"), BAD_REQUESTS)
def test_bad_requests_get_the_native_error_body(
    tiny_server: Server, model: str, body: dict, status: int, error_type: str, field: str | None
) -> None:
    with tiny_server.client() as client:
        response = client.post(f"/v1/models/{model}", json=body)
        assert client.post("/v1/models/bert-ner", json={"inputs": "still serving"}).status_code == 200
    assert response.status_code == status, response.text
    assert response.json()["error_type"] == error_type and response.json()["field"] == field, response.json()
    assert "Traceback" not in response.text


def test_the_inference_apis_options_are_taken_and_change_nothing(tiny_server: Server) -> None:
    """`options` ({use_cache, wait_for_model}) is part of the Inference API's payload, and its clients send it
    (langchain's HuggingFaceInferenceAPIEmbeddings on every call): it was a 422 on every task."""
    options = {"use_cache": False, "wait_for_model": True}
    bodies = {
        "bert-classification": {"inputs": ["fine", "dull"], "parameters": {"top_k": 2}},
        "bert-ner": {"inputs": NER_TEXTS[0]},
        "distilbert-qa": {"inputs": {"question": "Who?", "context": QA_CONTEXT}},
    }
    with tiny_server.client() as client:
        for model, body in bodies.items():
            plain = client.post(f"/v1/models/{model}", json=body)
            with_options = client.post(f"/v1/models/{model}", json={**body, "options": options})
            assert with_options.status_code == 200 and with_options.json() == plain.json(), with_options.text


TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION = "text-classification", "token-classification"
OTHER_TASKS_PAYLOADS = [
    # (model, payload of another task, that task, what the model serves)
    ("distilbert-qa", {"inputs": "a text"}, "text-classification", "question-answering"),
    (
        "bert-classification",
        {"inputs": {"question": "Who?", "context": "Paris."}},
        "question-answering",
        "text-classification",
    ),
    ("bert-classification", {"inputs": "x", "parameters": {"stride": 4}}, "token-classification", TEXT_CLASSIFICATION),
    ("bert-ner", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}, "sentence-similarity", TOKEN_CLASSIFICATION),
]


@pytest.mark.parametrize(("model", "body", "other", "served"), OTHER_TASKS_PAYLOADS)
def test_another_tasks_payload_is_named_as_such(
    tiny_server: Server, model: str, body: dict, other: str, served: str
) -> None:
    """The schema's own refusal listed the fields the client did send as missing ones ('inputs.source_sentence:
    Field required (also: inputs.context, inputs.question)' for a question to an embedding model)."""
    with tiny_server.client() as client:
        response = client.post(f"/v1/models/{model}", json=body)
    assert response.status_code == 422 and response.json()["field"] == "inputs", response.text
    assert response.json()["error"].startswith(f"this payload is {other}'s, and model {model} serves {served}: ")


def test_unknown_parameters_are_named_to_the_hugging_face_client(tiny_server: Server) -> None:
    [outcome] = call_hf_client(
        f"{tiny_server.url}/v1/models/bert-ner", [("token_classification", ["Paris"], {"stride": 10_000})]
    )
    assert outcome["status"] == 422 and json.loads(outcome["body"])["field"] == "parameters.stride"


def test_the_task_api_is_admitted_limited_and_counted_as_the_native_api(tiny_server: Server) -> None:
    with tiny_server.client() as client:
        form = client.post(
            "/v1/models/bert-classification", content=b"inputs=x", headers={"content-type": "text/plain"}
        )
        empty = client.post("/v1/models/bert-classification", content=b"")
        assert client.get("/v1/models/bert-classification").json()["name"] == "bert-classification"
        client.post("/v1/models/bert-classification", json={"inputs": "counted"})
        metrics = client.get("/metrics").text
    assert form.status_code == 415 and empty.status_code == 422
    assert counted(metrics, "bert-classification", "task") >= 1
