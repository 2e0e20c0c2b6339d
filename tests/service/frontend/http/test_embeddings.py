"""Sentence embeddings served (issue 38): the real all-MiniLM-L6-v2 checkpoint of ../shared exported once, one real
server process, and the clients people use against it: the openai SDK on POST /v1/embeddings (both encodings,
`dimensions`), the native POST /v1/models/{name}/embed, huggingface_hub's feature_extraction and tritonclient over
the Open Inference Protocol, every vector equal to sentence-transformers' `encode` of the same checkpoint on real
sentences (huggingface_hub's sentence_similarity, every score to its cos_sim); the errors of the OpenAI route in
OpenAI's shape, whichever layer answers."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from benchmarks.realdata import SHARED, sst2
from export.pipeline import export_checkpoint
from service.errors import Overloaded
from service.frontend.http import errors as http_errors
from service.frontend.http.errors import OPENAI_SHAPE
from service.frontend.http.gateway import ShapedErrors
from tests.harness.environment import online_env
from tests.harness.serving import free_port
from tests.service.conftest import Server
from tests.service.frontend.http.test_api import counted

MINILM = SHARED / "models" / "minilm-embed"
MODEL = "minilm-embed"
CLASSIFIER = "bert-classification"  # a tiny classification entry beside it: the wrong task for embeddings
COSINE = 0.99999  # fp32 against sentence-transformers, as the export validates it
# The most a cosine similarity can move when each of its two unit vectors is within COSINE of the reference's:
# |a.b - a'.b'| <= |a - a'| + |b - b'|, and |a - a'| = sqrt(2 (1 - cos(a, a'))). (MiniLM's fp32 export: ~2e-4.)
SIMILARITY = 2 * (2 * (1 - COSINE)) ** 0.5
KEY = "client-key-0123456789abcdef"
SMALL_BODY = 1024  # the keyed server's --max-body-bytes (the least the server takes)

ABSENT = "../shared/models/minilm-embed or ../shared/data/sst2 (the real checkpoint and sentences) is absent"


def skip_without_shared() -> None:
    if not (MINILM / "modules.json").is_file() or not (SHARED / "data" / "sst2" / "dev.tsv").is_file():
        pytest.skip(ABSENT)


@pytest.fixture(scope="session")
def embed_repository(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """minilm-embed exported as the export's users export it (fp32), once per session, beside a tiny classifier."""
    skip_without_shared()
    repository = tmp_path_factory.mktemp("embed-repository")
    export_checkpoint(str(MINILM), MODEL, repository, variants="fp32")
    export_checkpoint(str(tiny_checkpoint("bert", "classification")), CLASSIFIER, repository, variants="fp32")
    return repository


