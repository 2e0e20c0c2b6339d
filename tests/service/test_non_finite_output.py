"""A model that answers NaN or an infinity for some inputs (an fp16 graph that overflows where fp32 does not), served
by a real server: the requests holding such an input are refused, the same on every protocol (500,
`non_finite_output`; OpenAI's shape on its route; gRPC INTERNAL), where the JSON routes answered a bare 500 and
base64, the Open Inference Protocol's tensors and gRPC passed NaN on; every other request is answered, and the
server goes on serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from export.pipeline import export_checkpoint
from tests.export.embedding_models import write_sentence_transformers
from tests.harness.broken_models import poison_word, poisoned_copy
from tests.harness.serving import free_port
from tests.service.conftest import Server

CLASSIFIER, EMBEDDER = "nan-classifier", "nan-embedder"
SELF_TEST = "bertserve self-test"  # the text the server's self-test sends: it must stay finite, as CLEAN
CLEAN = ["a gorgeous movie", "a dull film"]


@pytest.fixture(scope="module")
def broken(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory, server_factory) -> tuple[Server, int, dict]:
    """A server of two poisoned entries (a classifier, a sentence-transformers embedder), each with its own word
    that makes it answer NaN; gRPC on. (server, gRPC port, {entry: word})."""
    root = tmp_path_factory.mktemp("non-finite")
    repository = root / "repository"
    repository.mkdir()
    export_checkpoint(str(write_sentence_transformers(root / "st", "bert")), "clean-embedder", root, variants="fp32")
    words = {}
    for name, source in ((CLASSIFIER, tiny_repository / "bert-classification"), (EMBEDDER, root / "clean-embedder")):
        token_id, words[name] = poison_word(source, " ".join([SELF_TEST, *CLEAN]))
        poisoned_copy(source, repository / name, token_id)
    port = free_port()
    return server_factory(repository, "--grpc-port", str(port)), port, words


def assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 500, response.text
    body = response.json()
    assert body["error_type"] == "non_finite_output" and "NaN or an infinity" in body["error"]
    assert response.headers["x-request-id"]


def test_the_json_routes_refuse_the_request_and_answer_the_others(broken: tuple[Server, int, dict]) -> None:
    server, _, words = broken
    word = words[CLASSIFIER]
    with server.client() as client:
        assert_refused(client.post(f"/v1/models/{CLASSIFIER}/classify", json={"inputs": [CLEAN[0], word]}))
        assert_refused(client.post(f"/v1/models/{CLASSIFIER}", json={"inputs": f"{word} {CLEAN[1]}"}))  # HF task API
        assert_refused(client.post(f"/v1/models/{EMBEDDER}/embed", json={"inputs": [words[EMBEDDER]]}))
        fine = client.post(f"/v1/models/{CLASSIFIER}/classify", json={"inputs": CLEAN})
        assert fine.status_code == 200 and len(fine.json()["results"]) == 2
        vectors = client.post(f"/v1/models/{EMBEDDER}/embed", json={"inputs": CLEAN}).json()["results"]
        assert np.isfinite(np.array(vectors)).all()


def test_requests_sharing_a_batch_with_a_refused_one_are_answered(broken: tuple[Server, int, dict]) -> None:
    server, _, words = broken

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            texts = [CLEAN[i % 2] for i in range(12)]
            texts[5] = words[CLASSIFIER]
            posts = [client.post(f"/v1/models/{CLASSIFIER}/classify", json={"inputs": [text]}) for text in texts]
            return [response.status_code for response in await asyncio.gather(*posts)]

    statuses = asyncio.run(burst())
    assert statuses[5] == 500 and statuses[:5] + statuses[6:] == [200] * 11


def test_openais_base64_and_float_answers_are_refused_in_its_shape(broken: tuple[Server, int, dict]) -> None:
    server, _, words = broken
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    for encoding in ("base64", "float"):
        with pytest.raises(openai.InternalServerError) as refused:
            client.embeddings.create(model=EMBEDDER, input=[CLEAN[0], words[EMBEDDER]], encoding_format=encoding)
        assert refused.value.status_code == 500
        assert isinstance(refused.value.body, dict) and refused.value.body["code"] == "non_finite_output"
        assert refused.value.body["type"] == "server_error" and "NaN" in refused.value.body["message"]
    answer = client.embeddings.create(model=EMBEDDER, input=CLEAN)
    assert len(answer.data) == 2 and all(np.isfinite(item.embedding).all() for item in answer.data)


def test_the_open_inference_protocols_tensors_are_refused_over_rest_and_grpc(broken: tuple[Server, int, dict]) -> None:
    import grpc
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    server, port, words = broken
    texts = np.array([CLEAN[0], words[EMBEDDER]], dtype=object)
    rest = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    text = httpclient.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(texts, binary_data=True)
    with pytest.raises(InferenceServerException, match="NaN or an infinity") as refused:
        rest.infer(EMBEDDER, [text], outputs=[httpclient.InferRequestedOutput("embedding", binary_data=True)])
    assert refused.value.status() == "500"
    remote = grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}")
    grpc_text = grpcclient.InferInput("text", [2], "BYTES")
    grpc_text.set_data_from_numpy(texts)
    with pytest.raises(InferenceServerException, match="NaN or an infinity") as refused:
        remote.infer(EMBEDDER, [grpc_text])
    assert refused.value.status() == str(grpc.StatusCode.INTERNAL)
    grpc_text.set_data_from_numpy(np.array(CLEAN, dtype=object))
    assert np.isfinite(remote.infer(EMBEDDER, [grpc_text]).as_numpy("embedding")).all()


def test_the_engine_names_the_request_in_its_log(broken: tuple[Server, int, dict]) -> None:
    server, _, words = broken
    with server.client() as client:
        response = client.post(
            f"/v1/models/{CLASSIFIER}/classify", json={"inputs": [words[CLASSIFIER]]}, headers={"x-request-id": "nan-1"}
        )
    assert_refused(response)
    lines = [line for line in server.log().splitlines() if line.endswith("(request nan-1)")]
    assert len(lines) == 1 and f"WARNING service.engine.batcher [-]: batcher {CLASSIFIER}: a row of" in lines[0]
    assert "holds NaN or an infinity" in lines[0]
