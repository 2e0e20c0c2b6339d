"""Every error, ours or the framework's, answered with one body shape: {"error", "error_type", "field"}.

The same body is written by FastAPI's handlers (below), by the pure ASGI middleware (`send_error`: 401, 413) and
by the HTTP protocol itself before any ASGI app runs (`error_body`: malformed HTTP 400, 408, 414, 431).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from bertcore.messages import natural_order
from service.errors import CLIENT_CLOSED, ServiceError, unpaired_surrogate
from service.frontend.http import schemas
from service.frontend.http.traces import SCOPE_ERROR_TYPE

log = logging.getLogger("service.http")
INVALID_JSON = "the request body is not valid JSON (UTF-8)"
EMPTY_BODY = "the request body is empty: a JSON object is required"
Handler = Callable[[Request, Exception], Awaitable[JSONResponse]]
MAX_OTHER_FIELDS = 5  # of a validation error's other failing fields, the most its message names
MAX_KEY_CHARS = 100  # of a key that is not allowed, the most its field and message quote
STARLETTE_TYPES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
OPENAI_EMBEDDINGS_PATH = "/v1/embeddings"  # OpenAI's embeddings API; the metrics' endpoint label "embeddings"


@dataclass(frozen=True)
class ErrorShape:
    """Another API's errors, as its clients parse them: its status for one of this server's where the two differ
    (`statuses`), and its body for the one error body ({error, error_type, field}) at that status (`body`)."""

    body: Callable[[int, dict[str, Any]], dict[str, Any]]
    statuses: Mapping[int, int] = field(default_factory=dict)

    def status(self, status: int) -> int:
        return self.statuses.get(status, status)


def error_content(error_type: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": message, "error_type": error_type, "field": field}


def error_response(status: int, error_type: str, message: str, field: str | None = None, headers=None) -> JSONResponse:
    return JSONResponse(error_content(error_type, message, field), status_code=status, headers=headers)


def error_body(exc: ServiceError, path: str | None = None) -> bytes:
    """The JSON body of a domain error, byte for byte as FastAPI's handlers write it; in the path's shape where it
    has one (`ERROR_SHAPES`)."""
    if path is not None and (shape := ERROR_SHAPES.get(path)) is not None:
        content = error_content(exc.error_type, exc.message, exc.field)
        return render_shaped(shape.body(shape.status(exc.status_code), content))
    return bytes(error_response(exc.status_code, exc.error_type, exc.message, exc.field).body)


def openai_error(status: int, content: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's error body: the message, a type by the status (the openai SDK picks its exception by the status;
    the type is for people and logs), the field as `param` and the server's error_type as `code`, but OpenAI's own
    `model_not_found` for a model not served (the one thing a 404 on that route can be)."""
    if status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    message, field, code = content.get("error"), content.get("field"), content.get("error_type")
    if status == 404 and code == "not_found":
        code = "model_not_found"
    return {"error": {"message": message, "type": kind, "param": field, "code": code}}


def render_shaped(content: dict[str, Any]) -> bytes:
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


# OpenAI answers a request it cannot take 400 (the openai SDK's BadRequestError), where this server says 422
OPENAI_SHAPE = ErrorShape(openai_error, {422: 400})
# Paths whose errors are answered in another API's shape (every method: a GET's 405 too), whichever layer answers:
# the HTTP protocol's refusals (`error_body`, `shaped_status`), the gateway and everything below it
# (`gateway.ShapedErrors`)
ERROR_SHAPES: dict[str, ErrorShape] = {OPENAI_EMBEDDINGS_PATH: OPENAI_SHAPE}


def shaped_status(status: int, path: str) -> int:
    """The status an error answered at `path` has in the path's API."""
    shape = ERROR_SHAPES.get(path)
    return status if shape is None else shape.status(status)


