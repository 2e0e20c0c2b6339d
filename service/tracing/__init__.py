"""OpenTelemetry traces (--otlp-endpoint): the SDK's tracer, configured once per process, and the few calls the
request path makes.

- Off (no endpoint, the default): `ENABLED` is False, nothing of the SDK is imported, and every call below answers
  at once (`span()` gives one shared no-op): the request path pays a flag check.
- On: one TracerProvider per process (front-end, engine), its resource naming the service (--otlp-service-name), the
  process's role (`bertserve.process`: server, frontend, engine) and its pid. Spans go through a BatchSpanProcessor
  (a bounded queue, --otlp-max-queue-spans, exported in batches by a thread of its own) to the OTLP exporter of
  --otlp-protocol, gRPC or HTTP/protobuf (auto: HTTP where the URL ends in /v1/traces or names port 4318, else
  gRPC). A slow or dead collector costs no request: spans wait in the queue, and those the queue cannot hold or the
  collector refuses are dropped and counted (`bertserve_trace_spans_dropped_total{reason}`: queue_full,
  export_failed).
- Sampling is parent-based (a client's sampled `traceparent` is always continued, an unsampled one never), and a
  trace that starts here is sampled at --trace-sample-ratio; a batch span (which serves many requests, each in its
  own trace) is sampled when any request it links to is.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import socket
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

if TYPE_CHECKING:
    from service.settings import Settings

ENABLED = False  # read on the request path: is a tracer configured in this process?
# The deadline (time.monotonic()) of the call whose task runs, where its protocol cancels the task at it (gRPC): a
# step that the task's cancellation leaves past it is the deadline's (DeadlineExceeded, ERROR, as its server span
# says), else a client's cancel. A cancel this close before it is the deadline's: the client's timer starts first.
CALL_DEADLINE: ContextVar[float] = ContextVar("bertserve_call_deadline", default=math.inf)
DEADLINE_SLACK_S = 0.02
SCOPE = "bertserve"
_tracer: trace.Tracer = trace.NoOpTracer()
_provider: Any = None
DroppedCounter = Callable[[str, int], None]  # reason, spans
DROP_REASONS = ("queue_full", "export_failed")  # why spans are lost (service.tracing.sdk counts them)


class _NoSpan(AbstractContextManager):
    """The span of a request that is not traced: entering and leaving it, and setting its attributes, do nothing."""

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def is_recording(self) -> bool:
        return False


NO_SPAN = _NoSpan()


def configure(settings: Settings, process: str, on_dropped: DroppedCounter | None = None) -> None:
    """Traces on where --otlp-endpoint is set (else off, as they are by default); `process` names this process's
    role in the resource; `on_dropped(reason, spans)` counts what is lost."""
    global ENABLED, _tracer, _provider
    shutdown()
    if not settings.otlp_endpoint:
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased

    from service.tracing import sdk as tracing_sdk

    count = on_dropped or (lambda reason, spans: None)
    for reason in DROP_REASONS:  # each series at 0 from the start: the first loss already shows as an increase
        count(reason, 0)
    resource = Resource.create(
        {
            "service.name": settings.otlp_service_name,
            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
            "bertserve.process": process,
        }
    )
    sampler = ParentBased(tracing_sdk.RatioOrLinked(settings.trace_sample_ratio))
    provider = TracerProvider(resource=resource, sampler=sampler)
    tracing_sdk.hold_repeats()
    exporter = tracing_sdk.CountingExporter(
        tracing_sdk.otlp_exporter(settings, protocol_of(settings)), count, settings.otlp_endpoint
    )
    provider.add_span_processor(tracing_sdk.CountingBatchProcessor(exporter, settings.otlp_max_queue_spans, count))
    _provider = provider
    _tracer = provider.get_tracer(SCOPE)
    ENABLED = True


def shutdown() -> None:
    """Export what is queued (for at most a few seconds: `sdk.SHUTDOWN_S`, a dead collector does not hold a stop) and
    stop; tracing is off afterwards."""
    global ENABLED, _tracer, _provider
    provider, _provider = _provider, None
    ENABLED = False
    _tracer = trace.NoOpTracer()
    if provider is not None:
        provider.shutdown()


def protocol_of(settings: Settings) -> str:
    """grpc or http/protobuf: --otlp-protocol, or by the endpoint's URL where it says auto."""
    if settings.otlp_protocol != "auto":
        return settings.otlp_protocol
    url = urlsplit(settings.otlp_endpoint or "")
    return "http/protobuf" if url.path.rstrip("/").endswith("/v1/traces") or url.port == 4318 else "grpc"


def start_span(
    name: str,
    parent: SpanContext | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: dict[str, Any] | None = None,
    start_ns: int | None = None,
    links: Sequence[Link] | None = None,
) -> trace.Span:
    """A span, child of `parent` where given (another process's, or one that is not current here), else the root of a
    trace of its own (never a child of whatever span happens to be current)."""
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent is not None else Context()
    return _tracer.start_span(name, context, kind, attributes, links, start_ns)


def span(name: str, attributes: dict[str, Any] | None = None) -> AbstractContextManager:
    """A child of the current span, made current while the block runs; NO_SPAN where tracing is off or the request
    is not sampled (the common case costs a flag check, and a context lookup when tracing is on)."""
    if not ENABLED or not trace.get_current_span().is_recording():
        return NO_SPAN
    return _ChildSpan(name, attributes)


