"""`python -m service` as an operator starts and stops it: where it cannot listen it says so in one line and exits 2
before anything loads, in either layout; a BERTSERVE_* variable that sets nothing is refused where it looks like a
misspelt setting, a warning otherwise; `--drain-timeout-s` bounds a stop whatever is in flight."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.harness.serving import free_port, start_service
from tests.service.conftest import run_service, wait_for

MODEL = "bert-classification"


@pytest.mark.parametrize(
    ("layout", "port_flag"),
    [("in-process", "--port"), ("in-process", "--probe-port"), ("process", "--probe-port")],
)
def test_a_port_in_use_is_one_line_and_exit_2_before_anything_starts(
    tiny_repository: Path, layout: str, port_flag: str
) -> None:
    """In-process, a taken --port was found by uvicorn once every model had loaded (its error line, exit 3); a
    taken --probe-port was a traceback there and, in process mode, front-ends restarted until the launcher gave up
    (exit 1)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--port": str(free_port()), port_flag: str(port)}
        flags = [item for pair in ports.items() for item in pair]
        done = run_service("--repository", str(tiny_repository), "--models", MODEL, "--engine-mode", layout, *flags)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot listen on 127.0.0.1:{port}: "), done.stderr
    assert lines[0].endswith(" (probes)") == (port_flag == "--probe-port")


@pytest.mark.parametrize(
    ("signal_number", "code", "said"),
    [
        (signal.SIGINT, 130, "error: interrupted before the server started; nothing was served"),
        (signal.SIGTERM, 143, "error: stopped (SIGTERM) before the server started; nothing was served"),
    ],
    ids=["ctrl-c", "sigterm"],
)
def test_a_stop_while_the_models_load_is_one_line_and_its_exit_code(
    real_repository: Path, tmp_path: Path, signal_number: int, code: int, said: str
) -> None:
    """In-process, the models load before uvicorn takes the signals: a Ctrl-C then was a KeyboardInterrupt
    traceback through onnxruntime, and a SIGTERM (an orchestrator's stop) ended the process with no word (and as a
    container's PID 1, was ignored). The signal comes after the first model's load, while the others load: real
    MiniLM sessions, a few tenths of a second each (the tiny models had all loaded in 45 ms, within one poll of the
    log, and once uvicorn had started before the signal came: a graceful stop, exit 0; CI failed so)."""
    log_path = tmp_path / "server.log"
    server = start_service(
        real_repository, "--engine-mode", "in-process", log_path=log_path, wait=False, own_group=True
    )
    try:
        assert wait_for(lambda: "CPUExecutionProvider" in server.log(), timeout=60), server.log()
        os.killpg(server.process.pid, signal_number)  # as a terminal sends it: to the whole group
        exited = server.process.wait(timeout=60)
    finally:
        server.stop()
    log = server.log()
    assert exited == code, log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert log.strip().splitlines()[-1] == said


def test_a_host_that_is_no_address_is_one_line_and_exit_2(tiny_repository: Path) -> None:
    done = run_service("--repository", str(tiny_repository), "--models", MODEL, "--host", "999.1.1.1")
    assert done.returncode == 2
    assert done.stderr.startswith("error: cannot listen on 999.1.1.1:") and "Traceback" not in done.stderr


def test_a_misspelt_setting_in_the_environment_is_refused_not_ignored(tiny_repository: Path) -> None:
    """pydantic-settings passes over BERTSERVE_API_KEY in silence: the server served with no key at all."""
    key = {"BERTSERVE_API_KEY": "abcdefghijklmnopqrstuvwxyz012345"}
    done = run_service("--repository", str(tiny_repository), "--models", MODEL, env=key)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: BERTSERVE_API_KEY is not a setting; did you mean BERTSERVE_API_KEYS? (unset it or correct its name)"
    )


def test_another_unknown_variable_is_a_warning_and_service_links_and_comma_lists_are_taken(
    tiny_repository: Path,
) -> None:
    """A name like no setting is said once in the log (the server then starts: here it stops at a taken port, after
    the settings were read); the kubelet's service links and this project's compose variables are not warned of;
    BERTSERVE_MODELS takes the comma-separated list its help describes (it wanted JSON)."""
    env = {
        "BERTSERVE_COLOUR": "blue",
        "BERTSERVE_SERVICE_HOST": "10.0.0.7",
        "BERTSERVE_PORT_80_TCP_ADDR": "10.0.0.7",
        "BERTSERVE_MODELS_DIR": "/srv/models",
        "BERTSERVE_MODELS": f"{MODEL},bert-ner",
    }
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_service("--repository", str(tiny_repository), "--port", str(port), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: cannot listen on 127.0.0.1:{port}: ")
    warnings = [line for line in done.stderr.splitlines() if "is not a setting" in line]
    assert len(warnings) == 1 and "BERTSERVE_COLOUR is not a setting and is ignored" in warnings[0], done.stderr


@pytest.mark.parametrize("lane", ["gateway", "cors"])
def test_a_drain_timeout_under_a_second_bounds_the_stop(tiny_repository: Path, server_factory, lane: str) -> None:
    """`int(drain_timeout_s) or None` made 0 and 0.5 s no bound at all: an upload that stalls held the stop for the
    body timeout (60 s). The request that the drain's end cuts short is answered a 503 in the error body, its access
    line says so, and the log has no traceback: it was a plain-text 500 and "Exception in ASGI application". A
    request from a page (an Origin, CORS on) goes down the middleware stack: the same there."""
    origin = "https://app.example.com"
    flags = (
        "--models",
        MODEL,
        "--engine-mode",
        "in-process",
        "--drain-timeout-s",
        "0.5",
        "--cors-allow-origins",
        origin,
    )
    server = server_factory(tiny_repository, *flags)
    host, port = server.url.removeprefix("http://").split(":")
    origin_line = f"origin: {origin}\r\n" if lane == "cors" else ""
    with socket.create_connection((host, int(port))) as stalled:
        stalled.sendall(
            f"POST /v1/models/{MODEL}/classify HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"x-request-id: cut-{lane}\r\n{origin_line}"
            'content-length: 1000\r\n\r\n{"inputs": '.encode()
        )
        time.sleep(0.5)  # the request is in the app, waiting for the rest of its body
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        stalled.settimeout(10)
        answer = b""
        while chunk := stalled.recv(65536):
            answer += chunk
        code = server.process.wait(timeout=30)
    assert time.monotonic() - signalled < 5
    assert code == 0
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), answer
    assert json.loads(body) == {
        "error": "the server stopped before answering: its drain (--drain-timeout-s 0.5) ended first",
        "error_type": "unavailable",
        "field": None,
    }
    assert b"x-request-id: cut-" + lane.encode() in head.lower() and b"retry-after: 1" in head.lower()
    log = server.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    assert f'"POST /v1/models/{MODEL}/classify" 503' in log
