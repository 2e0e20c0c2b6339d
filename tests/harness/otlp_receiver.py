"""A real OTLP trace receiver on the loopback interface, for the tests and for scripts: what a server exports with
--otlp-endpoint arrives here as the collector's own messages (opentelemetry-proto's ExportTraceServiceRequest), is
decoded into ReceivedSpan records, and can be waited for and drawn as a tree.

    with OtlpReceiver("grpc") as receiver:            # or "http" (OTLP/HTTP protobuf, gzip accepted)
        server = start_service(repository, "--otlp-endpoint", receiver.endpoint, "--otlp-protocol", "grpc")
        ...
        spans = receiver.wait_for(lambda spans: any(s.name == "classify" for s in spans))
        print(render_tree(spans, spans[0].trace_id, attributes=["http.route"]))

`OtlpReceiver(fail=True)` answers every export with an error (HTTP 503, gRPC UNAVAILABLE) and still counts the
attempts: a collector that is down.

    python -m tests.harness.otlp_receiver [--protocol http|grpc] [--port N] [--seconds N]

runs one, prints its endpoint, and after N seconds (or Ctrl-C) prints every trace received as a tree.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

HOST = "127.0.0.1"
HTTP_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
MAX_BODY = 64 * 1024 * 1024  # an OTLP/HTTP request larger than this is refused (413)
MAX_SECONDS = 3600  # the command line's --seconds is bounded


@dataclass(frozen=True)
class ReceivedLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex characters
    span_id: str  # 16 hex characters
    parent_span_id: str | None  # 16 hex characters; None for a root
    kind: str  # INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER or UNSPECIFIED
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: str  # UNSET, OK or ERROR
    status_message: str
    links: tuple[ReceivedLink, ...]
    events: tuple[tuple[str, dict[str, Any]], ...]  # (name, attributes)
    resource: dict[str, Any]  # the resource's attributes (service.name, ...)
    scope: str  # the instrumentation scope's name
    trace_state: str = ""  # W3C tracestate, as exported

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def any_value(value: common_pb2.AnyValue) -> Any:
    """An AnyValue as Python: str, int, float, bool, bytes, a list of those, a dict (kvlist), or None (empty)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, which)


def attributes_of(pairs: Sequence[common_pb2.KeyValue]) -> dict[str, Any]:
    return {pair.key: any_value(pair.value) for pair in pairs}


def _kind(span: trace_pb2.Span) -> str:
    return trace_pb2.Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_")