@pytest.fixture(scope="module")
def embed_server(embed_repository: Path, server_factory) -> Server:
    return server_factory(embed_repository)


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers as its users load the same checkpoint."""
    skip_without_shared()
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(MINILM), device="cpu")


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    skip_without_shared()
    return [sentence for sentence, _ in sst2(24)]


def openai_client(server: Server, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=60)


def cosines(got: Any, want: np.ndarray) -> np.ndarray:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    return (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))


def test_the_openai_sdk_gets_sentence_transformers_vectors_in_both_encodings(
    embed_server: Server, reference, sentences: list[str]
) -> None:
    client = openai_client(embed_server)
    default = client.embeddings.create(model=MODEL, input=sentences)  # the SDK asks for base64, and decodes it
    floats = client.embeddings.create(model=MODEL, input=sentences, encoding_format="float")
    want = reference.encode(sentences, convert_to_numpy=True)
    for response in (default, floats):
        assert response.object == "list" and response.model == MODEL
        assert [item.index for item in response.data] == list(range(len(sentences)))
        vectors = np.array([item.embedding for item in response.data])
        assert vectors.shape == (len(sentences), 384)
        assert cosines(vectors, want).min() >= COSINE
        assert np.allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)  # OpenAI's vectors are unit length
    # base64 carries the same float32 values the float encoding writes out (each as its float32's shortest text)
    as_base64 = np.array([item.embedding for item in default.data], dtype=np.float32)
    as_floats = np.array([item.embedding for item in floats.data], dtype=np.float32)
    assert np.array_equal(as_base64.view(np.uint32), as_floats.view(np.uint32))
    tokens = sum(len(reference.tokenizer(sentence)["input_ids"]) for sentence in sentences)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == tokens
    one = client.embeddings.create(model=MODEL, input=sentences[0], encoding_format="float")
    assert len(one.data) == 1 and cosines(one.data[0].embedding, want[0]) >= COSINE


def test_dimensions_keeps_the_first_values_normalized_again(
    embed_server: Server, reference, sentences: list[str]
) -> None:
    client = openai_client(embed_server)
    response = client.embeddings.create(model=MODEL, input=sentences[:4], dimensions=64)
    vectors = np.array([item.embedding for item in response.data])
    assert vectors.shape == (4, 64)
    assert np.allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)
    assert cosines(vectors, reference.encode(sentences[:4])[:, :64]).min() >= COSINE


def test_the_raw_answer_is_openais_schema(embed_server: Server) -> None:
    with embed_server.client() as client:
        response = client.post(
            "/v1/embeddings",
            json={
                "model": MODEL,
                "input": ["a gorgeous movie", "a dull one"],
                "encoding_format": "base64",
                "user": "u",
            },
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"object", "data", "model", "usage"} and body["usage"]["prompt_tokens"] > 0
    assert body["data"][1]["object"] == "embedding" and body["data"][1]["index"] == 1
    assert isinstance(body["data"][1]["embedding"], str)
    assert len(np.frombuffer(base64.b64decode(body["data"][1]["embedding"]), dtype="<f4")) == 384
    assert response.headers["x-rows"] == "2" and "x-inference-time-ms" in response.headers


def test_the_native_route_embeds_alike(embed_server: Server, reference, sentences: list[str]) -> None:
    want = reference.encode(sentences[:8], convert_to_numpy=True)
    with embed_server.client() as client:
        response = client.post(f"/v1/models/{MODEL}/embed", json={"inputs": sentences[:8]})
        single = client.post(f"/v1/models/{MODEL}/embed", json={"inputs": sentences[0], "normalize": False})
        metrics = client.get("/metrics").text
    assert response.status_code == 200, response.text
    assert response.json()["model"] == MODEL and response.headers["x-rows"] == "8"
    vectors = np.array(response.json()["results"])
    assert vectors.shape == (8, 384) and cosines(vectors, want).min() >= COSINE
    assert single.status_code == 200 and len(single.json()["results"]) == 1
    assert cosines(single.json()["results"][0], want[0]) >= COSINE  # the model's own vector: unit length already
    assert counted(metrics, MODEL, "embed") >= 2


def test_texts_past_the_window_are_cut_or_refused(embed_server: Server, reference) -> None:
    long = " ".join(["the film is a quiet, patient study of grief"] * 40)  # ~400 tokens; the window is 256
    with embed_server.client() as client:
        refused = client.post(f"/v1/models/{MODEL}/embed", json={"inputs": ["short", long], "truncate": False})
        cut = client.post(f"/v1/models/{MODEL}/embed", json={"inputs": [long], "truncate": True})
        by_default = client.post("/v1/embeddings", json={"model": MODEL, "input": long})  # --token-overflow truncate
    assert refused.status_code == 422 and refused.json()["field"] == "inputs.1", refused.text
    assert "this model takes at most 256" in refused.json()["error"]
    want = reference.encode([long], convert_to_numpy=True)[0]  # sentence-transformers cuts it to 256 tokens too
    assert cut.status_code == 200 and cosines(cut.json()["results"][0], want) >= COSINE
    assert by_default.status_code == 200 and by_default.json()["usage"]["prompt_tokens"] == 256


def test_the_model_shows_its_task_and_dimension(embed_server: Server) -> None:
    with embed_server.client() as client:
        info = client.get(f"/v1/models/{MODEL}").json()
        listed = client.get("/v1/models").json()["models"]
    assert info["task"] == "embedding" and info["status"] == "ready" and info["max_length"] == 256
    assert info["embedding"] == {
        "dimension": 384,
        "pooling": "mean",
        "normalize": True,
        "dense_layers": 0,
        "similarity": "cosine",
        "prompts": {},
        "default_prompt": None,
    }
    assert {model["name"]: model["embedding"] for model in listed}[CLASSIFIER] is None


def openai_error_of(response: httpx.Response) -> dict[str, Any]:
    """The body of an error in OpenAI's shape, checked to be exactly that shape."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


