"""The probe port: /livez and /readyz answered by a thread of their own."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from benchmarks.serving import free_port
from service.http_server import shared_port_socket
from service.probes import Heartbeat, ProbeServer


def test_a_server_answers_probes_on_its_probe_port(tiny_repository: Path, server_factory) -> None:
    probe_port = free_port()
    server = server_factory(tiny_repository, "--models", "bert-classification", "--probe-port", str(probe_port))
    base = f"http://127.0.0.1:{probe_port}"
    assert httpx.get(base + "/livez").json() == {"status": "alive"}
    ready = httpx.get(base + "/readyz")
    with server.client() as client:
        assert ready.status_code == 200 and ready.json() == client.get("/readyz").json()
    missing = httpx.get(base + "/v1/models")
    assert missing.status_code == 404 and set(missing.json()) == {"error", "error_type", "field"}
    assert server.stop() == 0
    assert "probes on http://127.0.0.1:" in server.log()


def test_liveness_fails_once_the_event_loop_has_stalled() -> None:
    heartbeat = Heartbeat()  # never started: as a loop that stopped running
    probes = ProbeServer(shared_port_socket("127.0.0.1", 0), heartbeat, lambda: (200, {"status": "ready"}), 0.3)
    probes.start()
    try:
        port = probes.httpd.socket.getsockname()[1]
        assert httpx.get(f"http://127.0.0.1:{port}/livez").status_code == 200
        time.sleep(0.4)
        stalled = httpx.get(f"http://127.0.0.1:{port}/livez")
        assert stalled.status_code == 503 and "event loop has not run" in stalled.json()["error"]
    finally:
        probes.stop()