def _status(span: trace_pb2.Span) -> str:
    return trace_pb2.Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_")


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Every span of one export request, each with its resource's attributes and its scope's name."""
    received = []
    for resource_spans in request.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                received.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        kind=_kind(span),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=attributes_of(span.attributes),
                        status_code=_status(span),
                        status_message=span.status.message,
                        links=tuple(
                            ReceivedLink(link.trace_id.hex(), link.span_id.hex(), attributes_of(link.attributes))
                            for link in span.links
                        ),
                        events=tuple((event.name, attributes_of(event.attributes)) for event in span.events),
                        resource=dict(resource),
                        scope=scope_spans.scope.name,
                        trace_state=span.trace_state,
                    )
                )
    return received


class OtlpReceiver:
    """An OTLP trace collector on 127.0.0.1 (a free port unless `port` is given): OTLP/HTTP protobuf
    (POST /v1/traces) or OTLP/gRPC (TraceService/Export). A context manager; start() and stop() otherwise."""

    def __init__(self, protocol: Literal["http", "grpc"] = "http", fail: bool = False, *, port: int = 0) -> None:
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
        self.protocol = protocol
        self.fail = fail
        self._requested_port = port
        self._port: int | None = None
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._exports = 0
        self._authorizations: list[str | None] = []
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._grpc: grpc.Server | None = None

    # --- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> OtlpReceiver:
        if self._port is not None:
            raise RuntimeError("the receiver is already started")
        if self.protocol == "http":
            self._http = ThreadingHTTPServer((HOST, self._requested_port), _handler_for(self))
            self._http.daemon_threads = True
            self._port = self._http.server_address[1]
            self._http_thread = threading.Thread(
                target=self._http.serve_forever, kwargs={"poll_interval": 0.1}, name="otlp-http", daemon=True
            )
            self._http_thread.start()
        else:
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp-grpc"))
            trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), server)
            port = server.add_insecure_port(f"{HOST}:{self._requested_port}")
            if port == 0:
                raise OSError(f"cannot listen on {HOST}:{self._requested_port}")
            server.start()
            self._grpc, self._port = server, port
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            if self._http_thread is not None:
                self._http_thread.join(5)
            self._http = self._http_thread = None
        if self._grpc is not None:
            self._grpc.stop(grace=0.5).wait(5)
            self._grpc = None
        self._port = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- what a server is given, what it sent -------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the receiver is not started")
        return self._port

    @property
    def endpoint(self) -> str:
        """The URL to export to: http://127.0.0.1:PORT/v1/traces (http), http://127.0.0.1:PORT (grpc)."""
        base = f"http://{HOST}:{self.port}"
        return base + HTTP_PATH if self.protocol == "http" else base

    @property
    def exports(self) -> int:
        """Export requests received (answered with an error too, where fail=True)."""
        with self._lock:
            return self._exports

    @property
    def authorizations(self) -> list[str | None]:
        """Each export request's `authorization` header (HTTP) or metadata entry (gRPC), None where it had none."""
        with self._lock:
            return list(self._authorizations)

    def spans(self) -> list[ReceivedSpan]:
        """The spans received so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        """Forget the spans received and the export count."""
        with self._lock:
            self._spans.clear()
            self._exports = 0

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 15.0) -> list[ReceivedSpan]:
        """The spans as soon as predicate(spans) holds; AssertionError naming the spans received at `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if predicate(spans):
                return spans
            if time.monotonic() >= deadline:
                names = sorted({span.name for span in spans})
                raise AssertionError(
                    f"no match in {timeout} s: {len(spans)} spans received in {self.exports} exports, named {names}"
                )
            time.sleep(0.05)

    def _record(
        self, request: trace_service_pb2.ExportTraceServiceRequest | None, authorization: str | None = None
    ) -> None:
        """One export request: counted always, its spans kept unless this receiver fails every export."""
        spans = spans_of(request) if request is not None and not self.fail else []
        with self._lock:
            self._exports += 1
            self._authorizations.append(authorization)
            self._spans.extend(spans)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        metadata = dict(context.invocation_metadata())
        authorization = metadata.get("authorization")
        self.receiver._record(request, authorization if isinstance(authorization, str) else None)
        if self.receiver.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the test collector fails every export")
        return trace_service_pb2.ExportTraceServiceResponse()


def _handler_for(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the exporter's requests.Session reuses its connection

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.path.split("?", 1)[0] != HTTP_PATH:
                self._discard(length)
                return self._answer(404, b"not found", "text/plain")
            if length > MAX_BODY:
                self.close_connection = True
                return self._answer(413, b"request too large", "text/plain")
            body = self.rfile.read(length)
            content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
            if content_type != PROTOBUF:
                return self._answer(415, f"Content-Type must be {PROTOBUF}".encode(), "text/plain")
            encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
            try:
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                elif encoding != "identity":
                    return self._answer(415, f"unknown Content-Encoding {encoding}".encode(), "text/plain")
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            except (OSError, EOFError, zlib.error, DecodeError) as error:
                receiver._record(None)
                return self._answer(400, f"undecodable request: {error}".encode(), "text/plain")
            receiver._record(request, self.headers.get("Authorization"))
            if receiver.fail:
                return self._answer(503, b"the test collector fails every export", "text/plain")
            self._answer(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString(), PROTOBUF)

        def do_GET(self) -> None:
            self._answer(404 if self.path.split("?", 1)[0] != HTTP_PATH else 405, b"POST only", "text/plain")

        def _discard(self, length: int) -> None:
            if length > MAX_BODY:
                self.close_connection = True
            else:
                self.rfile.read(length)

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests' output is theirs
            pass

    return Handler


# --- reading traces -----------------------------------------------------------------------------------------------
def trace_of(spans: Sequence[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    """The spans of one trace, by start time."""
    return sorted((span for span in spans if span.trace_id == trace_id), key=lambda span: span.start_ns)


def children(spans: Sequence[ReceivedSpan], span: ReceivedSpan) -> list[ReceivedSpan]:
    """The spans whose parent is `span` (same trace), by start time."""
    return sorted(
        (s for s in spans if s.trace_id == span.trace_id and s.parent_span_id == span.span_id),
        key=lambda s: s.start_ns,
    )


def render_tree(spans: Sequence[ReceivedSpan], trace_id: str, attributes: Sequence[str] = ()) -> str:
    """One trace as an indented tree, one line per span: `name  [service.name]  12.34 ms  key=value ...` with the
    `attributes` named that the span has (and status=ERROR: message for a failed span). The roots come first: spans
    without a parent, or whose parent is not in the trace; children by start time."""
    members = trace_of(spans, trace_id)
    ids = {span.span_id for span in members}
    lines: list[str] = []
    seen: set[str] = set()

    def draw(span: ReceivedSpan, depth: int) -> None:
        if span.span_id in seen:  # a malformed trace (a cycle, a repeated id) is drawn once
            return
        seen.add(span.span_id)
        line = f"{'  ' * depth}{span.name}  [{span.resource.get('service.name', '?')}]  {span.duration_ms:.2f} ms"
        shown = [f"{key}={span.attributes[key]}" for key in attributes if key in span.attributes]
        if span.status_code == "ERROR":
            shown.append(f"status=ERROR: {span.status_message}" if span.status_message else "status=ERROR")
        lines.append("  ".join([line, " ".join(shown)]) if shown else line)
        for child in children(members, span):
            draw(child, depth + 1)

    for root in (span for span in members if span.parent_span_id is None or span.parent_span_id not in ids):
        draw(root, 0)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.otlp_receiver",
        description="An OTLP trace receiver on 127.0.0.1; prints every trace received as a tree when it ends.",
    )
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--seconds", type=float, default=60.0, help=f"how long to receive (default 60, at most {MAX_SECONDS})"
    )
    parser.add_argument(
        "--attribute", action="append", default=[], help="an attribute to show on each line (repeatable)"
    )
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= MAX_SECONDS:
        parser.error(f"--seconds must be in (0, {MAX_SECONDS}]")
    with OtlpReceiver(args.protocol, port=args.port) as receiver:
        print(f"OTLP {args.protocol} receiver: {receiver.endpoint}", flush=True)
        print(f"receiving for {args.seconds:g} s (Ctrl-C to stop sooner)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.seconds)
        spans = receiver.spans()
        exports = receiver.exports
    first_start: dict[str, int] = {}
    for span in spans:
        first_start[span.trace_id] = min(first_start.get(span.trace_id, span.start_ns), span.start_ns)
    print(f"{len(spans)} spans in {len(first_start)} traces, {exports} exports")
    for trace_id in sorted(first_start, key=first_start.__getitem__):
        print(f"\ntrace {trace_id}")
        print(render_tree(spans, trace_id, args.attribute))
    return 0


if __name__ == "__main__":
    sys.exit(main())
