"""The OpenTelemetry SDK's parts as bertserve configures them (imported only where traces are on): the sampler, the
exporter of the chosen protocol, and the counting of dropped spans."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult, TraceIdRatioBased
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

if TYPE_CHECKING:
    from service.settings import Settings

HTTP_TRACES_PATH = "/v1/traces"
EXPORT_BATCH_SPANS = 512
EXPORT_DELAY_MS = 1000
SHUTDOWN_S = 3.0  # at a stop, the longest wait for the queued spans' export
# The SDK's loggers that speak of failed exports: with the collector down, each export logged an ERROR and each
# retry a WARNING, in every process, for as long as it lasted (42 lines in 10 s from three processes)
EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
)
REPEAT_S = 60.0  # of those lines, one a minute at most
log = logging.getLogger("service.tracing")


class RatioOrLinked(Sampler):
    """A trace that starts here: sampled at `ratio` of trace ids, or always where a link points at a sampled span
    (a batch: it is part of the sampled requests it served)."""

    def __init__(self, ratio: float) -> None:
        self._ratio = TraceIdRatioBased(ratio)

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if links and any(link.context.trace_flags.sampled for link in links):
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, trace_state)
        return self._ratio.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"RatioOrLinked{{{self._ratio.get_description()}}}"


def otlp_exporter(settings: Settings, protocol: str) -> SpanExporter:
    """OTLP over gRPC (the URL's scheme says whether TLS: https) or over HTTP/protobuf (to the URL, /v1/traces
    added where it names no path)."""
    endpoint = settings.otlp_endpoint or ""
    timeout = settings.otlp_timeout_s
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=urlsplit(endpoint).scheme != "https", timeout=timeout)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    url = urlsplit(endpoint)
    if url.path in ("", "/"):
        endpoint = urlunsplit(url._replace(path=HTTP_TRACES_PATH))
    return HttpExporter(endpoint=endpoint, timeout=timeout)


class HeldRepeats(logging.Filter):
    """The first line, then one every `repeat_s` at most, saying how many were held back meanwhile."""

    def __init__(self, repeat_s: float = REPEAT_S) -> None:
        super().__init__()
        self.repeat_s = repeat_s
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self.repeat_s:
                self._held += 1
                return False
            self._last, held, self._held = now, self._held, 0
        if held:
            record.msg, record.args = f"{record.getMessage()} ({held} more such lines held back)", None
        return True

    def reset(self) -> None:
        """The next line goes through (exports work again: a new failure is news)."""
        with self._lock:
            self._last, self._held = -float("inf"), 0


HELD_REPEATS = HeldRepeats()


def hold_repeats() -> None:
    """The SDK's export failure lines, one a minute at most (`HELD_REPEATS`), whatever their logger."""
    for name in EXPORT_LOGGERS:
        logger = logging.getLogger(name)
        if HELD_REPEATS not in logger.filters:
            logger.addFilter(HELD_REPEATS)


class CountingExporter(SpanExporter):
    """The exporter, with the spans of every batch it could not deliver counted (export_failed). The first failure
    after exports worked is said once, naming the collector (the HTTP exporter's own lines name none), and exports
    working again are said too."""

    def __init__(self, exporter: SpanExporter, count: Callable[[str, int], None], endpoint: str = "") -> None:
        self._exporter = exporter
        self._count = count
        self._endpoint = endpoint or "the collector"
        self._failed = 0  # exports failed in a row

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._exporter.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._count("export_failed", len(spans))
            if not self._failed:
                log.warning(
                    "traces: spans could not be exported to %s; they are dropped and counted "
                    "(bertserve_trace_spans_dropped_total), requests are served as ever; the exporter's own lines "
                    "say why, one every %g s at most",
                    self._endpoint,
                    HELD_REPEATS.repeat_s,
                )
            self._failed += 1
        elif self._failed:
            log.info("traces: spans are exported to %s again (%d exports had failed)", self._endpoint, self._failed)
            self._failed = 0
            HELD_REPEATS.reset()
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class CountingBatchProcessor(BatchSpanProcessor):
    """The SDK's batch processor (a bounded queue; a thread exports in batches), with the spans it drops because its
    queue is full counted (queue_full): it drops them with a log line only. Its shutdown waits at most
    `shutdown_s` for the queue's last exports: the SDK's own waits 30 s, and its flush one export timeout per batch
    (with a dead collector, a stop held for a minute)."""

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue_spans: int,
        count: Callable[[str, int], None],
        shutdown_s: float = SHUTDOWN_S,
    ) -> None:
        self._shutdown_s = shutdown_s
        super().__init__(
            exporter,
            max_queue_size=max_queue_spans,
            schedule_delay_millis=EXPORT_DELAY_MS,
            max_export_batch_size=min(EXPORT_BATCH_SPANS, max_queue_spans),
        )
        self._max_queue_spans = max_queue_spans
        self._count = count

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            queue = self._batch_processor._queue  # the SDK's deque (opentelemetry-sdk 1.45, pinned)
            if len(queue) >= self._max_queue_spans:
                self._count("queue_full", 1)
        super().on_end(span)

    def shutdown(self) -> None:
        self._batch_processor.shutdown(timeout_millis=int(self._shutdown_s * 1000))
