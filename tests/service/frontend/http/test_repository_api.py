"""The repository API (--model-control explicit) through real servers, in-process and in process mode: load,
reload under traffic with no failed request, unload, failed loads that leave the old version serving, the admin
key, and the names and calls it must refuse."""

from __future__ import annotations

import http.client
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as tritonhttp
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.harness.serving import free_port
from tests.service.conftest import run_service, wait_for
from tests.service.lifecycle import Traffic, models, publish, samples

ADMIN_KEY = "admin-key-0123456789abcdef"
USER_KEY = "user-key-0123456789abcdefgh"
USER = {"Authorization": f"Bearer {USER_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CLASSIFY = ("/v1/models/a/classify", {"inputs": ["a gorgeous movie"]})


@pytest.fixture(scope="module", params=["in-process", "process"])
def explicit(request, tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory, server_factory):
    """A server with entries a (classification) and b (ner), only a loaded at start; admin and inference keys."""
    root = tmp_path_factory.mktemp("explicit")
    repository = root / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification")
    publish(repository, "b", tiny_repository / "bert-ner")
    for name, key in (("admin.keys", ADMIN_KEY), ("user.keys", USER_KEY)):
        (root / name).write_text(key + "\n")
        (root / name).chmod(0o600)
    grpc_port = free_port()
    server = server_factory(
        repository,
        *("--engine-mode", request.param, "--frontends", "2", "--model-control", "explicit", "--model", "a"),
        *("--grpc-port", str(grpc_port)),
        *("--admin-api-key-file", str(root / "admin.keys"), "--api-key-file", str(root / "user.keys")),
        *("--metrics-auth", "open"),
    )
    server.repository = repository
    server.source = tiny_repository
    server.grpc = f"127.0.0.1:{grpc_port}"
    return server


def admin(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(server.url + path, headers=ADMIN, timeout=120, **kwargs)


def every_front_end_serves(server, name: str, version: str, connections: int = 8) -> bool:
    """Whether `version` of `name` is what fresh connections read right after a load call's answer: with two
    front-ends (process mode) the kernel spreads them over both, and the call is answered once each serves it. (It
    had been answered once the front-end that took it did: a CI run once read the version before on the test's
    keep-alive connection, which was on the other one.)"""
    read = [
        httpx.get(server.url + "/v1/models", headers={**USER, "Connection": "close"}).json()["models"]
        for _ in range(connections)
    ]
    return all(next(m["version"] for m in listed if m["name"] == name) == version for listed in read)


def test_only_the_named_models_load_at_start_and_the_index_lists_every_entry(explicit) -> None:
    with explicit.client(headers=USER) as client:
        listed = models(client)
        assert set(listed) == {"a"} and listed["a"]["status"] == "ready" and listed["a"]["version"], listed
        assert client.get("/readyz").status_code == 200
    index = admin(explicit, "/v2/repository/index")
    assert index.status_code == 200, index.text
    states = {m["name"]: (m["state"], bool(m["version"])) for m in index.json()}
    assert states == {"a": ("READY", True), "b": ("UNAVAILABLE", True)}
    assert [m["name"] for m in admin(explicit, "/v2/repository/index", json={"ready": True}).json()] == ["a"]


def test_the_admin_routes_need_the_admin_key(explicit) -> None:
    for headers, status in [({}, 401), (USER, 403), ({"Authorization": "Bearer not-a-key-0123456789"}, 401)]:
        for path in ("/v2/repository/index", "/v2/repository/models/b/load", "/v2/repository/models/a/unload"):
            response = httpx.post(explicit.url + path, headers=headers)
            assert response.status_code == status, (path, headers, response.text)
            assert response.json()["error_type"] in ("unauthorized", "forbidden")
    assert httpx.post(explicit.url + CLASSIFY[0], json=CLASSIFY[1], headers=ADMIN).status_code == 401
    with explicit.client(headers=USER) as client:
        assert set(models(client)) == {"a"}  # nothing was loaded or unloaded


# A model's own series, which go when it is no longer served: the Grafana dashboard's "Served models" table, its
# model list, "Models ready" and the admission panel read them
MODEL_SERIES = (
    "bertserve_model_ready",
    "bertserve_model_info",
    "bertserve_model_placement",
    "bertserve_queue_depth",
    "bertserve_model_admission_share",
    "bertserve_model_version_info",
)


def model_samples(server, model: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of `model` on /metrics, by sample name: its labels and value."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.labels.get("model") == model:
                found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def model_series(server, model: str) -> dict[str, list[float]]:
    """MODEL_SERIES' values for `model` on /metrics (each a list: info and placement have more labels)."""
    samples = model_samples(server, model)
    return {name: [value for _, value in samples.get(name, [])] for name in MODEL_SERIES}


def load_failed(server, model: str) -> list[float]:
    return [value for _, value in model_samples(server, model).get("bertserve_model_load_failed", [])]


def test_load_and_unload_a_model(explicit) -> None:
    loaded = admin(explicit, "/v2/repository/models/b/load")
    assert loaded.status_code == 200 and loaded.json()["state"] == "READY", loaded.text
    with explicit.client(headers=USER) as client:
        assert every_front_end_serves(explicit, "b", loaded.json()["version"])
        assert models(client)["b"]["status"] == "ready"
        assert client.post("/v1/models/b/ner", json={"inputs": ["Peter lives in Paris"]}).status_code == 200
        assert model_series(explicit, "b") == {
            "bertserve_model_ready": [1.0],
            "bertserve_model_info": [1.0],
            "bertserve_model_placement": [1.0],
            "bertserve_queue_depth": [0.0],
            "bertserve_model_admission_share": [1.0],  # its gate, made at its load
            "bertserve_model_version_info": [1.0],
        }
        unloaded = admin(explicit, "/v2/repository/models/b/unload")
        assert unloaded.status_code == 200 and unloaded.json()["state"] == "UNAVAILABLE", unloaded.text
        gone = client.post("/v1/models/b/ner", json={"inputs": ["Peter lives in Paris"]})
        assert gone.status_code == 404 and gone.json()["error_type"] == "not_found", gone.text
        assert "b" not in models(client)
        assert client.post(*CLASSIFY[:1], json=CLASSIFY[1]).status_code == 200
    # its series are gone (in process mode too, where each process's file keeps a series it cannot remove), a's stay
    assert wait_for(lambda: not any(model_series(explicit, "b").values()), timeout=10), model_series(explicit, "b")
    assert all(values for values in model_series(explicit, "a").values()), model_series(explicit, "a")
    again = admin(explicit, "/v2/repository/models/b/load")  # served again: its series again, a new gate's share
    assert again.status_code == 200 and again.json()["state"] == "READY", again.text
    with explicit.client(headers=USER) as client:
        assert client.post("/v1/models/b/ner", json={"inputs": ["Peter lives in Paris"]}).status_code == 200
    shown = model_series(explicit, "b")
    assert all(len(values) == 1 for values in shown.values()), shown
    assert shown["bertserve_model_admission_share"] == shown["bertserve_model_ready"] == [1.0], shown
    assert admin(explicit, "/v2/repository/models/b/unload").status_code == 200
    states = {m["name"]: m["state"] for m in admin(explicit, "/v2/repository/index").json()}
    assert states == {"a": "READY", "b": "UNAVAILABLE"}
    assert f"model b: version {loaded.json()['version']} closed" in explicit.log()


def test_a_reload_under_traffic_answers_every_request(explicit) -> None:
    with explicit.client(headers=USER) as client:
        before = models(client)["a"]["version"]
        with Traffic(explicit.url, *CLASSIFY, headers=USER, clients=3) as traffic:
            for _ in range(3):
                publish(explicit.repository, "a", explicit.source / "bert-classification")
                reloaded = admin(explicit, "/v2/repository/models/a/load")
                assert reloaded.status_code == 200, reloaded.text
                assert client.get("/readyz").status_code == 200
                assert reloaded.json()["version"] != before
                assert every_front_end_serves(explicit, "a", reloaded.json()["version"])
        assert traffic.statuses.count(200) == len(traffic.statuses) > 0, traffic.bodies[:3]
    # the old versions closed once their last request was answered, not at the fallback (--request-timeout-s, 30 s)
    assert wait_for(lambda: f"model a: version {before} closed" in explicit.log(), timeout=10)
    loads = samples(explicit.url, "bertserve_model_loads_total")
    assert loads[(("model", "a"), ("result", "ok"))] >= 4  # the start and three reloads
    versions = samples(explicit.url, "bertserve_model_version_info")
    assert [labels for labels, value in versions.items() if value == 1 and ("model", "a") in labels] == [
        (("model", "a"), ("version", reloaded.json()["version"]))
    ]


@pytest.mark.parametrize("kind", ["corrupt", "half"])
def test_a_failed_load_leaves_the_old_version_serving(explicit, kind: str) -> None:
    with explicit.client(headers=USER) as client:
        serving = models(client)["a"]["version"]
        with Traffic(explicit.url, *CLASSIFY, headers=USER) as traffic:
            publish(explicit.repository, "a", explicit.source / "bert-classification", **{kind: True})
            failed = admin(explicit, "/v2/repository/models/a/load")
        assert failed.status_code == 422 and failed.json()["error_type"] == "load_failed", failed.text
        assert "failed to load" in failed.json()["error"] and str(explicit.repository) not in failed.json()["error"]
        assert traffic.statuses.count(200) == len(traffic.statuses) > 0, traffic.bodies[:3]
        listed = models(client)["a"]
        assert (listed["status"], listed["version"]) == ("ready", serving)
        assert "failed to load" in listed["load_error"]
        assert samples(explicit.url, "bertserve_model_load_failed")[(("model", "a"),)] == 1
        index = {m["name"]: m for m in admin(explicit, "/v2/repository/index").json()}
        assert index["a"]["state"] == "READY" and "failed to load" in index["a"]["reason"]
        publish(explicit.repository, "a", explicit.source / "bert-classification")
        assert admin(explicit, "/v2/repository/models/a/load").status_code == 200
        assert models(client)["a"]["load_error"] is None
    assert samples(explicit.url, "bertserve_model_load_failed")[(("model", "a"),)] == 0
    assert "model a version" in explicit.log() and "failed to load" in explicit.log()


def raw_post(server, path: str) -> tuple[int, dict]:
    """A POST with the path exactly as given (httpx would normalize '..')."""
    connection = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=30)
    try:
        connection.request("POST", path, headers=ADMIN)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


def test_unknown_names_are_404_and_bad_names_400(explicit) -> None:
    for action in ("load", "unload"):
        missing = admin(explicit, f"/v2/repository/models/no-such-model/{action}")
        assert missing.status_code == 404 and missing.json()["error_type"] == "not_found", missing.text
        for name in ("a%2Fb", "..", "a..b", "a%00b", "%2E%2E", "UPPER"):
            status, body = raw_post(explicit, f"/v2/repository/models/{name}/{action}")
            assert status == 400 and body["error_type"] == "bad_request" and body["field"] == "name", (name, body)
    with explicit.client(headers=USER) as client:
        assert set(models(client)) >= {"a"} and client.post(*CLASSIFY[:1], json=CLASSIFY[1]).status_code == 200


def test_two_loads_of_one_model_at_once_are_served_one_after_the_other(explicit) -> None:
    publish(explicit.repository, "a", explicit.source / "bert-classification")
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: admin(explicit, "/v2/repository/models/a/load"), range(2)))
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert answers[0].json()["version"] == answers[1].json()["version"]
    with explicit.client(headers=USER) as client:
        assert every_front_end_serves(explicit, "a", answers[0].json()["version"])
        assert client.post(*CLASSIFY[:1], json=CLASSIFY[1]).status_code == 200
    assert explicit.process.poll() is None


