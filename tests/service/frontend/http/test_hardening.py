"""HTTP hardening over raw sockets against real servers: idle and slowloris connections closed by the header
timeout while the server keeps answering, slow bodies, keep-alive idling, oversized and malformed requests
answered with the one JSON error body; request ids on every response and in the JSON access log, in both engine
modes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import selectors
import socket
import time
from pathlib import Path

import httpx
import pytest

from service.frontend.http.middleware import RequestContextMiddleware
from service.logs import TEXT_FORMAT, RequestIdFilter
from tests.service.conftest import wait_for
from tests.service.test_scheduling import metric

CLASSIFY = "/v1/models/bert-classification/classify"
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 2.0
KEEPALIVE_S = 1.0
ACCESS_FIELDS = {"ts", "level", "request_id", "method", "path", "status", "duration_ms", "client", "model"}
HEX_ID = re.compile(r"[0-9a-f]{32}")


def address(server) -> tuple[str, int]:
    return "127.0.0.1", int(server.url.rsplit(":", 1)[1])


def exchange(server, data: bytes, timeout: float = 15.0) -> tuple[bytes, float]:
    """Send `data` on a new connection and read until the server closes it: (all it sent, seconds it took)."""
    with socket.create_connection(address(server), timeout=timeout) as sock:
        started = time.monotonic()
        sock.sendall(data)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        return received, time.monotonic() - started


def parse(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def assert_error(response: bytes, status: int, error_type: str) -> dict[str, str]:
    got, headers, body = parse(response)
    assert got == status, response[:300]
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert HEX_ID.fullmatch(headers["x-request-id"])
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)
    assert set(error) == {"error", "error_type", "field"} and error["error_type"] == error_type
    assert body == json.dumps(error, separators=(",", ":")).encode()  # the very bytes the app writes for an error
    return headers


def access_lines(server) -> list[dict]:
    return [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]


def access_line(server, request_id: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in access_lines(server) if line["request_id"] == request_id]
        if found or time.monotonic() > deadline:
            assert len(found) == 1, (request_id, found)
            return found[0]
        time.sleep(0.05)


@pytest.fixture(scope="module")
def hardened(tiny_repository: Path, server_factory):
    return server_factory(
        tiny_repository,
        "--models",
        "bert-classification",
        "--header-timeout-s",
        str(HEADER_TIMEOUT_S),
        "--body-timeout-s",
        str(BODY_TIMEOUT_S),
        "--keepalive-timeout-s",
        str(KEEPALIVE_S),
        "--access-log",
        "json",
    )


def hold_connections(server, count: int, trickle: bool = True) -> tuple[dict[int, float], dict[int, bytes], list]:
    """Open `count` connections: a third send nothing, a third part of a request, a third part of a request and
    then a byte every 0.2 s (slowloris). Returns when the server has closed them all (or after 20 s): when each
    was closed (seconds after opening) and what the server sent on it, with what the server answered meanwhile."""
    selector = selectors.DefaultSelector()
    opened: dict[int, float] = {}
    sockets: dict[int, socket.socket] = {}
    for i in range(count):
        sock = socket.create_connection(address(server))
        opened[i] = time.monotonic()
        if i % 3:
            sock.sendall(b"POST " + CLASSIFY.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, i)
        sockets[i] = sock
    closed: dict[int, float] = {}
    sent: dict[int, bytes] = dict.fromkeys(sockets, b"")
    answers = []
    last_trickle = time.monotonic()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        while len(closed) < count and time.monotonic() - min(opened.values()) < 20:
            for key, _ in selector.select(timeout=0.05):
                i = key.data
                try:
                    chunk = sockets[i].recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    sent[i] += chunk
                else:
                    closed[i] = time.monotonic() - opened[i]
                    selector.unregister(sockets[i])
                    sockets[i].close()
            if trickle and time.monotonic() - last_trickle > 0.2:
                last_trickle = time.monotonic()
                for i, sock in sockets.items():
                    if i % 3 == 2 and i not in closed:
                        with contextlib.suppress(OSError):
                            sock.send(b"a")
            if len(answers) < 5 and len(closed) < count // 2:  # the server answers while they are held
                started = time.monotonic()
                response = client.post(CLASSIFY, json={"inputs": ["fine"]})
                answers.append((response.status_code, time.monotonic() - started))
    for i, sock in sockets.items():
        if i not in closed:
            sock.close()
    return closed, sent, answers


def test_idle_and_slowloris_connections_are_closed_by_the_header_timeout(hardened) -> None:
    count = 550  # as many as the probe held for 60 s
    closed, sent, answers = hold_connections(hardened, count)
    assert len(closed) == count, f"{count - len(closed)} connections still open after 20 s"
    times = sorted(closed.values())
    assert times[0] >= HEADER_TIMEOUT_S - 0.05 and times[-1] <= HEADER_TIMEOUT_S + 2.0, (times[0], times[-1])
    for i, data in sent.items():
        if i % 3 == 0:
            assert data == b"", "a connection that sent nothing is closed without an answer"
        else:
            headers = assert_error(data, 408, "request_timeout")
            assert access_line(hardened, headers["x-request-id"])["status"] == 408
    assert answers and all(status == 200 and seconds < 2.0 for status, seconds in answers), answers
    assert httpx.get(hardened.url + "/livez").status_code == 200


def test_a_slow_body_gets_408_and_one_access_line(hardened) -> None:
    head = f"POST {CLASSIFY} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
    response, seconds = exchange(hardened, (head + "x-request-id: slow-body-1\r\n\r\n{").encode())
    status, headers, body = parse(response)
    assert status == 408 and json.loads(body)["error_type"] == "request_timeout"
    assert headers["x-request-id"] == "slow-body-1"  # the app had given the request its id already
    assert BODY_TIMEOUT_S - 0.05 <= seconds <= BODY_TIMEOUT_S + 2.0
    line = access_line(hardened, "slow-body-1")
    assert (line["status"], line["path"], line["model"]) == (408, CLASSIFY, "bert-classification")


def test_a_kept_alive_connections_next_head_has_its_own_deadline(hardened) -> None:
    """The header timeout of a second request on a connection counts from that request's first byte, not from the
    connection's opening nor from the first request's (one timer per connection now, moved as requests come)."""
    with socket.create_connection(address(hardened)) as client:
        client.settimeout(10)
        client.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        assert client.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(KEEPALIVE_S / 2)
        client.sendall(b"GET /livez HTTP/1.1\r\nHo")  # a second head, cut short
        started = time.monotonic()
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := client.recv(65536):
                received += chunk
        seconds = time.monotonic() - started
    assert_error(received, 408, "request_timeout")
    assert HEADER_TIMEOUT_S - 0.05 <= seconds <= HEADER_TIMEOUT_S + 1.0, seconds


def test_idle_keep_alive_connections_are_closed(hardened) -> None:
    response, seconds = exchange(hardened, b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    assert parse(response)[0] == 200
    assert KEEPALIVE_S - 0.05 <= seconds <= KEEPALIVE_S + 1.5


@pytest.mark.parametrize(
    ("request_bytes", "status", "error_type"),
    [
        (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
        (b"GET /livez?" + b"q" * 8200 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
        (b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n", 431, "headers_too_large"),
        (
            b"GET /livez HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 90) for i in range(200)) + b"\r\n",
            431,
            "headers_too_large",
        ),
        (b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Endless: " + b"e" * 40_000, 431, "headers_too_large"),
        (b"GET /livez HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "bad_request"),
        (b"GET /livez HTTP/1.1\r\nAccept: */*\r\n\r\n", 400, "bad_request"),  # RFC 9112 3.2: no Host
        (b"GET /livez HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "bad_request"),  # two
        # RFC 9110 15.6.6: another major version is a 505 (both read by httptools, and were answered as HTTP/1.1)
        (b"GET /livez HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
        (b"GET /livez HTTP/0.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
        (
            b"POST " + CLASSIFY.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
            400,
            "bad_request",
        ),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "bad_request"),  # TLS to the plain port
        (b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello", 400, "bad_request"),
        (b"POST /livez HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "bad_request"),
        # a transfer coding other than chunked: RFC 9112's 501 ("gzip, chunked" was served, its gzip read as JSON)
        *[
            (
                b"POST "
                + CLASSIFY.encode()
                + b" HTTP/1.1\r\nHost: x\r\n"
                + coding
                + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                501,
                "not_implemented",
            )
            for coding in (
                b"Transfer-Encoding: gzip, chunked",
                b"Transfer-Encoding: deflate\r\nTransfer-Encoding: chunked",
            )
        ],
    ],
    ids=[
        "url-100k",
        "query-8k",
        "header-20k",
        "headers-200",
        "header-endless",
        "malformed",
        "no-host",
        "two-hosts",
        "http-2.0",
        "http-0.9",
        "two-content-types",
        "tls",
        "two-lengths",
        "bad-chunk",
        "gzip-chunked",
        "deflate-then-chunked",
    ],
)
def test_oversized_and_malformed_requests_get_the_json_error(hardened, request_bytes, status, error_type) -> None:
    response, seconds = exchange(hardened, request_bytes)
    headers = assert_error(response, status, error_type)
    assert seconds < 1.0  # at once, not at a timeout
    line = access_line(hardened, headers["x-request-id"])
    assert line["status"] == status and set(line) == ACCESS_FIELDS
    assert httpx.get(hardened.url + "/livez").status_code == 200


def test_a_malformed_request_pipelined_behind_a_good_one_is_logged(hardened) -> None:
    """The good one is answered and the connection closes after it; the malformed one behind it had left no trace
    at all (no answer of its own can come before the first's, and none is sent after a close)."""
    body = b'{"inputs": ["fine"]}'
    good = b"POST /v1/models/bert-classification/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    good += b"Content-Length: %d\r\n\r\n" % len(body) + body
    bad = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"
    response, _ = exchange(hardened, good + bad)
    status, headers, _ = parse(response)
    assert status == 200 and headers["connection"] == "close"
    assert wait_for(lambda: "(a pipelined request behind one being answered: the connection closes" in hardened.log())


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"POST /v1/embeddings?" + b"q" * 8200 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
        (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n", 431, "headers_too_large"),
        (
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{",
            408,
            "request_timeout",
        ),
    ],
    ids=["query-8k", "header-20k", "slow-body"],
)
def test_the_protocols_refusals_on_openais_route_are_in_openais_shape(hardened, request_bytes, status, code) -> None:
    """The HTTP layer answers these before any app runs (the slow body's 408 while the app waits for it): on
    /v1/embeddings in OpenAI's error shape as the app's own errors there are (the openai SDK read a bare string)."""
    response, _ = exchange(hardened, request_bytes)
    got, headers, body = parse(response)
    assert got == status and headers["connection"] == "close" and int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["code"] == code and error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    assert set(error) == {"message", "type", "param", "code"} and error["message"]


def test_an_http_1_0_request_needs_no_host(hardened) -> None:
    """RFC 9112's Host rule is HTTP/1.1's: an HTTP/1.0 request without one is served (an old health checker's)."""
    response, _ = exchange(hardened, b"GET /livez HTTP/1.0\r\n\r\n")
    assert parse(response)[0] == 200


def test_within_the_limits_is_served(hardened) -> None:
    with httpx.Client(base_url=hardened.url) as client:
        assert client.get("/livez?" + "q" * 8000).status_code == 200
        assert client.get("/livez", headers={f"x-h{i}": "v" * 90 for i in range(120)}).status_code == 200


def test_a_trailing_slash_is_a_404_not_a_redirect_to_the_clients_host(hardened) -> None:
    """Starlette answered a bare 307 whose Location it built from the Host header: any host a client sent."""
    with httpx.Client(base_url=hardened.url, headers={"Host": "evil.example:1234"}) as client:
        for method, path in (("POST", "/v1/models/bert-classification/classify/"), ("GET", "/v1/models/")):
            answer = client.request(method, path, json={"inputs": ["x"]} if method == "POST" else None)
            assert answer.status_code == 404 and "location" not in answer.headers, (path, answer.headers)
            assert answer.json()["error_type"] == "not_found", answer.text


def test_upgrade_requests_are_answered_as_plain_http(hardened) -> None:
    """No websocket or h2c here: an Upgrade request gets its plain HTTP/1.1 answer, and no warning."""
    for upgrade in (b"h2c", b"websocket"):
        request = b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: " + upgrade + b"\r\n\r\n"
        with socket.create_connection(address(hardened), timeout=5) as sock:
            sock.sendall(request)
            received = b""
            while b"\r\n\r\n" not in received or not received.endswith(b"}"):
                chunk = sock.recv(65536)
                assert chunk, received
                received += chunk
            status, _, body = parse(received)
        assert (status, json.loads(body)) == (200, {"status": "alive"})
    assert "Unsupported upgrade request" not in hardened.log()


def test_request_ids_are_accepted_when_sane_generated_otherwise_and_always_returned(hardened) -> None:
    with httpx.Client(base_url=hardened.url, timeout=30) as client:
        cases = [
            ("GET", "/livez", None, "trace-7f3a/b:c_d", "trace-7f3a/b:c_d"),
            # it forged a trace's ids in the text log, ahead of the real ones: [abc trace_id=... span_id=...]
            ("GET", "/livez", None, f"abc trace_id={'d' * 32} span_id={'1' * 16}", None),
            ("GET", "/livez", None, "abc]x", None),
            ("GET", "/livez", None, "x" * 128, "x" * 128),
            ("GET", "/livez", None, "x" * 129, None),
            ("GET", "/livez", None, "", None),
            ("GET", "/livez", None, "caf\u00e9".encode(), None),
            ("GET", "/nowhere", None, "id-404", "id-404"),
            ("POST", CLASSIFY, {"inputs": []}, "id-422", "id-422"),
            ("POST", CLASSIFY, {"inputs": ["fine"]}, None, None),
        ]
        for method, path, body, sent, expected in cases:
            headers = {} if sent is None else {"x-request-id": sent}
            response = client.request(method, path, json=body, headers=headers)
            returned = response.headers["x-request-id"]
            if expected is None:
                assert HEX_ID.fullmatch(returned), (sent, returned)
            else:
                assert returned == expected
            line = access_line(hardened, returned)
            assert (line["method"], line["path"], line["status"]) == (method, path, response.status_code)
    head = f"POST {CLASSIFY} HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\nx-request-id: id-413\r\n\r\n"
    status, headers, _ = parse(exchange(hardened, head.encode())[0])
    assert status == 413 and headers["x-request-id"] == "id-413"
    assert access_line(hardened, "id-413")["status"] == 413


def test_access_log_is_json_lines_and_only_ours(hardened) -> None:
    with httpx.Client(base_url=hardened.url, timeout=30) as client:
        client.post(CLASSIFY, json={"inputs": ["fine", "awful"]}, headers={"x-request-id": "json-line-1"})
    line = access_line(hardened, "json-line-1")
    assert set(line) == ACCESS_FIELDS
    assert line["method"] == "POST" and line["path"] == CLASSIFY and line["status"] == 200
    assert line["model"] == "bert-classification" and line["level"] == "info"
    assert line["duration_ms"] > 0 and re.fullmatch(r"127\.0\.0\.1:\d+", line["client"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", line["ts"])
    log = hardened.log()
    assert "uvicorn.access" not in log and '"POST /v1/models/bert-classification/classify HTTP/1.1"' not in log
    assert log.count("json-line-1") == 1  # one line for the request, and no text copy of it


def test_text_access_log_carries_the_request_id(tiny_server) -> None:
    """The default: one text line per request, through the one handler, with the id in its place."""
    response = httpx.get(tiny_server.url + "/v1/models", headers={"x-request-id": "text-line-1"})
    assert response.headers["x-request-id"] == "text-line-1"
    deadline = time.monotonic() + 5
    while "text-line-1" not in tiny_server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    (line,) = [line for line in tiny_server.log().splitlines() if "text-line-1" in line]
    assert re.search(r' INFO service\.access \[text-line-1\]: 127\.0\.0\.1:\d+ "GET /v1/models" 200 [\d.]+ ms$', line)


def test_every_line_logged_for_a_request_carries_its_id() -> None:
    """Concurrent requests whose handling logs (and awaits in between): each line has its own request's id."""
    log = logging.getLogger("tests.request-lines")
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    async def app(scope, receive, send) -> None:
        name = scope["path"].strip("/")
        log.info("start %s", name)
        await asyncio.sleep(0.01)
        log.info("end %s", name)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=RequestContextMiddleware(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await asyncio.gather(
                *(client.get(f"/r{i}", headers={"x-request-id": f"id-{i}"} if i % 2 else {}) for i in range(6))
            )

    try:
        responses = asyncio.run(run())
        log.info("outside any request")
    finally:
        log.removeHandler(handler)
    assert lines.pop().endswith("[-]: outside any request")
    ids = {f"r{i}": response.headers["x-request-id"] for i, response in enumerate(responses)}
    assert [ids[f"r{i}"] for i in (1, 3, 5)] == ["id-1", "id-3", "id-5"]
    assert all(HEX_ID.fullmatch(ids[f"r{i}"]) for i in (0, 2, 4))
    assert len(lines) == 12
    for line in lines:
        name = line.rsplit(" ", 1)[1]
        assert f"[{ids[name]}]: " in line, line


def test_process_mode_front_ends_have_the_same_protocol_and_logs(tiny_repository: Path, server_factory) -> None:
    server = server_factory(
        tiny_repository,
        "--engine-mode",
        "process",
        "--frontends",
        "1",
        "--models",
        "bert-classification",
        "--header-timeout-s",
        str(HEADER_TIMEOUT_S),
        "--access-log",
        "json",
    )
    response = httpx.post(server.url + CLASSIFY, json={"inputs": ["fine"]}, headers={"x-request-id": "front-1"})
    assert response.status_code == 200 and response.headers["x-request-id"] == "front-1"
    line = access_line(server, "front-1")
    assert (line["status"], line["model"]) == (200, "bert-classification")
    closed, sent, _ = hold_connections(server, 30, trickle=False)
    assert len(closed) == 30 and max(closed.values()) <= HEADER_TIMEOUT_S + 2.0
    assert_error(sent[1], 408, "request_timeout")
    response, _ = exchange(server, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_error(response, 414, "uri_too_long")


def _classify_count(server, status: int) -> float:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        text = client.get("/metrics").text
    series = f'bertserve_requests_total{{endpoint="classify",model="bert-classification",status="{status}"}} '
    line = next((line for line in text.splitlines() if line.startswith(series)), None)
    return float(line.split()[-1]) if line else 0.0


def _ner_tokens_run(server) -> float:
    """The real tokens bert-ner has run, from the metrics."""
    return metric(server, "bertserve_batch_real_tokens_total", model="bert-ner")


def leave_mid_body(server, extra_header: str = "") -> tuple[float, float]:
    """A classify request that sends part of its body and leaves; (500s, 499s) counted before, once it is counted."""
    before = _classify_count(server, 500), _classify_count(server, 499)
    with socket.create_connection(address(server), timeout=10) as sock:
        sock.sendall(
            f"POST {CLASSIFY} HTTP/1.1\r\nhost: x\r\n{extra_header}content-type: application/json\r\n"
            'content-length: 100\r\n\r\n{"inputs": '.encode()
        )
        time.sleep(0.3)
    deadline = time.monotonic() + 10
    while _classify_count(server, 499) == before[1] and time.monotonic() < deadline:
        time.sleep(0.1)
    return before


def test_a_client_that_leaves_before_its_body_is_in_is_a_499_not_a_500(hardened) -> None:
    """Nothing failed at the server and nobody was answered: counted (and logged) as a 500, each such client set
    off an operator's 5xx alerts."""
    before = leave_mid_body(hardened)
    assert (_classify_count(hardened, 500), _classify_count(hardened, 499)) == (before[0], before[1] + 1)
    lines = [json.loads(line) for line in hardened.log().splitlines() if line.startswith("{")]
    assert any(line.get("path") == CLASSIFY and line.get("status") == 499 for line in lines)


def test_on_the_slow_lane_too_a_client_gone_mid_body_is_a_499_without_a_traceback(tiny_repository, server_factory):
    """A request with an Origin, where CORS is on, goes down the full middleware stack; Starlette's ClientDisconnect
    there was an "unexpected error", its traceback logged, and a 500."""
    origin = "http://app.example"
    server = server_factory(tiny_repository, "--models", "bert-classification", "--cors-allow-origins", origin)
    assert leave_mid_body(server, f"origin: {origin}\r\n") == (0, 0)
    assert (_classify_count(server, 500), _classify_count(server, 499)) == (0, 1)
    assert f'"POST {CLASSIFY}" 499' in server.log() and "Traceback" not in server.log()


def test_an_upgrade_request_with_a_body_is_refused_not_served_without_it(hardened) -> None:
    """The parser ends an Upgrade request's message at its headers: its body was never read, and the request was
    answered 422 "the request body is empty"."""
    body = b'{"inputs": ["fine"]}'
    request = (
        f"POST {CLASSIFY} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        f"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    received, _ = exchange(hardened, request)
    status, _, answer = parse(received)
    assert status == 400, received
    assert json.loads(answer)["error"].startswith("a request that asks to Upgrade (h2c, websocket) cannot carry a body")


SEND_TIMEOUT_S = 3.0


@pytest.mark.parametrize("lane", ["gateway", "cors"])
def test_a_client_that_reads_none_of_its_answers_is_cut_and_holds_no_admission(tiny_repository, server_factory, lane):
    """A client sends large requests, pipelined, and reads none of the answers: the first answer fills the socket's
    buffers, and the second's write waits on the client. uvicorn waited for ever, and that request held its
    admission all along (its time in flight growing: the gate cut its share for every other client, to its floor).
    The gate lets go when the answer starts; the connection is cut after --send-timeout-s. (An Origin header takes
    the request through the CORS lane's middleware instead of the gateway.)"""
    origin = "http://app.example"
    cors = ("--cors-allow-origins", origin) if lane == "cors" else ()
    server = server_factory(tiny_repository, "--models", "bert-ner,bert-classification", "--send-timeout-s", "3", *cors)
    text = "Peter Blackburn met Maria Lopez in Brussels on Monday. " * 36  # ~2,000 characters
    body = json.dumps({"inputs": [text] * 64, "aggregation_strategy": "none"}).encode()
    head = "POST /v1/models/bert-ner/ner HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Origin: {origin}\r\n" if lane == "cors" else ""
    request = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    # one such request read in full first: the tokens the model runs for one (the metrics count them)
    json_type = {"content-type": "application/json"}
    before = _ner_tokens_run(server)  # a warm-up's few, where the server ran one
    assert httpx.post(server.url + "/v1/models/bert-ner/ner", content=body, headers=json_type, timeout=60).is_success
    read_first = _ner_tokens_run(server)
    once = read_first - before
    with socket.create_connection(address(server)) as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.sendall(request * 3)
        started = time.monotonic()

        def answer_begun() -> bool:  # its first bytes arrived (peeked: nothing read); a loaded machine's NER takes s
            with contextlib.suppress(BlockingIOError):
                return bool(client.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
            return False

        # the first answer under way, and the second request's work done (the model has run its tokens twice more
        # since the request read first):
        # what is in flight now is the second answer's write alone. A fixed second after the first answer had other
        # clients meet the second NER itself at the gate on a loaded machine (3 s of work to the door, rightly 429)
        assert wait_for(answer_begun, timeout=60)
        assert wait_for(lambda: _ner_tokens_run(server) >= read_first + 2 * once, timeout=60)
        time.sleep(0.5)
        with httpx.Client(base_url=server.url, timeout=30) as other:
            # one at a time, so each is alone in flight but for the stuck one: it held the gate, cut to its floor
            served = [other.post(CLASSIFY, json={"inputs": ["fine"]}).status_code for _ in range(30)]
        assert served == [200] * 30
        client.settimeout(30)
        with contextlib.suppress(ConnectionResetError):
            while client.recv(1 << 20):
                pass
        cut_after = time.monotonic() - started
    assert SEND_TIMEOUT_S - 1 <= cut_after <= SEND_TIMEOUT_S + 10, cut_after  # was: for as long as it stayed
    assert f"read nothing of its answer for {SEND_TIMEOUT_S:g} s" in server.log()
    assert httpx.post(server.url + CLASSIFY, json={"inputs": ["fine"]}).status_code == 200


def test_an_answer_before_the_body_is_in_is_read_by_a_client_still_writing(hardened) -> None:
    """A body declared over the limit is answered 413 before it is read (as a 429 or a 401 at the door): the server
    closed the connection with the body unread, the kernel answered the client's next segments with a reset, and a
    client still writing (urllib3, `requests`) failed its write and never read the answer: of 20 raw-socket clients
    writing a 4 MiB body without the API key, 17 failed their write and 3 read a reset (measured). Lingering, the
    server ends its side after the answer and drops the rest."""
    body = b'{"inputs": ["' + b"a" * (3 * 1024 * 1024) + b'"]}'  # over the default 2 MiB limit
    head = f"POST {CLASSIFY} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    head += "\r\n"
    outcomes = []
    for _ in range(5):
        with socket.create_connection(address(hardened), timeout=10) as sock:
            sock.sendall(head.encode())
            sock.sendall(body)  # a reset fails this write (ConnectionResetError, BrokenPipeError)
            received = b""
            while chunk := sock.recv(65536):  # to the server's end of file: no reset
                received += chunk
        outcomes.append(parse(received)[0])
    assert outcomes == [413] * 5


def test_a_lingering_connection_is_closed_after_linger_s_whatever_the_client_does(hardened) -> None:
    """The rest of the body is read for LINGER_S at most: a client that declared a body, was answered before it,
    and sends nothing more (nor closes) is closed then, not held to the body timeout."""
    from service.frontend.http.httptools_protocol import LINGER_S

    head = f"POST {CLASSIFY} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {1 << 30}\r\n\r\n"
    with socket.create_connection(address(hardened), timeout=10) as sock:
        sock.sendall(head.encode())
        started = time.monotonic()
        received = b""
        while chunk := sock.recv(65536):  # the answer, then our end (FIN)
            received += chunk
        answered_s = time.monotonic() - started
        assert parse(received)[0] == 413
        sock.sendall(b"x" * 1024)  # still open for the client to write into; then reset at LINGER_S
        deadline = time.monotonic() + LINGER_S + 5
        closed = False
        while time.monotonic() < deadline and not closed:
            try:
                sock.sendall(b"x" * 1024)
                time.sleep(0.1)
            except OSError:
                closed = True
        assert closed and time.monotonic() - started >= LINGER_S - 0.5
    assert answered_s < LINGER_S  # the answer itself does not wait for the linger


def test_a_model_named_in_the_body_is_the_access_lines_model(hardened) -> None:
    """Rerank and OpenAI's embeddings name their model in the body: the JSON access line had "model": null, where the
    metrics counted the request under the model (here one of another task: refused, and still that model's)."""
    with httpx.Client(base_url=hardened.url, timeout=30) as client:
        for path, body in [
            ("/v1/rerank", {"model": "bert-classification", "query": "q", "documents": ["d"]}),
            ("/v1/embeddings", {"model": "bert-classification", "input": "a text"}),
        ]:
            request_id = f"body-model{path.replace('/', '-')}"
            response = client.post(path, json=body, headers={"x-request-id": request_id})
            assert response.status_code == 400, response.text
            assert access_line(hardened, request_id)["model"] == "bert-classification", path
