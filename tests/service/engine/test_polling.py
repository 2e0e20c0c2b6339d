"""--model-control poll through real servers, in-process and in process mode: a new entry loads, a new export of a
served one reloads under traffic with every request answered, a removed entry unloads, and a repository that
vanishes leaves the models serving with one logged error (no crash loop)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import wait_for
from tests.service.lifecycle import Traffic, models, publish

CLASSIFY = ("/v1/models/a/classify", {"inputs": ["a gorgeous movie"]})


@pytest.mark.parametrize("mode", ["in-process", "process"])
def test_polling_loads_reloads_and_unloads(mode: str, tiny_repository: Path, tmp_path: Path, server_factory) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification")
    server = server_factory(
        repository,
        *("--engine-mode", mode, "--frontends", "2", "--model-control", "poll", "--repository-poll-s", "0.5"),
    )
    with server.client() as client, Traffic(server.url, *CLASSIFY) as traffic:
        first = models(client)["a"]["version"]
        publish(repository, "b", tiny_repository / "bert-ner")
        assert wait_for(lambda: models(client).get("b", {}).get("status") == "ready", timeout=60), models(client)
        assert client.post("/v1/models/b/ner", json={"inputs": ["Peter lives in Paris"]}).status_code == 200

        publish(repository, "a", tiny_repository / "bert-classification")
        assert wait_for(lambda: models(client)["a"]["version"] != first, timeout=60)
        assert client.get("/readyz").status_code == 200

        shutil.rmtree(repository / "b")
        assert wait_for(lambda: "b" not in models(client), timeout=60), models(client)
        assert client.post("/v1/models/b/ner", json={"inputs": ["Paris"]}).status_code == 404

        repository.rename(tmp_path / "moved")  # the volume goes away under the server
        assert wait_for(lambda: "cannot be read" in server.log(), timeout=30)
        before = len(traffic.statuses)
        assert wait_for(lambda: len(traffic.statuses) > before + 20, timeout=30)
        assert set(models(client)) == {"a"} and client.get("/readyz").status_code == 200
        (tmp_path / "moved").rename(repository)
        assert wait_for(lambda: "can be read again" in server.log(), timeout=30)
    assert traffic.statuses.count(200) == len(traffic.statuses) > 0, traffic.bodies[:3]
    assert server.log().count("cannot be read") == 1  # logged once, not at every scan
    assert server.process.poll() is None and httpx.get(server.url + "/livez").status_code == 200
    assert "restarted" not in server.log() and "engine started" not in server.log()[server.log().index("cannot") :]