def test_a_model_replaced_by_another_task_under_its_name_is_described_once(explicit) -> None:
    """An entry exported again from another checkpoint (here a tagger where a classifier was) keeps its name: the
    model's info series says what serves now, not both, and it is gone with the model."""
    publish(explicit.repository, "c", explicit.source / "bert-classification")
    try:
        assert admin(explicit, "/v2/repository/models/c/load").status_code == 200
        publish(explicit.repository, "c", explicit.source / "bert-ner")
        assert admin(explicit, "/v2/repository/models/c/load").status_code == 200
        described = model_samples(explicit, "c")["bertserve_model_info"]
        assert [(labels["task"], value) for labels, value in described] == [("ner", 1.0)], described
        # the version before closes once no front-end uses it: its version series goes, not left at 0 for good
        assert wait_for(lambda: model_series(explicit, "c")["bertserve_model_version_info"] == [1.0], timeout=10)
        assert admin(explicit, "/v2/repository/models/c/unload").status_code == 200
        assert wait_for(lambda: not any(model_series(explicit, "c").values()), timeout=10), model_series(explicit, "c")
    finally:
        shutil.rmtree(explicit.repository / "c", ignore_errors=True)


def test_an_unloaded_model_whose_load_failed_leaves_no_failure_behind(explicit) -> None:
    """bertserve_model_load_failed is 1 while a model's latest load failed (the alert BertserveModelLoadFailed);
    once the model is unloaded there is nothing to alert about."""
    publish(explicit.repository, "d", explicit.source / "bert-classification", corrupt=True)
    try:
        failed = admin(explicit, "/v2/repository/models/d/load")
        assert failed.status_code >= 400, failed.text
        assert load_failed(explicit, "d") == [1.0]
        assert admin(explicit, "/v2/repository/models/d/unload").status_code == 200
        assert wait_for(lambda: load_failed(explicit, "d") == [], timeout=10)
    finally:
        shutil.rmtree(explicit.repository / "d", ignore_errors=True)


