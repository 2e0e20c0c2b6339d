"""The one request pipeline of every inference POST over HTTP: native, Hugging Face task API, rerank and the Open
Inference Protocol's infer, each endpoint an adapter below it.

Under 1-input load a front-end spent about a quarter of its CPU in the layers between uvicorn and the endpoint: a
pure ASGI middleware for each concern (request id and access line, API key, body limit, metrics, JSON only,
admission), Starlette's error middlewares, FastAPI's and Starlette's routing, each an `await` and a wrapped `send`
per message. Here those concerns run once, in order, in one function, and the endpoint is called directly; every
other request (probes, model information, the repository API, docs, a CORS request) goes down the full stack
(`slow_lane`), where the same middleware classes still apply. What a client sees is the same either way: statuses,
the one error body, headers, the access line and the metrics.

The order, as the middleware stack had it: the request id; the API key (401, not counted in the request metrics);
the body limit by Content-Length (413, not counted); then, counted and timed: JSON only (415), admission (429,
before the body is read), the body (read here, bounded: 413; decoded where it is gzip or deflate, bounded again:
`content_coding`), the endpoint and its errors.

Every error has one body, {error, error_type, field}, and one mapping of domain errors to statuses
(`service.errors`, `service.frontend.http.errors`); a path that speaks another API's error shape (OpenAI's
embeddings: `{"error": {message, type, param, code}}`) has that body rendered in its shape on the way out
(`errors.ERROR_SHAPES`, `ShapedErrors`), whichever layer answered the error, with the same headers, and the
same status but where that API has its own for it (OpenAI's 400 for a 422).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from service import tracing
from service.errors import CLIENT_CLOSED, PayloadTooLarge, ServiceError, UnsupportedMediaType
from service.frontend.admission import SCOPE_ADMISSION, Door
from service.frontend.http import content_coding, traces
from service.frontend.http import errors as http_errors
from service.frontend.http.auth import ApiKeys, bearer_token, unauthorized
from service.frontend.http.middleware import (
    SCOPE_MODEL,
    drain_cut,
    endpoint_label,
    json_only_refusal,
    read_body,
)
from service.frontend.http.state import ServerState
from service.logs import (
    REQUEST_ID,
    REQUEST_ID_HEADER,
    SCOPE_REQUEST_ID,
    SCOPE_STATUS,
    access_log,
    log_access,
    request_id_from,
)

Scope = dict[str, Any]
Endpoint = Callable[[Request], Awaitable[Response]]
ASGIApp = Callable[..., Awaitable[None]]
log = logging.getLogger("service.http")


class ShapedErrors:
    """`send`, with an error answer's body (status 400 and up, the one error body) rendered in the path's shape:
    whichever layer answered (the gateway's checks, the endpoint, the slow lane's middleware or FastAPI's
    handlers), the headers and which error it is stay theirs; the body's shape changes, and the status where the
    shape has its own for it."""

    def __init__(self, send: Callable, shape: http_errors.ErrorShape, scope: Scope) -> None:
        self._send = send
        self._shape = shape
        self._scope = scope  # told the status answered (SCOPE_STATUS), where the shape's differs: logs and metrics
        self._start: dict[str, Any] | None = None  # an error's start, held until its body is in
        self._chunks: list[bytes] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            self._start = message
            return
        if self._start is None or message["type"] != "http.response.body":
            await self._send(message)
            return
        self._chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        start, body = self._start, self._shaped(self._start["status"], b"".join(self._chunks))
        self._start, self._chunks = None, []
        if (status := self._shape.status(start["status"])) != start["status"]:
            start = {**start, "status": status}
            self._scope[SCOPE_STATUS] = status
        headers = [(name, value) for name, value in start.get("headers", ()) if name.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({**start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})

    def _shaped(self, status: int, body: bytes) -> bytes:
        """The body in the path's shape; as it is where it is not the one error body (nothing to render)."""
        try:
            content = json.loads(body)
        except ValueError:
            return body
        if not isinstance(content, dict) or "error_type" not in content:
            return body
        return http_errors.render_shaped(self._shape.body(self._shape.status(status), content))


