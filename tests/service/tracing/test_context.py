"""service.tracing: W3C trace context in and out, the protocol chosen by the URL, the no-op path while off, and the
span a request's rows take to the engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.trace import SpanContext, TraceFlags

from service import tracing
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[3]

TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("header", "sampled"),
    [
        (f"00-{TRACE_ID}-{SPAN_ID}-01", True),
        (f"00-{TRACE_ID}-{SPAN_ID}-00", False),
        (f"00-{TRACE_ID}-{SPAN_ID}-09".encode(), True),  # other flags are not ours to keep; bytes as HTTP gives them
        (f"01-{TRACE_ID}-{SPAN_ID}-01-future-fields", True),  # a later version: read as 00
    ],
)
def test_a_valid_traceparent_is_read(header: str | bytes, sampled: bool) -> None:
    context = tracing.parse_traceparent(header)
    assert context is not None and context.is_remote
    assert (f"{context.trace_id:032x}", f"{context.span_id:016x}") == (TRACE_ID, SPAN_ID)
    assert context.trace_flags.sampled is sampled


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        f"00-{'0' * 32}-{SPAN_ID}-01",  # an all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # an all-zero span id
        f"00-{TRACE_ID.upper()}-{SPAN_ID}-01",  # upper case
        f"00-{TRACE_ID}-{SPAN_ID}-01-extra",  # version 00 has exactly four fields
        f"ff-{TRACE_ID}-{SPAN_ID}-01",  # version ff is invalid
        f"00-{TRACE_ID[:-1]}-{SPAN_ID}-01",
        f"00-{TRACE_ID}-{SPAN_ID}-zz",
        "00-\udcff" * 3,
        # what int(x, 16) reads but W3C's lower-case hex forbids: a trace the client never sent, continued
        f"00-+{TRACE_ID[1:]}-{SPAN_ID}-01",
        f"00-0x{TRACE_ID[2:]}-{SPAN_ID}-01",
        f"00- {TRACE_ID[1:]}-{SPAN_ID}-01",
        f"00-{TRACE_ID[:16]}_{TRACE_ID[17:]}-{SPAN_ID}-01",
        f"00-{TRACE_ID}-+{SPAN_ID[1:]}-01",
        f"00-{TRACE_ID}-{SPAN_ID}-+1",
        f"0A-{TRACE_ID}-{SPAN_ID}-01",
    ],
)
def test_a_malformed_traceparent_starts_a_trace_of_its_own(header: str | None) -> None:
    assert tracing.parse_traceparent(header) is None


def test_the_response_header_writes_the_context_back() -> None:
    context = SpanContext(int(TRACE_ID, 16), int(SPAN_ID, 16), is_remote=False, trace_flags=TraceFlags(1))
    assert tracing.traceparent(context) == f"00-{TRACE_ID}-{SPAN_ID}-01"
    assert tracing.parse_traceparent(tracing.traceparent(context)) == SpanContext(
        context.trace_id, context.span_id, is_remote=True, trace_flags=TraceFlags(1)
    )


@pytest.mark.parametrize(
    ("endpoint", "protocol"),
    [
        ("http://collector:4317", "grpc"),
        ("https://collector.example:443", "grpc"),
        ("http://collector:4318", "http/protobuf"),
        ("http://collector:4318/v1/traces", "http/protobuf"),
        ("https://otlp.example/api/v1/traces", "http/protobuf"),
    ],
)
def test_the_protocol_follows_the_url_unless_named(endpoint: str, protocol: str) -> None:
    assert tracing.protocol_of(Settings(otlp_endpoint=endpoint)) == protocol
    assert tracing.protocol_of(Settings(otlp_endpoint=endpoint, otlp_protocol="grpc")) == "grpc"


@pytest.mark.parametrize(
    "endpoint",
    ["collector:4317", "ftp://collector", "http://", "http://a b:4317", "http://127.0.0.1:99999", "http://[::1"],
)
def test_an_endpoint_that_is_not_a_url_is_refused(endpoint: str) -> None:
    with pytest.raises(ValueError, match="is not an OTLP URL"):
        Settings(otlp_endpoint=endpoint)


def test_off_by_default_and_then_free() -> None:
    settings = Settings()
    assert settings.otlp_endpoint is None
    tracing.configure(settings, "server")
    assert not tracing.ENABLED
    assert tracing.span("tokenize") is tracing.NO_SPAN
    assert tracing.current_context() is None
    with tracing.span("x") as span:
        span.set_attribute("a", 1)
        assert not span.is_recording()


def test_a_sampled_span_is_what_the_rows_carry(tmp_path) -> None:
    """On, with a collector that nobody answers (the spans wait in the queue): a span made current is the context
    handed on; outside it, nothing."""
    tracing.configure(Settings(otlp_endpoint="http://127.0.0.1:9/v1/traces", otlp_timeout_s=0.5), "server")
    try:
        assert tracing.ENABLED
        assert tracing.current_context() is None  # no request
        assert tracing.span("child") is tracing.NO_SPAN  # nothing to be a child of
        root = tracing.CurrentSpan(tracing.start_span("request"))
        try:
            with tracing.span("engine") as engine:
                carried = tracing.current_context()
                assert carried == engine.get_span_context()
                assert carried.trace_id == root.span.get_span_context().trace_id
        finally:
            root.end()
        assert tracing.current_context() is None
    finally:
        tracing.shutdown()
    assert not tracing.ENABLED


GLOBAL_PROVIDER_SCRIPT = """
import asyncio, httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from service.frontend.http.app import create_app
from service.settings import Settings

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def main():
    transport = httpx.ASGITransport(app=create_app(Settings()))
    async with httpx.AsyncClient(transport=transport, base_url="http://bertserve") as client:
        for path in ("/livez", "/v1/models/none/classify"):
            await client.post(path, json={"inputs": ["x"]}) if "classify" in path else await client.get(path)

