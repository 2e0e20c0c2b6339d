"""Pure ASGI middleware: the request body limit, per-request metrics, and CORS with the one error body."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from service.errors import PayloadTooLarge
from service.http_errors import error_response, send_error
from service.metrics import Metrics

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[..., Any]


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 for bodies over `max_bytes`: at once by Content-Length, or as soon as a streamed body passes it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reject(send)

    async def _reject(self, send: Callable) -> None:
        await send_error(send, PayloadTooLarge(f"the request body is larger than {self.max_bytes} bytes"))


class MetricsMiddleware:
    """Counts every /v1/models/{name}/{endpoint} request by model, endpoint and status, and times it."""

    def __init__(self, app: ASGIApp, metrics: Metrics, known_models: Callable[[], set[str]]) -> None:
        self.app = app
        self.metrics = metrics
        self.known_models = known_models

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/v1/models/"):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            parts = scope["path"].split("/")  # ['', 'v1', 'models', name, endpoint?]
            name = parts[3] if len(parts) > 3 else ""
            model = name if name in self.known_models() else "unknown"  # bounded label values
            endpoint = parts[4] if len(parts) > 4 and parts[4] in ("classify", "ner", "qa") else "info"
            self.metrics.requests.labels(model, endpoint, str(status)).inc()
            self.metrics.request_duration.labels(model, endpoint).observe(time.perf_counter() - started)


class JsonCorsMiddleware(CORSMiddleware):
    """Starlette's CORS (only installed with --cors-allow-origins); a refused preflight answers the error body,
    not Starlette's plain text."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        message = f"CORS preflight refused: {bytes(response.body).decode()}"
        headers = {k: v for k, v in response.headers.items() if k.startswith("access-control-") or k == "vary"}
        return error_response(400, "bad_request", message, headers=headers)