def test_the_routes_are_absent_unless_explicit(tiny_server) -> None:
    assert httpx.post(tiny_server.url + "/v2/repository/index").status_code == 404


def test_explicit_without_an_admin_key_file_refuses_to_start(tmp_path: Path) -> None:
    done = run_service("--repository", str(tmp_path), "--model-control", "explicit")
    assert done.returncode == 2 and "admin_api_key_file" in done.stderr, done.stderr
    missing = tmp_path / "no-such.keys"
    done = run_service(
        "--repository", str(tmp_path), "--model-control", "explicit", "--admin-api-key-file", str(missing)
    )
    assert done.returncode == 2 and done.stderr.strip() == f"error: admin_api_key_file {missing} does not exist"
    # an admin key that is also an inference key: every client holding it could load and unload (it was accepted)
    shared = tmp_path / "admin.keys"
    shared.write_text(f"{ADMIN_KEY}\n")
    shared.chmod(0o600)
    done = run_service(
        *("--repository", str(tmp_path), "--model-control", "explicit", "--admin-api-key-file", str(shared)),
        env={"BERTSERVE_API_KEYS": f"{USER_KEY},{ADMIN_KEY}"},
    )
    assert done.returncode == 2 and "a key of admin_api_key_file is also an inference key" in done.stderr, done.stderr
    assert ADMIN_KEY not in done.stderr