class InferenceEndpoints:
    """Which endpoint serves a POST to a path, and the path's model name (None for rerank's and OpenAI's, which is
    the body's). The paths are `middleware.is_inference`'s."""

    def __init__(
        self,
        native: dict[str, Endpoint],
        hf_task: Endpoint,
        v2_infer: Endpoint,
        rerank: dict[str, Endpoint],
        openai: dict[str, Endpoint] | None = None,
    ) -> None:
        self.native = native  # the last part of /v1/models/{name}/{action} -> its endpoint
        self.hf_task = hf_task  # /v1/models/{name}
        self.v2_infer = v2_infer  # /v2/models/{name}/infer
        self.rerank = rerank  # /v1/rerank, /v2/rerank
        self.model_in_body = {**rerank, **(openai or {})}  # those and /v1/embeddings: paths that name no model

    def find(self, path: str) -> tuple[Endpoint, str | None] | None:
        endpoint = self.model_in_body.get(path)
        if endpoint is not None:
            return endpoint, None
        parts = path.split("/")  # ['', 'v1', 'models', name, action?]
        if len(parts) < 4 or parts[2] != "models" or not parts[3]:
            return None
        if parts[1] == "v1":
            if len(parts) == 4:
                return self.hf_task, parts[3]
            if len(parts) == 5 and (endpoint := self.native.get(parts[4])) is not None:
                return endpoint, parts[3]
        elif parts[1] == "v2" and len(parts) == 5 and parts[4] == "infer":
            return self.v2_infer, parts[3]
        return None