asyncio.run(main())
print(len(exporter.get_finished_spans()))
"""


def test_a_global_provider_gets_no_spans_from_the_framework() -> None:
    # Under `opentelemetry-instrument` (a global SDK provider) FastAPI would trace every request, probes included,
    # beside the server's own traces: the server's traces are its own (--otlp-endpoint), and FastAPI's are off.
    result = subprocess.run(
        [sys.executable, "-c", GLOBAL_PROVIDER_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "0", result.stdout


def test_one_traceparent_is_a_parent_none_or_two_are_none() -> None:
    """HTTP's headers and gRPC's metadata alike: two are no parent (W3C trace context's test suite)."""
    header = f"00-{TRACE_ID}-{SPAN_ID}-01"
    assert tracing.client_parent([]) is None
    assert tracing.client_parent([header]) == tracing.parse_traceparent(header) is not None
    assert tracing.client_parent([header.encode()]) == tracing.parse_traceparent(header)
    assert tracing.client_parent([header, header]) is None


def test_a_clients_tracestate_goes_with_its_traceparent_and_a_malformed_one_is_dropped(caplog) -> None:
    """Dropped quietly: OpenTelemetry's parser logged a warning holding the client's text for each malformed one."""
    header = f"00-{TRACE_ID}-{SPAN_ID}-01"
    parent = tracing.client_parent([header], [b"congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7"])
    assert parent is not None and parent.trace_state.to_header() == "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    assert (parent.trace_id, parent.span_id) == (int(TRACE_ID, 16), int(SPAN_ID, 16))
    assert tracing.client_parent([header], ["bad key=1"]).trace_state.to_header() == ""
    assert tracing.client_parent([header], ["rojo=1,rojo=2"]).trace_state.to_header() == ""  # a key twice
    assert tracing.client_parent([], ["congo=1"]) is None  # no traceparent: a trace of our own, its state empty
    assert tracing.client_parent([header], [",".join(f"k{i}=v" for i in range(33))]).trace_state.to_header() == ""
    kept = tracing.client_parent([header], [",".join(f"k{i}=v" for i in range(31)), " t@sys=a b ,"])
    assert len(kept.trace_state) == 32 and kept.trace_state["t@sys"] == "a b"  # a vendor's tenant key, two headers
    caplog.clear()
    assert tracing.client_parent([header], ["ATTACKER TEXT " * 200]).trace_state.to_header() == ""
    assert not [record for record in caplog.records if "ATTACKER" in record.getMessage()]


def test_a_step_that_fails_for_the_client_is_not_marked_as_the_servers_error(monkeypatch) -> None:
    """A request's steps mark an error as its server span does: the SDK had made every exception ERROR, so a
    client's disconnect read as a failure of the `engine` span, an input refused as one of `tokenize`."""
    from service.errors import ClientClosed, InferenceFailed, InvalidInput

    exporter = memory_tracer(monkeypatch)
    root = tracing.CurrentSpan(tracing.start_span("request"))
    try:
        for name, error in (
            ("tokenize", InvalidInput("too long")),
            ("engine", ClientClosed("the client went away")),
            ("inference", InferenceFailed("the batch failed")),
            ("postprocess", RuntimeError("a bug")),
        ):
            with pytest.raises(type(error)), tracing.span(name):
                raise error
    finally:
        root.end()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    for name, error_type, status in (
        ("tokenize", "InvalidInput", "UNSET"),
        ("engine", "ClientClosed", "UNSET"),
        ("inference", "InferenceFailed", "ERROR"),
        ("postprocess", "RuntimeError", "ERROR"),
    ):
        assert spans[name].attributes["error.type"] == error_type, name
        assert spans[name].status.status_code.name == status, name
    assert [event.name for event in spans["postprocess"].events] == ["exception"]  # a bug's traceback, recorded
    assert not spans["tokenize"].events  # a client's error: no exception event


def memory_tracer(monkeypatch):
    """Tracing on in this process, its spans kept in memory: the exporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "ENABLED", True)
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    return exporter


def test_a_step_its_calls_deadline_cancelled_is_the_deadlines_and_a_client_cancel_is_not(monkeypatch) -> None:
    """grpc cancels a call's task at the client's deadline: the server span said DeadlineExceeded (504, ERROR) and
    its `engine` step said CancelledError, unset, as for a client's cancel."""
    import asyncio
    import contextvars
    import time

    exporter = memory_tracer(monkeypatch)

    def cancelled_step(name: str, deadline: float | None) -> None:
        if deadline is not None:
            tracing.CALL_DEADLINE.set(deadline)
        root = tracing.CurrentSpan(tracing.start_span("call"))
        try:
            with pytest.raises(asyncio.CancelledError), tracing.span(name):
                raise asyncio.CancelledError
        finally:
            root.end()

    contextvars.copy_context().run(cancelled_step, "cancelled", None)  # no deadline: the client's cancel
    contextvars.copy_context().run(cancelled_step, "early", time.monotonic() + 60)  # before its deadline
    contextvars.copy_context().run(cancelled_step, "late", time.monotonic() - 0.001)  # at (past) its deadline
    steps = [span for span in exporter.get_finished_spans() if span.name != "call"]
    marks = {span.name: (span.attributes["error.type"], span.status.status_code.name) for span in steps}
    assert marks == {
        "cancelled": ("CancelledError", "UNSET"),
        "early": ("CancelledError", "UNSET"),
        "late": ("DeadlineExceeded", "ERROR"),
    }


def test_a_429_at_the_door_marks_the_admission_step_as_the_server_span(monkeypatch) -> None:
    """`bertserve.admitted` false said it; `error.type` (Overloaded, a client's status: unset) was missing, which
    every other step an error leaves has."""
    from service.frontend.admission import AdmissionGate, Door, ModelGates

    exporter = memory_tracer(monkeypatch)
    door = Door(AdmissionGate(max_queue_s=2.0, floor_tokens=100), ModelGates(2.0, 100), lambda model: False)
    root = tracing.CurrentSpan(tracing.start_span("request"))
    try:
        assert door.try_enter(10_000) is not None  # a cold gate's one request, whatever it costs
        assert door.try_enter(10_000) is None
    finally:
        root.end()
    admitted, refused = [span for span in exporter.get_finished_spans() if span.name == "admission"]
    assert admitted.attributes["bertserve.admitted"] is True and "error.type" not in admitted.attributes
    assert refused.attributes["bertserve.admitted"] is False and refused.attributes["error.type"] == "Overloaded"
    assert refused.status.status_code.name == "UNSET"
