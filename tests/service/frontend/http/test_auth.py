"""API keys: the rules a key and a key file must meet, rotation through the file, and a real server that asks for
a key everywhere but its probes (401 with the error body and WWW-Authenticate), in both engine modes."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from service.frontend.http.auth import ApiKeys, KeyFileProblem, read_key_file
from service.settings import Settings
from tests.service.conftest import run_service
from tests.service.conftest import wait_for as poll_until

ROOT = Path(__file__).resolve().parents[4]
KEY_A = "key-a-0123456789abcdef"
KEY_B = "key-b-0123456789abcdef"
KEY_C = "key-c-0123456789abcdef"
CLASSIFY = "/v1/models/bert-classification/classify"


def write_keys(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace the file at once (a new inode), as an operator's `mv` or a Kubernetes Secret update does."""
    staging = path.with_suffix(".new")
    staging.write_text(text)
    staging.chmod(mode)
    staging.replace(path)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- keys and key files, without a server ------------------------------------------------------------------------
def test_every_key_of_the_settings_and_the_file_is_accepted_and_nothing_else(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    write_keys(key_file, f"# team one\n{KEY_B}\n\n   {KEY_C}   # rotated 2026-11\n")
    keys = ApiKeys([KEY_A], key_file)
    assert keys.enabled and keys.count == 3
    assert ApiKeys([KEY_B, KEY_B], key_file).count == 2  # a key given twice (a variable and the file) is one key
    for key in (KEY_A, KEY_B, KEY_C):
        assert keys.verify(key.encode())
    for wrong in (KEY_A[:-1], KEY_A + "x", b"", b"# team one", KEY_A.upper()):
        assert not keys.verify(wrong if isinstance(wrong, bytes) else wrong.encode())
    assert not ApiKeys().enabled


def test_the_file_is_re_read_when_it_changes_at_most_once_a_second(tmp_path: Path, caplog) -> None:
    key_file = tmp_path / "keys"
    write_keys(key_file, KEY_A + "\n")
    clock = Clock()
    keys = ApiKeys((), key_file, clock=clock)
    assert keys.verify(KEY_A.encode())
    write_keys(key_file, KEY_B + "\n")
    clock.now += 0.5  # not yet looked at again
    assert keys.verify(KEY_A.encode()) and not keys.verify(KEY_B.encode())
    clock.now += 0.6
    assert keys.verify(KEY_B.encode()) and not keys.verify(KEY_A.encode())

    # a file that cannot be used any more leaves the keys as they were, with one warning that never shows a key
    with caplog.at_level(logging.WARNING, logger="service.frontend.http.auth"):
        for bad in ("short\n", "# nothing\n", None):
            if bad is None:
                key_file.unlink()
            else:
                write_keys(key_file, bad)
            clock.now += 1.1
            assert keys.verify(KEY_B.encode())
            clock.now += 1.1
            assert keys.verify(KEY_B.encode())  # and warned about once, not every second
    warnings = [r.getMessage() for r in caplog.records if r.name == "service.frontend.http.auth"]
    assert len(warnings) == 3, warnings
    assert "line 1: the key is 5 characters: at least 16 needed" in warnings[0]
    assert "holds no key" in warnings[1] and "does not exist" in warnings[2]
    assert all("keeping the 1 keys read before" in w and "short" not in w for w in warnings)
    write_keys(key_file, KEY_C + "\n")
    clock.now += 1.1
    assert keys.verify(KEY_C.encode()) and not keys.verify(KEY_B.encode())


@pytest.mark.parametrize(
    ("content", "mode", "reason"),
    [
        (None, 0o600, "does not exist"),
        (KEY_A, 0o644, "is open to other users (mode 0644): chmod 600 (or 640) it"),
        (KEY_A, 0o602, "is open to other users (mode 0602)"),
        ("# only a comment\n\n", 0o600, "holds no key"),
        (f"{KEY_A}\nshort-key\n", 0o600, "line 2: the key is 9 characters: at least 16 needed"),
        (f"{KEY_A} {KEY_B}\n", 0o600, "line 1: the key has characters a Bearer token cannot carry"),
    ],
)
def test_unusable_key_files_are_refused_with_the_reason(tmp_path: Path, content, mode: int, reason: str) -> None:
    key_file = tmp_path / "keys"
    if content is not None:
        write_keys(key_file, content, mode)
    with pytest.raises(KeyFileProblem, match=reason.replace("(", r"\(").replace(")", r"\)")):
        read_key_file(key_file)
    (tmp_path / "dir").mkdir()
    with pytest.raises(KeyFileProblem, match="is not a regular file"):
        read_key_file(tmp_path / "dir")


def test_a_key_file_over_a_mebibyte_is_refused_not_cut_short(tmp_path: Path) -> None:
    """The file was read to 1 MiB and the rest ignored: a key across that mark was accepted by its first
    characters (a shorter secret), and the keys after it were dropped, without a word."""
    key_file = tmp_path / "keys"
    filler = "#" * 99 + "\n"
    padding = filler * (1_048_576 // len(filler))
    padding += "#" * (1_048_576 - len(padding) - 10) + "\n"  # the next key starts 9 bytes before the mark
    write_keys(key_file, f"{KEY_A}\n{padding}{KEY_B}\n")
    with pytest.raises(KeyFileProblem, match="is over 1,048,576 bytes: too large for a key file"):
        read_key_file(key_file)
    write_keys(key_file, f"{KEY_A}\n{padding[: -len(KEY_B) - 20]}\n{KEY_B}\n")  # under the mark: every key
    keys = ApiKeys(file=key_file)
    assert keys.count == 2 and keys.verify(KEY_B.encode()) and not keys.verify(KEY_B[:9].encode())


def test_a_byte_order_mark_is_not_part_of_the_first_key(tmp_path: Path) -> None:
    """A file saved by Notepad starts with U+FEFF: it was refused as "characters a Bearer token cannot carry"."""
    key_file = tmp_path / "keys"
    write_keys(key_file, f"\ufeff{KEY_A}\r\n{KEY_B}\r\n")
    keys = ApiKeys(file=key_file)
    assert keys.count == 2 and keys.verify(KEY_A.encode())


def test_keys_in_the_settings_comma_separated_json_or_flags(monkeypatch) -> None:
    monkeypatch.setenv("BERTSERVE_API_KEYS", f" {KEY_A} , {KEY_B}")
    assert Settings().api_keys == [KEY_A, KEY_B]
    env = Settings().to_env()  # the launcher hands them on as JSON; the children read them back
    monkeypatch.setenv("BERTSERVE_API_KEYS", env["BERTSERVE_API_KEYS"])
    assert Settings().api_keys == [KEY_A, KEY_B]
    assert KEY_A not in repr(Settings())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "set but holds no key"),
        (f"{KEY_A},", "key 2 of 2 is 0 characters: at least 16 needed"),
        ("abc", "key 1 of 1 is 3 characters"),
        ("a" * 15 + "é", "has characters a Bearer token cannot carry"),
        ("0123456789abcdef ghi", "has characters a Bearer token cannot carry"),
    ],
)
def test_unsafe_keys_are_refused_without_showing_them(monkeypatch, value: str, message: str) -> None:
    monkeypatch.setenv("BERTSERVE_API_KEYS", value)
    with pytest.raises(ValidationError, match=message) as caught:
        Settings()
    if value:
        assert value not in str(caught.value)


