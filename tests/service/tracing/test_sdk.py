"""service.tracing.sdk: the sampler of traces that start here, and the spans lost on the way counted by reason."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import Link, SpanContext, TraceFlags
from pydantic import ValidationError

from service.settings import Settings
from service.tracing import sdk
from service.tracing.sdk import CountingBatchProcessor, CountingExporter, RatioOrLinked, otlp_exporter
from tests.harness.otlp_receiver import OtlpReceiver


def context(sampled: bool) -> SpanContext:
    return SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1 if sampled else 0))


def test_a_batch_is_sampled_where_any_request_it_served_is() -> None:
    never = RatioOrLinked(0.0)
    assert never.should_sample(None, 0xABC, "request").decision is Decision.DROP
    linked = [Link(context(False)), Link(context(True))]
    assert never.should_sample(None, 0xABC, "batch", links=linked).decision is Decision.RECORD_AND_SAMPLE
    assert never.should_sample(None, 0xABC, "batch", links=[Link(context(False))]).decision is Decision.DROP
    assert RatioOrLinked(1.0).should_sample(None, 0xABC, "request").decision is Decision.RECORD_AND_SAMPLE


class Exporter(SpanExporter):
    """Holds every export until released; then answers `result`."""

    def __init__(self, result: SpanExportResult) -> None:
        self.result = result
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(10)
        self.exported += len(spans)
        return self.result

    def shutdown(self) -> None:
        self.release.set()


def test_a_full_queue_and_a_failing_collector_are_counted() -> None:
    counted: dict[str, int] = {}

    def count(reason: str, spans: int) -> None:
        counted[reason] = counted.get(reason, 0) + spans

    stuck = Exporter(SpanExportResult.FAILURE)
    provider = TracerProvider()
    provider.add_span_processor(CountingBatchProcessor(CountingExporter(stuck, count), 64, count))
    tracer = provider.get_tracer("test")
    started = time.perf_counter()
    for _ in range(200):  # the exporter holds the first batch: the queue of 64 fills, the rest is dropped
        tracer.start_span("request").end()
    assert time.perf_counter() - started < 1.0  # never waits for the collector
    assert counted.get("queue_full", 0) >= 200 - 2 * 64
    stuck.release.set()
    provider.force_flush(5000)
    provider.shutdown()
    assert counted["export_failed"] == stuck.exported > 0


def test_a_stop_waits_for_a_stuck_collector_only_so_long() -> None:
    stuck = Exporter(SpanExportResult.SUCCESS)
    provider = TracerProvider()
    provider.add_span_processor(CountingBatchProcessor(stuck, 64, lambda reason, spans: None, shutdown_s=0.5))
    for _ in range(100):
        provider.get_tracer("test").start_span("request").end()
    started = time.perf_counter()
    provider.shutdown()  # the exporter holds its export for 10 s
    assert time.perf_counter() - started < 3.0
    stuck.release.set()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_collectors_credentials_go_as_the_header_the_refusal_names(protocol: str, monkeypatch) -> None:
    """A URL's "user:secret@" was the host name to the gRPC exporter (nothing exported, the secret in each failed
    export's log line): such a URL is refused, naming OTEL_EXPORTER_OTLP_HEADERS, which both exporters send."""
    with pytest.raises(ValidationError, match=r"'http://\.\.\.@127\.0\.0\.1:4317' holds credentials") as refused:
        Settings(otlp_endpoint="http://user:s3cret@127.0.0.1:4317")
    assert "s3cret" not in str(refused.value)
    header = re.search(r"OTEL_EXPORTER_OTLP_HEADERS='([^']+)'", str(refused.value))
    assert header is not None and header.group(1) == "authorization=Basic%20BASE64"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Basic%20dXNlcjpzM2NyZXQ=")
    with OtlpReceiver(protocol) as receiver:
        exporter = otlp_exporter(Settings(otlp_endpoint=receiver.endpoint, otlp_timeout_s=5), protocol)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.get_tracer("test").start_span("request").end()
        provider.shutdown()
        assert receiver.authorizations == ["Basic dXNlcjpzM2NyZXQ="]


def test_a_collector_that_fails_is_said_once_and_its_return_too(caplog) -> None:
    """Each failed export logged an ERROR and each retry a WARNING, in every process, for as long as the collector
    was down (42 lines in 10 s from three processes), and the HTTP exporter's named no collector."""
    caplog.set_level(logging.INFO)
    sdk.hold_repeats()
    sdk.HELD_REPEATS.reset()
    with OtlpReceiver("http", fail=True) as receiver:
        settings = Settings(otlp_endpoint=receiver.endpoint, otlp_timeout_s=0.5)
        exporter = CountingExporter(otlp_exporter(settings, "http"), lambda reason, spans: None, receiver.endpoint)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("test")
        for _ in range(4):
            tracer.start_span("request").end()
        assert receiver.exports >= 4
        ours = [r.getMessage() for r in caplog.records if r.name == "service.tracing"]
        assert ours == [ours[0]] and f"could not be exported to {receiver.endpoint}" in ours[0]
        theirs = [r for r in caplog.records if r.name in sdk.EXPORT_LOGGERS]
        assert len(theirs) == 1, [r.getMessage() for r in theirs]  # the first; the rest held for a minute
        receiver.fail = False
        tracer.start_span("request").end()
        assert (
            caplog.records[-1].getMessage()
            == f"traces: spans are exported to {receiver.endpoint} again (4 exports had failed)"
        )
        provider.shutdown()
