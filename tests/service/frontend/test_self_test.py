"""Ready means one real request went through the whole path: a model that loads but cannot answer is failed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx


def test_a_model_that_loads_but_cannot_answer_is_reported_failed(tiny_repository: Path, tmp_path: Path, server_factory):
    shutil.copytree(tiny_repository / "bert-classification", tmp_path / "good")
    shutil.copytree(tiny_repository / "bert-classification", tmp_path / "wrong-tokenizer")
    # another model's tokenizer: it loads, and its ids run past this model's vocabulary; model.json without the
    # vocabulary size (an entry exported before it was recorded), so only the self-test can find out
    shutil.copy(tiny_repository / "roberta-classification" / "tokenizer.json", tmp_path / "wrong-tokenizer")
    config = json.loads((tmp_path / "wrong-tokenizer" / "model.json").read_text())
    del config["encoder"]["vocab_size"]
    (tmp_path / "wrong-tokenizer" / "model.json").write_text(json.dumps(config))
    server = server_factory(tmp_path, "--log-level", "info")
    with server.client() as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["failed"] == ["wrong-tokenizer"], ready.text
        models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        assert models["good"]["status"] == "ready"
        assert models["wrong-tokenizer"]["status"] == "failed"
        assert models["wrong-tokenizer"]["error"].startswith("self-test failed")
        refused = client.post("/v1/models/wrong-tokenizer/classify", json={"inputs": ["x"]})
        assert refused.status_code == 503 and refused.json()["error_type"] == "unavailable"
        assert client.post("/v1/models/good/classify", json={"inputs": ["x"]}).status_code == 200
    assert "model wrong-tokenizer: self-test failed" in server.log()
    assert httpx.get(server.url + "/livez").status_code == 200