def test_the_server_refuses_to_start_with_an_unusable_key_file(tmp_path: Path, tiny_repository: Path) -> None:
    key_file = tmp_path / "keys"
    write_keys(key_file, KEY_A, 0o644)
    done = run_service("--repository", str(tiny_repository), "--api-key-file", str(key_file))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: api_key_file {key_file} is open to other users (mode 0644): chmod 600 (or 640) it"
    )
    done = run_service("--repository", str(tiny_repository), "--api-keys", "too-short")
    assert done.returncode == 2
    assert done.stderr.startswith("error: invalid setting api_keys (--api-keys): key 1 of 1 is 9 characters")
    assert done.stderr.count("\n") == 1 and "too-short" not in done.stderr


# --- a real server -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    write_keys(path, f"# the file's key\n{KEY_B}\n")
    return path


@pytest.fixture(scope="module")
def keyed_server(tiny_repository: Path, server_factory, key_file: Path):
    return server_factory(
        tiny_repository,
        "--models",
        "bert-classification",
        "--api-key-file",
        str(key_file),
        env={"BERTSERVE_API_KEYS": KEY_A},
    )


def assert_unauthorized(response: httpx.Response, invalid: bool) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["content-type"] == "application/json"
    challenge = 'Bearer realm="bertserve"' + (', error="invalid_token"' if invalid else "")
    assert response.headers["www-authenticate"] == challenge
    assert len(response.headers["x-request-id"]) == 32
    body = response.json()
    assert body["error_type"] == "unauthorized" and body["field"] is None
    assert body["error"] == (
        "the API key is not valid"
        if invalid
        else ("this server needs an API key: send the header Authorization: Bearer KEY")
    )


