"""`/livez` and `/readyz` on a port of their own (`--probe-port`), answered by a thread: fast under any load.

On the main port a probe waits behind everything else the event loop has to do; under overload that was
seconds, and an orchestrator kills a pod whose liveness probe times out. Here a thread answers at once, from
state the event loop keeps: liveness is "the event loop ran within `--liveness-stall-s`" (a heartbeat), so a
loop that is stuck (not merely busy) still fails the probe; readiness is the same verdict as the main port's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("service.probes")
HEARTBEAT_S = 0.2


class Heartbeat:
    """The event loop's pulse: a task that notes the time every HEARTBEAT_S."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._beat(), name="heartbeat")

    async def _beat(self) -> None:
        while True:
            self.last = time.monotonic()
            await asyncio.sleep(HEARTBEAT_S)

    def silent_for(self) -> float:
        return time.monotonic() - self.last

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class ProbeServer:
    def __init__(
        self,
        sock: socket.socket,
        heartbeat: Heartbeat,
        readiness: Callable[[], tuple[int, dict[str, Any]]],
        stall_s: float,
    ) -> None:
        probes = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 5  # a probe that sends nothing holds its thread no longer than this

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/livez":
                    status, body = probes.liveness()
                elif path == "/readyz":
                    status, body = readiness()
                else:
                    status, body = 404, {"error": "this port serves /livez and /readyz", "error_type": "not_found"}
                    body["field"] = None
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.heartbeat = heartbeat
        self.stall_s = stall_s
        self.httpd = ThreadingHTTPServer(sock.getsockname()[:2], Handler, bind_and_activate=False)
        self.httpd.socket.close()
        self.httpd.socket = sock
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="probes", daemon=True)

    def liveness(self) -> tuple[int, dict[str, Any]]:
        silent = self.heartbeat.silent_for()
        if silent > self.stall_s:
            message = f"the event loop has not run for {silent:.1f} s (--liveness-stall-s {self.stall_s:g})"
            return 503, {"error": message, "error_type": "unavailable", "field": None}
        return 200, {"status": "alive"}

    def start(self) -> None:
        self._thread.start()
        host, port = self.httpd.socket.getsockname()[:2]
        log.info("probes on http://%s:%d (/livez, /readyz)", host, port)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