def test_a_load_past_the_batch_token_budget_is_refused_as_the_start_is(
    tiny_repository: Path, tmp_path: Path, server_factory
) -> None:
    """--max-batch-tokens below an entry's max_length refuses the start naming it (--model), yet the same entry
    loaded through the API was served: its full-length inputs past the budget."""
    publish(tmp_path / "repository", "a", tiny_repository / "bert-classification")
    config_file = tmp_path / "repository" / "a" / "model.json"  # said longer than the budget (never opened)
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "max_length": 128}))
    (tmp_path / "admin.keys").write_text(ADMIN_KEY + "\n")
    (tmp_path / "admin.keys").chmod(0o600)
    budget = ("--max-batch-tokens", "96", "--max-batch-size", "8", "--admin-api-key-file", str(tmp_path / "admin.keys"))
    refused = run_service(
        "--repository", str(tmp_path / "repository"), "--model-control", "explicit", "--model", "a", *budget
    )
    assert refused.returncode == 2 and "is below model a's max_length (128)" in refused.stderr, refused.stderr
    server = server_factory(tmp_path / "repository", "--model-control", "explicit", *budget, wait_ready=False)

    def alive() -> bool:
        try:
            return httpx.get(server.url + "/livez").status_code == 200
        except httpx.TransportError:
            return False

    assert wait_for(alive, timeout=60)
    loaded = admin(server, "/v2/repository/models/a/load")
    assert loaded.status_code == 422, loaded.text
    assert loaded.json()["error_type"] == "load_failed"
    assert "max_batch_tokens (96) is below model a's max_length (128)" in loaded.json()["error"]
    assert httpx.post(server.url + CLASSIFY[0], json=CLASSIFY[1]).status_code == 404


