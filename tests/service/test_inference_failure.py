"""A batch that fails at run time: a 500 `inference` for the requests in it, the server goes on serving, and the
log line about the failed batch names those requests (x-request-id), in either engine mode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.service.conftest import wait_for

OVERRUN_WORD = "zzoverrunzz"


def repository_with_a_word_past_the_vocabulary(tiny_repository: Path, tmp_path: Path) -> Path:
    """The tiny BERT classifier whose tokenizer maps one word to an id its embedding table lacks: the self-test's
    text passes, a request with that word makes onnxruntime's lookup fail."""
    entry = tmp_path / "overrun"
    shutil.copytree(tiny_repository / "bert-classification", entry)
    tokenizer = json.loads((entry / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"][OVERRUN_WORD] = 1_000_000
    (entry / "tokenizer.json").write_text(json.dumps(tokenizer))
    return tmp_path


@pytest.mark.parametrize("mode", ["in-process", "process"])
def test_a_failing_batch_is_a_500_that_the_log_ties_to_its_request(
    tiny_repository: Path, tmp_path: Path, server_factory, mode: str
) -> None:
    repository = repository_with_a_word_past_the_vocabulary(tiny_repository, tmp_path)
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