ERRORS = [
    # (body, status, type, param, code)
    ({"model": "no-such-model", "input": "x"}, 404, "invalid_request_error", None, "model_not_found"),
    ({"model": MODEL, "input": "x", "dimensions": 385}, 400, "invalid_request_error", "dimensions", "validation"),
    ({"model": MODEL, "input": "x", "dimensions": 0}, 400, "invalid_request_error", "dimensions", "validation"),
    ({"model": MODEL, "input": []}, 400, "invalid_request_error", "input", "validation"),
    ({"model": MODEL, "input": ""}, 400, "invalid_request_error", "input", "validation"),
    ({"model": MODEL, "input": ["fine", ""]}, 400, "invalid_request_error", "input.1", "validation"),
    ({"model": MODEL, "input": [""] * 11}, 400, "invalid_request_error", "input.0", "validation"),  # not input.10
    ({"model": MODEL, "input": [[101, 2023]]}, 400, "invalid_request_error", "input", "validation"),
    ({"model": MODEL, "input": [101, 2023]}, 400, "invalid_request_error", "input", "validation"),
    ({"model": MODEL, "input": [True]}, 400, "invalid_request_error", "input.0", "validation"),
    ({"model": MODEL, "input": ["fine", 7]}, 400, "invalid_request_error", "input.1", "validation"),
    ({"model": MODEL, "input": ["x"] * 65}, 400, "invalid_request_error", "input", "validation"),
    ({"model": MODEL, "input": ["fine", "x" * 20_001]}, 400, "invalid_request_error", "input.1", "validation"),
    (
        {"model": MODEL, "input": "x", "encoding_format": "int8"},
        400,
        "invalid_request_error",
        "encoding_format",
        "validation",
    ),
    ({"input": "x"}, 400, "invalid_request_error", "model", "validation"),
    ({"model": MODEL, "input": "x", "priority": 1}, 400, "invalid_request_error", "priority", "validation"),
    ({"model": CLASSIFIER, "input": "x"}, 400, "invalid_request_error", None, "wrong_task"),
]


@pytest.mark.parametrize(("body", "status", "kind", "param", "code"), ERRORS)
def test_errors_have_openais_shape(
    embed_server: Server, body: dict, status: int, kind: str, param: str | None, code: str
) -> None:
    with embed_server.client() as client:
        response = client.post("/v1/embeddings", json=body)
        native = client.post(f"/v1/models/{MODEL}/embed", json={"inputs": "still served", "dimensions": 385})
    assert response.status_code == status, response.text
    error = openai_error_of(response)
    assert (error["type"], error["param"], error["code"]) == (kind, param, code), error
    assert error["message"]
    if code == "wrong_task":
        assert f"/v1/models/{CLASSIFIER}/classify" in error["message"]
    assert native.status_code == 422 and native.json()["field"] == "dimensions"  # the native body, as ever


