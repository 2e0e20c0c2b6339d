"""Pure ASGI middleware: the request body limit, JSON only, admission by time, per-request metrics, and CORS
with the one error body."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from starlette import types
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from service import tracing
from service.errors import NotReady, PayloadTooLarge, ServiceError, UnsupportedMediaType
from service.frontend.admission import SCOPE_ADMISSION, Door
from service.frontend.http import content_coding, traces
from service.frontend.http.errors import OPENAI_EMBEDDINGS_PATH, error_response, send_error
from service.logs import (
    REQUEST_ID,
    REQUEST_ID_HEADER,
    SCOPE_REQUEST_ID,
    SCOPE_STATUS,
    access_log,
    log_access,
    request_id_from,
)
from service.metrics import Metrics

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[..., Any]


class BodyTooLarge(Exception):
    pass


INFERENCE_ENDPOINTS = ("classify", "ner", "qa", "embed")
V2_INFER_ENDPOINT = "v2-infer"  # the request metrics' endpoint label of POST /v2/models/{name}/infer
# Inference paths that name no model: the route puts the body's model in the scope (SCOPE_MODEL) for the metrics.
RERANK_PATHS = frozenset({"/v1/rerank", "/v2/rerank"})
MODEL_IN_BODY_PATHS = RERANK_PATHS | {OPENAI_EMBEDDINGS_PATH}
SCOPE_MODEL = "bertserve.model"


def note_body_model(scope: MutableMapping[str, Any], data: Any) -> None:
    """The model a body names, in the scope for the metrics as soon as the JSON is read: a body that then fails
    validation (422) was counted under `unknown` though it named a served model. (Not a served one: still
    `unknown`, the gateway's bounded labels.)"""
    if isinstance(data, dict) and isinstance(model := data.get("model"), str):
        scope[SCOPE_MODEL] = model


def drain_cut(scope: Mapping[str, Any]) -> NotReady | None:
    """The answer to a request whose task was cancelled because the drain ended (uvicorn cancels what still runs
    --drain-timeout-s after a SIGTERM): a 503 in the one error body, where the client got a plain-text 500 and the
    log a traceback. None where the server is not draining: the cancellation is someone else's, to re-raise."""
    server = getattr(getattr(scope.get("app"), "state", None), "server", None)
    if server is None or not server.draining:
        return None
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()  # handled: the answer below is written, and the task ends as it would have
    seconds = server.settings.drain_timeout_s
    return NotReady(f"the server stopped before answering: its drain (--drain-timeout-s {seconds:g}) ended first")


class StatusRecorder:
    """`send`, noting the response's status on the way (500 until a response starts)."""

    def __init__(self, send: Callable) -> None:
        self._send = send
        self.status = 500

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)


def is_inference(path: str) -> bool:
    """A path whose POST is inference: the native endpoints, the Hugging Face task API (the model's own path),
    rerank, OpenAI's embeddings and the Open Inference Protocol's /v2/models/{name}/infer. (Only POSTs are
    inference: a GET of the model's path is its information.)"""
    if path in MODEL_IN_BODY_PATHS:
        return True
    parts = path.split("/")  # ['', 'v1', 'models', name, endpoint?]
    if len(parts) < 4 or parts[2] != "models" or not parts[3]:
        return False
    if parts[1] == "v2":
        return len(parts) == 5 and parts[4] == "infer"
    if parts[1] != "v1":
        return False
    return len(parts) == 4 or (len(parts) == 5 and parts[4] in INFERENCE_ENDPOINTS)


def endpoint_label(scope: Scope) -> str:
    """The metrics' endpoint label: classify, ner, qa, embed, task (the Hugging Face task API), rerank, embeddings
    (OpenAI's), v2-infer, or info."""
    path = scope.get("path", "")
    if path in RERANK_PATHS:
        return "rerank"
    if path == OPENAI_EMBEDDINGS_PATH:
        return "embeddings"
    parts = path.split("/")
    if parts[-1] == "infer" and parts[1] == "v2" and (len(parts) == 5 or (len(parts) == 7 and parts[4] == "versions")):
        return V2_INFER_ENDPOINT  # /v2/models/{name}[/versions/{version}]/infer (a version is a 404, still an infer)
    if len(parts) == 5 and parts[1] == "v1" and parts[4] in INFERENCE_ENDPOINTS:
        return parts[4]
    posted_task = len(parts) == 4 and parts[1] == "v1" and scope.get("method") == "POST" and is_inference(path)
    return "task" if posted_task else "info"


