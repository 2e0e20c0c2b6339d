"""uvicorn with the drain this server promises: on SIGTERM/SIGINT stop admitting (readyz 503, new work 503),
finish what is in flight, then exit. Used by the in-process server and by each front-end process."""

from __future__ import annotations

import socket
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from service.frontend.http.httptools_protocol import HttpLimits, protocol_class
from service.settings import Settings


class DrainingServer(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = _find_state(self.config.loaded_app)  # loaded_app may be wrapped in uvicorn's middleware
        if state is not None:
            state.draining = True
        super().handle_exit(sig, frame)
        # uvicorn raises the signal again once it has shut down, so the process dies of it (exit 143): after a
        # drain that is a clean stop, and says so with exit 0, as process mode's launcher does.
        self._captured_signals.clear()


def _find_state(app: Any) -> Any:
    for _ in range(10):
        if app is None:
            return None
        server = getattr(getattr(app, "state", None), "server", None)
        if server is not None:
            return server
        app = getattr(app, "app", None)
    return None


def serve(app: FastAPI, settings: Settings, sockets: list[socket.socket] | None = None) -> bool:
    """Run until SIGTERM/SIGINT; False where the server never started (a start-up error, already reported)."""
    limits = HttpLimits(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        send_timeout_s=settings.send_timeout_s,
        max_url_bytes=settings.max_url_bytes,
        max_header_bytes=settings.max_header_bytes,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol_class(limits),  # httptools with header/body deadlines, size limits, JSON errors
        ws="none",
        log_level=settings.log_level,
        log_config=None,  # uvicorn's lines go through the server's one handler (request ids, one format)
        access_log=False,  # the app writes its own (service.logs), with the request id
        timeout_keep_alive=settings.keepalive_timeout_s,  # type: ignore[arg-type]  # a float works
        timeout_graceful_shutdown=settings.drain_timeout_s,  # type: ignore[arg-type]  # a float works; 0: no wait
        proxy_headers=False,
        server_header=False,
    )
    server = DrainingServer(config)
    server.run(sockets=sockets)
    return server.started


def shared_port_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening socket that several front-end processes open on one port (SO_REUSEPORT): the kernel spreads
    new connections over them evenly."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(False)
    return sock
