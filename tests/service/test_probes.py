"""The probe port: /livez and /readyz answered by a process of its own."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from service import probes
from service.frontend.http.app import create_app
from service.frontend.http.server import shared_port_socket
from service.probes import ALIVE, HeartbeatFile, probe_child
from service.settings import Settings
from tests.harness.serving import free_port
from tests.service.conftest import wait_for


def test_a_server_answers_probes_on_its_probe_port(tiny_repository: Path, server_factory) -> None:
    probe_port = free_port()
    server = server_factory(tiny_repository, "--models", "bert-classification", "--probe-port", str(probe_port))
    base = f"http://127.0.0.1:{probe_port}"
    assert httpx.get(base + "/livez").json() == {"status": "alive"}
    ready = httpx.get(base + "/readyz")
    with server.client() as client:
        assert ready.status_code == 200 and ready.content == client.get("/readyz").content  # the very bytes
    missing = httpx.get(base + "/v1/models")
    assert missing.status_code == 404 and set(missing.json()) == {"error", "error_type", "field"}
    assert missing.content.startswith(b'{"error":"')  # compact, as the app writes every body
    assert server.stop() == 0
    assert "probes on http://127.0.0.1:" in server.log()


def test_a_server_killed_outright_leaves_no_probe_state_behind(tiny_repository: Path, server_factory) -> None:
    """The probe process outlives a server killed with SIGKILL (an OOM kill) only until it reads the end of its
    stdin; its state folder was left in /tmp at every such death (one per restart of a front-end in process mode)."""
    server = server_factory(tiny_repository, "--models", "bert-classification", "--probe-port", str(free_port()))
    child = int(re.findall(r"answered by process (\d+)", server.log())[-1])
    command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
    state = Path(command[command.index(b"--state") + 1].decode())
    assert state.parent.name.startswith(probes.STATE_DIR_PREFIX) and state.exists()
    server.process.kill()
    server.process.wait(10)
    assert wait_for(lambda: not state.parent.exists(), timeout=10), list(state.parent.iterdir())


def test_head_is_answered_as_get_without_a_body_on_both_ports(tiny_repository: Path, server_factory) -> None:
    """HEAD (uptime checkers and load balancers send it) gets GET's status and headers, and no body; a keep-alive
    connection goes on after it."""
    probe_port = free_port()
    server = server_factory(tiny_repository, "--models", "bert-classification", "--probe-port", str(probe_port))
    with httpx.Client(base_url=server.url) as client:  # one connection for all: the bodies left out leave it sound
        for path in ("/livez", "/readyz", "/v1/models", "/v1/models/bert-classification", "/metrics", "/docs"):
            got, head = client.get(path), client.head(path)
            assert (head.status_code, head.content) == (got.status_code, b""), path
            assert head.headers["content-type"] == got.headers["content-type"], path
            if path != "/metrics":  # its counters move between the two requests
                assert head.headers["content-length"] == got.headers["content-length"], path
        refused = client.head("/v1/models/bert-classification/classify")
        assert (refused.status_code, refused.headers["allow"], refused.content) == (405, "POST", b"")
        assert client.post("/v1/models/bert-classification/classify", json={"inputs": ["ok"]}).status_code == 200
    for path in ("/livez", "/readyz"):
        got, head = (
            httpx.get(f"http://127.0.0.1:{probe_port}{path}"),
            httpx.head(f"http://127.0.0.1:{probe_port}{path}"),
        )
        assert (head.status_code, head.content) == (200, b"") and got.status_code == 200, path
        assert head.headers["content-length"] == got.headers["content-length"] == str(len(got.content)), path


def test_the_probe_port_is_ready_as_soon_as_the_main_port_is(tiny_repository: Path, monkeypatch) -> None:
    """A verdict that changes is written at once, not at the next heartbeat: once the main port has said ready,
    the probe port says so too (CI once caught the probe port 503 right after the main port's 200)."""
    monkeypatch.setattr(probes, "HEARTBEAT_S", 3600.0)  # one beat at start-up, then none during this test
    probe_port = free_port()
    settings = Settings(repository=tiny_repository, models=["bert-classification"], probe_port=probe_port)
    with TestClient(create_app(settings)) as client:
        assert wait_for(lambda: client.get("/readyz").status_code == 200)
        ready = httpx.get(f"http://127.0.0.1:{probe_port}/readyz")
        assert ready.status_code == 200 and ready.json() == client.get("/readyz").json()


def test_the_probe_process_reports_a_stalled_event_loop_and_a_state_not_ready(tmp_path: Path) -> None:
    sock = shared_port_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    state = HeartbeatFile(tmp_path / "state.json")
    not_ready = (503, {"error": "not ready; loading: x", "error_type": "unavailable", "field": None})
    state.write(live=ALIVE, ready=not_ready)
    child = probe_child(sock, state, stall_s=2.0)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:  # until the child answers
            try:
                httpx.get(base + "/livez")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        state.write(live=ALIVE, ready=not_ready)  # a fresh beat: the loop is running
        assert httpx.get(base + "/livez").status_code == 200
        assert httpx.get(base + "/readyz").json()["error"] == "not ready; loading: x"
        time.sleep(2.5)  # no new beat: as a loop that stopped running
        stalled = httpx.get(base + "/livez")
        assert stalled.status_code == 503 and "event loop has not run" in stalled.json()["error"]
    finally:
        child.stdin.close()  # type: ignore[union-attr]  # the server's end closes: the probe process exits
        assert child.wait(10) == 0


def test_an_engine_state_file_says_alive_stuck_or_stale(tmp_path: Path) -> None:
    """What the launcher reads of an engine process (a "live" verdict, no readiness): each way it can be judged."""
    state = HeartbeatFile(tmp_path / "engine.state")
    assert probes.liveness(state.read(), stall_s=1.0)[0] == 503  # nothing written yet (the launcher waits for it)
    state.write(live=probes.alive_unless(None))
    assert probes.liveness(state.read(), stall_s=1.0) == ALIVE
    state.write(live=probes.alive_unless("model m: a batch has been on the device for 41 s"))
    status, body = probes.liveness(state.read(), stall_s=1.0)
    assert status == 503 and body["error"] == "not alive: model m: a batch has been on the device for 41 s"
    state.write(live=ALIVE)
    time.sleep(1.2)
    status, body = probes.liveness(state.read(), stall_s=1.0)
    assert status == 503 and body["error"].startswith("the event loop has not run for 1.")


class HangingSession:
    """A real session whose runs, once `hang` is set, block until `release` is: a device that stopped answering."""

    def __init__(self, real) -> None:
        self.real = real
        self.hang = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def run(self, *args, **kwargs):
        if self.hang.is_set():
            self.release.wait(30)
        return self.real.run(*args, **kwargs)


def test_a_batch_stuck_on_the_device_fails_liveness_on_both_ports(tiny_repository: Path) -> None:
    """In-process: a batch still on the device --liveness-stall-s past its requests' deadline is a stuck device;
    /livez says so (on the main port and the probe port) so that an orchestrator restarts the server, and /readyz
    too; once the device answers again, both are 200 again."""
    probe_port = free_port()
    settings = Settings(
        repository=tiny_repository,
        models=["bert-classification"],
        probe_port=probe_port,
        request_timeout_s=0.5,
        liveness_stall_s=0.5,
    )
    app = create_app(settings)
    with TestClient(app) as client:
        assert wait_for(lambda: client.get("/readyz").status_code == 200)
        runtime = app.state.server.engine.core.models["bert-classification"].runtime
        session = runtime.session = HangingSession(runtime.session)
        session.hang.set()
        sent = time.monotonic()  # the batch goes on the device after this
        late = client.post("/v1/models/bert-classification/classify", json={"inputs": ["stuck"]})
        assert late.status_code == 504
        live_at_504 = client.get("/livez").status_code
        if time.monotonic() - sent < 1.0:  # ~0.5 s past its start: within --request-timeout-s + --liveness-stall-s
            assert live_at_504 == 200  # not yet stuck (a loaded machine may have taken us past the bound: no verdict)
        assert wait_for(lambda: client.get("/livez").status_code == 503, timeout=10)
        live = client.get("/livez").json()
        assert live["error_type"] == "unavailable"
        assert "model bert-classification: a batch has been on the device for" in live["error"], live
        assert "--request-timeout-s + --liveness-stall-s (1 s)" in live["error"], live
        assert "a batch has been on the device" in client.get("/readyz").json()["error"]
        assert wait_for(lambda: httpx.get(f"http://127.0.0.1:{probe_port}/livez").status_code == 503)
        session.hang.clear()
        session.release.set()
        assert wait_for(lambda: client.get("/livez").status_code == 200)
        assert wait_for(lambda: httpx.get(f"http://127.0.0.1:{probe_port}/livez").status_code == 200)
        assert client.get("/readyz").status_code == 200
        ok = client.post("/v1/models/bert-classification/classify", json={"inputs": ["fine"]})
        assert ok.status_code == 200
