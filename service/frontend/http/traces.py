"""An HTTP request's server span (traces on, `service.tracing`): the client's `traceparent` continued, the HTTP
semantic conventions' attributes, the status and error type at the end, and the `traceparent` header the response
carries where the request is sampled."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from service import tracing

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
SCOPE_ERROR_TYPE = "bertserve.error_type"  # the domain error a request was answered with, for its span
# Probes and scrapes: many a second, nothing to follow in a trace
UNTRACED_PATHS = frozenset({"/livez", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"})


class ServerSpan(tracing.CurrentSpan):
    """One request's span, current (in the context variables) from `start` until `end`."""

    __slots__ = ("method",)

    def __init__(self, span: trace.Span, method: str) -> None:
        super().__init__(span)
        self.method = method

    def header(self) -> tuple[bytes, bytes]:
        """The response's `traceparent`: this span's."""
        return TRACEPARENT, tracing.traceparent(self.span.get_span_context()).encode("ascii")

    def finish(self, status: int, error_type: str | None, route: str | None = None) -> None:
        """The response's status and error type; `route`: the route template, where it was not known at the start
        (it then names the span)."""
        span = self.span
        if route is not None:
            span.update_name(f"{self.method} {route}")
            span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        if status >= 400:
            tracing.set_error(span, error_type or str(status), status)
        self.end()


def start(scope: MutableMapping[str, Any], route: str | None) -> ServerSpan | None:
    """The request's server span, named by its route template (`route`: None where it is not known yet, the path
    then), where tracing is on and the request is sampled; else None."""
    if not tracing.ENABLED or scope["path"] in UNTRACED_PATHS:
        return None
    parents: list[bytes] = []
    states: list[bytes] = []
    user_agent = None
    for name, value in scope["headers"]:
        if name == TRACEPARENT:
            parents.append(value)
        elif name == TRACESTATE:
            states.append(value)
        elif name == b"user-agent":
            user_agent = value.decode("latin-1")
    parent = tracing.client_parent(parents, states)
    method = scope["method"]
    attributes: dict[str, Any] = {
        "http.request.method": method,
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
    }
    if route is not None:
        attributes["http.route"] = route
    if (client := scope.get("client")) is not None:
        attributes["client.address"], attributes["client.port"] = client[0], client[1]
    if (server := scope.get("server")) is not None:
        attributes["server.address"], attributes["server.port"] = server[0], server[1] or 0
    if user_agent is not None:
        attributes["user_agent.original"] = user_agent
    span = tracing.start_span(f"{method} {route}" if route else method, parent, SpanKind.SERVER, attributes)
    if not span.is_recording():
        return None
    return ServerSpan(span, method)


def route_of(path: str, model: str | None) -> str:
    """The route template of an inference path: the model's name in it as {name}."""
    if model is None:
        return path
    parts = path.split("/")  # ['', 'v1', 'models', name, action?]
    parts[3] = "{name}"
    return "/".join(parts)