def test_an_entry_whose_labels_are_not_its_models_is_refused(explicit) -> None:
    """A model.json listing 3 labels for a 2-logit head loaded, passed its self-test and answered every sentence a
    label of the wrong class; fewer labels than logits failed each request with an IndexError. (This head: 3.)"""
    for labels in (["negative", "neutral", "positive", "mixed"], ["only"]):
        publish(explicit.repository, "f", explicit.source / "bert-classification")
        config = json.loads((explicit.repository / "f" / "model.json").read_text())
        config["labels"] = labels
        (explicit.repository / "f" / "model.json").write_text(json.dumps(config))
        try:
            failed = admin(explicit, "/v2/repository/models/f/load")
            assert failed.status_code == 422, failed.text
            assert f"model.json lists {len(labels)} labels but the model's logits have 3" in failed.json()["error"]
        finally:
            admin(explicit, "/v2/repository/models/f/unload")
            shutil.rmtree(explicit.repository / "f", ignore_errors=True)


def test_a_version_the_front_ends_turned_down_is_judged_again_when_loaded_again(explicit) -> None:
    """An entry whose tokenizer is missing loads at the engine and is turned down by the front-ends. Loaded again
    (the same version), it waited 60 s for front-ends that had judged that version already and ignored it, and the
    engine kept it as the version it offered."""
    with explicit.client(headers=USER) as client:
        serving = models(client)["a"]["version"]
        publish(explicit.repository, "a", explicit.source / "bert-classification")
        (explicit.repository / "a" / "tokenizer.json").unlink()
        try:
            for _ in range(2):
                started = time.monotonic()
                failed = admin(explicit, "/v2/repository/models/a/load")
                assert failed.status_code == 422 and "tokenizer.json" in failed.json()["error"], failed.text
                assert time.monotonic() - started < 20
                index = {m["name"]: m for m in admin(explicit, "/v2/repository/index").json()}
                assert (index["a"]["state"], index["a"]["version"]) == ("READY", serving)
                assert models(client)["a"]["version"] == serving
                assert client.post(*CLASSIFY[:1], json=CLASSIFY[1]).status_code == 200
        finally:
            publish(explicit.repository, "a", explicit.source / "bert-classification")
            assert admin(explicit, "/v2/repository/models/a/load").status_code == 200


def test_a_model_loaded_again_while_it_unloads_serves_and_reloads_without_a_failed_request(explicit) -> None:
    """Unloaded while a request held its version, then loaded again at once (the same version): the front-ends
    kept that version as retiring and never said they served it, so the load call waited 60 s and the next reload
    closed the version under the requests still sent to it (503 "is not loaded (any more)")."""
    publish(explicit.repository, "e", explicit.source / "bert-ner")
    long_text = ("Peter Blackburn met Maria Lopez in Brussels. " * 450)[:20000]
    long_request = {"inputs": [long_text] * 12}  # ~1.5 s of work here: it holds the version through the unload
    try:
        assert admin(explicit, "/v2/repository/models/e/load").status_code == 200
        with ThreadPoolExecutor(4) as pool:
            held = pool.submit(
                httpx.post, explicit.url + "/v1/models/e/ner", json=long_request, headers=USER, timeout=60
            )
            time.sleep(0.3)
            unloaded = pool.submit(admin, explicit, "/v2/repository/models/e/unload")
            time.sleep(0.2)
            started = time.monotonic()
            loaded = admin(explicit, "/v2/repository/models/e/load")
            assert loaded.status_code == 200, loaded.text
            assert time.monotonic() - started < 20  # it waited for front-ends that never moved: 60 s
            assert unloaded.result().status_code == 200
            assert held.result().status_code == 200, held.result().text  # answered by the version it held
        publish(explicit.repository, "e", explicit.source / "bert-ner")
        with Traffic(explicit.url, "/v1/models/e/ner", {"inputs": ["Maria met Peter."]}, headers=USER) as traffic:
            assert admin(explicit, "/v2/repository/models/e/load").status_code == 200
        assert traffic.statuses and set(traffic.statuses) == {200}, traffic.bodies[:3]
    finally:
        admin(explicit, "/v2/repository/models/e/unload")
        shutil.rmtree(explicit.repository / "e", ignore_errors=True)