class HeadAsGetMiddleware:
    """HEAD is GET without the body (RFC 9110 9.3.2: every general-purpose server supports both; uptime checkers and
    load balancers send it to the probes). The app answers it as a GET; the HTTP protocol, whose scope still says
    HEAD, writes the headers (content-length included) and drops the body."""

    def __init__(self, app: types.ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: types.Scope, receive: types.Receive, send: types.Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}
        await self.app(scope, receive, send)


class JsonOnlyMiddleware:
    """415 for an inference request whose body says it is not JSON (a form, text): the usual mistake is curl -d
    without a Content-Type header, and without this it is a puzzling 422. No Content-Type at all reads as JSON; so
    does a body with Triton's binary tensor data (its JSON part's length in Inference-Header-Content-Length). A
    body in gzip or deflate is decoded here (`content_coding`), within the body limit, for the app behind."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and is_inference(scope.get("path", "")):
            coding = content_coding.body_coding(scope.get("headers") or [])
            refusal = json_only_refusal(scope, coding)
            if refusal is not None:
                await send_error(send, UnsupportedMediaType(refusal))
                return
            if coding is not None:
                await self._decoded(scope, receive, send, coding)
                return
        await self.app(scope, receive, send)

    async def _decoded(self, scope: Scope, receive: Callable, send: Callable, coding: bytes) -> None:
        """The app, given the body decoded (gzip or deflate; bounded by the body limit, as the gateway's)."""
        coded = await read_body(receive, self.max_bytes)  # within the limit: BodyLimitMiddleware is outside
        if coded is None:  # the client left before the body was in
            return
        try:
            body = content_coding.decoded(coded, coding, self.max_bytes)
        except ServiceError as exc:
            await send_error(send, exc)
            return
        await self.app(scope, replaying(body, receive), send)


def json_only_refusal(scope: Scope, coding: bytes | None) -> str | None:
    """Why an inference request's body is refused as not JSON (415), or None where it is JSON (or says nothing).
    A body in a content coding (`coding`: `content_coding.body_coding`'s) other than gzip and deflate is refused
    too, as RFC 9110 says of a coding the server does not take."""
    if coding is not None and (refused := content_coding.refusal(coding)) is not None:
        return refused
    declared = None
    binary = False
    for name, value in scope.get("headers") or ():
        if name == b"content-type":
            declared = value
        elif name == b"inference-header-content-length":
            binary = True
    if binary:
        return None  # Triton's binary tensor data: JSON, then bytes
    media = declared.split(b";")[0].strip().lower() if declared is not None else b"application/json"
    if media == b"application/json" or media.endswith(b"+json"):
        return None
    shown = media.decode("latin-1")[:100]
    return f"the body must be JSON (Content-Type: application/json), not {shown or 'empty'}"


async def read_body(receive: Callable, max_bytes: int) -> bytes | None:
    """The whole body, reading no more than one message past `max_bytes` (a caller finds it longer than that, and
    refuses it); None where the client left first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        if chunk:
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                break
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def replaying(body: bytes, receive: Callable) -> Callable:
    """An ASGI `receive` that hands over `body` (read already) as one message, then what `receive` brings next."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()  # after the body: the disconnect, when it comes
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class AdmissionMiddleware:
    """429 at once, before the body is read or tokenized, for inference requests the gate does not admit. The
    admitted request's shares (`admission.Passage`) ride in the scope (SCOPE_ADMISSION): the route charges it
    the request's real tokens once tokenized."""

    def __init__(self, app: ASGIApp, door: Door, on_refused: Callable[[], None] | None = None) -> None:
        self.app = app
        self.door = door
        self.on_refused = on_refused or (lambda: None)

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not is_inference(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        door = self.door
        admission = door.try_enter(declared_length(scope))
        if admission is None:
            self.on_refused()
            await send_error(send, door.overloaded())
            return
        scope[SCOPE_ADMISSION] = admission

        async def leaving_send(message: Message) -> None:
            if message["type"] == "http.response.start":  # its work is done: the write is the client's pace
                admission.leave(completed=200 <= message["status"] < 300)
            await send(message)

        sent = StatusRecorder(leaving_send)
        try:
            await self.app(scope, receive, sent)
        finally:
            admission.leave(completed=200 <= sent.status < 300)  # where it answered nothing (no-op where it did)


def declared_length(scope: Scope) -> int | None:
    """The body's Content-Length, where the request declares one."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


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
        if declared is None:  # chunked (or no body): read it here, bounded, so that too much is a 413
            await self._buffered(scope, receive, send)
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

    async def _buffered(self, scope: Scope, receive: Callable, send: Callable) -> None:
        body = await read_body(receive, self.max_bytes)
        if body is None:  # the client left before the body was in
            return
        if len(body) > self.max_bytes:
            await self._reject(send)
            return
        await self.app(scope, replaying(body, receive), send)

    async def _reject(self, send: Callable) -> None:
        await send_error(send, PayloadTooLarge(f"the request body is larger than {self.max_bytes} bytes"))


class MetricsMiddleware:
    """Counts every /v1/models/{name}[/{endpoint}], /v2/models/{name}/..., rerank and OpenAI embeddings request by
    model, endpoint and status, and times it."""

    def __init__(self, app: ASGIApp, metrics: Metrics, known_models: Callable[[], set[str]]) -> None:
        self.app = app
        self.metrics = metrics
        self.known_models = known_models

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith(("/v1/models/", "/v2/models/")) and path not in MODEL_IN_BODY_PATHS:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        sent = StatusRecorder(send)
        try:
            await self.app(scope, receive, sent)
        finally:
            parts = path.split("/")  # ['', 'v1', 'models', name, endpoint?]
            name = scope.get(SCOPE_MODEL) if path in MODEL_IN_BODY_PATHS else parts[3] if len(parts) > 3 else ""
            model = name if name in self.known_models() else "unknown"  # bounded label values
            endpoint = endpoint_label(scope)
            status = scope.get(SCOPE_STATUS, sent.status)  # the status answered, where the path's API has its own
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


class RequestContextMiddleware:
    """The outermost layer: the request's id (context variable, response header) and its access line."""

    def __init__(self, app: types.ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: types.Scope, receive: types.Receive, send: types.Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                raw = value
                break
        # the HTTP protocol may have named the request already (it answered it while the app was starting)
        request_id = scope.get(SCOPE_REQUEST_ID) or request_id_from(raw)
        # Not reset afterwards: the request has a task of its own (uvicorn), and uvicorn's own lines about it
        # ("Exception in ASGI application") come after this returns.
        REQUEST_ID.set(request_id)
        scope[SCOPE_REQUEST_ID] = request_id
        added = [(REQUEST_ID_HEADER, request_id.encode("ascii"))]
        span = traces.start(scope, None) if tracing.ENABLED else None  # named by its route once routed
        if span is not None:
            added.append(span.header())
        replaced = {name for name, _ in added}
        started = time.perf_counter()
        status = 500  # what the client gets if the app raises before answering (uvicorn's 500)
        answering = False

        async def send_with_id(message: types.Message) -> None:
            nonlocal status, answering
            if message["type"] == "http.response.start":
                status, answering = message["status"], True
                headers = [h for h in message.get("headers", ()) if h[0].lower() not in replaced]
                message = {**message, "headers": [*headers, *added]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            cut = drain_cut(scope) if not answering else None
            if cut is None:
                raise
            scope[traces.SCOPE_ERROR_TYPE] = type(cut).__name__
            await send_error(send_with_id, cut)
        finally:
            status = scope.get(SCOPE_STATUS, status)
            if access_log.isEnabledFor(logging.INFO):
                log_access(
                    request_id,
                    scope.get("method"),
                    scope.get("path"),
                    status,
                    time.perf_counter() - started,
                    scope.get("client"),
                    model=scope.get(SCOPE_MODEL),  # a route that names its model in the body (rerank, OpenAI's)
                )
            if span is not None:
                route = scope.get("route")
                span.finish(status, scope.get(traces.SCOPE_ERROR_TYPE), getattr(route, "path_format", None))