async def send_error(
    send: Callable[[dict[str, Any]], Awaitable[None]],
    exc: ServiceError,
    close: bool = True,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer a domain error from pure ASGI middleware (outside FastAPI's handlers); `close`: and close the
    connection (the request's body, if any, is left unread)."""
    body = error_body(exc)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in exc.headers.items()]
    if close:
        headers.append((b"connection", b"close"))
    if extra_headers:
        headers += extra_headers
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install_error_handlers(app: FastAPI) -> None:
    for kind, handler in HANDLERS:
        app.add_exception_handler(kind, _noting_type(handler))


def _noting_type(handler: Handler) -> Handler:
    """The handler, with the error's type noted in the request's scope first (for its span: `traces`)."""

    async def noted(request: Request, exc: Exception) -> JSONResponse:
        response = await handler(request, exc)
        request.scope[SCOPE_ERROR_TYPE] = error_type_name(exc, response.status_code)
        return response

    return noted


def error_type_name(exc: Exception, status: int) -> str:
    """A span's `error.type`: the domain error's class; for the framework's own errors the domain's name for what
    they answered (a body that fails validation: InvalidInput, as the gateway's routes say), else the status (an
    unknown path's 404: "HTTPException" had named the framework, not the error)."""
    if isinstance(exc, ServiceError):
        return type(exc).__name__
    if isinstance(exc, RequestValidationError):
        return "InvalidInput" if status == 422 else "BadRequest"
    return str(status)


async def error_response_for(request: Request, exc: Exception) -> JSONResponse:
    """The response the handler of `exc` gives, for code that calls an endpoint outside FastAPI's handlers (the
    gateway): the first of HANDLERS whose type `exc` is, as FastAPI picks the most specific."""
    handler = next(handler for kind, handler in HANDLERS if isinstance(exc, kind))
    response = await handler(request, exc)
    request.scope[SCOPE_ERROR_TYPE] = error_type_name(exc, response.status_code)
    return response


async def service_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return error_response(exc.status_code, exc.error_type, exc.message, exc.field, exc.headers)


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """Built from exc.errors(), never str(exc); malformed JSON (or invalid UTF-8) is a 400, not a 422."""
    assert isinstance(exc, RequestValidationError)
    errors: list[dict[str, Any]] = list(exc.errors())
    if not errors:
        return error_response(422, "validation", "the request body is not valid")
    if errors[0].get("type") == "json_invalid":
        return error_response(400, "bad_request", INVALID_JSON)
    if errors[0].get("type") == "missing" and tuple(errors[0].get("loc", ())) == ("body",):
        return error_response(422, "validation", EMPTY_BODY, "body")
    # Unions report one error per alternative. An alternative whose type the value is not (a list given where a
    # string or an object may also go) says nothing about what is wrong where another alternative's type matched;
    # of the rest, the deepest path is the one that says what is wrong.
    errors = [error for error in errors if not _wrong_alternative(error)] or errors
    # deepest by the path's parts, the first of them in the body's order: "input.10" is no deeper than "input.0"
    first = max(errors, key=lambda error: len((_field(error) or "").split(".")))
    field = _field(first)
    # A string field with constraints (QA's question and context) meets a lone surrogate in pydantic, not in the
    # server's own check: the same message either way, with the character it is at.
    text = first.get("input") if first.get("type") == "string_unicode" else None
    if field and isinstance(text, str) and (surrogate := unpaired_surrogate(field, text)) is not None:
        return error_response(422, surrogate.error_type, surrogate.message, field)
    message = f"{field}: {first.get('msg', 'invalid')}" if field else str(first.get("msg", "invalid request body"))
    if first.get("type") == "too_long" and field in ("inputs", "input"):
        # the schema's ceiling (MAX_INPUTS_CEILING, bounding the parse) is not the server's limit: the same message
        # as a list over the limit and under the ceiling gets
        limit = request.app.state.server.settings.max_inputs_per_request
        count = first.get("ctx", {}).get("actual_length", "more")
        message = f"{count} inputs in one request; the limit is {limit}"
    others = sorted(
        {str(_field(error)) for error in errors if error is not first} - {str(field), "None"}, key=natural_order
    )
    if others:  # a few: the message is read by people, and a body of 10,000 bad inputs must not make it megabytes
        more = f" and {len(others) - MAX_OTHER_FIELDS} more" if len(others) > MAX_OTHER_FIELDS else ""
        message += f" (also: {', '.join(others[:MAX_OTHER_FIELDS])}{more})"
    return error_response(422, "validation", message, field)


def _field(error: dict[str, Any]) -> str | None:
    """The path of request fields, without pydantic's union and type tags: inputs.0.question, top_k; for a key
    that is not allowed, that key (the last part of the path).

    A single input (`"inputs": {...}` rather than a list) is input 0, as the server's own checks name it: pydantic's
    path for it is inputs, the alternative's tag (QaInput), then the field."""
    loc = list(error.get("loc", ()))
    # a key that is not allowed, cut short: it is the client's, and may be a megabyte long
    unknown = [str(loc.pop())[:MAX_KEY_CHARS]] if error.get("type") == "extra_forbidden" and len(loc) > 1 else []
    if "inputs" in loc:
        after = loc.index("inputs") + 1
        tags = after
        while tags < len(loc) and _is_type_tag(loc[tags]):
            tags += 1
        if after < tags and (
            (tags < len(loc) and loc[tags] in schemas.REQUEST_FIELDS) or (unknown and tags == len(loc))
        ):
            loc.insert(after, 0)
    parts = [str(p) for p in loc if isinstance(p, int) or p in schemas.REQUEST_FIELDS]
    return ".".join(parts + unknown) or None


def _wrong_alternative(error: dict[str, Any]) -> bool:
    """A union alternative refused as a whole for its type (inputs given as a list: its str and TextPair ones)."""
    loc = error.get("loc", ())
    last = loc[-1] if loc else None
    tag = isinstance(last, str) and last not in schemas.REQUEST_FIELDS
    return tag and str(error.get("type", "")).endswith("_type")


def _is_type_tag(part: Any) -> bool:
    """A union alternative's tag in pydantic's path (QaInput, union[str,TextPair]), not a list's or a field."""
    return isinstance(part, str) and part not in schemas.REQUEST_FIELDS and not part.startswith("list[")


async def http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    error_type = STARLETTE_TYPES.get(status, "bad_request" if status < 500 else "internal")
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(status).phrase
    if status == 404:
        message = "no such endpoint; see /docs"
    elif status == 400:  # FastAPI's own body-parsing failure (e.g. bytes that are not UTF-8)
        message = INVALID_JSON
    return error_response(status, error_type, message, headers=getattr(exc, "headers", None))


async def client_gone(_: Request, exc: Exception) -> JSONResponse:
    """A client that left before its body was in (Starlette's ClientDisconnect, on the slow lane): nobody reads the
    answer; its status is what the access line and the metrics record."""
    return error_response(CLIENT_CLOSED, "client_closed", "the client closed the connection before its body was in")


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal server error")


# Every error's handler, most specific first: FastAPI's (install_error_handlers) and the gateway's (error_response_for)
HANDLERS: tuple[tuple[type[Exception], Handler], ...] = (
    (ServiceError, service_error),
    (RequestValidationError, validation_error),
    (StarletteHTTPException, http_error),
    (ClientDisconnect, client_gone),
    (Exception, unexpected_error),
)