def test_errors_before_the_endpoint_have_openais_shape_too(embed_server: Server) -> None:
    with embed_server.client() as client:
        not_json = client.post("/v1/embeddings", content=b"model=x", headers={"content-type": "text/plain"})
        broken = client.post("/v1/embeddings", content=b"{", headers={"content-type": "application/json"})
        empty = client.post("/v1/embeddings", content=b"")
        method = client.get("/v1/embeddings")
    assert not_json.status_code == 415 and openai_error_of(not_json)["code"] == "unsupported_media_type"
    assert broken.status_code == 400 and openai_error_of(broken)["code"] == "bad_request"
    assert empty.status_code == 400 and openai_error_of(empty)["param"] == "body"
    assert method.status_code == 405 and openai_error_of(method)["code"] == "method_not_allowed"


def test_the_sdk_raises_its_own_errors(embed_server: Server) -> None:
    client = openai_client(embed_server)
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="no-such-model", input=["x"])
    assert missing.value.status_code == 404 and "no-such-model" in missing.value.message
    assert missing.value.code == "model_not_found" and missing.value.type == "invalid_request_error"  # OpenAI's
    with pytest.raises(openai.BadRequestError) as too_many:  # OpenAI's status for what the server calls 422
        client.embeddings.create(model=MODEL, input=["x"], dimensions=1024)
    assert too_many.value.param == "dimensions" and "384" in too_many.value.message
    with pytest.raises(openai.BadRequestError) as wrong:
        client.embeddings.create(model=CLASSIFIER, input=["x"])
    assert wrong.value.code == "wrong_task"
    with pytest.raises(openai.BadRequestError) as token_ids:  # what LangChain sends by default: tiktoken's
        client.embeddings.create(model=MODEL, input=[[9906, 1917], [40, 1093]])
    assert token_ids.value.param == "input" and "check_embedding_ctx_length=False" in token_ids.value.message


def test_the_metrics_label_the_openai_route(embed_server: Server) -> None:
    with embed_server.client() as client:
        assert client.post("/v1/embeddings", json={"model": MODEL, "input": "counted"}).status_code == 200
        assert client.post("/v1/embeddings", json={"model": "nope", "input": "x"}).status_code == 404
        before = counted(client.get("/metrics").text, MODEL, "embeddings", "400")
        invalid = client.post("/v1/embeddings", json={"model": MODEL, "input": []}, headers={"x-request-id": "r-400"})
        metrics = client.get("/metrics").text
    assert counted(metrics, MODEL, "embeddings") >= 1
    assert counted(metrics, "unknown", "embeddings", "404") >= 1
    # OpenAI's 400 for the server's 422, as answered: counted and logged 400, never 422
    assert invalid.status_code == 400
    assert counted(metrics, MODEL, "embeddings", "400") == before + 1
    assert counted(metrics, MODEL, "embeddings", "422") == 0
    logged = [line for line in embed_server.log().splitlines() if "r-400" in line and "/v1/embeddings" in line]
    assert logged and all('"POST /v1/embeddings" 400' in line for line in logged), logged


def test_the_native_routes_keep_the_native_error_body(embed_server: Server) -> None:
    with embed_server.client() as client:
        wrong = client.post(f"/v1/models/{MODEL}/classify", json={"inputs": "x"})
        missing = client.post("/v1/models/no-such-model/embed", json={"inputs": "x"})
    assert wrong.status_code == 400 and wrong.json()["error_type"] == "wrong_task"
    assert f"is an embedding model; use POST /v1/models/{MODEL}/embed" in wrong.json()["error"]
    assert missing.status_code == 404 and set(missing.json()) == {"error", "error_type", "field"}


@pytest.fixture(scope="module")
def keyed_server(embed_repository: Path, server_factory) -> Server:
    return server_factory(
        embed_repository, "--models", MODEL, "--max-body-bytes", str(SMALL_BODY), env={"BERTSERVE_API_KEYS": KEY}
    )


