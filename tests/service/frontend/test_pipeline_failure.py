"""A batch that fails at run time: a 500 `inference` for the requests in it, the server goes on serving, and the
log line about the failed batch names those requests (x-request-id), in either engine mode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.service.conftest import wait_for

OVERRUN_WORD = "zzoverrunzz"


def repository_with_a_word_past_the_vocabulary(tiny_repository: Path, tmp_path: Path, record_vocab: bool) -> Path:
    """The tiny BERT classifier whose tokenizer maps one word to an id its embedding table lacks. With the
    vocabulary size in model.json the server refuses the tokenizer at load; without it (an entry exported before
    it was recorded) the self-test's text passes and a request with that word makes onnxruntime's lookup fail."""
    entry = tmp_path / "overrun"
    shutil.copytree(tiny_repository / "bert-classification", entry)
    tokenizer = json.loads((entry / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"][OVERRUN_WORD] = 1_000_000
    (entry / "tokenizer.json").write_text(json.dumps(tokenizer))
    if not record_vocab:
        config = json.loads((entry / "model.json").read_text())
        del config["encoder"]["vocab_size"]
        (entry / "model.json").write_text(json.dumps(config))
    return tmp_path


def test_a_tokenizer_with_ids_past_the_vocabulary_is_a_failed_model(
    tiny_repository: Path, tmp_path: Path, server_factory
) -> None:
    repository = repository_with_a_word_past_the_vocabulary(tiny_repository, tmp_path, record_vocab=True)
    shutil.copytree(tiny_repository / "bert-classification", repository / "good")
    server = server_factory(repository)
    with server.client() as client:
        assert client.get("/readyz").json()["failed"] == ["overrun"]
        model = client.get("/v1/models/overrun").json()
        assert model["status"] == "failed"
        assert "has token ids up to 1000000, but the model's vocabulary has" in model["error"], model
        assert client.post("/v1/models/overrun/classify", json={"inputs": ["fine"]}).status_code == 503
        assert client.post("/v1/models/good/classify", json={"inputs": ["fine"]}).status_code == 200


@pytest.mark.parametrize("mode", ["in-process", "process"])
def test_a_failing_batch_is_a_500_that_the_log_ties_to_its_request(
    tiny_repository: Path, tmp_path: Path, server_factory, mode: str
) -> None:
    repository = repository_with_a_word_past_the_vocabulary(tiny_repository, tmp_path, record_vocab=False)
    server = server_factory(repository, "--engine-mode", mode, "--frontends", "1")
    with server.client() as client:
        failed = client.post(
            "/v1/models/overrun/classify", json={"inputs": [f"fine {OVERRUN_WORD}"]}, headers={"x-request-id": "bad-1"}
        )
        assert failed.status_code == 500, failed.text
        assert failed.json() == {
            "error": "inference failed for this request's batch",
            "error_type": "inference",
            "field": None,
        }
        assert failed.headers["x-request-id"] == "bad-1"
        assert client.post("/v1/models/overrun/classify", json={"inputs": ["fine"]}).status_code == 200
    assert wait_for(lambda: "a batch of 1 rows failed (requests bad-1)" in server.log(), timeout=10), server.log()
    assert "Traceback" not in failed.text