class InferenceGateway:
    """Below Starlette's own entry (which puts the app in the scope, where endpoints find the server's state): inference
    POSTs through `_serve`, everything else to `slow_lane` (the middleware stack and FastAPI's routing)."""

    def __init__(
        self,
        slow_lane: ASGIApp,
        server: ServerState,
        endpoints: InferenceEndpoints,
        keys: ApiKeys,
        cors: bool,
    ) -> None:
        self.slow_lane = slow_lane
        self.server = server
        self.endpoints = endpoints
        self.keys = keys if keys.enabled else None
        self.cors = cors
        self.max_bytes = server.settings.max_body_bytes
        self.door: Door = server.door
        self.metrics = server.metrics

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and (shape := http_errors.ERROR_SHAPES.get(scope["path"])) is not None:
            send = ShapedErrors(send, shape, scope)
        found = self.endpoints.find(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if found is None:
            await self.slow_lane(scope, receive, send)
            return
        if self.cors and any(name == b"origin" for name, _ in scope["headers"]):
            await self.slow_lane(scope, receive, send)  # CORS headers on the answer: Starlette's middleware
            return
        await self._serve(scope, receive, send, *found)

    async def _serve(
        self, scope: Scope, receive: Callable, send: Callable, endpoint: Endpoint, name: str | None
    ) -> None:
        started = time.perf_counter()
        declared: bytes | None = None
        given_id: bytes | None = None
        for header, value in scope["headers"]:
            if header == b"content-length":
                declared = value
            elif header == REQUEST_ID_HEADER and given_id is None:
                given_id = value
        request_id = scope.get(SCOPE_REQUEST_ID) or request_id_from(given_id)
        REQUEST_ID.set(request_id)  # not reset: uvicorn's own lines about the request come after this returns
        scope[SCOPE_REQUEST_ID] = request_id
        headers = [(REQUEST_ID_HEADER, request_id.encode("ascii"))]  # on every answer
        span = traces.start(scope, traces.route_of(scope["path"], name)) if tracing.ENABLED else None
        if span is not None:
            headers.append(span.header())
        status = 500
        try:
            status = await self._checked(scope, receive, send, endpoint, name, declared, headers)
        finally:
            status = scope.get(SCOPE_STATUS, status)
            if access_log.isEnabledFor(logging.INFO):
                seconds = time.perf_counter() - started
                log_access(
                    request_id,
                    "POST",
                    scope["path"],
                    status,
                    seconds,
                    scope.get("client"),
                    model=scope.get(SCOPE_MODEL),
                )
            if span is not None:
                span.finish(status, scope.get(traces.SCOPE_ERROR_TYPE))

    async def _checked(
        self,
        scope: Scope,
        receive: Callable,
        send: Callable,
        endpoint: Endpoint,
        name: str | None,
        declared: bytes | None,
        headers: list[tuple[bytes, bytes]],
    ) -> int:
        """The API key and the body's declared size, then the counted part; the answer's status, counted and timed
        whatever it is: a 401 or a declared size's 413 too (gRPC counts its UNAUTHENTICATED; after a key's rotation,
        clients still on the old key show on the dashboards' error ratio)."""
        started = time.perf_counter()
        status = 500
        try:
            if self.keys is not None:
                token = bearer_token(scope)
                if token is None or not self.keys.verify(token):
                    status = await _send_error(scope, send, unauthorized(token), headers)
                    return status
            length: int | None = None  # None: chunked (or no body), read in `_counted`, bounded
            if declared is not None and declared.isdigit():
                length = int(declared)
                if length > self.max_bytes:
                    status = await _send_error(scope, send, self._too_large(), headers)
                    return status
            status = await self._counted(scope, receive, send, endpoint, name, length, headers)
            return status
        finally:
            status = scope.get(SCOPE_STATUS, status)  # the status answered, where the path's API has its own
            path_model = scope.get(SCOPE_MODEL) if name is None else name
            model = path_model if path_model in self.server.registry.models else "unknown"  # bounded label values
            label = endpoint_label(scope)
            metrics = self.metrics
            metrics.series(metrics.requests, model, label, str(status)).inc()
            metrics.series(metrics.request_duration, model, label).observe(time.perf_counter() - started)

    async def _counted(
        self,
        scope: Scope,
        receive: Callable,
        send: Callable,
        endpoint: Endpoint,
        name: str | None,
        length: int | None,
        headers: list[tuple[bytes, bytes]],
    ) -> int:
        coding = content_coding.body_coding(scope["headers"])
        refusal = json_only_refusal(scope, coding)
        if refusal is not None:
            return await _send_error(scope, send, UnsupportedMediaType(refusal), headers)
        door = self.door
        admission = door.try_enter(length if coding is None else None, name)  # a coded body's size says little
        if admission is None:
            return await _send_error(scope, send, door.overloaded(), headers)
        scope[SCOPE_ADMISSION] = admission
        status = 500
        answering = False
        try:
            body_or_status = await self._bounded_body(scope, receive, send, headers)
            if isinstance(body_or_status, int):
                status = body_or_status
                return status
            body = body_or_status
            if coding is not None:
                try:
                    body = content_coding.decoded(body, coding, self.max_bytes)
                except ServiceError as exc:
                    status = await _send_error(scope, send, exc, headers)
                    return status
            if name is not None:
                scope["path_params"] = {"name": name}
            request = Request(scope, receive)
            request._body = body  # read here, bounded; the endpoint's `await request.body()` takes it
            try:
                response = await endpoint(request)
            except Exception as exc:
                response = await http_errors.error_response_for(request, exc)
            response.raw_headers.extend(headers)
            status = response.status_code
            answering = True
            # its work is done: the answer's write goes at the client's pace, and a client that reads none of it
            # must not hold the gate (until --send-timeout-s cuts it)
            admission.leave(completed=200 <= status < 300)
            await response(scope, receive, send)
            return status
        except asyncio.CancelledError:
            cut = drain_cut(scope) if not answering else None
            if cut is None:
                raise
            status = await _send_error(scope, send, cut, headers)
            return status
        finally:
            admission.leave(completed=200 <= status < 300)

    async def _bounded_body(
        self, scope: Scope, receive: Callable, send: Callable, headers: list[tuple[bytes, bytes]]
    ) -> bytes | int:
        """The body; or, where there is none to serve, the status of what happened: 413 answered (over the limit),
        499 where the client left before its body was in (nobody to answer, and nothing failed here)."""
        body = await read_body(receive, self.max_bytes)
        if body is None:
            return CLIENT_CLOSED
        if len(body) > self.max_bytes:
            return await _send_error(scope, send, self._too_large(), headers)
        return body

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body is larger than {self.max_bytes} bytes")


async def _send_error(scope: Scope, send: Callable, exc: ServiceError, headers: list[tuple[bytes, bytes]]) -> int:
    """The error answered and the connection closed (the request's body, if any, is left unread)."""
    scope[traces.SCOPE_ERROR_TYPE] = type(exc).__name__
    await http_errors.send_error(send, exc, extra_headers=headers)
    return exc.status_code