def test_an_unload_while_its_load_runs_answers_the_load_at_once(explicit) -> None:
    """An unload sent while the model loaded: the load call waited for front-ends to serve a model no longer
    offered, 60 s in the engine and 60 s more in the front-end, then answered 200 "LOADING" for a model not loaded."""
    publish(explicit.repository, "g", explicit.source / "bert-ner")
    try:
        with ThreadPoolExecutor(2) as pool:
            started = time.monotonic()
            loading = pool.submit(admin, explicit, "/v2/repository/models/g/load")
            time.sleep(0.05)
            unloaded = admin(explicit, "/v2/repository/models/g/unload")
            loaded = loading.result()
            seconds = time.monotonic() - started
        assert seconds < 20, (seconds, loaded.text)
        assert unloaded.status_code in (200, 404), unloaded.text  # 404: it came before the load began
        if loaded.status_code != 200:  # served before the unload came: 200, and the unload took it away after
            assert loaded.status_code == 422, loaded.text
            assert "was unloaded before it served: an unload call came while it loaded" in loaded.json()["error"]
        if unloaded.status_code == 200:
            index = admin(explicit, "/v2/repository/index").json()
            assert next(m for m in index if m["name"] == "g")["state"] == "UNAVAILABLE", index
    finally:
        admin(explicit, "/v2/repository/models/g/unload")
        shutil.rmtree(explicit.repository / "g", ignore_errors=True)


def test_an_unload_after_grpc_requests_is_answered_at_once(explicit) -> None:
    """A gRPC call answered never let go of the version it used (its ticket was never done): an unload waited
    --request-timeout-s (30 s) for it, as a reload kept the version replaced, its session and memory, as long."""
    publish(explicit.repository, "g", explicit.source / "bert-classification")
    client = grpcclient.InferenceServerClient(explicit.grpc)
    try:
        assert admin(explicit, "/v2/repository/models/g/load").status_code == 200
        text = grpcclient.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array(["a gorgeous movie"], dtype=object))
        for _ in range(4):  # spread over both front-ends in process mode (a channel each)
            with grpcclient.InferenceServerClient(explicit.grpc) as fresh:
                answer = fresh.infer("g", [text], headers={"authorization": USER["Authorization"]})
                assert answer.as_numpy("label").shape[0] == 1
        started = time.monotonic()
        assert admin(explicit, "/v2/repository/models/g/unload").status_code == 200
        assert time.monotonic() - started < 10
    finally:
        client.close()
        admin(explicit, "/v2/repository/models/g/unload")
        shutil.rmtree(explicit.repository / "g", ignore_errors=True)


def test_a_configuration_override_or_files_sent_with_a_load_are_refused_not_ignored(explicit) -> None:
    """tritonclient's load_model(config=...) and load_model(files=...) were answered 200 with the body unread, as if
    the override or the files had been applied."""
    client = tritonhttp.InferenceServerClient(explicit.url.removeprefix("http://"))
    for kwargs, said in (
        ({"config": '{"max_batch_size": 8}'}, "parameter 'config' is not taken"),
        ({"config": "not json at all"}, "parameter 'config' is not taken"),
        ({"files": {"file:1/model.onnx": b"weights"}}, "parameter 'file:1/model.onnx' is not taken"),
    ):
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("b", headers=ADMIN, **kwargs)
        assert said in refused.value.message(), refused.value.message()
        assert refused.value.status() == "400"
    assert admin(explicit, "/v2/repository/models/b/load", json={"parameters": {"priority": 1}}).status_code == 400
    assert admin(explicit, "/v2/repository/models/b/load", json=[1]).status_code == 400
    index = {m["name"]: m["state"] for m in admin(explicit, "/v2/repository/index").json()}
    assert index["b"] == "UNAVAILABLE"  # nothing loaded
    client.load_model("a", headers=ADMIN)  # a plain load (a served model: at once), as tritonclient sends it
    client.close()