class _ChildSpan(AbstractContextManager):
    """A request's step (admission, tokenize, engine, ...): an error leaving it is marked as the request's server
    span marks it (`set_error`): ERROR (with the exception's event) where the server is at fault, `error.type` alone
    where the client is (a 4xx, a client gone: the SDK's own handling had made every exception ERROR, so a client's
    disconnect or empty input read as the server's failure in the engine or tokenize span)."""

    __slots__ = ("_manager", "_span")

    def __init__(self, name: str, attributes: dict[str, Any] | None) -> None:
        self._manager = _tracer.start_as_current_span(
            name, attributes=attributes, record_exception=False, set_status_on_exception=False
        )

    def __enter__(self) -> trace.Span:
        self._span = self._manager.__enter__()
        return self._span

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool | None:
        if error is not None:
            status = getattr(error, "status_code", None)
            if isinstance(status, int):
                set_error(self._span, type(error).__name__, status)
            elif isinstance(error, GeneratorExit | asyncio.CancelledError):  # the request's task cancelled
                if time.monotonic() >= CALL_DEADLINE.get() - DEADLINE_SLACK_S:
                    set_error(self._span, "DeadlineExceeded", 504)
                else:
                    self._span.set_attribute("error.type", type(error).__name__)
            else:
                self._span.record_exception(error)
                set_error(self._span, type(error).__name__, 500, str(error) or None)
        return self._manager.__exit__(kind, error, traceback)


def current_context() -> SpanContext | None:
    """The current span's context where it is sampled (what a request hands the engine with its rows), else None."""
    if not ENABLED:
        return None
    context = trace.get_current_span().get_span_context()
    return context if context.is_valid and context.trace_flags.sampled else None


def remote_context(trace_id: int, span_id: int, flags: int) -> SpanContext:
    """A span context received from another process (the engine's view of a front-end's span)."""
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


def traceparent(context: SpanContext) -> str:
    """W3C trace context's header value for `context`."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


HEX_2, HEX_16, HEX_32 = (re.compile(f"[0-9a-f]{{{n}}}") for n in (2, 16, 32))
# W3C trace context's tracestate member: a key (lower case; "tenant@system" for a multi-tenant vendor), "=", a value
# of printable ASCII without "," and "=" that does not end in a space; 32 members at most
TRACESTATE_MEMBER = re.compile(
    r"([a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])"
)
TRACESTATE_MAX_MEMBERS = 32


def parse_traceparent(value: str | bytes | None) -> SpanContext | None:
    """A client's `traceparent` (W3C trace context, version 00 or a later one read as 00), else None where it is
    absent or malformed (the request then starts a trace of its own, as the spec says)."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    parts = text.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or (parts[0] == "00" and len(parts) != 4):
        return None
    version, trace_hex, span_hex, flags_hex = parts[:4]
    # lower-case hex digits only: int(x, 16) also reads "+7...", "0x7...", " 7..." and "7_7...", and would continue
    # a trace the client never sent
    if not (
        HEX_2.fullmatch(version)
        and HEX_32.fullmatch(trace_hex)
        and HEX_16.fullmatch(span_hex)
        and HEX_2.fullmatch(flags_hex)
    ):
        return None
    trace_id, span_id, flags = int(trace_hex, 16), int(span_hex, 16), int(flags_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 0x01))


def client_parent(values: Sequence[str | bytes], states: Sequence[str | bytes] = ()) -> SpanContext | None:
    """The parent a request's `traceparent` headers (HTTP) or metadata entries (gRPC) give: the one, where it is well
    formed; none for none or several (W3C trace context's test suite starts a trace of its own for two). With it,
    the client's `tracestate` (`states`: its headers, several read as one list), carried on by every span of the
    request, as the specification asks of a participant (a vendor's entries); a malformed one (a bad key, a key
    twice, over 32 entries) is dropped whole, as OpenTelemetry's propagator drops it."""
    parent = parse_traceparent(values[0]) if len(values) == 1 else None
    if parent is None or not states:
        return parent
    from opentelemetry.trace.span import TraceState

    members = trace_state_members([v.decode("latin-1") if isinstance(v, bytes) else v for v in states])
    return SpanContext(
        parent.trace_id, parent.span_id, is_remote=True, trace_flags=parent.trace_flags, trace_state=TraceState(members)
    )


def trace_state_members(states: Sequence[str]) -> list[tuple[str, str]]:
    """A client's `tracestate` headers as one list of members; none where one is malformed, a key comes twice or
    there are over 32. Read here, quietly: OpenTelemetry's `TraceState.from_header` logs a warning holding the
    client's text for each malformed one, so that any client could write its words, 16 KiB a request, into the
    server's log."""
    members: dict[str, str] = {}
    for state in states:
        for member in state.split(","):
            member = member.strip(" \t")
            if not member:
                continue
            found = TRACESTATE_MEMBER.fullmatch(member)
            if found is None or found.group(1) in members:
                return []
            members[found.group(1)] = found.group(2)
    return list(members.items()) if len(members) <= TRACESTATE_MAX_MEMBERS else []


def set_error(span: trace.Span, error_type: str, status: int, message: str | None = None) -> None:
    """A failed request's span: `error.type` (the domain error's class, or the status where none is known) on
    every error; the span's status ERROR where the server is at fault (5xx), as the HTTP conventions say for a
    server span (a 4xx is the client's: its status stays unset)."""
    span.set_attribute("error.type", error_type)
    if status >= 500:
        span.set_status(trace.Status(trace.StatusCode.ERROR, message or error_type))


class CurrentSpan:
    """A request's own span (its server span), current in the request's context variables from here until `end`:
    what the request does meanwhile is its children, and its log lines name it."""

    __slots__ = ("span", "token")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.token = otel_context.attach(trace.set_span_in_context(span))

    def end(self) -> None:
        self.span.end()
        otel_context.detach(self.token)