def test_keys_and_the_body_limit_answer_in_openais_shape(keyed_server: Server, sentences: list[str]) -> None:
    """The gateway's refusals before the endpoint (401, 413) on the OpenAI route: OpenAI's body, the same status."""
    assert len(openai_client(keyed_server, KEY).embeddings.create(model=MODEL, input=sentences[:2]).data) == 2
    with pytest.raises(openai.AuthenticationError) as refused:
        openai_client(keyed_server, "not-the-key-0123456789").embeddings.create(model=MODEL, input=["x"])
    assert refused.value.status_code == 401 and refused.value.type == "authentication_error"
    big = {"model": MODEL, "input": ["word " * 100] * 3}
    with keyed_server.client(headers={"authorization": f"Bearer {KEY}"}) as client:
        too_large = client.post("/v1/embeddings", json=big)
        native = client.post(f"/v1/models/{MODEL}/embed", json={"inputs": big["input"]})
    assert too_large.status_code == 413 and openai_error_of(too_large)["code"] == "payload_too_large"
    assert native.status_code == 413 and native.json()["error_type"] == "payload_too_large"


def test_an_overload_refusal_keeps_its_status_and_retry_after() -> None:
    """429 (admission refuses before the body is read) through the OpenAI route's renderer: the status and the
    Retry-After header stay, the body becomes OpenAI's, its length follows."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(
        http_errors.send_error(ShapedErrors(send, OPENAI_SHAPE, {}), Overloaded("the server is busy", retry_after_s=3))
    )
    start, body = sent
    headers = dict(start["headers"])
    assert start["status"] == 429 and headers[b"retry-after"] == b"3" and headers[b"connection"] == b"close"
    assert json.loads(body["body"]) == {
        "error": {"message": "the server is busy", "type": "rate_limit_error", "param": None, "code": "overloaded"}
    }
    assert headers[b"content-length"] == str(len(body["body"])).encode()


HF_FEATURE_EXTRACTION = """
import json, sys
from huggingface_hub import InferenceClient
url, texts, kwargs = json.loads(sys.argv[1])
client = InferenceClient(model=url)
print(json.dumps([client.feature_extraction(text, **kwargs).tolist() for text in texts]))
"""


def hf_feature_extraction(url: str, texts: list[str], **kwargs: Any) -> list[Any]:
    """huggingface_hub's InferenceClient.feature_extraction of each text, in its own process (the hub client refuses
    every request while the suite's offline variables are set)."""
    done = subprocess.run(
        [sys.executable, "-c", HF_FEATURE_EXTRACTION, json.dumps([url, texts, kwargs])],
        env=online_env("HF_TOKEN"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_huggingface_hubs_feature_extraction(embed_server: Server, reference, sentences: list[str]) -> None:
    """The Hugging Face task API at the model's own URL: a vector per input, as TEI answers feature-extraction."""
    url = f"{embed_server.url}/v1/models/{MODEL}"
    plain, cut = hf_feature_extraction(url, sentences[:3]), hf_feature_extraction(url, sentences[:1], dimensions=32)
    want = reference.encode(sentences[:3], convert_to_numpy=True)
    vectors = np.array(plain)
    assert vectors.shape == (3, 1, 384) and cosines(vectors[:, 0], want).min() >= COSINE
    assert np.array(cut).shape == (1, 1, 32) and cosines(cut[0][0], want[0, :32]) >= COSINE
    with embed_server.client() as client:
        several = client.post(url, json={"inputs": sentences[:2], "normalize": True, "truncate": True})
        unknown = client.post(url, json={"inputs": "x", "prompt_name": "query"})
        # the Inference API's older clients: parameters under `parameters` (langchain's HuggingFaceHubEmbeddings
        # sends an empty object), `options` (its HuggingFaceInferenceAPIEmbeddings sends both): a 422 each, before
        older = {"inputs": sentences[:2], "parameters": {"normalize": False}, "options": {"wait_for_model": True}}
        nested = client.post(url, json=older)
        empty = client.post(url, json={"inputs": sentences[:2], "parameters": {}, "options": {"use_cache": True}})
        plain_normalized = client.post(url, json={"inputs": sentences[:2], "normalize": False})
        twice = client.post(url, json={"inputs": "x", "normalize": True, "parameters": {"normalize": True}})
        question = client.post(url, json={"inputs": {"question": "Who?", "context": "Paris."}})
        stray = client.post(url, json={"inputs": "x", "parameters": {"pooling": "cls"}})
    assert several.status_code == 200 and cosines(several.json(), want[:2]).min() >= COSINE
    assert unknown.status_code == 422 and unknown.json()["field"] == "prompt_name", unknown.text  # top level here
    assert nested.status_code == 200 and nested.json() == plain_normalized.json(), nested.text
    assert empty.status_code == 200 and empty.json() == several.json(), empty.text
    assert twice.status_code == 422 and twice.json()["field"] == "normalize", twice.text
    assert "given twice" in twice.json()["error"]
    assert question.status_code == 422 and question.json()["field"] == "inputs", question.text
    assert stray.status_code == 422 and stray.json()["field"] == "parameters.pooling", stray.text  # where it was sent
    want_words = f"this payload is question-answering's, and model {MODEL} serves feature-extraction and sentence-"
    assert question.json()["error"].startswith(want_words), question.text


HF_SENTENCE_SIMILARITY = """
import json, sys
from huggingface_hub import InferenceClient
url, sentence, others = json.loads(sys.argv[1])
print(json.dumps(InferenceClient(model=url).sentence_similarity(sentence, other_sentences=others)))
"""


def hf_sentence_similarity(url: str, sentence: str, others: list[str]) -> list[float]:
    """huggingface_hub's InferenceClient.sentence_similarity, in its own process (as hf_feature_extraction)."""
    done = subprocess.run(
        [sys.executable, "-c", HF_SENTENCE_SIMILARITY, json.dumps([url, sentence, others])],
        env=online_env("HF_TOKEN"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_huggingface_hubs_sentence_similarity(embed_server: Server, reference, sentences: list[str]) -> None:
    """sentence-similarity at the model's own URL: the cosine similarity of the source to each sentence, in order,
    as sentence-transformers' cos_sim computes it of the server's own vectors (to float rounding), and of its own
    `encode` (to what the vectors' COSINE allows); the source and the sentences are one request's rows."""
    from sentence_transformers import util

    url = f"{embed_server.url}/v1/models/{MODEL}"
    source, others = sentences[0], sentences[1:6]
    got = hf_sentence_similarity(url, source, others)
    assert len(got) == len(others) and all(isinstance(score, float) for score in got)
    with embed_server.client() as client:
        served = client.post(f"/v1/models/{MODEL}/embed", json={"inputs": [source, *others]}).json()["results"]
        raw = client.post(url, json={"inputs": {"source_sentence": source, "sentences": others[::-1]}})
    assert np.allclose(got, util.cos_sim(served[:1], served[1:])[0].tolist(), rtol=0, atol=1e-6)
    want = util.cos_sim(reference.encode([source]), reference.encode(others))[0].tolist()
    assert np.allclose(got, want, rtol=0, atol=SIMILARITY), (got, want)
    assert raw.status_code == 200 and raw.headers["x-rows"] == str(len(others) + 1), raw.text
    assert np.allclose(raw.json(), got[::-1], rtol=0, atol=1e-6)
    # a text and itself: 1 at most (float32 vectors' dot product in float64 gave 1.00000006 for some)
    itself = [hf_sentence_similarity(url, text, [text])[0] for text in sentences[:16]]
    assert all(0.9999 < score <= 1.0 for score in itself), itself


SIMILARITY_ERRORS = [
    ({"source_sentence": "a film", "sentences": []}, None, "inputs.sentences"),
    ({"sentences": ["a film"]}, None, "inputs.source_sentence"),
    ({"source_sentence": "a film", "sentences": ["fine", "x" * 20_001]}, None, "inputs.sentences.1"),
    ({"source_sentence": "a film", "sentences": ["fine", "word " * 300]}, {"truncate": False}, "inputs.sentences.1"),
    ({"source_sentence": "a film", "sentences": ["x"] * 64}, None, "inputs.sentences"),  # 65 rows: the limit is 64
    ({"source_sentence": "a film", "sentences": ["x"]}, {"prompt_name": "query"}, "parameters.prompt_name"),
    ({"source_sentence": "a film", "sentences": ["x"]}, {"normalize": True}, "parameters.normalize"),
]


@pytest.mark.parametrize(("inputs", "parameters", "field"), SIMILARITY_ERRORS)
def test_sentence_similarity_names_the_field_at_fault(
    embed_server: Server, inputs: dict, parameters: dict | None, field: str
) -> None:
    with embed_server.client() as client:
        response = client.post(f"/v1/models/{MODEL}", json={"inputs": inputs, "parameters": parameters})
    assert response.status_code == 422, response.text
    assert response.json()["error_type"] == "validation" and response.json()["field"] == field, response.json()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_gets_an_fp32_tensor(embed_server: Server, reference, sentences: list[str], binary: bool) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=embed_server.url.removeprefix("http://"))
    metadata = client.get_model_metadata(MODEL)
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["outputs"]] == [("embedding", "FP32", [-1, -1])]
    text = httpclient.InferInput("text", [4], "BYTES")
    text.set_data_from_numpy(np.array(sentences[:4], dtype=object), binary_data=binary)
    output = httpclient.InferRequestedOutput("embedding", binary_data=binary)
    vectors = client.infer(MODEL, [text], outputs=[output]).as_numpy("embedding")
    assert vectors.shape == (4, 384) and vectors.dtype == np.float32
    assert cosines(vectors, reference.encode(sentences[:4], convert_to_numpy=True)).min() >= COSINE
    with embed_server.client() as http:  # the native route's JSON floats: the very same float32 values
        native = http.post(f"/v1/models/{MODEL}/embed", json={"inputs": sentences[:4], "normalize": True})
    native_vectors = np.array(native.json()["results"], dtype=np.float32)
    assert np.array_equal(native_vectors.view(np.uint32), vectors.view(np.uint32))
    cut = client.infer(MODEL, [text], parameters={"dimensions": 16}).as_numpy("embedding")
    assert cut.shape == (4, 16) and np.allclose(np.linalg.norm(cut, axis=-1), 1.0, atol=1e-5)


def test_tritonclient_over_grpc_gets_the_same_tensor(
    embed_repository: Path, server_factory, reference, sentences: list[str]
) -> None:
    import tritonclient.grpc as grpcclient

    port = free_port()
    server_factory(embed_repository, "--models", MODEL, "--grpc-port", str(port))
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}")
    text = grpcclient.InferInput("text", [3], "BYTES")
    text.set_data_from_numpy(np.array(sentences[:3], dtype=object))
    vectors = client.infer(MODEL, [text]).as_numpy("embedding")
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert cosines(vectors, reference.encode(sentences[:3], convert_to_numpy=True)).min() >= COSINE


def test_the_sdks_models_api_lists_and_retrieves_the_served_models(embed_server: Server) -> None:
    """`client.models.list()` failed inside the openai SDK (a TypeError: no `data`), and `retrieve` gave a model
    whose id was None: OpenAI-compatible gateways list a server's models so."""
    client = openai_client(embed_server)
    listed = {model.id: model for model in client.models.list()}
    assert set(listed) == {MODEL, CLASSIFIER}
    assert all(model.object == "model" and model.owned_by == "bertserve" for model in listed.values())
    assert listed[MODEL].created > 1_700_000_000  # the version's export time: this session's
    one = client.models.retrieve(MODEL)
    assert (one.id, one.created) == (MODEL, listed[MODEL].created)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    native = httpx.get(embed_server.url + "/v1/models").json()  # the native list, as before, beside
    assert {model["name"] for model in native["models"]} == {MODEL, CLASSIFIER}
