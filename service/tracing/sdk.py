"""The OpenTelemetry SDK's parts as bertserve configures them (imported only where traces are on): the sampler, the
exporter of the chosen protocol, and the counting of dropped spans."""

from __future__ import annotations

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


class CountingExporter(SpanExporter):
    """The exporter, with the spans of every batch it could not deliver counted (export_failed)."""

    def __init__(self, exporter: SpanExporter, count: Callable[[str, int], None]) -> None:
        self._exporter = exporter
        self._count = count

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._exporter.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._count("export_failed", len(spans))
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