def test_every_path_but_the_probes_needs_a_key(keyed_server) -> None:
    with httpx.Client(base_url=keyed_server.url, timeout=30) as client:
        assert client.get("/livez").status_code == 200
        assert client.get("/readyz").status_code == 200
        for path in (
            "/v1/models",
            "/metrics",
            "/docs",
            "/openapi.json",
            "/redoc",
            "/docs/assets/swagger-ui.css",
            "/no/such/path",
            "/livez/",
            "/readyz/x",
        ):
            assert_unauthorized(client.get(path), invalid=False)
        assert_unauthorized(client.post(CLASSIFY, json={"inputs": ["fine"]}), invalid=False)
        for header in (f"Bearer {KEY_A[:-1]}", f"Bearer {KEY_A}x", f"Bearer {KEY_A} extra", "Bearer x"):
            assert_unauthorized(client.post(CLASSIFY, json={"inputs": ["ok"]}, headers={"Authorization": header}), True)
        for header in (KEY_A, f"Basic {KEY_A}", f"Token {KEY_A}", "Bearer", f"{KEY_A} Bearer"):
            assert_unauthorized(client.get("/v1/models", headers={"Authorization": header}), invalid=False)
        # two Authorization headers are no key, whichever comes first (the first one counted, gRPC's last)
        for pair in ((f"Bearer {KEY_A}", "Bearer x"), ("Bearer x", f"Bearer {KEY_A}"), (f"Bearer {KEY_A}",) * 2):
            headers = [("Authorization", value) for value in pair]
            assert_unauthorized(client.post(CLASSIFY, json={"inputs": ["ok"]}, headers=headers), True)
            assert_unauthorized(client.get("/v1/models", headers=headers), True)
        for key in (KEY_A, KEY_B):  # the setting's key and the file's
            auth = {"Authorization": f"Bearer {key}"}
            answer = client.post(CLASSIFY, json={"inputs": ["fine"]}, headers=auth)
            assert answer.status_code == 200 and answer.json()["results"]
            assert client.get("/metrics", headers=auth).status_code == 200
            assert client.get("/docs", headers=auth).status_code == 200
            assert client.get("/v1/models", headers={"Authorization": f"bearer   {key}"}).status_code == 200
    # the key is checked before the body is read: a body over the limit without a key is a 401, not a 413
    with socket.create_connection(("127.0.0.1", int(keyed_server.url.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(f"POST {CLASSIFY} HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n".encode())
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 401 ") and b"connection: close" in head
    assert KEY_A not in keyed_server.log() and KEY_B not in keyed_server.log()
    assert "API keys: 2 in force; open without a key: /livez, /readyz" in keyed_server.log()


def test_refused_keys_are_counted_in_the_request_metrics(keyed_server) -> None:
    """A 401 was left out of bertserve_requests_total over HTTP (gRPC counted its UNAUTHENTICATED): clients left on a
    rotated key failed every request and the dashboards' error ratio stayed at 0. Both lanes, and a route whose body
    names the model (refused before it is read: `unknown`)."""

    def refused() -> dict[str, float]:
        text = httpx.get(keyed_server.url + "/metrics", headers={"Authorization": f"Bearer {KEY_A}"}).text
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "bertserve_requests_total" and sample.labels["status"] == "401":
                    key = f"{sample.labels['model']} {sample.labels['endpoint']}"
                    totals[key] = totals.get(key, 0.0) + sample.value
        return totals

    before = refused()
    wrong = {"Authorization": "Bearer not-a-key-0123456789"}
    with httpx.Client(base_url=keyed_server.url, timeout=30) as client:
        assert client.post(CLASSIFY, json={"inputs": ["ok"]}, headers=wrong).status_code == 401  # the fast lane
        assert client.post(CLASSIFY, json={"inputs": ["ok"]}).status_code == 401
        assert client.get("/v1/models/bert-classification").status_code == 401  # the framework's lane
        embeddings = {"model": "bert-classification", "input": "ok"}
        assert client.post("/v1/embeddings", json=embeddings, headers=wrong).status_code == 401
    after = refused()
    grown = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    assert grown.get("bert-classification classify") == 2, after
    assert sum(value for key, value in grown.items() if key.startswith("bert-classification ")) == 3, after
    assert sum(value for key, value in grown.items() if key.startswith("unknown ")) == 1, after


def test_the_schema_documents_the_bearer_scheme(keyed_server) -> None:
    schema = httpx.get(keyed_server.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY_A}"}).json()
    assert schema["components"]["securitySchemes"]["apiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "an API key of the server (--api-keys, --api-key-file)",
    }
    classify = schema["paths"]["/v1/models/{name}/classify"]["post"]
    assert classify["security"] == [{"apiKey": []}] and "401" in classify["responses"]
    assert schema["paths"]["/livez"]["get"]["security"] == []
    assert schema["paths"]["/metrics"]["get"]["security"] == [{"apiKey": []}]


def test_keys_rotate_through_the_file_without_a_restart(keyed_server, key_file: Path) -> None:
    def status(key: str) -> int:
        return httpx.get(keyed_server.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code

    def wait_for(key: str, wanted: int) -> float:
        started = time.monotonic()
        while time.monotonic() - started < 10:
            if status(key) == wanted:
                return time.monotonic() - started
            time.sleep(0.05)
        raise AssertionError(f"{key}: not {wanted} after 10 s")

    assert status(KEY_B) == 200 and status(KEY_C) == 401
    write_keys(key_file, f"{KEY_B}\n{KEY_C}\n")  # both while clients move over
    assert wait_for(KEY_C, 200) < 2.5
    assert status(KEY_B) == 200 and status(KEY_A) == 200
    write_keys(key_file, f"{KEY_C}\n")  # the old one retired
    assert wait_for(KEY_B, 401) < 2.5
    assert status(KEY_C) == 200 and status(KEY_A) == 200  # the setting's key stays
    write_keys(key_file, "short\n")  # a broken file: the keys stay as they were, with a warning
    warning = f"api_key_file {key_file} line 1: the key is 5 characters: at least 16 needed"
    warnings_before = keyed_server.log().count(warning)

    def warned() -> bool:
        status(KEY_C)  # the file is looked at on the request path, at most once a second
        return keyed_server.log().count(warning) > warnings_before

    # read within a second or so of the change, as the rotations above
    assert poll_until(warned, timeout=10), f"no warning about the broken file after 10 s: {warning}"
    assert status(KEY_C) == 200  # the broken file read, the key stays
    log = keyed_server.log()
    assert "keeping the 1 keys read before" in log
    assert KEY_C not in log
    write_keys(key_file, f"{KEY_B}\n")  # leave it as the module began


def test_metrics_and_docs_can_be_left_open(tiny_repository: Path, server_factory) -> None:
    server = server_factory(
        tiny_repository,
        "--models",
        "bert-classification",
        "--metrics-auth",
        "open",
        "--docs-auth",
        "open",
        "--engine-mode",
        "process",
        "--frontends",
        "1",
        env={"BERTSERVE_API_KEYS": f"{KEY_A},{KEY_B}"},
    )
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for path in ("/metrics", "/docs", "/redoc", "/openapi.json", "/docs/assets/swagger-ui-bundle.js"):
            assert client.get(path).status_code == 200, path
        assert_unauthorized(client.get("/v1/models"), invalid=False)  # process mode: the front-end asks too
        assert_unauthorized(client.post(CLASSIFY, json={"inputs": ["x"]}, headers={"Authorization": "Bearer x"}), True)
        answer = client.post(CLASSIFY, json={"inputs": ["fine"]}, headers={"Authorization": f"Bearer {KEY_B}"})
        assert answer.status_code == 200
        schema = client.get("/openapi.json").json()
    assert schema["paths"]["/metrics"]["get"]["security"] == []
    assert KEY_A not in server.log() and KEY_B not in server.log()
